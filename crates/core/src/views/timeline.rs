//! What each thread was doing, and when: the per-thread shares of wall time (running, waiting
//! for the GVL, blocked, in the GC) that `record`'s summary prints, and the timeline that
//! `ddprof-recorder timeline` draws, one lane per thread, from the samples that carry a time.
//!
//! The profiler's timeline option (`Profiler.new(timeline: true)`) dates each thread sample
//! ([`END_TIMESTAMP_LABEL`], Unix ns) and says what its thread was doing then
//! ([`THREAD_STATE_LABEL`]); its `wall-time` is the time since the thread's previous sample,
//! so a thread's dated samples tile its life: sample `s` covers `[end - wall, end]`.
//!
//! The shares are counted from the values, which are measured, not sampled: `running` is the
//! thread's `cpu-time` outside the GC, `gc` the `wall-time` of its GC samples (`"gc kind"`
//! label), `waiting for GVL` its `gvl-wait-time` (Ruby 3.3+), and `blocked` the rest of its
//! wall time (which also holds the time the kernel kept it off a CPU). Without
//! `gvl-wait-time` (Ruby 3.1, where Ruby has no GVL events) the waiting share is absent and
//! the rest is `blocked or waiting`: an estimate from the states' labels was tried, and was 5
//! to 39 points off the truth for busy threads (a thread's idle passes do not say which).
//!
//! The timeline page tells one story: its lanes, each lane's hover and its table use the
//! same words for the same numbers ([`LaneShares`]). `running`, `waiting for GVL`, `blocked`
//! and `gc` there are the lanes' colors, each the share of the thread's drawn time in that
//! state, and `on a CPU` its `cpu-time`: a thread that holds the GVL is `running` though the
//! kernel may keep it off a CPU. The table used [`ThreadTimes`] while the lanes drew states:
//! on Ruby 3.1, 4 threads taking turns on the GVL on a loaded machine were "blocked 92-93%"
//! in the table and mostly red (waiting for GVL) in their lanes.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::reader::{ResolvedLabelValue, StackProfile, StackSample};
use super::ViewError;
use crate::END_TIMESTAMP_LABEL;

/// The label that says what a dated sample's thread was doing (the profiler's
/// `ThreadSampler::THREAD_STATE_LABEL`).
pub const THREAD_STATE_LABEL: &str = "thread state";
const THREAD_ID_LABEL: &str = "thread id";
const THREAD_NAME_LABEL: &str = "thread name";
const PROCESS_ID_LABEL: &str = "process id";
const GC_KIND_LABEL: &str = "gc kind";

/// A thread's state, as the profiler labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ThreadState {
    Running,
    Waiting,
    Blocked,
    Gc,
    /// A dated sample without a state label (another recorder's).
    Unknown,
}

impl ThreadState {
    pub(crate) const ALL: [Self; 5] =
        [Self::Running, Self::Waiting, Self::Blocked, Self::Gc, Self::Unknown];

    fn of(label: &str) -> Self {
        match label {
            "running" => Self::Running,
            "waiting for GVL" => Self::Waiting,
            "blocked" => Self::Blocked,
            "gc" => Self::Gc,
            _ => Self::Unknown,
        }
    }

    /// The label's text.
    pub fn name(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Waiting => "waiting for GVL",
            Self::Blocked => "blocked",
            Self::Gc => "gc",
            Self::Unknown => "(no state)",
        }
    }

    fn color(self) -> &'static str {
        match self {
            Self::Running => "#2e7d32",
            Self::Waiting => "#d32f2f",
            Self::Blocked => "#b0b0b0",
            Self::Gc => "#f57c00",
            Self::Unknown => "#1e88e5",
        }
    }
}

/// One thread's wall time in a profile, and how it was spent (ns).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadTimes {
    /// The `"process id"` label, if the samples have one (a merged profile's processes).
    pub process: Option<String>,
    /// The `"thread id"` label.
    pub thread_id: String,
    /// The `"thread name"` label (the last one seen, for a renamed thread).
    pub name: String,
    pub wall_ns: i64,
    pub running_ns: i64,
    /// `None` when the profile has no `gvl-wait-time` (Ruby 3.1, or no timeline): then
    /// `blocked_ns` holds the waits too.
    pub waiting_ns: Option<i64>,
    pub gc_ns: i64,
    pub blocked_ns: i64,
}

/// What [`StackProfile::timeline`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimelineFormat {
    Svg,
    /// The SVG in a page, with a table of the threads' shares below it.
    Html,
}

