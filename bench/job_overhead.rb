# frozen_string_literal: true

# Where a busy loop's extra CPU under the profiler comes from: the loop's own CPU (its thread's
# clock) with no profiler, with the native trigger and postponed job but a Ruby handler that
# returns at once (`nop`), and with the real profiler at 99 Hz with and without signals and
# with signals at 1 Hz (the handler runs at every kernel tick, the jobs almost never). The
# kinds alternate in a shuffled order, in one process; medians over the rounds.
#
#   ruby bench/job_overhead.rb [--rounds 7] [--iterations 40000000]
#
# Prints each kind against none, then one JSON line.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "ddprof_recorder"
require "json"
require "optparse"

options = { rounds: 7, iterations: 40_000_000 }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--iterations N", Integer) { |v| options[:iterations] = v }
end.parse!

def work(n)
  x = 0
  i = 0
  while i < n
    x = ((x * 31) + i) % 1_000_003
    i += 1
  end
  x
end

# The profiler's handler interface (ThreadSampler's `call` and `signal_samples`), doing nothing.
class NopHandler
  def call(_on_time, _cpu_ns, _now_ns) = true
  def signal_samples(_samples, _job_cpu_ns, _now_ns) = false
end

KINDS = {
  "none" => nil,
  "nop trigger 99 Hz" => 99,
  "nop trigger 999 Hz" => 999,
  "profiler 99 Hz" => { hz: 99 },
  "profiler 99 Hz, signals: false" => { hz: 99, signals: false },
  "profiler 1 Hz" => { hz: 1 },
}.freeze

cpu = -> { Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) }
owner = Object.new
times = Hash.new { |h, k| h[k] = [] }
work(options[:iterations] / 20) # warm-up
options[:rounds].times do
  KINDS.to_a.shuffle.each do |name, how|
    wake_reader, wake_writer = IO.pipe
    profiler = nil
    case how
    when Integer
      # hz, handler, wake fd, signal mode (:off: the trigger's jobs only), ticks, owner, yjit.
      DdprofRecorder::Profiler._native_sampling_start(how, NopHandler.new, wake_writer.fileno, :off, :cpu, owner, false)
    when Hash then profiler = DdprofRecorder::Profiler.new(**how, compression: :none).start
    end
    started = cpu.call
    work(options[:iterations])
    times[name] << cpu.call - started
    DdprofRecorder::Profiler._native_sampling_stop(owner) if how.is_a?(Integer)
    profiler&.stop
    [wake_reader, wake_writer].each(&:close)
  end
end
median = ->(xs) { xs.sort[xs.size / 2] }
base = median.call(times["none"])
KINDS.each_key do |name|
  printf "%-32s %.3f s of the loop's CPU  %+6.1f%%\n", name, median.call(times[name]), (median.call(times[name]) / base - 1) * 100
end
puts JSON.generate(bench: "job_overhead", ruby: RUBY_VERSION, rounds: options[:rounds],
                   median_s: KINDS.keys.to_h { |k| [k, median.call(times[k]).round(4)] })
