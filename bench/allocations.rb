# frozen_string_literal: true

# What allocation sampling costs, and whether it finds the right allocators, on an
# allocation-heavy program of known shape: `ten` makes 10x more Strings than `one` (and a
# few Arrays and Hashes on the side). Each run is a fresh `ruby` process timing the same work
# (the CPU of its main thread, CLOCK_THREAD_CPUTIME_ID, and wall); every round runs each kind
# once, in an order rotated from round to round, so that load changes hit every kind alike.
#
#   ruby bench/allocations.rb [--rounds 10] [--iterations 40] [--workload strings|json|phases]
#                             [--kinds cpu,default,...] [--default-interval N]
#                             [--default-overhead F]
#   bench/run allocations ...     (the same)
#
# `--workload json` times `JSON.parse` and `JSON.generate` of a 200-record document instead
# (`--iterations` x 15 of each; about 3.5 million objects a second here): a program that
# allocates a lot but does other work too. Its shares are not checked (no known truth).
# `--workload phases` alternates `dense` (allocation only) and `sparse` (computing between
# allocations), `--iterations` x 5 times 20,000 iterations of each: equal counts, unequal
# slowdowns under the hook (truth: 50/50).
#
# Kinds:
# - `baseline`: no profiler;
# - `cpu`: DdprofRecorder::Profiler at 99 Hz, no memory option (what allocation sampling is
#   compared with: its own cost is `default` / `cpu`);
# - `hooked`: `allocations: true, allocation_overhead: 1.0` at the largest interval
#   (MAX_ALLOCATION_INTERVAL): the NEWOBJ hook always on, no sample ever taken, i.e. what the
#   hook alone costs;
# - `always`: `allocations: true, allocation_overhead: 1.0`: the default interval with the
#   hook always on (every allocation seen; what the default was before the duty cycle);
# - `default`: `allocations: true`, the defaults: the default interval, and the hook on for
#   random slots of time only, about DEFAULT_ALLOCATION_OVERHEAD of the program's time
#   (ext/ddprof_recorder/src/memory/duty_cycle.rs);
# - `every`: `allocations: true, allocation_interval: 1` (every object);
# - `gc`: `gc: true` alone (its GC hooks send every allocation through Ruby 3.1's slow path
#   too);
# - `heap`: `heap: true` with the defaults (its FREEOBJ hook is always on, and so is that slow
#   path);
# - `stackprof`: `StackProf.run(mode: :object, interval: 1)` (every object), for the top
#   functions' overlap.
#
# Prints a table of medians and, as its last line, one JSON object.
require "json"
require "optparse"
require "rbconfig"
require_relative "support/measure"