/// The lane of one thread: `(process id, thread id)`.
pub(crate) type LaneKey = (Option<String>, String);

/// One drawn span of a lane: adjacent dated samples with the same state and stack, merged.
struct Span<'a> {
    start: i64,
    end: i64,
    state: ThreadState,
    cpu: i64,
    waited: i64,
    sample: &'a StackSample,
}

/// What a lane draws, in ns: its time in each state, as its rects are colored (by
/// [`ThreadState`], in [`ThreadState::ALL`]'s order), and its samples' `cpu-time`. The lane's
/// hover and the page's table both say these.
#[derive(Default)]
struct LaneShares {
    states: [i64; 5],
    cpu: i64,
}

impl LaneShares {
    fn of(spans: &[Span]) -> Self {
        let mut shares = Self::default();
        for span in spans {
            for (from, to, state) in span.parts() {
                shares.states[state as usize] =
                    shares.states[state as usize].saturating_add(to.saturating_sub(from).max(0));
            }
            shares.cpu = shares.cpu.saturating_add(span.cpu);
        }
        shares
    }

    fn drawn(&self) -> i64 {
        self.states.iter().fold(0i64, |sum, &t| sum.saturating_add(t))
    }

    /// `running 25.0%, waiting for GVL 74.1%, blocked 0.9%, gc 0.0%; on a CPU 20.0%`, with
    /// `(no state)` too when some span has none.
    fn text(&self) -> String {
        let drawn = self.drawn();
        let parts: Vec<String> = ThreadState::ALL
            .iter()
            .filter(|&&state| state != ThreadState::Unknown || self.states[state as usize] > 0)
            .map(|&state| {
                format!("{} {:.1}%", state.name(), percent(self.states[state as usize], drawn))
            })
            .collect();
        format!("{}; on a CPU {:.1}%", parts.join(", "), percent(self.cpu, drawn))
    }
}

/// SVG bytes per span beyond its stack's names: the `<rect>`, its `<title>` and numbers.
const SVG_BYTES_PER_SPAN: usize = 320;
/// Frames of a span's stack shown on hover, leaf first.
const HOVER_FRAMES: usize = 24;
const WIDTH: f64 = 1200.0;
const LABEL_WIDTH: f64 = 250.0;
const LANE_HEIGHT: f64 = 22.0;
const LANE_GAP: f64 = 6.0;
const TOP: f64 = 64.0;

impl Span<'_> {
    /// The span as drawn: its GVL wait first (the thread was ready, then ran or blocked up to
    /// the sample), then its state; `(from, to, state)` each, the first empty if it did not
    /// wait (a span of a zero length is drawn, as its state).
    fn parts(&self) -> impl Iterator<Item = (i64, i64, ThreadState)> {
        let waited_until = match self.state {
            ThreadState::Waiting => self.start,
            _ => self.start.saturating_add(self.waited).min(self.end),
        };
        let (start, end) = (self.start, self.end);
        [(start, waited_until, ThreadState::Waiting), (waited_until, end, self.state)]
            .into_iter()
            .filter(move |&(from, to, _)| to > from || (from == start && to == end))
    }
}

fn label<'a>(s: &'a StackSample, key: &str) -> Option<&'a ResolvedLabelValue> {
    s.labels.iter().find(|(k, _)| k == key).map(|(_, v)| v)
}

fn label_text(s: &StackSample, key: &str) -> Option<String> {
    label(s, key).map(ToString::to_string)
}

fn lane_key(s: &StackSample) -> Option<LaneKey> {
    Some((label_text(s, PROCESS_ID_LABEL), label_text(s, THREAD_ID_LABEL)?))
}

fn end_ns(s: &StackSample) -> Option<i64> {
    match label(s, END_TIMESTAMP_LABEL)? {
        ResolvedLabelValue::Num(n) => Some(*n),
        ResolvedLabelValue::Str(_) => None,
    }
}

pub(crate) fn state_of(s: &StackSample) -> ThreadState {
    match label(s, THREAD_STATE_LABEL) {
        Some(ResolvedLabelValue::Str(v)) => ThreadState::of(v),
        _ if label(s, GC_KIND_LABEL).is_some() => ThreadState::Gc,
        _ => ThreadState::Unknown,
    }
}

fn is_gc(s: &StackSample) -> bool {
    label(s, GC_KIND_LABEL).is_some() || state_of(s) == ThreadState::Gc
}

