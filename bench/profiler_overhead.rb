# frozen_string_literal: true

# How much DdprofRecorder::Profiler slows a program down, next to stackprof and rbspy: the
# CPU work of examples/hot_spot.rb (a "cruncher" thread doing a fixed number of HotSpot.work
# rounds while a "sleeper" thread sleeps and the main thread waits), timed without a
# profiler (baseline) and under each profiler. Each run is a fresh `ruby` process; every
# round runs each kind once, in an order rotated from round to round (round 1: baseline,
# ours, stackprof, rbspy; round 2: ours, stackprof, rbspy, baseline; ...), so that a change
# in machine load hits every kind alike and none always runs first.
#
#   ruby bench/profiler_overhead.rb [--runs 7] [--hz 99] [--rounds 60] [--workload cpu|yielding]
#                                   [--kinds ours,stackprof,rbspy] [--rbspy PATH]
#   bench/run overhead ...        (the same)
#
# Kinds (`--kinds`, comma-separated; the baseline always runs):
# - `ours`: DdprofRecorder::Profiler.new(hz: --hz).start before the threads, #stop after
#   (in-process; the timed work includes starting it, not serializing at stop, reported apart).
#   Its own CPU is `stats[:sampler_cpu_ns]` (its Ruby thread plus the sampling jobs' work).
# - `loaded` (a diagnostic, not in the default --kinds): `require "ddprof_recorder"` and no
#   more. What loading the gem costs a program that never starts the profiler.
# - `stackprof`: `StackProf.start(mode: :cpu, interval: 1000)` ... `StackProf.stop` around
#   the same work, `StackProf.results` after the timing (what `StackProf.run(mode: :cpu,
#   interval: 1000) { work }` does). In-process; its cost is in the process' CPU. Its SIGPROF
#   comes from the kernel's CPU timer, capped by the kernel tick (about 250 a second here):
#   it samples more often than 99 Hz, so it is not the same rate (samples/s are reported).
# - `rbspy`: `rbspy record --rate --hz --silent --format collapsed --file F --raw-file R --
#   ruby this-file --child rbspy ...`: the child runs the baseline work, rbspy (another
#   process) samples it from outside. rbspy's default mode, which users get, is *blocking*:
#   it stops the process (ptrace) for each sample; `rbspy-nonblocking` (not in the default
#   --kinds) adds `--nonblocking`, which reads the memory of the running process. rbspy's
#   own CPU is the CPU of the rbspy process tree (getrusage of the waited children) minus
#   the Ruby child's own (its CLOCK_PROCESS_CPUTIME_ID at exit), as % of the rbspy command's
#   wall time. Its samples/s = collapsed stacks through `crunch` over the timed work
#   (rbspy samples the thread that holds the GVL). If rbspy cannot attach (no ptrace
#   permission, not installed), that is printed and rbspy is skipped.
#
# --workload cpu (default) is the example as it is: the cruncher never lets go of the GVL.
# Our profiler samples it at about --hz with postponed jobs that a native trigger thread
# registers. --workload yielding does the same work in 1 ms slices with a Thread.pass
# between them, as a program doing I/O would.
#
# Per kind: wall time of the work (median of the ratios to the baseline of the same round,
# and quartiles), the process CPU of the timed work against the baseline (CLOCK_PROCESS_
# CPUTIME_ID, in-process: not rbspy's own), the CPU of the whole process tree (the child
# from spawn to exit, plus rbspy for rbspy, measured by this parent), the profiler's own CPU
# as % of the run's wall time, and the sampling rate reached.
#
# Prints one line per run, a table, and last one JSON line (machine-readable). Its top-level
# keys are those of the earlier two-kind version (our profiler = `profiled`):
#   {"bench":"profiler_overhead","hz":99,"runs":7,"baseline_s":[...],"profiled_s":[...],
#    "median_ratio":1.004,"min_ratio":...,"cpu_ratio":...,"effective_hz":...,...,
#    "kinds":{"ours":{...},"stackprof":{...},"rbspy":{...}}}
require "fileutils"
require "json"
require "optparse"
require "rbconfig"
require_relative "support/measure"

include BenchMeasure # rubocop:disable Style/MixinUsage

ROOT = File.expand_path("..", __dir__)
OUT = File.join(ROOT, "bench", "out", "overhead")
PROFILER_KINDS = %w[ours loaded stackprof rbspy rbspy-nonblocking].freeze
DEFAULT_KINDS = %w[ours stackprof rbspy].freeze
CHILD_KINDS = %w[baseline profiled ours loaded stackprof rbspy].freeze
STACKPROF_INTERVAL_US = 1000

