//! A profile as a speedscope file: what the `ddprof-recorder speedscope` command and
//! `DdprofRecorder.speedscope` write.
//!
//! [speedscope](https://www.speedscope.app) is a flame graph viewer that many Ruby people
//! open profiles in (stackprof and rbspy both write its format). Its file format is JSON
//! (the schema: `file-format-schema.json` of the `speedscope` npm package, which the test
//! suite validates our output against): frames are listed once in `shared.frames`, and each
//! profile of the file refers to them by index. We write *sampled* profiles: a list of
//! stacks, root first, with one weight each.
//!
//! A pprof has no time order: its samples are aggregated by stack. So each distinct stack is
//! one speedscope sample, weighted by its value, and the samples are sorted by their frames'
//! names, root first. speedscope's "Time Order" view then reads like a flame graph (stacks
//! that share a prefix are side by side), and "Left Heavy" and "Sandwich" are what they
//! always are.
//!
//! One file holds one profile per value type asked for (`cpu-time`, `wall-time`, ...), in
//! that order; with [`SpeedscopeOptions::group_by`], one per value type and value of a label
//! (one per thread with `"thread name"`), the heaviest first. speedscope opens the first one
//! and lists the others in its profile menu.
//!
//! A profile whose samples carry their time (the profiler's timeline option) can also be
//! written as a timeline ([`StackProfile::speedscope_timeline`]): one profile per thread, its
//! dated samples in time order, each weighted by its wall time, so that speedscope's "Time
//! Order" view shows what the thread did when. Each stack's root is the thread's state then
//! (`[running]`, `[waiting for GVL]`, `[blocked]`, `[gc]`): the first row of the view is a lane
//! of states, as in `ddprof-recorder timeline`.
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::folded::group_name;
use super::reader::{StackProfile, NO_STACK};
use super::timeline::{state_of, ThreadState};
use super::ViewError;

/// The `$schema` that speedscope checks to recognize its own format.
const SCHEMA: &str = "https://www.speedscope.app/file-format-schema.json";

/// How [`StackProfile::speedscope`] writes the file.
#[derive(Debug, Clone, Default)]
pub struct SpeedscopeOptions {
    /// The file's name (speedscope's title bar), e.g. the pprof's file name.
    pub name: String,
    /// Who wrote the file: the format's `exporter`, e.g. `"ddprof_recorder 0.1.0"`.
    pub exporter: String,
    /// One profile per value of this label (e.g. `"thread name"`) rather than one for all
    /// samples, named `value type, key=value`; the samples without the label go to the
    /// profile of `value type, (no key)`.
    pub group_by: Option<String>,
}

/// Stacks as function indices, root first (`None`: the [`NO_STACK`] frame), with their
/// summed weights.
type Stacks = BTreeMap<Vec<Option<usize>>, i64>;

/// A frame of the document's `shared.frames`.
enum SharedFrame {
    /// A timeline's root frame: the thread's state, `[running]` etc.
    State(ThreadState),
    /// A function of the profile (`None`: the [`NO_STACK`] frame), with its file.
    Function(Option<usize>),
}

/// One speedscope profile before it is written: its value type, its label value, its stacks.
struct Part {
    value: usize,
    group: Option<String>,
    total: i64,
    stacks: Stacks,
}

