# frozen_string_literal: true

# What the profiler's own work costs in a server's shape: a pool of threads that each wake for
# a short request (sleep, then a little Ruby work, as a Puma thread serving a route that waits
# on I/O), and busy threads beside them (a route that computes 10 ms a request). Between two wall passes most
# pool threads have run a little and blocked again, so each pass reads their stacks
# (ThreadSampler#sample_other). Reports the profiler's own CPU (stats[:sampler_cpu_ns]) per
# pass and as a share of the process's CPU, and the pool's requests per second.
#
#   ruby bench/pool_passes.rb [--pool 8] [--busy 2] [--seconds 4] [--runs 3] [--hz 99]
#
# Each run is a fresh process. Prints one line per run and, last, one JSON object. Compare two
# trees by running them in turn (the machine's noise is ±15–20%: alternate, and several runs).
require "json"
require "optparse"
require "rbconfig"

options = { pool: 8, busy: 2, seconds: 4.0, runs: 3, hz: 99 }
OptionParser.new do |o|
  o.on("--pool N", Integer, "threads that sleep 10 ms, then work ~0.3 ms") { |v| options[:pool] = v }
  o.on("--busy N", Integer, "threads that compute 10 ms at a time") { |v| options[:busy] = v }
  o.on("--seconds S", Float) { |v| options[:seconds] = v }
  o.on("--runs N", Integer) { |v| options[:runs] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
  o.on("--child") { options[:child] = true }
end.parse!

# A request's work: ~0.3 ms of Ruby method calls, a few frames deep.
module PoolWork
  module_function

  def handle(depth)
    return render if depth.zero?

    handle(depth - 1)
  end

  def render
    (1..300).map { |i| i.to_s }.join(",").size
  end
end

def child(options)
  $LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
  require "ddprof_recorder"
  stop = false
  requests = Array.new(options[:pool], 0)
  pool = Array.new(options[:pool]) do |i|
    Thread.new do
      until stop
        sleep 0.01
        PoolWork.handle(20)
        requests[i] += 1
      end
    end
  end
  # A computing route's requests: 10 ms of CPU each, then the thread blocks briefly (as on
  # its socket), so that the pool's threads get the GVL between them.
  busy = Array.new(options[:busy]) do
    Thread.new do
      until stop
        x = 0
        t = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.01
        x = (x * 31 + 7) % 1_000_003 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < t
        sleep 0.0005
      end
    end
  end
  profiler = DdprofRecorder::Profiler.new(hz: options[:hz], compression: :none)
  cpu0 = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)
  profiler.start
  sleep options[:seconds]
  stats = profiler.stats
  cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond) - cpu0
  stop = true
  (pool + busy).each(&:join)
  profiler.stop
  puts JSON.generate(passes: stats[:passes], sampler_cpu_ns: stats[:sampler_cpu_ns], process_cpu_ns: cpu,
                     requests: requests.sum)
end

if options[:child]
  child(options)
  exit
end

args = options.reject { |k, _| k == :runs }.flat_map { |k, v| ["--#{k}", v.to_s] }
runs = Array.new(options[:runs]) do |i|
  out = IO.popen([RbConfig.ruby, __FILE__, "--child", *args], &:read)
  r = JSON.parse(out.lines.last, symbolize_names: true)
  r[:us_per_pass] = (r[:sampler_cpu_ns] / 1e3 / r[:passes]).round(1)
  r[:pct_of_process_cpu] = (100.0 * r[:sampler_cpu_ns] / r[:process_cpu_ns]).round(3)
  r[:requests_per_s] = (r[:requests] / options[:seconds]).round(1)
  puts format("run %d: %d passes, own CPU %.1f ms = %.1f us a pass, %.2f%% of the process's CPU; pool %.1f requests/s",
              i + 1, r[:passes], r[:sampler_cpu_ns] / 1e6, r[:us_per_pass], r[:pct_of_process_cpu], r[:requests_per_s])
  r
end
median = ->(a) { a.sort[a.size / 2] }
puts JSON.generate(bench: "pool_passes", ruby: RUBY_VERSION, **options.except(:child),
                   median_us_per_pass: median.call(runs.map { |r| r[:us_per_pass] }),
                   median_pct_of_process_cpu: median.call(runs.map { |r| r[:pct_of_process_cpu] }), runs: runs)