options = { runs: 7, hz: 99, rounds: 60, workload: "cpu", child: nil, kinds: DEFAULT_KINDS,
            rbspy: nil }
OptionParser.new do |o|
  o.banner = "Usage: ruby bench/profiler_overhead.rb [--runs N] [--hz N] [--rounds N] [--workload cpu|yielding] " \
             "[--kinds #{DEFAULT_KINDS.join(',')}]"
  o.on("--runs N", Integer, "rounds (runs of each kind, default 7)") { |v| options[:runs] = v }
  o.on("--hz N", Integer, "rate of ours and rbspy (default 99)") { |v| options[:hz] = v }
  o.on("--rounds N", Integer, "HotSpot.work(200_000) rounds per run (default 60, ~1-2 s)") { |v| options[:rounds] = v }
  o.on("--workload NAME", %w[cpu yielding], "cpu (default) or yielding, see above") { |v| options[:workload] = v }
  o.on("--kinds LIST", Array, "profilers beside the baseline: #{PROFILER_KINDS.join(', ')} " \
                              "(default #{DEFAULT_KINDS.join(',')})") do |v|
    bad = v - PROFILER_KINDS - ["profiled"]
    raise OptionParser::InvalidArgument, "#{bad.join(',')} (known: #{PROFILER_KINDS.join(', ')})" unless bad.empty?

    options[:kinds] = v.map { |k| k == "profiled" ? "ours" : k }.uniq
  end
  o.on("--rbspy PATH", "the rbspy binary (default: rbspy on PATH, else ~/.cargo/bin/rbspy)") { |v| options[:rbspy] = v }
  o.on("--child KIND", CHILD_KINDS, "(internal) run one measurement") { |v| options[:child] = v }
  o.parse!
rescue OptionParser::ParseError => e
  abort "bench/profiler_overhead.rb: #{e.message}\n#{o}"
end

# CPU used by our native trigger thread ("ddprof-trigger"), which stats[:sampler_cpu_ns]
# does not include; nil if it is not found.
def trigger_cpu_ns
  tid = Dir.children("/proc/self/task").find do |t|
    File.read("/proc/self/task/#{t}/comm").strip == "ddprof-trigger"
  rescue SystemCallError
    false
  end
  tid && DdprofRecorder::Profiler._native_thread_cpu_time_ns(Integer(tid))
rescue SystemCallError
  nil
end

# One measurement, in this process: prints a JSON object.
def child(kind, hz, rounds, workload)
  kind = "ours" if kind == "profiled"
  require File.join(ROOT, "lib", "ddprof_recorder") if %w[ours loaded].include?(kind)
  require "stackprof" if kind == "stackprof"
  require File.join(ROOT, "examples", "hot_spot")
  HotSpot.work(200_000) # warm up: method caches, the integer ops

  clock = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
  cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID) }
  t0 = clock.call
  c0 = cpu.call
  profiler = DdprofRecorder::Profiler.new(hz: hz).start if kind == "ours"
  StackProf.start(mode: :cpu, interval: STACKPROF_INTERVAL_US) if kind == "stackprof"
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
  StackProf.stop if kind == "stackprof"
  elapsed = clock.call - t0
  cpu_used = cpu.call - c0

  result = { kind: kind, seconds: elapsed, cpu_seconds: cpu_used, work_cpu_seconds: work_cpu }
  if profiler
    stats = profiler.stats
    trigger = trigger_cpu_ns
    t1 = clock.call
    pprof = profiler.stop&.last
    result.merge!(stop_seconds: clock.call - t1, effective_hz: stats[:effective_hz], on_cpu_hz: stats[:on_cpu_hz],
                  passes: stats[:passes], samples: stats[:samples], late_jobs: stats[:late_jobs],
                  sampler_cpu_seconds: (stats[:sampler_cpu_ns] || 0) / 1e9, trigger_cpu_seconds: trigger && trigger / 1e9,
                  pprof_bytes: pprof&.bytesize)
  elsif kind == "stackprof"
    t1 = clock.call
    profile = StackProf.results
    result.merge!(stop_seconds: clock.call - t1, stackprof_samples: profile[:samples],
                  stackprof_missed: profile[:missed_samples], samples_per_second: profile[:samples] / elapsed)
  end
  # Everything this process used since it began (rbspy's own CPU is the tree's minus this).
  result[:process_total_cpu_seconds] = cpu.call
  puts JSON.generate(result)
end

def quartiles(values)
  sorted = values.compact.sort
  return [nil, nil] if sorted.empty?

  [sorted[sorted.size / 4], sorted[(sorted.size * 3) / 4]]