impl StackProfile {
    /// The speedscope JSON of the value types `values` (indices into
    /// [`StackProfile::value_types`], one profile each, or one per label value with
    /// [`SpeedscopeOptions::group_by`]). Stacks whose value is 0 are left out, and so are
    /// negative values, which speedscope cannot lay out; so is a profile left without stacks.
    ///
    /// Fails with [`ViewError::NothingToDraw`] if no profile is left ([`ViewError::NoMatch`]
    /// if [`Self::keep_labels`] left no sample), and with [`ViewError::UnknownLabel`] if no
    /// sample has the [`SpeedscopeOptions::group_by`] label; with [`ViewError::OutputTooLarge`]
    /// if the file would be more than the output bound.
    pub fn speedscope(
        &self,
        values: &[usize],
        options: &SpeedscopeOptions,
    ) -> Result<String, ViewError> {
        if let Some(key) = &options.group_by {
            self.require_label(key)?;
        }
        let parts = self.parts(values, options.group_by.as_deref());
        if parts.is_empty() {
            let names: Vec<&str> = values.iter().map(|&v| self.value_types[v].0.as_str()).collect();
            return Err(self.nothing_left(ViewError::NothingToDraw(names.join(" or "))));
        }

        // The frames that some stack uses, numbered in the order of their names (then files),
        // so that sorting stacks by frame index sorts them by name.
        let mut used: Vec<Option<usize>> = parts
            .iter()
            .flat_map(|p| p.stacks.keys().flatten().copied())
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .collect();
        used.sort_by(|&a, &b| self.frame_sort_key(a).cmp(&self.frame_sort_key(b)));
        let frame_index: HashMap<Option<usize>, usize> =
            used.iter().enumerate().map(|(i, &f)| (f, i)).collect();

        let frames = used.iter().map(|&f| SharedFrame::Function(f));
        self.write_document(options, frames, |out| {
            for (i, part) in parts.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                self.write_profile(out, part, options.group_by.as_deref(), &frame_index)?;
            }
            Ok(())
        })
    }

    /// The speedscope JSON of the dated samples, one `wall-time` profile per thread (the one
    /// with the most CPU first), in time order, each stack under a root frame naming the thread's state
    /// (see the module doc). Its profiles' names say the thread's shares of wall time.
    ///
    /// Fails with [`ViewError::NoTimeline`] if no sample has a time ([`ViewError::NoMatch`] if
    /// [`Self::keep_labels`] left no sample), and with [`ViewError::OutputTooLarge`] as
    /// [`Self::speedscope`].
    pub fn speedscope_timeline(&self, options: &SpeedscopeOptions) -> Result<String, ViewError> {
        let wall = self.value_index("wall-time")?;
        let lanes = self.dated_lanes();
        if lanes.is_empty() {
            return Err(self.nothing_left(ViewError::NoTimeline));
        }
        // The thread that ran most first: speedscope opens it.
        let mut times = self.thread_times();
        times.sort_by(|a, b| b.running_ns.cmp(&a.running_ns).then(b.wall_ns.cmp(&a.wall_ns)));
        // Frames: the states, then the functions some dated sample has, by name.
        let mut used: Vec<Option<usize>> = lanes
            .values()
            .flat_map(|samples| samples.iter().flat_map(|(_, s)| s.frames.iter().map(|&f| Some(f))))
            .chain(lanes.values().flatten().filter(|(_, s)| s.frames.is_empty()).map(|_| None))
            .collect::<std::collections::HashSet<_>>()
            .into_iter()
            .collect();
        used.sort_by(|&a, &b| self.frame_sort_key(a).cmp(&self.frame_sort_key(b)));
        let states = ThreadState::ALL.len();
        let frame_index: HashMap<Option<usize>, usize> =
            used.iter().enumerate().map(|(i, &f)| (f, i + states)).collect();

        let frames = ThreadState::ALL
            .iter()
            .map(|&state| SharedFrame::State(state))
            .chain(used.iter().map(|&f| SharedFrame::Function(f)));
        self.write_document(options, frames, |out| {
            let mut first = true;
            for t in &times {
                let Some(samples) = lanes.get(&(t.process.clone(), t.thread_id.clone())) else {
                    continue;
                };
                let weighted: Vec<_> = samples.iter().filter(|(_, s)| s.values[wall] > 0).collect();
                if weighted.is_empty() {
                    continue;
                }
                if !first {
                    out.push(',');
                }
                first = false;
                let total =
                    weighted.iter().fold(0i64, |a, (_, s)| a.saturating_add(s.values[wall]));
                out.push_str("{\"type\":\"sampled\",\"name\":");
                json_string(out, &format!("{}: {}", t.title(), t.shares()));
                let _ = write!(
                    out,
                    ",\"unit\":\"nanoseconds\",\"startValue\":0,\"endValue\":{total},\"samples\":["
                );
                for (i, (_, s)) in weighted.iter().enumerate() {
                    let state =
                        ThreadState::ALL.iter().position(|&x| x == state_of(s)).unwrap_or(0);
                    let _ = write!(out, "{}[{state}", if i > 0 { "," } else { "" });
                    if s.frames.is_empty() {
                        let _ = write!(out, ",{}", frame_index[&None]);
                    }
                    for &f in s.frames.iter().rev() {
                        let _ = write!(out, ",{}", frame_index[&Some(f)]);
                    }
                    out.push(']');
                    self.output_budget.check_usize(out.len(), SPEEDSCOPE)?;
                }
                out.push_str("],\"weights\":[");
                for (i, (_, s)) in weighted.iter().enumerate() {
                    let _ = write!(out, "{}{}", if i > 0 { "," } else { "" }, s.values[wall]);
                }
                out.push_str("]}");
            }
            if first {
                return Err(ViewError::NothingToDraw("wall-time".to_string()));
            }
            Ok(())
        })
    }

    /// The speedscope document around its profiles, what [`StackProfile::speedscope`] and
    /// [`StackProfile::speedscope_timeline`] both write: the `$schema`, `shared.frames` (one
    /// `{"name": ...}` object per frame of `frames`, in order: the profiles' samples refer to
    /// them by index), the `profiles` that `write_profiles` appends (comma-separated by it),
    /// then the file's `name`, `activeProfileIndex` 0 and `exporter`. An error of
    /// `write_profiles` is the document's.
    fn write_document(
        &self,
        options: &SpeedscopeOptions,
        frames: impl IntoIterator<Item = SharedFrame>,
        write_profiles: impl FnOnce(&mut String) -> Result<(), ViewError>,
    ) -> Result<String, ViewError> {
        let mut out = String::with_capacity(4096);
        out.push_str("{\"$schema\":");
        json_string(&mut out, SCHEMA);
        out.push_str(",\"shared\":{\"frames\":[");
        for (i, frame) in frames.into_iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str("{\"name\":");
            match frame {
                SharedFrame::State(state) => json_string(&mut out, &format!("[{}]", state.name())),
                SharedFrame::Function(f) => self.write_frame(&mut out, f),
            }
            out.push('}');
            self.output_budget.check_usize(out.len(), SPEEDSCOPE)?;
        }
        out.push_str("]},\"profiles\":[");
        write_profiles(&mut out)?;
        out.push_str("],\"name\":");
        json_string(&mut out, &options.name);
        out.push_str(",\"activeProfileIndex\":0,\"exporter\":");
        json_string(&mut out, &options.exporter);
        out.push('}');
        Ok(out)
    }

    /// A frame's `name` (and `file`) members.
    fn write_frame(&self, out: &mut String, frame: Option<usize>) {
        match frame {
            Some(f) => {
                json_string(out, self.display_name(f));
                let file = &self.functions[f].filename;
                if !file.is_empty() && !self.functions[f].name.is_empty() {
                    out.push_str(",\"file\":");
                    json_string(out, file);
                }
            }
            None => json_string(out, NO_STACK),
        }
    }

    /// The non-empty profiles: per value in `values` order, per label value (heaviest first,
    /// then by name) when grouped.
    fn parts(&self, values: &[usize], group_by: Option<&str>) -> Vec<Part> {
        let mut parts = Vec::new();
        for &value in values {
            let mut groups: BTreeMap<Option<String>, Stacks> = BTreeMap::new();
            for s in &self.samples {
                let v = s.values[value];
                if v <= 0 {
                    continue;
                }
                let group = group_by.map(|key| group_name(key, &s.labels));
                let stack: Vec<Option<usize>> = if s.frames.is_empty() {
                    vec![None]
                } else {
                    s.frames.iter().rev().map(|&f| Some(f)).collect()
                };
                let sum = groups.entry(group).or_default().entry(stack).or_insert(0);
                *sum = sum.saturating_add(v);
            }
            let mut value_parts: Vec<Part> = groups
                .into_iter()
                .map(|(group, stacks)| Part {
                    value,
                    group,
                    total: stacks.values().fold(0i64, |a, &v| a.saturating_add(v)),
                    stacks,
                })
                .collect();
            // Stable: equal totals keep the label values' order.
            value_parts.sort_by_key(|p| std::cmp::Reverse(p.total));
            parts.extend(value_parts);
        }
        parts
    }

    fn frame_sort_key(&self, frame: Option<usize>) -> (&str, &str) {
        match frame {
            Some(f) => (self.display_name(f), &self.functions[f].filename),
            None => (NO_STACK, ""),
        }
    }

    fn write_profile(
        &self,
        out: &mut String,
        part: &Part,
        group_by: Option<&str>,
        frame_index: &HashMap<Option<usize>, usize>,
    ) -> Result<(), ViewError> {
        let (value_name, unit) = &self.value_types[part.value];
        let name = match (group_by, &part.group) {
            (Some(_), Some(group)) => format!("{value_name}, {group}"),
            _ => value_name.clone(),
        };
        let mut stacks: Vec<(Vec<usize>, i64)> = part
            .stacks
            .iter()
            .map(|(stack, &w)| (stack.iter().map(|f| frame_index[f]).collect(), w))
            .collect();
        stacks.sort_unstable();

        out.push_str("{\"type\":\"sampled\",\"name\":");
        json_string(out, &name);
        out.push_str(",\"unit\":");
        json_string(out, speedscope_unit(unit));
        let _ = write!(out, ",\"startValue\":0,\"endValue\":{},\"samples\":[", part.total);
        for (i, (stack, _)) in stacks.iter().enumerate() {
            out.push_str(if i > 0 { ",[" } else { "[" });
            for (j, f) in stack.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{f}");
            }
            out.push(']');
            self.output_budget.check_usize(out.len(), SPEEDSCOPE)?;
        }
        out.push_str("],\"weights\":[");
        for (i, (_, w)) in stacks.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{w}");
        }
        out.push_str("]}");
        Ok(())
    }
}

