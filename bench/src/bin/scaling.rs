//! `bench/run scaling [--reps N]`: add cost and serialize time on the small, medium and large
//! workloads (the large one must serialize: there is no output cap), and a plot of both
//! against distinct stacks (`--svg PATH`, written by `bench/run` to `bench/scaling.svg`).
use std::path::PathBuf;

use ddprof_recorder_bench::alloc::CountingAlloc;
use ddprof_recorder_bench::core_bench::{self, CoreResult};
use ddprof_recorder_bench::stats::{median, min};
use ddprof_recorder_bench::workload::Workload;
use ddprof_recorder_bench::{exit_on_error, take_option, take_reps};
use plotters::prelude::*;
use serde_json::json;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn main() {
    exit_on_error(run());
}

fn run() -> Result<(), String> {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let reps = take_reps(&mut args, 3)?;
    let svg = take_option(&mut args, "--svg")?.map(PathBuf::from);
    if let Some(json) = take_option(&mut args, "--replot")? {
        // Redraws the plot from the JSON line of an earlier run, without measuring again.
        let svg = svg.ok_or("--replot needs --svg PATH")?;
        return replot(&PathBuf::from(json), &svg);
    }
    if args.is_empty() {
        return Err("usage: scaling [--reps N] [--svg PATH] WORKLOAD.json...".into());
    }
    let mut results = Vec::new();
    for path in &args {
        // One workload in memory at a time: the large one alone is a few hundred MB.
        let w = Workload::load(&PathBuf::from(path))?;
        eprintln!("loaded {path}: {} samples; {reps} reps", w.samples.len());
        results.push(core_bench::run(&w, reps, false)?);
    }
    results.sort_by_key(|r| r.distinct_stacks);

    println!("scaling: {reps} reps per workload (two fills each), min / median");
    println!(
        "{:<8} {:>10} {:>9} {:>10} {:>15} {:>15} {:>17} {:>17} {:>10} {:>10}",
        "workload",
        "samples",
        "stacks",
        "out",
        "add ns/sample",
        "floor ns/sample",
        "serialize raw ms",
        "serialize gzip ms",
        "raw MB",
        "peak MB"
    );
    for r in &results {
        println!(
            "{:<8} {:>10} {:>9} {:>10} {:>15} {:>15} {:>17} {:>17} {:>10.1} {:>10.1}",
            r.workload,
            r.samples_in,
            r.distinct_stacks,
            r.samples_out,
            format!("{:.0} / {:.0}", min(&r.add_ns), median(&r.add_ns)),
            format!("{:.0} / {:.0}", min(&r.floor_ns), median(&r.floor_ns)),
            format!("{:.1} / {:.1}", min(&r.raw_ms), median(&r.raw_ms)),
            format!("{:.1} / {:.1}", min(&r.gzip_ms), median(&r.gzip_ms)),
            r.raw_bytes as f64 / 1e6,
            r.peak_heap_raw as f64 / 1e6,
        );
    }
    if let Some(svg) = &svg {
        plot(svg, &results).map_err(|e| format!("plotting {}: {e}", svg.display()))?;
        println!("plot: {}", svg.display());
    }
    let json = json!({
        "benchmark": "scaling",
        "reps": reps,
        "plot": svg.map(|p| p.display().to_string()),
        "workloads": results.iter().map(CoreResult::to_json).collect::<Vec<_>>(),
    });
    println!("{json}");
    Ok(())
}

fn replot(json: &std::path::Path, svg: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let last = text.lines().rev().find(|l| l.starts_with('{')).ok_or("no JSON line")?;
    let value: serde_json::Value = serde_json::from_str(last).map_err(|e| e.to_string())?;
    let workloads = value["workloads"].as_array().ok_or("no \"workloads\" in the JSON line")?;
    let f = |w: &serde_json::Value, key: &str| w[key].as_f64().unwrap_or(f64::NAN);
    let results: Vec<CoreResult> = workloads
        .iter()
        .map(|w| CoreResult {
            workload: w["workload"].as_str().unwrap_or("").to_string(),
            distinct_stacks: f(w, "distinct_stacks") as usize,
            add_ns: vec![f(w, "add_ns_per_sample_median")],
            floor_ns: vec![f(w, "floor_ns_per_sample_median")],
            raw_ms: vec![f(w, "serialize_raw_ms_median")],
            gzip_ms: vec![f(w, "serialize_gzip_ms_median")],
            ..CoreResult::default()
        })
        .collect();
    plot(svg, &results).map_err(|e| format!("plotting {}: {e}", svg.display()))?;
    println!("plot: {}", svg.display());
    Ok(())
}

/// Two panels side by side, both against distinct stacks on a log axis: add ns/sample (core
/// and floor), and serialize ms (raw and gzip) on a log axis.
fn plot(path: &std::path::Path, results: &[CoreResult]) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1100, 460)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    let x_max = results.iter().map(|r| r.distinct_stacks).max().unwrap_or(1) as f64 * 2.0;
    let x_min = results.iter().map(|r| r.distinct_stacks).min().unwrap_or(1) as f64 / 2.0;

    let y_max =
        results.iter().flat_map(|r| [median(&r.add_ns), median(&r.floor_ns)]).fold(0.0, f64::max)
            * 1.3;
    let mut chart = ChartBuilder::on(&left)
        .caption("add cost (median)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min..x_max).log_scale(), 0.0..y_max)?;
    chart
        .configure_mesh()
        .x_desc("distinct stacks (log)")
        .y_desc("ns per sample")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    draw_lines(
        &mut chart,
        results,
        [
            ("core recorder", BLUE, |r| median(&r.add_ns)),
            ("floor (FxHash maps)", RED, |r| median(&r.floor_ns)),
        ],
    )?;

    let y_lo = results.iter().map(|r| median(&r.raw_ms)).fold(f64::INFINITY, f64::min) / 2.0;
    let y_hi = results.iter().map(|r| median(&r.gzip_ms)).fold(0.0, f64::max) * 2.0;
    let mut chart = ChartBuilder::on(&right)
        .caption("serialize time (median)", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((x_min..x_max).log_scale(), (y_lo..y_hi).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("distinct stacks (log)")
        .y_desc("ms (log)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    draw_lines(
        &mut chart,
        results,
        [("raw pprof", BLUE, |r| median(&r.raw_ms)), ("gzip pprof", GREEN, |r| median(&r.gzip_ms))],
    )?;
    root.present()?;
    Ok(())
}

/// A plotted series: its name, its color and the y of a result.
type Series<'n> = (&'n str, RGBColor, fn(&CoreResult) -> f64);

/// One line with points per series against distinct stacks, and the legend in the upper left.
fn draw_lines<'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<LogCoord<f64>, Y>>,
    results: &[CoreResult],
    series: [Series<'_>; 2],
) -> Result<(), Box<dyn std::error::Error>> {
    for (name, color, pick) in series {
        let points: Vec<(f64, f64)> =
            results.iter().map(|r| (r.distinct_stacks as f64, pick(r))).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 4, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