end

def children_cpu
  t = Process.times
  t.cutime + t.cstime
end

def find_rbspy(path)
  return path if path

  on_path = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).map { |d| File.join(d, "rbspy") }
  [*on_path, File.join(Dir.home, ".cargo", "bin", "rbspy")].find { |f| File.executable?(f) }
end

# Runs one child (under rbspy for the rbspy kinds). Returns its result with the parent's
# measures (`tree_cpu_seconds`, `command_seconds`), or raises with what went wrong.
def run_child(kind, options, rbspy)
  child_kind = kind.start_with?("rbspy") ? "rbspy" : kind
  child_kind = "profiled" if child_kind == "ours" # the name the earlier version used
  args = [RbConfig.ruby, __FILE__, "--child", child_kind, "--hz", options[:hz].to_s, "--rounds", options[:rounds].to_s,
          "--workload", options[:workload]]
  collapsed = nil
  if child_kind == "rbspy"
    FileUtils.mkdir_p(OUT)
    collapsed = File.join(OUT, "rbspy.collapsed.txt")
    File.delete(collapsed) if File.exist?(collapsed)
    args = [rbspy, "record", "--rate", options[:hz].to_s, "--silent", "--format", "collapsed", "--file", collapsed,
            "--raw-file", File.join(OUT, "rbspy.raw.gz"), *("--nonblocking" if kind == "rbspy-nonblocking"), "--", *args]
  end
  cpu0 = children_cpu
  t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  out = IO.popen(args, err: %i[child out], &:read)
  status = $?
  command_seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
  tree_cpu = children_cpu - cpu0
  line = out.lines.reverse.find { |l| l.start_with?("{") }
  raise "#{kind} run failed (#{status}): #{out.strip[-2000..] || out.strip}" unless status.success? && line

  r = JSON.parse(line, symbolize_names: true)
  r[:kind] = kind
  r[:tree_cpu_seconds] = tree_cpu
  r[:command_seconds] = command_seconds
  if collapsed
    r[:rbspy_cpu_seconds] = tree_cpu - r[:process_total_cpu_seconds]
    samples = rbspy_samples(collapsed)
    r[:rbspy_samples] = samples[:total]
    r[:samples_per_second] = samples[:work] / r[:seconds]
  end
  r
end

# Samples in rbspy's collapsed output: all, and those in the timed work (through `crunch`).
def rbspy_samples(path)
  total = work = 0
  File.foreach(path) do |line|
    stack, _, count = line.rstrip.rpartition(" ")
    n = Integer(count, exception: false) or next
    total += n
    work += n if stack.include?("crunch - ")
  end
  { total: total, work: work }
rescue SystemCallError
  { total: 0, work: 0 }
end

# rbspy must be able to attach (ptrace) here: one short try before the rounds.
def rbspy_usable(rbspy)
  return [false, "rbspy not found (give --rbspy PATH; `cargo install rbspy --locked`)"] unless rbspy

  FileUtils.mkdir_p(OUT)
  file = File.join(OUT, "rbspy.check.txt")
  out = IO.popen([rbspy, "record", "--rate", "99", "--silent", "--format", "summary", "--file", file,
                  "--raw-file", File.join(OUT, "rbspy.check.raw.gz"), "--", RbConfig.ruby, "-e",
                  "t = Process.clock_gettime(Process::CLOCK_MONOTONIC); nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < 0.3"],
                 err: %i[child out], &:read)
  return [false, "rbspy could not profile a Ruby child (#{$?}): #{out.strip[-500..] || out.strip}"] unless $?.success?
  return [false, "rbspy wrote no samples (#{out.strip[-500..] || out.strip})"] unless File.size?(file)

  version = IO.popen([rbspy, "--version"], &:read).strip
  [true, version]
rescue SystemCallError => e
  [false, "rbspy could not run: #{e.message}"]
end

if options[:child]
  child(options[:child], options[:hz], options[:rounds], options[:workload])
  exit
end

kinds = ["baseline", *options[:kinds]]
rbspy = nil
notes = []
if kinds.any? { |k| k.start_with?("rbspy") }
  rbspy = find_rbspy(options[:rbspy])
  usable, message = rbspy_usable(rbspy)
  if usable
    notes << "rbspy: #{message} (#{rbspy}), default (blocking) mode#{kinds.include?('rbspy-nonblocking') ? ' and --nonblocking' : ''}"
  else
    notes << "rbspy SKIPPED: #{message}"
    kinds.reject! { |k| k.start_with?("rbspy") }
  end
end
kinds.delete("stackprof") unless begin
  require "stackprof"
  true
