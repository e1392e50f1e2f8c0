# frozen_string_literal: true

# Ruby-level benchmark of DdprofRecorder::StackRecorder (issue 3), side by side in one process
# with a pure-Ruby recorder (a Hash of stacks plus google-protobuf encoding) on the same input.
#
#   bench/run ruby WORKLOAD.json      (or: ruby -Ilib bench/ruby_bench.rb WORKLOAD.json)
#
# Prints a table and, as its last line, one JSON object.
require "json"
require "tmpdir"
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "ddprof_recorder"

workload_path = ARGV.fetch(0) { abort "usage: ruby bench/ruby_bench.rb WORKLOAD.json [--reps N]" }
reps = (ARGV.index("--reps") && Integer(ARGV[ARGV.index("--reps") + 1])) || 5
workload = JSON.parse(File.read(workload_path))
value_types = workload.fetch("value_types")
frames = workload.fetch("frames").map { |name, file, line| [name.freeze, file.freeze, line].freeze }
stacks = workload.fetch("stacks").map { |ids| ids.map { |i| frames[i] }.freeze }
samples = workload.fetch("samples").map do |stack, values, labels|
  [stacks[stack], values.freeze, labels.map { |k, s, n| [k.freeze, s ? s.freeze : n].freeze }.freeze]
end
endpoints = workload.fetch("endpoints")

def now_ns = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)

def median(xs) = xs.sort[xs.size / 2]

def allocations
  GC.stat(:total_allocated_objects)
end

# Runs the block `reps` times; returns [min, median] of its ns per call over n calls.
def time_per_call(reps, n)
  runs = Array.new(reps) do
    t = now_ns
    yield
    (now_ns - t).fdiv(n)
  end
  [runs.min, median(runs)]
end

results = {}
rows = []

# 1. record_sample with a fixed 61-frame stack, in each input form.
stack61 = Array.new(61) { |i| frames[i * 7 % frames.size] }.freeze
labels3 = [["thread id", "1001 (77)"], ["thread name", "worker-1"], ["local root span id", 1234]].freeze
values_array = [1_000, 1, 10_000_000].freeze
values_hash = { "cpu-time" => 1_000, "cpu-samples" => 1, "wall-time" => 10_000_000 }.freeze
def deep(depth, &block) = depth.zero? ? block.call : deep(depth - 1, &block)
locations61 = deep(61) { caller_locations(0, 61) }
raise "expected 61 locations, got #{locations61.size}" unless locations61.size == 61

calls = 50_000
{
  "61-frame Array stack, Array values" => [stack61, values_array],
  "61-frame Array stack, Hash values" => [stack61, values_hash],
  "61-frame Backtrace::Location stack, Array values" => [locations61, values_array],
}.each do |name, (stack, values)|
  recorder = DdprofRecorder::StackRecorder.new
  recorder.record_sample(stack, values, labels3) # intern strings first
  GC.start
  before = allocations
  recorder.record_sample(stack, values, labels3)
  allocs = allocations - before
  min, med = time_per_call(reps, calls) { calls.times { recorder.record_sample(stack, values, labels3) } }
  rows << [name, med, med / 61, min, allocs]
  key = name.downcase.gsub(/[^a-z0-9]+/, "_").sub(/_\z/, "")
  results["#{key}_ns_per_call_median"] = med.round
  results["#{key}_ns_per_call_min"] = min.round
  results["#{key}_ruby_allocations_per_call"] = allocs
end

# 2. The workload itself: every sample through record_sample (Array stacks and values).
add_runs = Array.new(reps) do
  recorder = DdprofRecorder::StackRecorder.new
  t = now_ns
  samples.each { |stack, values, labels| recorder.record_sample(stack, values, labels) }
  (now_ns - t).fdiv(samples.size)
end
frames_per_sample = samples.sum { |stack, _, _| stack.size }.fdiv(samples.size)
results["workload_ns_per_sample_median"] = median(add_runs).round
results["workload_ns_per_frame_median"] = (median(add_runs) / frames_per_sample).round(1)

