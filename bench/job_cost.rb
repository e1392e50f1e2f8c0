# frozen_string_literal: true

# What one sampling job costs the thread it runs on, with warm caches (called in a loop) and
# with cold ones (16 MB walked between two calls, as a program's own work does between two
# jobs): the signal sample's job (`ThreadSampler#signal_samples`, one sample, with and
# without the wall pass) and the trigger's job on an armed thread (`ThreadSampler#call`, a
# pass), plus a few of their native calls alone.
#
#   ruby bench/job_cost.rb [--calls 1500] [--idle-threads 10] [--after-work 0.1,1,10]
#
# --after-work MS,...: also, for each MS, the cost after MS milliseconds of a tight integer
# loop that touches no memory (examples/hot_spot.rb's shape), in place of the 16 MB walk: what
# a job costs after the program merely ran for a while. `nothing` (two clock reads around an
# empty call) is the floor to take off every figure.
#
# The profiler runs at 1 Hz meanwhile, so that its own jobs stay out of the way. Prints µs a
# call (this thread's CPU clock), then one JSON line.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "ddprof_recorder"
require "json"
require "optparse"

options = { calls: 1500, idle_threads: 10, after_work: [] }
OptionParser.new do |o|
  o.on("--calls N", Integer) { |v| options[:calls] = v }
  o.on("--idle-threads N", Integer) { |v| options[:idle_threads] = v }
  o.on("--after-work MS", Array, "milliseconds of a tight loop between two calls") do |v|
    options[:after_work] = v.map { |ms| Float(ms) }
  end
end.parse!

# Spins for `ms` of this thread's CPU, on registers alone.
def spin(ms)
  stop = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + (ms / 1e3)
  x = 0
  x = ((x * 31) + 7) % 1_000_003 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < stop
  x
end

queue = Thread::Queue.new
idle = Array.new(options[:idle_threads]) { Thread.new { queue.pop } }
profiler = DdprofRecorder::Profiler.new(hz: 1, compression: :none).start
sampler = profiler.instance_variable_get(:@sampler) # the sampler's own entry points
tid = Thread.current.native_thread_id
key = tid + (1 << 32) # the first signal-sample key of this thread (sampling/signal_sampler/samples.rs, `key`)
recorder = DdprofRecorder::StackRecorder.new(value_types: DdprofRecorder::Profiler::VALUE_TYPES)
labels = [["thread id", "1 (8)"].freeze, ["thread name", "main"].freeze].freeze
cpu = -> { Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond) }
mono = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) }
evict = "x" * (16 << 20)

def deep(depth, &block) = depth.zero? ? block.call : deep(depth - 1, &block)

results = {}
deep(20) do
  depth = DdprofRecorder::Profiler._native_capture_stack(key)
  cases = {
    "nothing" => -> {},
    "signal job, one sample" => lambda {
      sampler.instance_variable_set(:@last_pass_ns, mono.call) # no pass due
      c = cpu.call
      sampler.signal_samples([tid, c, mono.call, depth, key], c, mono.call)
    },
    "signal job + wall pass" => lambda {
      sampler.instance_variable_set(:@last_pass_ns, 0) # a pass due
      c = cpu.call
      sampler.signal_samples([tid, c, mono.call, depth, key], c, mono.call)
    },
    "trigger job (a pass)" => -> { sampler.call(true, cpu.call, mono.call) },
    "_native_capture_stack" => -> { DdprofRecorder::Profiler._native_capture_stack(key) },
    "_native_record_captured" => -> { recorder._native_record_captured(key, [1000, 1, 2000], labels) },
    "Thread.list" => -> { Thread.list },
  }
  cases.each do |name, call|
    columns = [:warm, :cold, *options[:after_work].map { |ms| :"after #{ms} ms" }]
    results[name] = columns.to_h do |caches|
      ms = options[:after_work][columns.index(caches) - 2] if columns.index(caches) >= 2
      # The slow columns take fewer calls: 10 ms of loop a call is 15 s at 1,500.
      calls = ms && ms >= 1 ? [options[:calls] / 5, 50].max : options[:calls]
      total = 0
      calls.times do
        evict.sum if caches == :cold
        spin(ms) if ms
        started = cpu.call
        call.call
        total += cpu.call - started
      end
      [caches, (total / 1e3 / calls).round(1)]
    end
    printf "%-26s %s\n", name, results[name].map { |k, v| format("%s %7.1f µs", k, v) }.join("   ")
  end
end
profiler.stop
queue.close
idle.each(&:join)
puts JSON.generate(bench: "job_cost", ruby: RUBY_VERSION, calls: options[:calls], us: results)