rescue LoadError
  notes << "stackprof SKIPPED: cannot require 'stackprof' (apt-get install ruby-stackprof)"
  false
end

puts "profiler_overhead: workload #{options[:workload]}, #{options[:rounds]} rounds of HotSpot.work(200_000), " \
     "#{options[:hz]} Hz, #{options[:runs]} runs of each of #{kinds.join(', ')}; load average #{load_average}"
notes.each { |n| puts n }

runs = Hash.new { |h, k| h[k] = [] }
loads = []
options[:runs].times do |i|
  loads << load_average
  # Rotate the order, so that each kind runs in each position as often.
  kinds.rotate(i % kinds.size).each do |kind|
    begin
      r = run_child(kind, options, rbspy)
    rescue RuntimeError => e
      raise unless kind.start_with?("rbspy")

      # rbspy passed the check but failed now: say so and go on without it.
      notes << "#{kind} FAILED in round #{i + 1} and was skipped from then on: #{e.message}"
      puts notes.last
      kinds.delete(kind)
      next
    end
    r[:round] = i
    runs[kind] << r
    extra =
      case kind
      when "ours"
        format("  (on-CPU %.1f/s, passes %.1f/s, %d late, sampler %.1f ms CPU, trigger %.1f ms, stop %.1f ms)",
               r[:on_cpu_hz], r[:effective_hz], r[:late_jobs], r[:sampler_cpu_seconds] * 1e3,
               (r[:trigger_cpu_seconds] || 0) * 1e3, r[:stop_seconds] * 1e3)
      when "stackprof"
        format("  (%.1f samples/s, %d missed, results %.1f ms)", r[:samples_per_second], r[:stackprof_missed],
               r[:stop_seconds] * 1e3)
      when /\Arbspy/
        format("  (%.1f samples/s in the work, rbspy %.1f ms CPU in %.2f s)", r[:samples_per_second],
               r[:rbspy_cpu_seconds] * 1e3, r[:command_seconds])
      else ""
      end
    puts format("run %2d  %-17s  %.3f s wall  %.3f s CPU (cruncher %.3f s), tree %.3f s CPU%s", i + 1, kind, r[:seconds],
                r[:cpu_seconds], r[:work_cpu_seconds], r[:tree_cpu_seconds], extra)
  end
end

base = runs["baseline"]
base_by_round = base.to_h { |r| [r[:round], r] }
# Ratios to the baseline of the same round (a round whose baseline did not run is left out).
paired = lambda do |kind, key|
  runs[kind].filter_map { |r| (b = base_by_round[r[:round]]) && r[key] / b[key] }
end
per_kind = {}
(runs.keys - ["baseline"]).each do |kind|
  rs = runs[kind]
  wall_ratios = paired.call(kind, :seconds)
  own_pct =
    case kind
    when "ours" then median(rs.map { |r| 100.0 * r[:sampler_cpu_seconds] / r[:seconds] })
    when /\Arbspy/ then median(rs.map { |r| 100.0 * r[:rbspy_cpu_seconds] / r[:command_seconds] })
    end
  per_kind[kind] = {
    seconds: rs.map { |r| r[:seconds].round(4) },
    median_s: median(rs.map { |r| r[:seconds] }).round(4),
    median_wall_ratio: median(wall_ratios).round(4),
    wall_ratio_quartiles: quartiles(wall_ratios).map { |v| v.round(4) },
    median_cpu_ratio: median(paired.call(kind, :cpu_seconds)).round(4),
    median_tree_cpu_ratio: median(paired.call(kind, :tree_cpu_seconds)).round(4),
    own_cpu_pct_of_wall: own_pct&.round(3),
    samples_per_second: median(rs.filter_map { |r| kind == "ours" ? r[:on_cpu_hz] : r[:samples_per_second] })&.round(1),
  }
  next unless kind == "ours"

  per_kind[kind].merge!(
    passes_per_second: median(rs.map { |r| r[:effective_hz] }).round(1),
    late_jobs: rs.sum { |r| r[:late_jobs] },
    sampler_cpu_ms: median(rs.map { |r| r[:sampler_cpu_seconds] * 1e3 }).round(2),
    trigger_cpu_ms: median(rs.map { |r| r[:trigger_cpu_seconds] && r[:trigger_cpu_seconds] * 1e3 })&.round(2),
    trigger_cpu_pct_of_wall: median(rs.map { |r| r[:trigger_cpu_seconds] && 100.0 * r[:trigger_cpu_seconds] / r[:seconds] })&.round(3),
    own_cpu_pct_of_process_cpu: median(rs.map { |r| 100.0 * r[:sampler_cpu_seconds] / r[:cpu_seconds] }).round(3),
    stop_ms: median(rs.map { |r| r[:stop_seconds] * 1e3 }).round(2),
  )
