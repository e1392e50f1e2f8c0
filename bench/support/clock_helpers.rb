# frozen_string_literal: true

# The clocks that the timeline's truths are measured with, read by the calling thread, and a
# busy loop that keeps it on a CPU. Included by bench/timeline_truth.rb and by the specs that
# check the same truths (spec/profiler/thread_states_spec.rb, gvl_wait_spec.rb); a spec's
# child program defines what it needs in its own source.
module ClockHelpers
  def mono_ns = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)

  def thread_cpu_ns = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)

  # Ns the calling thread spent runnable but not on a CPU, as the kernel counts it.
  def runqueue_ns = Integer(File.read("/proc/thread-self/schedstat").split[1])

  # Spins for `ns` of wall time on the monotonic clock; returns the loop count.
  def busy_for(ns)
    from = mono_ns
    x = 0
    x += 1 while mono_ns - from < ns
    x
  end
end