fn percent(part: i64, whole: i64) -> f64 {
    if whole > 0 {
        100.0 * part as f64 / whole as f64
    } else {
        0.0
    }
}

/// `ns` as milliseconds or seconds, for people.
fn duration(ns: i64) -> String {
    if ns.abs() >= 10_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else {
        format!("{:.3} ms", ns as f64 / 1e6)
    }
}

/// Appends `s` with `&`, `<`, `>` and `"` escaped, for XML text and attribute values.
fn xml(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            c if (c as u32) < 0x20 && c != '\n' && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
}

/// The time axis: about ten ticks of a round step, from the first span's start.
fn axis(out: &mut String, span_ns: i64, plot: f64, height: f64) {
    let raw = span_ns as f64 / 10.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step =
        [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * magnitude).find(|&s| s >= raw).unwrap_or(raw);
    let step = step.max(1.0);
    let mut t = 0.0;
    while t <= span_ns as f64 {
        let x = LABEL_WIDTH + plot * t / span_ns as f64;
        let _ = write!(
            out,
            "<line x1=\"{x:.2}\" y1=\"{}\" x2=\"{x:.2}\" y2=\"{}\" stroke=\"#e0e0e0\"/>\
             <text x=\"{x:.2}\" y=\"{}\" text-anchor=\"middle\" fill=\"#555\">{}</text>",
            TOP - 14.0,
            height - 30.0,
            TOP - 18.0,
            tick(t, step)
        );
        t += step;
    }
}

/// An axis tick at `t` ns, in seconds from a 1 s step, else in milliseconds, with as many
/// decimals as the step needs.
fn tick(t: f64, step: f64) -> String {
    let (value, unit_step, unit) =
        if step >= 1e9 { (t / 1e9, step / 1e9, "s") } else { (t / 1e6, step / 1e6, "ms") };
    let decimals = if unit_step >= 1.0 { 0 } else { (-unit_step.log10().floor()) as usize };
    format!("{value:.decimals$} {unit}")
}

impl ThreadTimes {
    /// `running 25.0%, waiting for GVL 74.1%, blocked 0.9%, gc 0.0%` of its wall time;
    /// without GVL waits, `running 25.0%, blocked or waiting 75.0%, gc 0.0%`.
    pub fn shares(&self) -> String {
        let mut parts = vec![format!("running {:.1}%", percent(self.running_ns, self.wall_ns))];
        let blocked = match self.waiting_ns {
            Some(w) => {
                parts.push(format!("waiting for GVL {:.1}%", percent(w, self.wall_ns)));
                "blocked"
            }
            None => "blocked or waiting",
        };
        parts.push(format!("{blocked} {:.1}%", percent(self.blocked_ns, self.wall_ns)));
        parts.push(format!("gc {:.1}%", percent(self.gc_ns, self.wall_ns)));
        parts.join(", ")
    }

    /// `pid 12 main (12 (8))`, or without the pid outside a merge of processes.
    pub fn title(&self) -> String {
        match &self.process {
            Some(pid) => format!("pid {pid} {} ({})", self.name, self.thread_id),
            None => format!("{} ({})", self.name, self.thread_id),
        }
    }
}

impl StackProfile {
    /// The dated samples of each thread (see [`Self::timeline`]), in time order, with their
    /// times.
    pub(crate) fn dated_lanes(&self) -> BTreeMap<LaneKey, Vec<(i64, &StackSample)>> {
        let mut lanes: BTreeMap<LaneKey, Vec<(i64, &StackSample)>> = BTreeMap::new();
        for s in &self.samples {
            if let (Some(end), Some(key)) = (end_ns(s), lane_key(s)) {
                lanes.entry(key).or_default().push((end, s));
            }
        }
        for samples in lanes.values_mut() {
            samples.sort_by_key(|&(end, _)| end);
        }
        lanes
    }

