# frozen_string_literal: true

# The timeline's shares of wall time (DdprofRecorder.summary[:threads], `record`'s `states`
# lines) against truths the program measures itself, printed (the specs check the same with
# margins: spec/profiler/thread_states_spec.rb, gvl_wait_spec.rb):
#
# - GVL: 4 threads busy for 0.6 s each on one lock, and a sleeper (3 x 0.2 s). A busy thread's
#   waiting share against (its wall time from its release - its CPU - its run-queue time,
#   /proc/thread-self/schedstat) over that wall time; the sleeper's blocked share against the
#   time it asked to sleep over its wall time. Ruby 3.3+ (no waiting share on 3.1).
# - GC: an allocation-heavy loop; the gc share of the loop's wall time against GC.stat(:time)
#   (CPU time) over the loop's CPU: the kernel's preemptions stretch the GC's wall time as they
#   stretch the rest.
#
#   ruby bench/timeline_truth.rb
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "ddprof_recorder"
require "json"
require_relative "support/clock_helpers"

include ClockHelpers # rubocop:disable Style/MixinUsage

def threads_of(pprof) = DdprofRecorder.summary(pprof)[:threads].to_h { |t| [t[:name], t] }

results = { ruby: RUBY_VERSION, gvl: {}, gc: nil }
if DdprofRecorder::Profiler::GVL_EVENTS
  profiler = DdprofRecorder::Profiler.new(hz: 99, compression: :none, timeline: true)
  profiler.start
  truth = {}
  go = Queue.new
  threads = Array.new(4) do |i|
    Thread.new do
      released = go.pop
      cpu = thread_cpu_ns
      queued = runqueue_ns
      busy_for(600_000_000)
      wall = mono_ns - released
      truth["busy-#{i}"] = [:waiting, 100.0 * (wall - (thread_cpu_ns - cpu) - (runqueue_ns - queued)) / wall]
    end.tap { |t| t.name = "busy-#{i}" }
  end
  4.times { go << mono_ns }
  threads << Thread.new do
    Thread.current.name = "sleeper"
    from = mono_ns
    3.times { sleep 0.2 }
    truth["sleeper"] = [:blocked, 100.0 * 600_000_000 / (mono_ns - from)]
  end
  threads.each(&:join)
  measured = threads_of(profiler.stop.last)
  truth.sort.each do |name, (share, expected)|
    t = measured.fetch(name)
    got = 100.0 * t[share] / t[:wall]
    results[:gvl][name] = { share: share, measured: got.round(1), truth: expected.round(1), points: (got - expected).round(1) }
    printf("%-8s %-8s measured %5.1f%%  truth %5.1f%%  %+5.1f points\n", name, share, got, expected, got - expected)
  end
else
  puts "Ruby #{RUBY_VERSION}: no GVL events, no waiting share"
end

profiler = DdprofRecorder::Profiler.new(hz: 99, compression: :none, timeline: true, gc: true)
profiler.start
wall, cpu, gc_ns = gc_churn
truth = 100.0 * gc_ns / cpu
main = threads_of(profiler.stop.last).fetch("main")
got = 100.0 * main[:gc] / wall
results[:gc] = { measured: got.round(1), truth: truth.round(1), points: (got - truth).round(1) }
printf("%-8s %-8s measured %5.1f%%  truth %5.1f%%  %+5.1f points\n", "main", "gc", got, truth, got - truth)
puts JSON.generate(results)
