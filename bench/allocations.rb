# frozen_string_literal: true

# What allocation sampling costs, and whether it finds the right allocators, on an
# allocation-heavy program of known shape: `ten` makes 10x more Strings than `one` (and a
# few Arrays and Hashes on the side). Each run is a fresh `ruby` process timing the same work
# (the CPU of its main thread, CLOCK_THREAD_CPUTIME_ID, and wall); every round runs each kind
# once, in an order rotated from round to round, so that load changes hit every kind alike.
#
#   ruby bench/allocations.rb [--rounds 10] [--iterations 40] [--workload strings|json]
#   bench/run allocations ...     (the same)
#
# `--workload json` times `JSON.parse` and `JSON.generate` of a 200-record document instead
# (`--iterations` x 15 of each; about 3.5 million objects a second here): a program that
# allocates a lot but does other work too. Its shares are not checked (no known truth).
#
# Kinds:
# - `baseline`: no profiler;
# - `cpu`: DdprofRecorder::Profiler at 99 Hz, no memory option (what allocation sampling is
#   compared with: its own cost is `default` / `cpu`);
# - `hooked`: `allocations: true` at the largest interval (MAX_ALLOCATION_INTERVAL): the NEWOBJ
#   hook enabled, no sample ever taken, i.e. what the hook alone costs;
# - `default`: the same with `allocations: true` (DEFAULT_ALLOCATION_INTERVAL);
# - `every`: `allocations: true, allocation_interval: 1` (every object);
# - `stackprof`: `StackProf.run(mode: :object, interval: 1)` (every object), for the top
#   functions' overlap.
#
# Prints a table of medians and, as its last line, one JSON object.
require "json"
require "optparse"
require "rbconfig"