    /// Each thread's wall time and its shares (see the module doc), by process, then the
    /// longest first. Empty when the profile has no `wall-time` value or no sample has a
    /// `"thread id"` label; without `cpu-time`, nothing is running.
    pub fn thread_times(&self) -> Vec<ThreadTimes> {
        let Ok(wall) = self.value_index("wall-time") else { return Vec::new() };
        let cpu = self.value_index("cpu-time").ok();
        let gvl = self.value_index("gvl-wait-time").ok();
        let mut threads: BTreeMap<LaneKey, ThreadTimes> = BTreeMap::new();
        for s in &self.samples {
            let Some(key) = lane_key(s) else { continue };
            let t = threads.entry(key).or_insert_with_key(|(process, thread_id)| ThreadTimes {
                process: process.clone(),
                thread_id: thread_id.clone(),
                name: String::new(),
                wall_ns: 0,
                running_ns: 0,
                waiting_ns: gvl.map(|_| 0),
                gc_ns: 0,
                blocked_ns: 0,
            });
            if let Some(name) = label_text(s, THREAD_NAME_LABEL) {
                t.name = name;
            }
            let w = s.values[wall].max(0);
            t.wall_ns = t.wall_ns.saturating_add(w);
            if is_gc(s) {
                t.gc_ns = t.gc_ns.saturating_add(w);
            } else {
                let used = cpu.map_or(0, |c| s.values[c].max(0));
                t.running_ns = t.running_ns.saturating_add(used);
            }
            if let (Some(g), Some(sum)) = (gvl, t.waiting_ns.as_mut()) {
                *sum = sum.saturating_add(s.values[g].max(0));
            }
        }
        let mut out: Vec<ThreadTimes> = threads
            .into_values()
            .map(|mut t| {
                let accounted =
                    t.running_ns.saturating_add(t.gc_ns).saturating_add(t.waiting_ns.unwrap_or(0));
                t.blocked_ns = t.wall_ns.saturating_sub(accounted).max(0);
                t
            })
            .collect();
        out.sort_by(|a, b| a.process.cmp(&b.process).then(b.wall_ns.cmp(&a.wall_ns)));
        out
    }