end

base_s = base.map { |r| r[:seconds] }
summary = {
  bench: "profiler_overhead",
  workload: options[:workload],
  hz: options[:hz],
  runs: options[:runs],
  rounds: options[:rounds],
  kinds_run: kinds,
  notes: notes,
  load_averages: loads,
  baseline_s: base_s.map { |v| v.round(4) },
  baseline_median_s: median(base_s).round(4),
}
if (ours = runs["ours"]).any?
  # The keys of the earlier two-kind version, for our profiler.
  prof = ours.map { |r| r[:seconds] }
  pair_ratios = prof.zip(base_s).map { |p, b| p / b }
  base_work = base.map { |r| r[:work_cpu_seconds] }
  # The cruncher's own CPU time plus the sampler's: what the work and its profiling cost.
  prof_work = ours.map { |r| r[:work_cpu_seconds] + r[:sampler_cpu_seconds] }
  summary.merge!(
    profiled_s: prof.map { |v| v.round(4) },
    profiled_median_s: median(prof).round(4),
    median_ratio: (median(prof) / median(base_s)).round(4),
    min_ratio: (prof.min / base_s.min).round(4),
    median_pair_ratio: median(pair_ratios).round(4),
    cpu_ratio: (median(ours.map { |r| r[:cpu_seconds] }) / median(base.map { |r| r[:cpu_seconds] })).round(4),
    work_cpu_ratio: (median(prof_work) / median(base_work)).round(4),
    pair_ratio_quartiles: quartiles(pair_ratios).map { |v| v.round(4) },
    effective_hz: per_kind["ours"][:passes_per_second],
    on_cpu_hz: per_kind["ours"][:samples_per_second],
    sampler_cpu_ms: per_kind["ours"][:sampler_cpu_ms],
    stop_ms: per_kind["ours"][:stop_ms],
  )
end
summary[:kinds] = per_kind

puts
puts format("baseline: median %.3f s (min %.3f) wall, %.3f s process CPU", median(base_s), base_s.min,
            median(base.map { |r| r[:cpu_seconds] }))
puts "| kind | samples/s | wall vs baseline (median of pairs) | quartiles | process CPU vs baseline | " \
     "process tree CPU vs baseline | profiler's own CPU, % of wall |"
puts "|---|---|---|---|---|---|---|"
per_kind.each do |kind, k|
  label = kind == "rbspy" ? "rbspy (blocking, its default)" : kind
  label = "rbspy --nonblocking" if kind == "rbspy-nonblocking"
  label = "ours (hz #{options[:hz]})" if kind == "ours"
  label = "stackprof (cpu, #{STACKPROF_INTERVAL_US} us)" if kind == "stackprof"
  pct = ->(v) { format("%+.2f%%", (v - 1) * 100) }
  own = k[:own_cpu_pct_of_wall] ? format("%.2f%%", k[:own_cpu_pct_of_wall]) : "in process CPU"
  if kind == "ours"
    own += format(" (%.1f ms, %.2f%% of process CPU; + trigger thread %s ms, %s%%)", k[:sampler_cpu_ms],
                  k[:own_cpu_pct_of_process_cpu], k[:trigger_cpu_ms] || "?",
                  k[:trigger_cpu_pct_of_wall] ? format("%.2f", k[:trigger_cpu_pct_of_wall]) : "?")
  end
  puts "| #{label} | #{k[:samples_per_second]} | #{pct.call(k[:median_wall_ratio])} | " \
       "#{k[:wall_ratio_quartiles].map { |v| pct.call(v) }.join(' .. ')} | #{pct.call(k[:median_cpu_ratio])} | " \
       "#{pct.call(k[:median_tree_cpu_ratio])} | #{own} |"
end
if (k = per_kind["ours"])
  wall_ok = k[:median_wall_ratio] <= 1.02
  cpu_ok = k[:own_cpu_pct_of_wall] <= 1.0
  puts format("ours: wall slowdown %+.2f%% (target <= +2%%): %s; own CPU %.2f%% of the run (target <= 1%%): %s; " \
              "%.1f on-CPU samples/s, %.1f passes/s, %d late jobs",
              (k[:median_wall_ratio] - 1) * 100, wall_ok ? "met" : "MISSED", k[:own_cpu_pct_of_wall],
              cpu_ok ? "met" : "MISSED", k[:samples_per_second], k[:passes_per_second], k[:late_jobs])
end
puts JSON.generate(summary)
