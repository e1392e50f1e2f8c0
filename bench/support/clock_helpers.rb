# frozen_string_literal: true

# The clocks that the timeline's truths are measured with, read by the calling thread, the
# GC truth's allocation-heavy loop, and a busy loop that keeps it on a CPU. Included by bench/timeline_truth.rb and by the specs that
# check the same truths (spec/profiler/thread_states_spec.rb, gvl_wait_spec.rb); a spec's
# child program defines what it needs in its own source.
module ClockHelpers
  def mono_ns = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)

  def thread_cpu_ns = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)

  # Ns the calling thread spent runnable but not on a CPU, as the kernel counts it.
  def runqueue_ns = Integer(File.read("/proc/thread-self/schedstat").split[1])

  # The GC truth's program, an allocation-heavy loop (strings kept for a while: old objects to
  # mark; hashes dropped at once), timed: `[wall ns, this thread's CPU ns, GC.stat(:time) in
  # ns]` over it. GC.stat(:time) is the process's CPU time in the GC (Ruby's gc.c,
  # gc_clock_start: current_process_time), all of it on this thread here.
  def gc_churn
    gc_ms = GC.stat(:time)
    cpu = thread_cpu_ns
    wall = mono_ns
    keep = []
    150_000.times do |i|
      keep << (("x" * 100) + i.to_s)
      keep.shift if keep.size > 50_000
      { a: i, b: [i] }
    end
    wall = mono_ns - wall
    cpu = thread_cpu_ns - cpu
    [wall, cpu, (GC.stat(:time) - gc_ms) * 1_000_000]
  end

  # Spins for `ns` of wall time on the monotonic clock; returns the loop count.
  def busy_for(ns)
    from = mono_ns
    x = 0
    x += 1 while mono_ns - from < ns
    x
  end
end
