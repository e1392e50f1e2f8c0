# frozen_string_literal: true

# How much DdprofRecorder::Profiler slows a program down: the CPU work of
# examples/hot_spot.rb (a "cruncher" thread doing a fixed number of HotSpot.work rounds while
# a "sleeper" thread sleeps and the main thread waits), timed without and with the profiler
# at --hz (default 99). Each run is a fresh `ruby` process; the two kinds alternate, so that
# a change in machine load hits both alike.
#
#   ruby bench/profiler_overhead.rb [--runs 7] [--hz 99] [--rounds 60] [--workload cpu|yielding]
#
# --workload cpu (default) is the example as it is: the cruncher never lets go of the GVL,
# so the sampler (a Ruby thread) gets it only at Ruby's 100 ms thread switches and samples
# about 10 times a second. --workload yielding does the same work in 1 ms slices with a
# Thread.pass between them, as a program doing I/O would, so that the sampler reaches the
# asked rate: it measures the cost of sampling at the full 99 Hz.
#
# Prints one line per run, a summary, and last one JSON line (machine-readable):
#   {"bench":"profiler_overhead","hz":99,"runs":7,"baseline_s":[...],"profiled_s":[...],
#    "median_ratio":1.004,"min_ratio":...,"cpu_ratio":...,"effective_hz":...,...}
# The ratio is profiled / baseline wall time of the work (1.03 = 3% slower); the profiled
# time includes starting the profiler, not serializing at stop (reported apart).
require "json"
require "optparse"
require "rbconfig"

ROOT = File.expand_path("..", __dir__)

options = { runs: 7, hz: 99, rounds: 60, workload: "cpu", child: nil }
OptionParser.new do |o|
  o.banner = "Usage: ruby bench/profiler_overhead.rb [--runs N] [--hz N] [--rounds N]"
  o.on("--runs N", Integer, "runs of each kind (default 7)") { |v| options[:runs] = v }
  o.on("--hz N", Integer, "profiler rate (default 99)") { |v| options[:hz] = v }
  o.on("--rounds N", Integer, "HotSpot.work(200_000) rounds per run (default 60, ~1-2 s)") { |v| options[:rounds] = v }
  o.on("--workload NAME", %w[cpu yielding], "cpu (default) or yielding, see above") { |v| options[:workload] = v }
  o.on("--child KIND", %w[baseline profiled], "(internal) run one measurement") { |v| options[:child] = v }
end.parse!

# One measurement, in this process: prints a JSON object.
def child(kind, hz, rounds, workload)
  require File.join(ROOT, "lib", "ddprof_recorder")
  require File.join(ROOT, "examples", "hot_spot")
  HotSpot.work(200_000) # warm up: method caches, the integer ops

  clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
  t0 = clock.call
  c0 = cpu.call
  profiler = DdprofRecorder::Profiler.new(hz: hz).start if kind == "profiled"
  sleeper = Thread.new { sleep } # until woken at the end, as the example's sleeper
  sleeper.name = "sleeper"
  cruncher =
    if workload == "yielding"
      Thread.new do
        (rounds * 10).times do
          HotSpot.work(20_000)
          Thread.pass
        end
        Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      end
    else
      Thread.new do
        rounds.times { HotSpot.work(200_000) }
        Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      end
    end
  cruncher.name = "cruncher"
  work_cpu = cruncher.value
  sleeper.wakeup
  sleeper.join
  elapsed = clock.call - t0
  cpu_used = cpu.call - c0

  result = { kind: kind, seconds: elapsed, cpu_seconds: cpu_used, work_cpu_seconds: work_cpu }
  if profiler
    stats = profiler.stats
    t1 = clock.call
    pprof = profiler.stop&.last
    result.merge!(stop_seconds: clock.call - t1, effective_hz: stats[:effective_hz], passes: stats[:passes],
                  samples: stats[:samples], sampler_cpu_seconds: (stats[:sampler_cpu_ns] || 0) / 1e9,
                  pprof_bytes: pprof&.bytesize)
  end
  puts JSON.generate(result)
end

