# frozen_string_literal: true

# What application labels cost the thread that sets them (issue 39: "setting and restoring
# labels costs <= 1 us"): per operation, the time and the Ruby objects allocated, over N
# iterations, in rounds that alternate with an empty loop of the same length (the loop's own
# cost is subtracted). The profiler samples at --hz while it runs, as in production (the
# sampler's reads of the slot are its cost, not the setter's).
#
#   ruby bench/labels_cost.rb [--rounds 7] [--iterations 200000] [--hz 99]
#
# Prints one line per round and the medians, then one JSON object.
require "json"
require "optparse"
require_relative "../lib/ddprof_recorder"

options = { rounds: 7, iterations: 200_000, hz: 99 }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--iterations N", Integer) { |v| options[:iterations] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
end.parse!

def now_ns = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)

LABELS = { "tenant" => "acme", "plan" => "pro" }.freeze
# Each operation, as a lambda that runs it `n` times.
OPERATIONS = {
  "with_labels (2 labels) + restore" => ->(n) { n.times { DdprofRecorder.with_labels(LABELS) { nil } } },
  "push_labels + pop_labels" => lambda do |n|
    n.times { DdprofRecorder.pop_labels(DdprofRecorder.push_labels(LABELS)) }
  end,
  "endpoint span push + pop" => lambda do |n|
    labels = DdprofRecorder::Labels
    n.times { labels.pop(labels.push_span(labels.next_span_id)) }
  end,
  "empty loop" => ->(n) { n.times { nil } }
}.freeze

# ns and objects per iteration of `operation`, n iterations.
def measure(operation, n)
  GC.start
  objects = GC.stat(:total_allocated_objects)
  started = now_ns
  operation.call(n)
  [(now_ns - started).fdiv(n), (GC.stat(:total_allocated_objects) - objects).fdiv(n)]
end

def median(values) = values.sort[values.size / 2]

n = options[:iterations]
profiler = DdprofRecorder::Profiler.new(hz: options[:hz]).start
puts "labels cost: #{options[:rounds]} rounds of #{n} iterations, profiler at #{options[:hz]} Hz, " \
     "Ruby #{RUBY_VERSION}, load average #{File.read('/proc/loadavg').split.first}"
results = Hash.new { |h, k| h[k] = { ns: [], objects: [] } }
options[:rounds].times do |round|
  names = OPERATIONS.keys
  names = names.reverse if round.odd?
  measured = names.to_h { |name| [name, measure(OPERATIONS[name], n)] }
  empty_ns = measured["empty loop"][0]
  measured.each do |name, (ns, objects)|
    next if name == "empty loop"

    results[name][:ns] << (ns - empty_ns)
    results[name][:objects] << objects
  end
  puts "round #{round + 1}: " + measured.except("empty loop").map { |name, (ns, _)| format("%s %.0f ns", name, ns - empty_ns) }.join(", ")
end
profiler.stop
summary = results.to_h do |name, r|
  [name, { ns_median: median(r[:ns]).round, ns_min: r[:ns].min.round, ns_max: r[:ns].max.round,
           objects: median(r[:objects]).round(2) }]
end
summary.each do |name, r|
  printf("%-34s median %5d ns (%d-%d), %.2f objects\n", name, r[:ns_median], r[:ns_min], r[:ns_max], r[:objects])
end
puts JSON.generate(summary)