/// What a speedscope file over its output bound is called in the error: the file is checked
/// as it is written, after each frame and each stack.
const SPEEDSCOPE: &str = "the speedscope file";

/// speedscope's name for a pprof unit: the units it knows, else `none` (pprof's `count`).
fn speedscope_unit(unit: &str) -> &'static str {
    match unit {
        "nanoseconds" => "nanoseconds",
        "microseconds" => "microseconds",
        "milliseconds" => "milliseconds",
        "seconds" => "seconds",
        "bytes" => "bytes",
        _ => "none",
    }
}

/// Appends `s` as a JSON string: quotes, backslashes and control characters escaped (RFC 8259
/// section 7); everything else, non-ASCII included, as it is (the output is UTF-8).
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::super::reader::{
        Budget, ReadLimits, ResolvedFunction, ResolvedLabelValue, StackSample,
    };
    use super::*;
    use serde_json::{json, Value};

    fn label(key: &str, value: &str) -> (String, ResolvedLabelValue) {
        (key.to_string(), ResolvedLabelValue::Str(value.to_string()))
    }

    /// Functions main (0), work (1), spin (2), sleep (3) in a.rb; samples `(frames leaf
    /// first, [cpu-time, cpu-samples], thread name)`.
    fn profile(samples: &[(&[usize], [i64; 2], &str)]) -> StackProfile {
        let functions = ["main", "work", "spin", "sleep"]
            .iter()
            .map(|n| ResolvedFunction { name: n.to_string(), filename: "a.rb".to_string() })
            .collect();
        StackProfile {
            value_types: vec![
                ("cpu-time".to_string(), "nanoseconds".to_string()),
                ("cpu-samples".to_string(), "count".to_string()),
            ],
            time_nanos: 1,
            duration_nanos: 2,
            comments: Vec::new(),
            filtered: None,
            functions,
            samples: samples
                .iter()
                .map(|(frames, values, thread)| StackSample {
                    frames: frames.to_vec(),
                    values: values.to_vec(),
                    labels: vec![label("thread name", thread)],
                })
                .collect(),
            output_budget: Budget::output(&ReadLimits::default(), 0),
        }
    }

    fn options(group_by: Option<&str>) -> SpeedscopeOptions {
        SpeedscopeOptions {
            name: "x.pb.gz".to_string(),
            exporter: "ddprof_recorder test".to_string(),
            group_by: group_by.map(str::to_string),
        }
    }

    /// A parsed profile: name, unit, and its stacks as frame names with their weights.
    type Parsed = (String, String, Vec<(Vec<String>, i64)>);

    /// The output, parsed by serde_json (not by us), with each profile's samples written as
    /// frame names and paired with their weights.
    fn parse(json: &str) -> (Value, Vec<Parsed>) {
        let v: Value = serde_json::from_str(json).expect("valid JSON");
        let frames: Vec<String> = v["shared"]["frames"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_string())
            .collect();
        let profiles = v["profiles"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                let samples = p["samples"].as_array().unwrap();
                let weights = p["weights"].as_array().unwrap();
                assert_eq!(samples.len(), weights.len());
                let stacks = samples
                    .iter()
                    .zip(weights)
                    .map(|(s, w)| {
                        let names = s
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|i| frames[i.as_u64().unwrap() as usize].clone())
                            .collect();
                        (names, w.as_i64().unwrap())
                    })
                    .collect::<Vec<_>>();
                let total: i64 = stacks.iter().map(|(_, w)| w).sum();
                assert_eq!(p["startValue"], json!(0));
                assert_eq!(p["endValue"], json!(total));
                assert_eq!(p["type"], json!("sampled"));
                (
                    p["name"].as_str().unwrap().to_string(),
                    p["unit"].as_str().unwrap().to_string(),
                    stacks,
                )
            })
            .collect();
        (v, profiles)
    }

    fn names(stack: &[&str]) -> Vec<String> {
        stack.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn one_sampled_profile_per_value_with_root_first_stacks_sorted_by_name() {
        let p = profile(&[
            (&[2, 1, 0], [700, 7], "worker"),
            (&[1, 0], [100, 1], "worker"),
            (&[2, 1, 0], [50, 1], "other"), // same stack, other thread: added up
            (&[3, 0], [0, 9], "sleeper"),   // no cpu-time: not in that profile
        ]);
        let (v, profiles) = parse(&p.speedscope(&[0, 1], &options(None)).unwrap());
        assert_eq!(v["$schema"], json!(SCHEMA));
        assert_eq!(v["name"], json!("x.pb.gz"));
        assert_eq!(v["exporter"], json!("ddprof_recorder test"));
        assert_eq!(v["activeProfileIndex"], json!(0));
        assert_eq!(
            profiles,
            [
                (
                    "cpu-time".to_string(),
                    "nanoseconds".to_string(),
                    vec![(names(&["main", "work"]), 100), (names(&["main", "work", "spin"]), 750)]
                ),
                (
                    "cpu-samples".to_string(),
                    "none".to_string(),
                    vec![
                        (names(&["main", "sleep"]), 9),
                        (names(&["main", "work"]), 1),
                        (names(&["main", "work", "spin"]), 8)
                    ]
                ),
            ]
        );
        // Frames are listed once, sorted by name, with their file.
        assert_eq!(
            v["shared"]["frames"],
            json!([
                {"name": "main", "file": "a.rb"},
                {"name": "sleep", "file": "a.rb"},
                {"name": "spin", "file": "a.rb"},
                {"name": "work", "file": "a.rb"}
            ])
        );
    }

    #[test]
    fn grouped_by_a_label_one_profile_per_value_heaviest_first() {
        let mut p = profile(&[
            (&[2, 1, 0], [700, 7], "worker"),
            (&[1, 0], [100, 1], "other"),
            (&[3, 0], [0, 9], "sleeper"),
        ]);
        p.samples.push(StackSample { frames: vec![], values: vec![5, 1], labels: vec![] });
        let (_, profiles) = parse(&p.speedscope(&[0, 1], &options(Some("thread name"))).unwrap());
        let summary: Vec<(&str, i64)> = profiles
            .iter()
            .map(|(name, _, stacks)| (name.as_str(), stacks.iter().map(|s| s.1).sum()))
            .collect();
        assert_eq!(
            summary,
            [
                ("cpu-time, thread name=worker", 700),
                ("cpu-time, thread name=other", 100),
                ("cpu-time, (no thread name)", 5),
                ("cpu-samples, thread name=sleeper", 9),
                ("cpu-samples, thread name=worker", 7),
                ("cpu-samples, (no thread name)", 1),
                ("cpu-samples, thread name=other", 1),
            ]
        );
        assert_eq!(profiles[2].2, [(names(&["(no stack)"]), 5)]);
    }

    #[test]
    fn names_are_escaped_and_placeholders_named() {
        let mut p = profile(&[(&[2, 1, 0], [3, 1], "t")]);
        p.functions[0].name = "quote \" back \\ nl \n tab \t bell \u{7} é <main>".to_string();
        p.functions[1].name = String::new(); // "N frames omitted": only a file
        p.functions[1].filename = "12 frames omitted".to_string();
        p.functions[2] = ResolvedFunction { name: String::new(), filename: String::new() };
        let json = p.speedscope(&[0], &options(None)).unwrap();
        assert!(json.contains(r#"quote \" back \\ nl \n tab \t bell \u0007 é <main>"#), "{json}");
        let (_, profiles) = parse(&json);
        assert_eq!(
            profiles[0].2,
            [(
                names(&[
                    "quote \" back \\ nl \n tab \t bell \u{7} é <main>",
                    "12 frames omitted",
                    "(unknown)"
                ]),
                3
            )]
        );
    }

    #[test]
    fn a_value_with_nothing_is_left_out_and_nothing_at_all_is_an_error() {
        let p = profile(&[(&[3, 0], [0, 4], "t"), (&[1, 0], [-5, 0], "t")]);
        let (_, profiles) = parse(&p.speedscope(&[0, 1], &options(None)).unwrap());
        assert_eq!(profiles.len(), 1);
        assert_eq!(profiles[0].0, "cpu-samples");
        let e = p.speedscope(&[0], &options(None)).unwrap_err();
        assert_eq!(e.to_string(), "nothing to draw: no sample has a non-zero cpu-time");
    }

    #[test]
    fn the_timeline_is_one_profile_per_thread_in_time_order_under_its_states() {
        let mut p = profile(&[
            (&[2, 1, 0], [7, 10], "worker"),
            (&[3, 0], [0, 30], "worker"),
            (&[2, 1, 0], [5, 20], "worker"),
            (&[2, 1, 0], [1, 1], "worker"), // carried, no time: not in the timeline
        ]);
        p.value_types[1].0 = "wall-time".to_string();
        for (s, (end, state)) in
            p.samples.iter_mut().zip([(300, "running"), (330, "blocked"), (120, "waiting for GVL")])
        {
            s.labels.push(label("thread id", "7"));
            s.labels.push(label("thread state", state));
            s.labels.push(("end_timestamp_ns".to_string(), ResolvedLabelValue::Num(end)));
        }
        p.samples[3].labels.push(label("thread id", "7"));
        let (v, profiles) = parse(&p.speedscope_timeline(&options(None)).unwrap());
        assert_eq!(v["shared"]["frames"][1], json!({"name": "[waiting for GVL]"}));
        assert_eq!(profiles.len(), 1);
        let (name, unit, stacks) = &profiles[0];
        assert_eq!(name, "worker (7): running 21.3%, blocked or waiting 78.7%, gc 0.0%");
        assert_eq!(unit, "nanoseconds");
        assert_eq!(
            stacks,
            &[
                (names(&["[waiting for GVL]", "main", "work", "spin"]), 20),
                (names(&["[running]", "main", "work", "spin"]), 10),
                (names(&["[blocked]", "main", "sleep"]), 30),
            ]
        );
        let mut undated = p.clone();
        undated.samples.iter_mut().for_each(|s| s.labels.retain(|(k, _)| k != "end_timestamp_ns"));
        assert!(matches!(undated.speedscope_timeline(&options(None)), Err(ViewError::NoTimeline)));
    }

    #[test]
    fn weights_are_summed_with_saturation() {
        let p = profile(&[(&[0], [i64::MAX, 1], "a"), (&[0], [i64::MAX, 1], "b")]);
        let (_, profiles) = parse(&p.speedscope(&[0], &options(None)).unwrap());
        assert_eq!(profiles[0].2, [(names(&["main"]), i64::MAX)]);
    }
}