module AllocationBench
  KINDS = %w[baseline cpu hooked default every stackprof].freeze
  LIB = File.expand_path("../lib", __dir__)

  module Work
    module_function

    def ten(n)
      n.times { |i| "s#{i}" }
    end

    def one(n)
      n.times { |i| "s#{i}" }
    end

    def side(n)
      n.times { |i| [i, { i => i }] }
    end

    def run(iterations)
      iterations.times do
        ten(50_000)
        one(5_000)
        side(2_000)
      end
    end

    def json(iterations)
      require "json"
      doc = { "users" => Array.new(200) { |i| { "id" => i, "name" => "user#{i}", "tags" => %w[a b c], "score" => i * 1.5 } } }
      text = JSON.generate(doc)
      (iterations * 15).times do
        JSON.parse(text)
        JSON.generate(doc)
      end
    end
  end

  module_function

  def cpu_ns
    Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)
  end

  def wall_ns
    Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  end

  # In the child: runs the work under `kind`, prints one JSON line.
  def child(kind, iterations, workload)
    $LOAD_PATH.unshift(LIB)
    require "ddprof_recorder"
    require "stackprof" if kind == "stackprof"
    work = workload == "json" ? Work.method(:json) : Work.method(:run)
    work.call(2) # warm-up
    GC.start
    options = { "cpu" => {}, "default" => { allocations: true },
                "hooked" => { allocations: true, allocation_interval: DdprofRecorder::Profiler::MAX_ALLOCATION_INTERVAL },
                "every" => { allocations: true, allocation_interval: 1 } }[kind]
    profiler = DdprofRecorder::Profiler.new(compression: :none, **options).start if options
    StackProf.start(mode: :object, interval: 1, raw: false) if kind == "stackprof"
    cpu = cpu_ns
    wall = wall_ns
    work.call(iterations)
    cpu = cpu_ns - cpu
    wall = wall_ns - wall
    result = { kind: kind, cpu_ns: cpu, wall_ns: wall }
    if profiler
      pprof = profiler.stop[2]
      result[:stats] = profiler.stats[:allocations]
      result[:top] = DdprofRecorder.top(pprof, value: "alloc-count", limit: 5)[:rows].map { |r| [r[:name], r[:self]] } if %w[default every].include?(kind)
    elsif kind == "stackprof"
      StackProf.stop
      frames = StackProf.results[:frames].values
      result[:top] = frames.sort_by { |f| -f[:samples] }.first(5).map { |f| [f[:name].split(/[.#]/).last, f[:samples]] }
    end
    puts JSON.generate(result)
  end

  def median(values)
    sorted = values.sort
    n = sorted.size
    n.odd? ? sorted[n / 2] : (sorted[(n / 2) - 1] + sorted[n / 2]) / 2.0
  end

  def shares(top)
    total = top.sum(&:last).to_f
    top.to_h { |name, v| [name, (100.0 * v / total).round(1)] }
  end

  def main(argv)
    rounds = 10
    iterations = 40
    workload = "strings"
    OptionParser.new do |o|
      o.on("--workload NAME", %w[strings json]) { |v| workload = v }
      o.on("--rounds N", Integer) { |v| rounds = v }
      o.on("--iterations N", Integer) { |v| iterations = v }
      o.on("--child KIND") { |v| return child(v, iterations, workload) }
    end.parse!(argv)

    runs = Hash.new { |h, k| h[k] = [] }
    rounds.times do |round|
      KINDS.rotate(round).each do |kind|
        line = IO.popen([RbConfig.ruby, __FILE__, "--workload", workload, "--iterations", iterations.to_s,
                         "--child", kind], &:read)
        runs[kind] << JSON.parse(line.lines.last, symbolize_names: true)
      end
    end
    load = File.read("/proc/loadavg").split.first(3).join(" ")
    cpu = KINDS.to_h { |k| [k, median(runs[k].map { |r| r[:cpu_ns] })] }
    # Paired: the ratio of each round's runs, then the median of the ratios.
    ratio = lambda do |a, b|
      median(runs[a].zip(runs[b]).map { |x, y| x[:cpu_ns].to_f / y[:cpu_ns] })
    end
    puts format("allocation sampling, %s workload, %d rounds x %d iterations (load average %s)", workload, rounds,
                iterations, load)
    KINDS.each { |k| puts format("  %-9s median main-thread CPU %8.1f ms", k, cpu[k] / 1e6) }
    summary = {
      load_average: load,
      workload: workload,
      rounds: rounds,
      iterations: iterations,
      cpu_ms: cpu.transform_values { |v| (v / 1e6).round(1) },
      default_vs_cpu: ratio.call("default", "cpu").round(4),
      hooked_vs_cpu: ratio.call("hooked", "cpu").round(4),
      every_vs_cpu: ratio.call("every", "cpu").round(4),
      cpu_vs_baseline: ratio.call("cpu", "baseline").round(4),
      stackprof_vs_baseline: ratio.call("stackprof", "baseline").round(4),
      default_shares: shares(runs["default"].last[:top]),
      every_shares: shares(runs["every"].last[:top]),
      stackprof_shares: shares(runs["stackprof"].last[:top]),
      default_samples: runs["default"].last.dig(:stats, :recorded),
    }
    top_ours = runs["every"].last[:top].first(3).map(&:first)
    top_stackprof = runs["stackprof"].last[:top].first(3).map(&:first)
    summary[:top3_overlap] = (top_ours & top_stackprof).size
    puts format("  paired median ratios: hooked / cpu %.4f;  default / cpu %.4f;  every / cpu %.4f",
                summary[:hooked_vs_cpu], summary[:default_vs_cpu], summary[:every_vs_cpu])
    puts "  shares (alloc-count; stackprof: object samples): default #{summary[:default_shares]}"
    puts "                                                   every   #{summary[:every_shares]}"
    # stackprof names JSON's C methods apart from ours: its shares only compare on `strings`.
    if workload == "strings"
      puts "                                                   stackprof #{summary[:stackprof_shares]}"
      puts "  top-3 overlap with stackprof: #{summary[:top3_overlap]}/3"
    end
    puts JSON.generate(summary)
  end
end

AllocationBench.main(ARGV) if $PROGRAM_NAME == __FILE__
