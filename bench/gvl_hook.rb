# frozen_string_literal: true

# What the GVL event hook (ext/ddprof_recorder/src/sampling/gvl_events.rs) costs a program that
# switches threads all the time: 4 threads pass a token round a ring of Queues, so every pass
# is a GVL hand-over. In a pass the receiver becomes READY, the giver is SUSPENDED (it waits on
# its own empty queue), and the receiver is RESUMED once it has the lock: three events, of which
# our hook handles two (READY and RESUMED).
#
# Rounds of PASSES passes alternate between three modes, in one process, each round's order
# rotated, so that the machine's drift falls on all alike:
# - off: no thread event hook;
# - ruby: only `Profiler._native_gvl_dispatch_probe`, a hook on an event that does not fire
#   here. Once any hook exists, Ruby dispatches every event to its hook list under a read lock
#   (`rb_thread_execute_hooks`, 3.3 and 3.4 `thread_pthread.c`): this mode is that cost, which
#   is Ruby's whatever the hook does;
# - ours: our hook (`Profiler._native_gvl_start`), dispatch included.
# Each round gives the ratio of its process CPU time (the hand-over's futex calls and the
# hooks' work; less noisy than wall time, which waits on the kernel's scheduler) to the off
# round beside it. Reported: the median ratios with their quartiles, and the ns of CPU they
# come to: Ruby's dispatch per pass, and ours per hooked event (two a pass), from the median
# ratio of each round's ours to the same round's Ruby-only.
#
# Where the kernel runs the 4 threads decides what a hand-over costs, and with it the ratio
# (bench/RESULTS.md, "Timeline"), so the run measures each placement in turn:
# - free: the kernel's choice; a hand-over is sometimes on one CPU, sometimes across, and the
#   mix moves from round to round (the widest quartiles);
# - one-cpu: every thread on CPU 0 (`taskset -pc` on each thread's native id): a hand-over is a
#   task switch on one CPU, the cheapest, so the hook's share is the largest;
# - cross-cpu: thread i on CPU i % 2: every hand-over wakes a thread on the other CPU.
#
#   ruby bench/gvl_hook.rb [--rounds 31] [--passes 20000] [--placements free,one-cpu,cross-cpu]
#   perf record -e cpu-clock -F 9999 -- ruby bench/gvl_hook.rb --always; perf report --no-children
#
# `--always` keeps our hook on in every round of the free placement, for a CPU profile.
# Ruby 3.3+ only (Profiler::GVL_EVENTS); the placements other than free need `taskset`
# (util-linux) and, for cross-cpu, two CPUs. Prints a table, then one JSON line.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "ddprof_recorder"
require "etc"
require "json"
require "optparse"

options = { rounds: 31, passes: 20_000, always: false, placements: %w[free one-cpu cross-cpu] }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--passes N", Integer) { |v| options[:passes] = v }
  o.on("--placements LIST", Array) { |v| options[:placements] = v }
  o.on("--always", "our hook on in every round (for perf record)") do
    options[:always] = true
    options[:placements] = %w[free]
  end
end.parse!
profiler = DdprofRecorder::Profiler
abort "bench/gvl_hook.rb: Ruby #{RUBY_VERSION} has no GVL events (3.3+)" unless profiler::GVL_EVENTS
unknown = options[:placements] - %w[free one-cpu cross-cpu]
abort "bench/gvl_hook.rb: unknown placements #{unknown.join(', ')}" unless unknown.empty?

THREADS = 4
EVENTS_OURS = 2 # READY and RESUMED of the thread that takes the token
queues = Array.new(THREADS) { Thread::Queue.new }
done = Thread::Queue.new
# Thread i takes the token from its queue and gives it to the next; the token counts down.
ring = Array.new(THREADS) do |i|
  Thread.new do
    loop do
      left = queues[i].pop
      break if left.nil?

      left.zero? ? done << true : queues[(i + 1) % THREADS] << (left - 1)
    end
  end
end
Thread.pass until ring.all? { |t| t.status == "sleep" }

