# frozen_string_literal: true

# Clocks, medians and the load average, shared by bench/allocations.rb,
# bench/profiler_rate.rb and bench/profiler_overhead.rb.
module BenchMeasure
  module_function

  def monotonic_ns
    Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  end

  def thread_cpu_ns
    Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)
  end

  def process_cpu_ns
    Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)
  end

  # The median of the values that are not nil (the mean of the middle two for an even count);
  # nil if there are none.
  def median(values)
    sorted = values.compact.sort
    return nil if sorted.empty?

    mid = sorted.size / 2
    sorted.size.odd? ? sorted[mid] : (sorted[mid - 1] + sorted[mid]) / 2.0
  end

  # The 1, 5 and 15 minute load averages, as /proc/loadavg gives them ("?" without it).
  def load_average
    File.read("/proc/loadavg").split.first(3).join(" ")
  rescue SystemCallError
    "?"
  end
end