    /// The timeline of the dated samples: one lane per thread (per process and thread in a
    /// merged profile), each sample a span colored by its thread's state, its stack and values
    /// on hover, under a time axis; each lane's name says the thread's shares
    /// ([`Self::thread_times`]).
    ///
    /// Fails with [`ViewError::NoTimeline`] if no sample has a time ([`ViewError::NoMatch`] if
    /// [`Self::keep_labels`] left no sample), and with
    /// [`ViewError::OutputTooLarge`] if the drawing could take more than the output bound.
    /// Names longer than [`super::MAX_DRAWN_NAME_CHARS`] are cut (`…`).
    pub fn timeline(&self, format: TimelineFormat, title: &str) -> Result<String, ViewError> {
        let wall = self.value_index("wall-time")?;
        let cpu = self.value_index("cpu-time").ok();
        let gvl = self.value_index("gvl-wait-time").ok();
        let mut lanes = self.dated_lanes();
        if lanes.is_empty() {
            return Err(self.nothing_left(ViewError::NoTimeline));
        }
        let times: BTreeMap<LaneKey, ThreadTimes> = self
            .thread_times()
            .into_iter()
            .map(|t| ((t.process.clone(), t.thread_id.clone()), t))
            .collect();

        let value = |s: &StackSample, i: Option<usize>| i.map_or(0, |i| s.values[i].max(0));
        let mut drawn: Vec<(&LaneKey, Vec<Span>)> = Vec::with_capacity(lanes.len());
        let mut bytes = 0usize;
        for (key, samples) in &mut lanes {
            let mut spans: Vec<Span> = Vec::new();
            for &(end, s) in samples.iter() {
                let state = state_of(s);
                let start = end.saturating_sub(s.values[wall].max(0));
                if let Some(last) = spans.last_mut() {
                    // A sample that waited for the GVL keeps its own span: its wait is drawn
                    // at its start.
                    if last.state == state
                        && last.sample.frames == s.frames
                        && start <= last.end
                        && value(s, gvl) == 0
                    {
                        last.end = last.end.max(end);
                        last.cpu = last.cpu.saturating_add(value(s, cpu));
                        last.waited = last.waited.saturating_add(value(s, gvl));
                        continue;
                    }
                }
                let names: usize = s
                    .frames
                    .iter()
                    .take(HOVER_FRAMES)
                    .map(|&f| super::reader::drawn_name(self.display_name(f)).len() + 2)
                    .sum();
                // Twice: a span that waited is drawn as two rects with the same title.
                bytes = bytes.saturating_add(2 * (SVG_BYTES_PER_SPAN + names));
                spans.push(Span {
                    start,
                    end,
                    state,
                    cpu: value(s, cpu),
                    waited: value(s, gvl),
                    sample: s,
                });
            }
            drawn.push((key, spans));
        }
        self.output_budget.check_usize(bytes, "the timeline")?;

        let t0 =
            drawn.iter().flat_map(|(_, spans)| spans.iter().map(|s| s.start)).min().unwrap_or(0);
        let t1 = drawn.iter().flat_map(|(_, spans)| spans.iter().map(|s| s.end)).max().unwrap_or(0);
        // Saturating: the times are a file's labels, any i64.
        let span_ns = t1.saturating_sub(t0).max(1);
        let plot = WIDTH - LABEL_WIDTH - 20.0;
        let x = |t: i64| LABEL_WIDTH + plot * t.saturating_sub(t0) as f64 / span_ns as f64;
        let height = TOP + drawn.len() as f64 * (LANE_HEIGHT + LANE_GAP) + 40.0;

        let mut svg = String::with_capacity(bytes + 8192);
        let _ = write!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{height}\" \
             viewBox=\"0 0 {WIDTH} {height}\" font-family=\"DejaVu Sans, Verdana, sans-serif\" \
             font-size=\"12\"><rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\
             <text x=\"10\" y=\"22\" font-size=\"16\">"
        );
        xml(&mut svg, title);
        svg.push_str("</text>");
        // The legend, on the title's line.
        let mut lx = WIDTH - 560.0;
        for state in ThreadState::ALL.iter().take(4) {
            let _ = write!(
                svg,
                "<rect x=\"{lx}\" y=\"11\" width=\"12\" height=\"12\" fill=\"{}\"/>\
                 <text x=\"{}\" y=\"22\">{}</text>",
                state.color(),
                lx + 16.0,
                state.name()
            );
            lx += 130.0;
        }
        axis(&mut svg, span_ns, plot, height);
        let shares: Vec<LaneShares> =
            drawn.iter().map(|(_, spans)| LaneShares::of(spans)).collect();
        for (lane, (key, spans)) in drawn.iter().enumerate() {
            let y = TOP + lane as f64 * (LANE_HEIGHT + LANE_GAP);
            let times = &times[*key];
            let _ = write!(svg, "<g class=\"lane\"><title>");
            xml(&mut svg, &format!("{}\n{}", times.title(), shares[lane].text()));
            let _ = write!(svg, "</title><text x=\"10\" y=\"{}\">", y + 15.0);
            let mut shown = times.title();
            if shown.chars().count() > 38 {
                shown = shown.chars().take(37).collect::<String>() + "…";
            }
            xml(&mut svg, &shown);
            svg.push_str("</text></g>");
            for span in spans {
                for (from, to, state) in span.parts() {
                    let x0 = x(from);
                    let w = (x(to) - x0).max(0.5);
                    let _ = write!(
                        svg,
                        "<rect x=\"{x0:.2}\" y=\"{y}\" width=\"{w:.2}\" height=\"{LANE_HEIGHT}\" fill=\"{}\"><title>",
                        state.color()
                    );
                    self.hover(&mut svg, times, span, t0);
                    svg.push_str("</title></rect>");
                }
            }
        }
        svg.push_str("</svg>\n");
        Ok(match format {
            TimelineFormat::Svg => {
                format!("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"no\"?>\n{svg}")
            }
            TimelineFormat::Html => page(title, &svg, &drawn, &times, &shares),
        })
    }

    /// A span's hover text: thread, state, when, values, stack.
    fn hover(&self, out: &mut String, times: &ThreadTimes, span: &Span, t0: i64) {
        let mut text = format!(
            "{}: {}\n{} to {} ({})\ncpu-time {}",
            times.title(),
            span.state.name(),
            duration(span.start.saturating_sub(t0)),
            duration(span.end.saturating_sub(t0)),
            duration(span.end.saturating_sub(span.start)),
            duration(span.cpu)
        );
        if times.waiting_ns.is_some() {
            let _ = write!(text, ", gvl-wait-time {}", duration(span.waited));
        }
        for &f in span.sample.frames.iter().take(HOVER_FRAMES) {
            let _ = write!(text, "\n  {}", super::reader::drawn_name(self.display_name(f)));
        }
        if span.sample.frames.len() > HOVER_FRAMES {
            let _ = write!(text, "\n  ... {} more", span.sample.frames.len() - HOVER_FRAMES);
        }
        xml(out, &text);
    }
}