cpus = Etc.respond_to?(:nprocessors) ? Etc.nprocessors : 1
# Pins thread i (and main, which only waits for the end of a round) to its CPU; free: any.
place = lambda do |placement|
  all = (0...cpus).to_a.join(",")
  cpu_of = { "free" => ->(_) { all }, "one-cpu" => ->(_) { "0" }, "cross-cpu" => ->(i) { (i % 2).to_s } }
  [[Thread.main, 0], *ring.each_with_index].each do |thread, i|
    next if system("taskset", "-pc", cpu_of.fetch(placement).call(i), thread.native_thread_id.to_s, out: File::NULL)

    abort "bench/gvl_hook.rb: `taskset -pc` failed (util-linux's taskset is needed for #{placement})"
  end
end

cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond) }
# The process CPU ns of one round.
round = lambda do
  from = cpu.call
  queues[0] << options[:passes]
  done.pop
  cpu.call - from
end
modes = options[:always] ? %w[ours] : %w[off ruby ours]
set = lambda do |mode|
  profiler._native_gvl_dispatch_probe(mode == "ruby")
  mode == "ours" ? profiler._native_gvl_start : profiler._native_gvl_stop
end

median = ->(xs) { xs.sort[xs.size / 2] }
quartiles = ->(xs) { [xs.sort[xs.size / 4], xs.sort[(xs.size * 3) / 4]] }
results = options[:placements].to_h do |placement|
  abort "bench/gvl_hook.rb: cross-cpu needs two CPUs" if placement == "cross-cpu" && cpus < 2
  place.call(placement)
  set.call(modes.first)
  2.times { round.call } # warm up, and let the threads settle where they were put
  rounds = Hash.new { |h, k| h[k] = [] }
  options[:rounds].times do |i|
    modes.rotate(i % modes.size).each do |mode|
      set.call(mode)
      rounds[mode] << round.call
    end
  end
  set.call("off")
  next [placement, { ns_per_pass: { ours: median.call(rounds["ours"]).fdiv(options[:passes]).round(1) } }] if options[:always]

  off_ns = median.call(rounds["off"]).fdiv(options[:passes])
  ratio = ->(mode, base = "off") { rounds[mode].zip(rounds[base]).map { |on, off| on.fdiv(off) } }
  ruby_ratio = median.call(ratio.call("ruby"))
  ours_ratio = median.call(ratio.call("ours"))
  [placement, {
    off_ns_per_pass: off_ns.round(1),
    ruby: { ratio: ruby_ratio.round(4), quartiles: quartiles.call(ratio.call("ruby")).map { |r| r.round(4) },
            ns_per_pass: ((ruby_ratio - 1) * off_ns).round(1) },
    ours: { ratio: ours_ratio.round(4), quartiles: quartiles.call(ratio.call("ours")).map { |r| r.round(4) },
            ns_per_pass: ((ours_ratio - 1) * off_ns).round(1),
            # Ours against Ruby's alone in the same round (paired, so less spread than the
            # difference of the two medians against off).
            ns_per_event_beyond_ruby: ((median.call(ratio.call("ours", "ruby")) - 1) * off_ns / EVENTS_OURS).round(1) }
  }]
end
queues.each { |q| q << nil }
ring.each(&:join)

unless options[:always]
  printf("%-10s %10s %22s %22s %12s %12s\n", "placement", "CPU/pass", "Ruby's dispatch", "ours (with Ruby's)",
         "Ruby ns/pass", "ours ns/ev")
  results.each do |placement, r|
    show = ->(m) { format("%.4f [%.4f %.4f]", m[:ratio], *m[:quartiles]) }
    printf("%-10s %8.0f ns %22s %22s %12.1f %12.1f\n", placement, r[:off_ns_per_pass], show.call(r[:ruby]),
           show.call(r[:ours]), r[:ruby][:ns_per_pass], r[:ours][:ns_per_event_beyond_ruby])
  end
end
puts JSON.generate(ruby: RUBY_VERSION, yjit: defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? true : false,
                   rounds: options[:rounds], passes: options[:passes], threads: THREADS, placements: results,
                   untracked_events: profiler._native_sampling_stats[:gvl_untracked_events])
