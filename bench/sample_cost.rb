# frozen_string_literal: true

# What one on-CPU sample of the profiler costs: reading the current thread's stack and
# recording it, at a stack depth of --depth frames (default 61, the medium workload's), the
# native way the sampling job does it (`Profiler._native_capture_stack` +
# `StackRecorder#_native_record_captured`) and the Ruby way the first profiler did
# (`caller_locations` + `record_sample` with Locations), alternating, in one process.
#
#   ruby bench/sample_cost.rb [--depth 61] [--iterations 20000] [--rounds 5]
#
# Prints µs per sample (median over rounds) and Ruby objects allocated per sample, then one
# JSON line.
require "json"
require "optparse"
require_relative "../lib/ddprof_recorder"

options = { depth: 61, iterations: 20_000, rounds: 5 }
OptionParser.new do |o|
  o.on("--depth N", Integer) { |v| options[:depth] = v }
  o.on("--iterations N", Integer) { |v| options[:iterations] = v }
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
end.parse!

LABELS = [["thread id", "1 (8)"].freeze, ["thread name", "main"].freeze].freeze
VALUES = [1_000, 1, 10_000_000].freeze
KEY = Thread.current.native_thread_id

# Calls `yield` `depth` frames down (each frame its own line of this method).
def deep(depth, &block)
  depth <= 1 ? yield : deep(depth - 1, &block)
end

def native_sample(recorder)
  Profiler._native_capture_stack(KEY)
  recorder._native_record_captured(KEY, VALUES, LABELS)
end

def ruby_sample(recorder)
  recorder.record_sample(caller_locations(1), VALUES, LABELS)
end

Profiler = DdprofRecorder::Profiler

def measure(kind, depth, iterations)
  recorder = DdprofRecorder::StackRecorder.new(compression: :none)
  deep(depth - 3) do # -3: `measure`'s block, `deep`'s own frame and the sample method
    send(kind, recorder) # warm up: caches, interned strings
    GC.disable
    allocated = GC.stat(:total_allocated_objects)
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    i = 0
    while i < iterations
      send(kind, recorder)
      i += 1
    end
    elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - t0
    allocations = GC.stat(:total_allocated_objects) - allocated
    GC.enable
    [elapsed / 1000.0 / iterations, (allocations - 1).fdiv(iterations)]
  end
end

results = Hash.new { |h, k| h[k] = [] }
options[:rounds].times do
  %i[native_sample ruby_sample].each { |kind| results[kind] << measure(kind, options[:depth], options[:iterations]) }
end
median = ->(xs) { xs.sort[xs.size / 2] }
load_average = File.read("/proc/loadavg").split.first rescue "?"
puts "sample cost at depth #{options[:depth]}, #{options[:iterations]} samples x #{options[:rounds]} rounds, load average #{load_average}"
summary = results.to_h do |kind, rs|
  us = median.call(rs.map(&:first))
  allocs = median.call(rs.map(&:last))
  puts format("  %-14s %7.2f µs per sample (min %.2f), %.2f Ruby objects per sample", kind, us, rs.map(&:first).min, allocs)
  [kind, { median_us: us.round(3), min_us: rs.map(&:first).min.round(3), objects_per_sample: allocs.round(3) }]
end
ratio = summary[:ruby_sample][:median_us] / summary[:native_sample][:median_us]
puts format("  native is %.1fx faster", ratio)
puts JSON.generate(bench: "sample_cost", depth: options[:depth], load_average: load_average, ratio: ratio.round(2), **summary)