/// The HTML page: title, the SVG, and the table of the lanes' shares.
fn page(
    title: &str,
    svg: &str,
    drawn: &[(&LaneKey, Vec<Span>)],
    times: &BTreeMap<LaneKey, ThreadTimes>,
    shares: &[LaneShares],
) -> String {
    let mut out = String::with_capacity(svg.len() + 4096);
    out.push_str("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>");
    xml(&mut out, title);
    out.push_str(
        "</title><style>body{font-family:'DejaVu Sans',Verdana,sans-serif;margin:16px}\
         table{border-collapse:collapse;margin-top:16px}td,th{padding:4px 10px;\
         border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child\
         {text-align:left}</style></head><body>\n",
    );
    out.push_str(svg);
    // The hovered span's text (its <title>) in a panel too: a tooltip only shows after a
    // pause, and cannot be copied.
    out.push_str(
        "<pre id=\"hover\" style=\"min-height:6em;background:#f6f6f6;padding:8px;\
         margin:8px 0\">Point at a span for its thread, state, times and stack.</pre>\n\
         <script>for (const r of document.querySelectorAll(\"svg rect\")) {\
         const t = r.querySelector(\"title\"); if (!t) continue;\
         r.addEventListener(\"mouseover\", () => {\
         document.getElementById(\"hover\").textContent = t.textContent }) }</script>\n",
    );
    let unknown = ThreadState::Unknown as usize;
    let states: Vec<ThreadState> = ThreadState::ALL
        .iter()
        .copied()
        .filter(|&state| {
            state != ThreadState::Unknown || shares.iter().any(|s| s.states[unknown] > 0)
        })
        .collect();
    out.push_str("<table><tr><th>thread</th><th>wall-time</th>");
    for state in &states {
        let _ = write!(out, "<th>{}</th>", state.name());
    }
    out.push_str("<th>on a CPU</th></tr>\n");
    for ((key, _), lane) in drawn.iter().zip(shares) {
        out.push_str("<tr><td>");
        xml(&mut out, &times[*key].title());
        let drawn = lane.drawn();
        let _ = write!(out, "</td><td>{}</td>", duration(drawn));
        for &state in &states {
            let _ = write!(out, "<td>{:.1}%</td>", percent(lane.states[state as usize], drawn));
        }
        let _ = writeln!(out, "<td>{:.1}%</td></tr>", percent(lane.cpu, drawn));
    }
    out.push_str(
        "</table>\n<p>running, waiting for GVL, blocked and gc are the lanes' colors: \
                  each is the share of the thread's drawn time in that state (running: it held \
                  the GVL). on a CPU is its cpu-time in that time: a thread that holds the GVL \
                  can be kept off a CPU by the kernel, on a loaded machine.",
    );
    if times.values().any(|t| t.waiting_ns.is_none()) {
        out.push_str(
            " This profile has no gvl-wait-time (Ruby 3.1 has no GVL events): waiting for GVL \
             is what the threads' status said at each pass, not a measure.",
        );
    }
    out.push_str("</p>\n</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::super::reader::{Budget, ReadLimits, ResolvedFunction};
    use super::*;

    fn str_label(key: &str, value: &str) -> (String, ResolvedLabelValue) {
        (key.to_string(), ResolvedLabelValue::Str(value.to_string()))
    }

    /// Value types cpu-time, wall-time, gvl-wait-time; functions main (0), spin (1), sleep (2);
    /// samples `(frames leaf first, [cpu, wall, gvl], thread id, state, end)`.
    /// `(frames leaf first, [cpu, wall, gvl], thread id, state, end)`.
    type Sample<'a> = (&'a [usize], [i64; 3], &'a str, Option<&'a str>, Option<i64>);

    fn profile(samples: &[Sample]) -> StackProfile {
        StackProfile {
            value_types: ["cpu-time", "wall-time", "gvl-wait-time"]
                .iter()
                .map(|t| (t.to_string(), "nanoseconds".to_string()))
                .collect(),
            time_nanos: 0,
            duration_nanos: 1,
            comments: Vec::new(),
            filtered: None,
            functions: ["main", "spin", "sleep"]
                .iter()
                .map(|n| ResolvedFunction { name: n.to_string(), filename: "a.rb".to_string() })
                .collect(),
            samples: samples
                .iter()
                .map(|(frames, values, tid, state, end)| {
                    let mut labels = vec![
                        str_label(THREAD_ID_LABEL, tid),
                        str_label(THREAD_NAME_LABEL, &format!("t{tid}")),
                    ];
                    if let Some(state) = state {
                        labels.push(str_label(THREAD_STATE_LABEL, state));
                        if *state == "gc" {
                            labels.push(str_label(GC_KIND_LABEL, "minor"));
                        }
                    }
                    if let Some(end) = end {
                        labels
                            .push((END_TIMESTAMP_LABEL.to_string(), ResolvedLabelValue::Num(*end)));
                    }
                    StackSample { frames: frames.to_vec(), values: values.to_vec(), labels }
                })
                .collect(),
            output_budget: Budget::output(&ReadLimits::default(), 0),
        }
    }

    fn busy_and_sleeper() -> StackProfile {
        profile(&[
            (&[1, 0], [10, 10, 0], "1", Some("running"), Some(1_010)),
            (&[1, 0], [0, 30, 28], "1", Some("waiting for GVL"), Some(1_040)),
            (&[1, 0], [5, 5, 0], "1", Some("gc"), Some(1_045)),
            (&[1, 0], [2, 0, 2], "1", None, None), // carried at the window's end: no time
            (&[2, 0], [1, 50, 0], "2", Some("blocked"), Some(1_050)),
        ])
    }

    #[test]
    fn shares_come_from_the_values() {
        let times = busy_and_sleeper().thread_times();
        assert_eq!(times.len(), 2);
        // The longest first: the sleeper's 50 ns, then the busy thread's 45.
        let (sleeper, busy) = (&times[0], &times[1]);
        assert_eq!((busy.thread_id.as_str(), busy.name.as_str()), ("1", "t1"));
        assert_eq!(busy.wall_ns, 45);
        // running: cpu outside the GC (10 + 0 + 2); waiting: gvl (28 + 2); gc: its wall (5).
        assert_eq!(
            (busy.running_ns, busy.waiting_ns, busy.gc_ns, busy.blocked_ns),
            (12, Some(30), 5, 0)
        );
        assert_eq!((sleeper.running_ns, sleeper.waiting_ns, sleeper.blocked_ns), (1, Some(0), 49));
        assert_eq!(sleeper.shares(), "running 2.0%, waiting for GVL 0.0%, blocked 98.0%, gc 0.0%");
    }

    #[test]
    fn without_gvl_wait_time_the_waits_are_in_blocked() {
        let mut p = busy_and_sleeper();
        p.value_types.truncate(2);
        p.samples.iter_mut().for_each(|s| s.values.truncate(2));
        let busy = &p.thread_times()[1];
        assert_eq!(busy.waiting_ns, None);
        assert_eq!(busy.blocked_ns, 45 - 12 - 5);
        assert_eq!(busy.shares(), "running 26.7%, blocked or waiting 62.2%, gc 11.1%");
    }

    #[test]
    fn the_timeline_draws_a_lane_per_thread_and_a_span_per_state_run() {
        let p = busy_and_sleeper();
        let svg = p.timeline(TimelineFormat::Svg, "x").unwrap();
        assert!(svg.starts_with("<?xml"));
        assert_eq!(svg.matches("<rect x=").count() - 4, 4, "4 legend boxes, 4 dated samples");
        assert!(svg.contains("t1 (1): waiting for GVL"), "{svg}");
        assert!(svg.contains("gvl-wait-time 0.000 ms"));
        assert!(svg.contains("\n  spin\n  main"), "the stack, leaf first");
        // The lane's hover: its drawn time by state (10, 30, 0 and 5 ns of 45), and its cpu.
        assert!(
            svg.contains(
                "running 22.2%, waiting for GVL 66.7%, blocked 0.0%, gc 11.1%; on a CPU 33.3%"
            ),
            "{svg}"
        );
        // Two adjacent samples with the same state and stack are one span.
        let mut q = busy_and_sleeper();
        q.samples[1].labels[2] = str_label(THREAD_STATE_LABEL, "running");
        q.samples[1].values[2] = 0;
        let svg = q.timeline(TimelineFormat::Svg, "x").unwrap();
        assert_eq!(svg.matches("<rect x=").count() - 4, 3);
    }

    #[test]
    fn a_running_span_that_waited_for_the_gvl_is_drawn_waiting_then_running() {
        let p = profile(&[(&[1, 0], [4, 10, 6], "1", Some("running"), Some(1_010))]);
        let svg = p.timeline(TimelineFormat::Svg, "x").unwrap();
        let fills: Vec<&str> =
            svg.match_indices("<rect x=").skip(4).map(|(i, _)| &svg[i..i + 120]).collect();
        assert_eq!(fills.len(), 2, "{svg}");
        assert!(
            fills[0].contains(ThreadState::Waiting.color())
                && fills[1].contains(ThreadState::Running.color())
        );
    }

    #[test]
    fn the_page_has_the_svg_and_a_table_of_shares() {
        let html = busy_and_sleeper().timeline(TimelineFormat::Html, "a <b>").unwrap();
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<title>a &lt;b&gt;</title>"));
        assert!(html.contains("<svg "));
        assert!(
            html.contains(
                "<th>running</th><th>waiting for GVL</th><th>blocked</th><th>gc</th><th>on a CPU</th>"
            ),
            "{html}"
        );
        assert!(
            html.contains(
                "<td>t2 (2)</td><td>0.000 ms</td><td>0.0%</td><td>0.0%</td><td>100.0%</td>\
                 <td>0.0%</td><td>2.0%</td>"
            ),
            "{html}"
        );
    }

    /// Ruby 3.1's case: no gvl-wait-time, and threads whose passes said "waiting for GVL".
    /// The table said "blocked 92-93%" while the lanes were mostly red: now the lane's hover
    /// and its row say the same numbers under the same words.
    #[test]
    fn the_page_tells_one_story_without_gvl_wait_time() {
        let mut p = profile(&[
            (&[1, 0], [8, 10, 0], "1", Some("running"), Some(1_010)),
            (&[1, 0], [1, 80, 0], "1", Some("waiting for GVL"), Some(1_090)),
            (&[1, 0], [0, 10, 0], "1", Some("blocked"), Some(1_100)),
        ]);
        p.value_types.truncate(2);
        p.samples.iter_mut().for_each(|s| s.values.truncate(2));
        let html = p.timeline(TimelineFormat::Html, "x").unwrap();
        let shares = "running 10.0%, waiting for GVL 80.0%, blocked 10.0%, gc 0.0%; on a CPU 9.0%";
        assert!(html.contains(&format!("t1 (1)\n{shares}</title>")), "{html}");
        assert!(
            html.contains(
                "<td>t1 (1)</td><td>0.000 ms</td><td>10.0%</td><td>80.0%</td><td>10.0%</td>\
                 <td>0.0%</td><td>9.0%</td>"
            ),
            "{html}"
        );
        assert!(html.contains("not a measure"), "{html}");
        assert!(!html.contains("blocked or waiting"), "{html}");
    }

    #[test]
    fn no_dated_sample_is_an_error() {
        let p = profile(&[(&[1, 0], [10, 10, 0], "1", None, None)]);
        let e = p.timeline(TimelineFormat::Svg, "x").unwrap_err();
        assert!(matches!(e, ViewError::NoTimeline), "{e}");
        assert!(e.to_string().contains("--timeline"), "{e}");
    }

    #[test]
    fn any_times_and_values_draw_without_a_panic() {
        let p = profile(&[
            (&[1, 0], [i64::MAX, i64::MAX, i64::MAX], "1", Some("running"), Some(i64::MIN)),
            (&[1, 0], [-5, -5, -5], "1", Some("bogus"), Some(i64::MAX)),
            (&[], [0, 0, 0], "2", None, Some(0)),
        ]);
        for format in [TimelineFormat::Svg, TimelineFormat::Html] {
            assert!(p.timeline(format, "x").is_ok());
        }
        // No cpu-time: nothing runs, the rest is drawn.
        let mut q = busy_and_sleeper();
        q.value_types[0].0 = "other".to_string();
        assert!(q.thread_times().iter().all(|t| t.running_ns == 0));
        assert!(q.timeline(TimelineFormat::Svg, "x").is_ok());
    }

    #[test]
    fn ticks_have_the_decimals_of_their_step() {
        assert_eq!(tick(2e9, 1e9), "2 s");
        assert_eq!(tick(1.5e9, 5e8), "1500 ms");
        assert_eq!(tick(4e8, 2e8), "400 ms");
        assert_eq!(tick(15.0, 5.0), "0.000015 ms");
        assert_eq!(tick(2.5e6, 5e5), "2.5 ms");
    }

    #[test]
    fn the_axis_has_round_ticks() {
        let svg = busy_and_sleeper().timeline(TimelineFormat::Svg, "x").unwrap();
        // The spans run from 1,000 to 1,050 ns: ticks every 5 ns.
        assert_eq!(svg.matches("stroke=\"#e0e0e0\"").count(), 11);
    }
}
