# frozen_string_literal: true

# The accuracy workloads' own account of where their CPU time goes: each call of a leaf
# function is wrapped in `AccuracyTruth.measure("name") { ... }`, which adds the CPU time the
# calling thread used during the block (its CPU clock, CLOCK_THREAD_CPUTIME_ID) to `name`.
# A profiler's self time of `name` should be that share. The two clock reads cost about 1 µs
# per call, against calls of 0.3 ms or more.
#
# With ACCURACY_TRUTH_OUT set, writes at exit a JSON object:
#   {"measured_ns": {"name": ns, ...}, "process_cpu_ns": ns}
# process_cpu_ns is the process's CPU time at exit (start-up and the profiler's own work
# included), to show how much of it the measured calls cover.
require "json"

module AccuracyTruth
  @tables = []
  @lock = Mutex.new

  class << self
    # Runs the block and charges the CPU time the current thread used in it to `name`.
    #
    # @param name [String] the leaf function the block spends its time in.
    # @return whatever the block returns.
    def measure(name)
      table = Thread.current.thread_variable_get(:accuracy_truth) || register
      started = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)
      result = yield
      table[name] += Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond) - started
      result
    end

    # @return [Hash{String => Integer}] nanoseconds per name, all threads added up.
    def measured_ns
      @lock.synchronize do
        @tables.each_with_object(Hash.new(0)) { |table, sum| table.each { |name, ns| sum[name] += ns } }
      end
    end

    private

    # One table per thread, so that threads never update the same Hash.
    def register
      table = Hash.new(0)
      Thread.current.thread_variable_set(:accuracy_truth, table)
      @lock.synchronize { @tables << table }
      table
    end
  end
end

if (out = ENV["ACCURACY_TRUTH_OUT"])
  at_exit do
    File.write(out, JSON.generate(measured_ns: AccuracyTruth.measured_ns,
                                  process_cpu_ns: Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)))
  end
end