# 3. Serialization: alone (wall time of the call and the native part from stats), then a
# second Ruby thread's progress (iterations per second) while it runs, vs. its solo rate.
def filled_recorder(samples, endpoints)
  recorder = DdprofRecorder::StackRecorder.new
  samples.each { |stack, values, labels| recorder.record_sample(stack, values, labels) }
  endpoints.each { |id, endpoint| recorder.record_endpoint(id, endpoint) }
  recorder
end

serialize_runs = Array.new([reps, 3].min) do
  recorder = filled_recorder(samples, endpoints)
  t = now_ns
  _, _, pprof = recorder.serialize
  [now_ns - t, recorder.stats[:last_serialization_ns], pprof.bytesize]
end
serialize_ns = median(serialize_runs.map(&:first))
native_serialize_ns = median(serialize_runs.map { |r| r[1] })
pprof_bytes = serialize_runs.first[2]

# A second thread counts; every 1024 iterations it logs the time. Its rate over a time range
# is read from that log, so the GVL hand-offs around the measured call do not blur it.
def with_counter_log
  log = []
  stop = false
  counter = Thread.new do
    n = 0
    until stop
      n += 1
      log << now_ns if (n & 1023).zero?
    end
  end
  sleep 0.05 # the counter is running
  yield
  stop = true
  counter.join
  log
end

def rate(log, from_ns, to_ns)
  log.count { |t| t >= from_ns && t < to_ns } * 1024 / ((to_ns - from_ns) / 1e9)
end

# Longest time the counter made no progress during the whole `serialize` call: how long the
# call stops the other Ruby threads at once (GVL held, or handed back late). Its resolution is
# one log entry, 1024 iterations (tens of microseconds).
def longest_stop_ms(window)
  edges = [window[:from], *window[:log].select { |t| t > window[:from] && t < window[:to] }, window[:to]]
  edges.each_cons(2).map { |a, b| b - a }.max / 1e6
end

# Three windows of one recorder, the workload recorded anew for each: the first, then two
# whose pprof String is made beforehand from the previous window's size.
recorder = filled_recorder(samples, endpoints)
windows = Array.new(3) do |i|
  samples.each { |stack, values, labels| recorder.record_sample(stack, values, labels) } if i.positive?
  GC.start # the GC owed by what came before is not the call's
  window = { gc_ms: GC.stat(:time) }
  window[:log] = with_counter_log do
    window[:from] = now_ns
    recorder.serialize
    window[:to] = now_ns
    window[:native_to] = window[:from] + recorder.stats[:last_serialization_ns]
  end
  window[:gc_ms] = GC.stat(:time) - window[:gc_ms]
  window
end
first = windows.first
solo_from = solo_to = nil
solo_log = with_counter_log do
  solo_from = now_ns
  sleep 0.5
  solo_to = now_ns
end
progress_ratio = rate(first[:log], first[:from], first[:native_to]) / rate(solo_log, solo_from, solo_to)
results["serialize_ms_median"] = (serialize_ns / 1e6).round(1)
results["serialize_native_ms_median"] = (native_serialize_ns / 1e6).round(1)
results["pprof_bytes"] = pprof_bytes
results["second_thread_progress_ratio"] = progress_ratio.round(3)
results["second_thread_longest_stop_ms_first_window"] = longest_stop_ms(first).round(2)
results["second_thread_longest_stop_ms_later_windows"] = windows.drop(1).map { |w| longest_stop_ms(w) }.max.round(2)
results["gc_ms_during_serialize_windows"] = windows.map { |w| w[:gc_ms] }

# 4. A pure-Ruby recorder on the same input: aggregate in a Hash, encode with google-protobuf.
proto_dir = Dir.mktmpdir("ddprof_bench_proto")
proto_src = File.expand_path("../spec/support", __dir__)
system("protoc", "--proto_path=#{proto_src}", "--ruby_out=#{proto_dir}", "profile.proto") or
  abort "protoc failed on spec/support/profile.proto (apt-get install protobuf-compiler)"
require "google/protobuf"
require File.join(proto_dir, "profile_pb")