module AllocationBench
  KINDS = %w[baseline cpu hooked always default every gc heap stackprof].freeze
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

    # Two Strings an iteration each: `dense` only allocates, `sparse` computes between
    # allocations (about 5x as long for as many objects). The hook slows `dense` by about
    # 46% and `sparse` by less: what the duty cycle's lengthened on-slots must not turn into
    # a bias between them (truth: 50/50).
    def dense(n)
      n.times { |i| "d#{i}" }
    end

    def sparse(n)
      n.times do |i|
        x = i
        12.times { x = ((x * 7) + 3) % 1_000_003 }
        "s#{x}"
      end
    end

    def phases(iterations)
      (iterations * 5).times do
        dense(20_000)
        sparse(20_000)
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

  extend BenchMeasure

  module_function

  # In the child: runs the work under `kind`, prints one JSON line.
  def child(kind, iterations, workload)
    $LOAD_PATH.unshift(LIB)
    require "ddprof_recorder"
    require "stackprof" if kind == "stackprof"
    work = Work.method({ "json" => :json, "phases" => :phases }.fetch(workload, :run))
    work.call(2) # warm-up
    GC.start
    default = { allocations: true }
    default[:allocation_interval] = Integer(ENV["BENCH_DEFAULT_INTERVAL"]) if ENV["BENCH_DEFAULT_INTERVAL"]
    default[:allocation_overhead] = Float(ENV["BENCH_DEFAULT_OVERHEAD"]) if ENV["BENCH_DEFAULT_OVERHEAD"]
    options = { "cpu" => {}, "default" => default, "gc" => { gc: true }, "heap" => { heap: true },
                "always" => { allocations: true, allocation_overhead: 1.0 },
                "hooked" => { allocations: true, allocation_overhead: 1.0,
                              allocation_interval: DdprofRecorder::Profiler::MAX_ALLOCATION_INTERVAL },
                "every" => { allocations: true, allocation_interval: 1 } }[kind]
    profiler = DdprofRecorder::Profiler.new(compression: :none, **options).start if options
    StackProf.start(mode: :object, interval: 1, raw: false) if kind == "stackprof"
    allocated = GC.stat(:total_allocated_objects)
    cpu = thread_cpu_ns
    wall = monotonic_ns
    work.call(iterations)
    cpu = thread_cpu_ns - cpu
    wall = monotonic_ns - wall
    allocated = GC.stat(:total_allocated_objects) - allocated
    result = { kind: kind, cpu_ns: cpu, wall_ns: wall }
    if profiler
      pprof = profiler.stop[2]
      result[:stats] = profiler.stats[:allocations]
      result[:allocated] = allocated
      if %w[always default every].include?(kind)
        result[:top] = DdprofRecorder.top(pprof, value: "alloc-count", limit: 5)[:rows].map { |r| [r[:name], r[:self]] }
        result[:estimated] = DdprofRecorder.top(pprof, value: "alloc-count", limit: 1)[:total]
      end
    elsif kind == "stackprof"
      StackProf.stop
      frames = StackProf.results[:frames].values
      result[:top] = frames.sort_by { |f| -f[:samples] }.first(5).map { |f| [f[:name].split(/[.#]/).last, f[:samples]] }
    end
    puts JSON.generate(result)
  end

  def shares(top)
    total = top.sum(&:last).to_f
    top.to_h { |name, v| [name, (100.0 * v / total).round(1)] }
  end

  def main(argv)
    rounds = 10
    iterations = 40
    workload = "strings"
    kinds = KINDS
    OptionParser.new do |o|
      o.on("--workload NAME", %w[strings json phases]) { |v| workload = v }
      o.on("--rounds N", Integer) { |v| rounds = v }
      o.on("--iterations N", Integer) { |v| iterations = v }
      o.on("--kinds LIST", Array, "a subset of #{KINDS.join(",")}") { |v| kinds = v & KINDS }
      # Another interval for `default` (the duty cycle as it is): to try a default.
      o.on("--default-interval N", Integer) { |v| ENV["BENCH_DEFAULT_INTERVAL"] = v.to_s }
      # Another allocation_overhead for `default`: to try a default duty cycle.
      o.on("--default-overhead F", Float) { |v| ENV["BENCH_DEFAULT_OVERHEAD"] = v.to_s }
      o.on("--child KIND") { |v| return child(v, iterations, workload) }
    end.parse!(argv)

    runs = Hash.new { |h, k| h[k] = [] }
    rounds.times do |round|
      kinds.rotate(round).each do |kind|
        line = IO.popen([RbConfig.ruby, __FILE__, "--workload", workload, "--iterations", iterations.to_s,
                         "--child", kind], &:read)
        runs[kind] << JSON.parse(line.lines.last, symbolize_names: true)
      end
    end
    load = load_average
    cpu = kinds.to_h { |k| [k, median(runs[k].map { |r| r[:cpu_ns] })] }
    # Paired: the ratio of each round's runs, then the median of the ratios (nil: a kind not run).
    ratio = lambda do |a, b|
      next unless runs.key?(a) && runs.key?(b)

      median(runs[a].zip(runs[b]).map { |x, y| x[:cpu_ns].to_f / y[:cpu_ns] }).round(4)
    end
    top = ->(kind) { runs.key?(kind) ? runs[kind].last[:top] : nil }
    puts format("allocation sampling, %s workload, %d rounds x %d iterations (load average %s)", workload, rounds,
                iterations, load)
    kinds.each { |k| puts format("  %-9s median main-thread CPU %8.1f ms", k, cpu[k] / 1e6) }
    summary = {
      load_average: load,
      workload: workload,
      rounds: rounds,
      iterations: iterations,
      cpu_ms: cpu.transform_values { |v| (v / 1e6).round(1) },
    }
    %w[default always hooked every gc heap].each { |k| summary[:"#{k}_vs_cpu"] = ratio.call(k, "cpu") }
    summary[:cpu_vs_baseline] = ratio.call("cpu", "baseline")
    summary[:stackprof_vs_baseline] = ratio.call("stackprof", "baseline")
    %w[default always every stackprof].each { |k| summary[:"#{k}_shares"] = top.call(k) && shares(top.call(k)) }
    if (default = runs.key?("default") && runs["default"])
      # alloc-count's total against GC.stat's count of the same run: the estimate's error (the
      # profile also holds the few allocations made between start and the timed work).
      summary[:default_estimate_ratios] = default.map { |r| (r[:estimated].to_f / r[:allocated]).round(3) }
      leaf = workload == "phases" ? "dense" : "ten"
      # Function names are qualified (`AllocationBench::Work.ten`).
      summary[:"default_#{leaf}_shares"] = default.map do |r|
        shares(r[:top]).find { |name, _| name == leaf || name.end_with?(".#{leaf}", "##{leaf}") }&.last || 0.0
      end
      summary[:default_hook_on_share] = median(default.map { |r| r.dig(:stats, :hook_on_share) }).round(3)
      summary[:default_hook_cost_ns] = median(default.map { |r| r.dig(:stats, :hook_cost_ns) }).round(1)
      summary[:default_samples] = median(default.map { |r| r.dig(:stats, :recorded) })
    end
    if top.call("every") && top.call("stackprof")
      summary[:top3_overlap] = (top.call("every").first(3).map(&:first) & top.call("stackprof").first(3).map(&:first)).size
    end
    puts "  paired median ratios to cpu: " + %w[default always hooked every gc heap].map { |k| "#{k} #{summary[:"#{k}_vs_cpu"] || "-"}" }.join(";  ")
    if default
      puts format("  default: hook on %.1f%% of the time, %.1f ns an allocation, %d samples; alloc-count / true count %s",
                  100 * summary[:default_hook_on_share], summary[:default_hook_cost_ns], summary[:default_samples],
                  summary[:default_estimate_ratios])
      leaf = workload == "phases" ? "dense" : "ten"
      puts format("  default: %s's share of alloc-count, each run: %s", leaf, summary[:"default_#{leaf}_shares"])
    end
    %w[default always every].each do |k|
      puts format("  shares (alloc-count) %-9s %s", k, summary[:"#{k}_shares"]) if summary[:"#{k}_shares"]
    end
    # stackprof names JSON's C methods apart from ours: its shares only compare on `strings`.
    if workload == "strings" && summary[:stackprof_shares]
      puts format("  shares (object samples) stackprof %s", summary[:stackprof_shares])
      puts "  top-3 overlap with stackprof: #{summary[:top3_overlap]}/3" if summary[:top3_overlap]
    end
    puts JSON.generate(summary)
  end
end

AllocationBench.main(ARGV) if $PROGRAM_NAME == __FILE__