def median(values)
  sorted = values.sort
  mid = sorted.size / 2
  sorted.size.odd? ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0
end

if options[:child]
  child(options[:child], options[:hz], options[:rounds], options[:workload])
  exit
end

runs = Hash.new { |h, k| h[k] = [] }
options[:runs].times do |i|
  # Alternate which kind goes first, so neither always runs on a warmer machine.
  kinds = i.even? ? %w[baseline profiled] : %w[profiled baseline]
  kinds.each do |kind|
    out = IO.popen([RbConfig.ruby, __FILE__, "--child", kind, "--hz", options[:hz].to_s, "--rounds", options[:rounds].to_s,
                    "--workload", options[:workload]], &:read)
    raise "child run failed: #{out}" unless $?.success?

    r = JSON.parse(out.lines.last, symbolize_names: true)
    runs[kind] << r
    extra = kind == "profiled" ? format("  (%.1f samples/s per thread, sampler %.1f ms CPU, stop %.1f ms)",
                                        r[:effective_hz], r[:sampler_cpu_seconds] * 1e3, r[:stop_seconds] * 1e3) : ""
    puts format("run %2d  %-8s  %.3f s wall  %.3f s CPU (cruncher %.3f s)%s", i + 1, kind, r[:seconds], r[:cpu_seconds],
                r[:work_cpu_seconds], extra)
  end
end

base = runs["baseline"].map { |r| r[:seconds] }
prof = runs["profiled"].map { |r| r[:seconds] }
base_cpu = runs["baseline"].map { |r| r[:cpu_seconds] }
prof_cpu = runs["profiled"].map { |r| r[:cpu_seconds] }
pair_ratios = prof.zip(base).map { |p, b| p / b }
base_work = runs["baseline"].map { |r| r[:work_cpu_seconds] }
# The cruncher's own CPU time plus the sampler's: what the work and its profiling cost.
prof_work = runs["profiled"].map { |r| r[:work_cpu_seconds] + r[:sampler_cpu_seconds] }
summary = {
  bench: "profiler_overhead",
  workload: options[:workload],
  hz: options[:hz],
  runs: options[:runs],
  rounds: options[:rounds],
  baseline_s: base.map { |v| v.round(4) },
  profiled_s: prof.map { |v| v.round(4) },
  baseline_median_s: median(base).round(4),
  profiled_median_s: median(prof).round(4),
  median_ratio: (median(prof) / median(base)).round(4),
  min_ratio: (prof.min / base.min).round(4),
  median_pair_ratio: median(pair_ratios).round(4),
  cpu_ratio: (median(prof_cpu) / median(base_cpu)).round(4),
  work_cpu_ratio: (median(prof_work) / median(base_work)).round(4),
  pair_ratio_quartiles: [pair_ratios.sort[pair_ratios.size / 4], pair_ratios.sort[(pair_ratios.size * 3) / 4]].map { |v| v.round(4) },
  effective_hz: median(runs["profiled"].map { |r| r[:effective_hz] }).round(1),
  sampler_cpu_ms: median(runs["profiled"].map { |r| r[:sampler_cpu_seconds] * 1e3 }).round(2),
  stop_ms: median(runs["profiled"].map { |r| r[:stop_seconds] * 1e3 }).round(2),
}
puts
puts format("baseline  median %.3f s (min %.3f)", median(base), base.min)
puts format("profiled  median %.3f s (min %.3f) at %d Hz asked, %.1f samples/s per thread reached",
            median(prof), prof.min, options[:hz], summary[:effective_hz])
puts format("slowdown  wall: %+.2f%% (medians), %+.2f%% (minimums), %+.2f%% (median of paired runs)",
            (summary[:median_ratio] - 1) * 100, (summary[:min_ratio] - 1) * 100, (summary[:median_pair_ratio] - 1) * 100)
puts format("          CPU: %+.2f%% (process), %+.2f%% (cruncher + sampler threads); sampler %.2f ms per run",
            (summary[:cpu_ratio] - 1) * 100, (summary[:work_cpu_ratio] - 1) * 100, summary[:sampler_cpu_ms])
puts JSON.generate(summary)
