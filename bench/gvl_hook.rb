# frozen_string_literal: true

# What the GVL event hook (ext/ddprof_recorder/src/sampling/gvl_events.rs) costs a program that
# switches threads all the time: 4 threads pass a token round a ring of Queues, so every pass
# is a GVL hand-over (the receiver becomes READY, then RESUMED once it has the lock: two
# events the hook handles). Rounds of PASSES passes alternate with the hook off and on (paired,
# alternating, in one process, so that the machine's drift falls on both alike), and each
# pair gives a ratio, of wall time and of the process's CPU time (the hand-over's futex calls
# and the hook's work; less noisy than wall time, which waits on the kernel's scheduler);
# reported: the median ratios, the median ns per pass off and on, and the hook's ns per event
# ((on - off) / 2 per pass, of CPU time).
#
#   ruby bench/gvl_hook.rb [--rounds 21] [--passes 20000]
#   perf record -e cpu-clock -F 9999 -- ruby bench/gvl_hook.rb --always; perf report --no-children
#
# On this 2-core machine a pass takes 15 to 35 µs from run to run, mostly the kernel's
# futex wake and task switch, and the paired ratios spread over ±5%: too wide for a 1% effect.
# `--always` keeps the hook on for every round, for a CPU profile, whose share of samples in
# the hook's functions (`gvl_events::imp::on_gvl_event`, `clock_gettime`) and in Ruby's
# dispatch of it (`rb_thread_execute_hooks` and its rwlock) is the cost, measured where the
# paired ratios cannot see it.
#
# Ruby 3.3+ only (Profiler::GVL_EVENTS). Prints a table, then one JSON line.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "ddprof_recorder"
require "json"
require "optparse"

options = { rounds: 21, passes: 20_000, always: false }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--passes N", Integer) { |v| options[:passes] = v }
  o.on("--always", "the hook on in every round (for perf record)") { options[:always] = true }
end.parse!
abort "bench/gvl_hook.rb: Ruby #{RUBY_VERSION} has no GVL events (3.3+)" unless DdprofRecorder::Profiler::GVL_EVENTS

THREADS = 4
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

mono = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) }
cpu = -> { Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond) }
# [wall ns, process CPU ns] of one round.
round = lambda do
  from = mono.call
  cpu_from = cpu.call
  queues[0] << options[:passes]
  done.pop
  [mono.call - from, cpu.call - cpu_from]
end
hook = lambda do |on|
  on || options[:always] ? DdprofRecorder::Profiler._native_gvl_start : DdprofRecorder::Profiler._native_gvl_stop
end

2.times { round.call } # warm up
pairs = Array.new(options[:rounds]) do |i|
  # Which goes first alternates, so that neither always runs on a machine warmed by the other.
  order = i.even? ? [false, true] : [true, false]
  times = order.to_h do |on|
    hook.call(on)
    [on, round.call]
  end
  [times[false], times[true]]
end
hook.call(false)
queues.each { |q| q << nil }
ring.each(&:join)

median = ->(xs) { xs.sort[xs.size / 2] }
per_pass = ->(ns) { ns.to_f / options[:passes] }
stats = { wall: 0, cpu: 1 }.to_h do |name, i|
  off = per_pass.call(median.call(pairs.map { |a, _| a[i] }))
  on = per_pass.call(median.call(pairs.map { |_, b| b[i] }))
  ratios = pairs.map { |a, b| b[i].to_f / a[i] }
  [name, { off_ns_per_pass: off.round(1), on_ns_per_pass: on.round(1), ratio: median.call(ratios).round(4),
           ratios: ratios.map { |r| r.round(4) } }]
end
event_ns = (stats[:cpu][:on_ns_per_pass] - stats[:cpu][:off_ns_per_pass]) / 2
untracked = DdprofRecorder::Profiler._native_sampling_stats[:gvl_untracked_events]
printf("%-28s %12s %12s\n", "median", "wall", "process CPU")
printf("%-28s %12.0f %12.0f\n", "ns per pass, hook off", stats[:wall][:off_ns_per_pass], stats[:cpu][:off_ns_per_pass])
printf("%-28s %12.0f %12.0f\n", "ns per pass, hook on", stats[:wall][:on_ns_per_pass], stats[:cpu][:on_ns_per_pass])
printf("%-28s %12.4f %12.4f\n", "on / off (paired)", stats[:wall][:ratio], stats[:cpu][:ratio])
printf("%-28s %25.1f\n", "ns of CPU per event", event_ns)
puts JSON.generate(ruby: RUBY_VERSION, yjit: defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? true : false,
                   rounds: options[:rounds], passes: options[:passes], threads: THREADS, **stats,
                   ns_per_event: event_ns.round(1), untracked_events: untracked)