# The simplest recorder a Ruby profiler author would write: a Hash keyed by (stack, labels).
class PureRubyRecorder
  def initialize(value_types)
    @value_types = value_types
    @samples = Hash.new { |h, k| h[k] = Array.new(value_types.size, 0) }
  end

  def record_sample(stack, values, labels)
    sums = @samples[[stack, labels.sort_by(&:first)]]
    values.each_with_index { |v, i| sums[i] += v }
  end

  def serialize
    strings = { "" => 0 }
    str = ->(s) { strings[s] ||= strings.size }
    functions = {}
    locations = {}
    pb_samples = @samples.map do |(stack, labels), values|
      ids = stack.map do |name, file, line|
        function_id = functions[[name, file]] ||= functions.size + 1
        locations[[function_id, line]] ||= locations.size + 1
      end
      Perftools::Profiles::Sample.new(
        location_id: ids, value: values,
        label: labels.map { |k, v| v.is_a?(Integer) ? { key: str[k], num: v } : { key: str[k], str: str[v] } },
      )
    end
    Perftools::Profiles::Profile.encode(Perftools::Profiles::Profile.new(
      sample_type: @value_types.map { |t, u| { type: str[t], unit: str[u] } },
      sample: pb_samples,
      mapping: [{ id: 1 }],
      location: locations.map { |(function_id, line), id| { id: id, mapping_id: 1, line: [{ function_id: function_id, line: line }] } },
      function: functions.map { |(name, file), id| { id: id, name: str[name], system_name: str[name], filename: str[file] } },
      string_table: strings.keys,
    ))
  end
end

pure_add = Array.new([reps, 3].min) do
  pure = PureRubyRecorder.new(value_types)
  t = now_ns
  samples.each { |stack, values, labels| pure.record_sample(stack, values, labels) }
  add_ns = (now_ns - t).fdiv(samples.size)
  t = now_ns
  bytes = pure.serialize
  [add_ns, now_ns - t, bytes.bytesize]
end
pure_add_ns = median(pure_add.map(&:first))
pure_serialize_ns = median(pure_add.map { |r| r[1] })
results["pure_ruby_ns_per_sample_median"] = pure_add_ns.round
results["pure_ruby_serialize_ms"] = (pure_serialize_ns / 1e6).round(1)
results["speedup_vs_pure_ruby_add"] = (pure_add_ns / results["workload_ns_per_sample_median"]).round(1)
results["speedup_vs_pure_ruby_serialize"] = (pure_serialize_ns.to_f / serialize_ns).round(1)

puts "Ruby-level benchmark: #{File.basename(workload_path)} (#{samples.size} samples, " \
     "#{frames_per_sample.round(1)} frames/sample), #{reps} reps, Ruby #{RUBY_VERSION}"
puts
puts format("%-52s %12s %10s %12s %8s", "record_sample", "ns/call med", "ns/frame", "ns/call min", "allocs")
rows.each { |name, med, per_frame, min, allocs| puts format("%-52s %12.0f %10.1f %12.0f %8d", name, med, per_frame, min, allocs) }
puts
puts format("%-52s %12d ns/sample (%.1f ns/frame)", "workload, every sample", results["workload_ns_per_sample_median"], results["workload_ns_per_frame_median"])
puts format("%-52s %12d ns/sample  (%.1fx slower)", "pure-Ruby recorder, same input", results["pure_ruby_ns_per_sample_median"], results["speedup_vs_pure_ruby_add"])
puts format("%-52s %12.1f ms  (native part %.1f ms; %d bytes)", "serialize, alone", results["serialize_ms_median"], results["serialize_native_ms_median"], pprof_bytes)
puts format("%-52s %12.1f ms  (%.1fx slower)", "pure-Ruby serialize (google-protobuf)", results["pure_ruby_serialize_ms"], results["speedup_vs_pure_ruby_serialize"])
puts format("%-52s %12.1f %%", "2nd thread progress during serialize vs solo", progress_ratio * 100)
puts format("%-52s %12.2f ms (first window; later windows: %.2f ms at most)", "2nd thread's longest stop during serialize",
            results["second_thread_longest_stop_ms_first_window"], results["second_thread_longest_stop_ms_later_windows"])
puts format("%-52s %12s ms", "GC time inside those serialize calls", results["gc_ms_during_serialize_windows"].join(" / "))
puts
puts JSON.generate({ benchmark: "ruby", workload: File.basename(workload_path, ".json"), samples_in: samples.size }.merge(results))
