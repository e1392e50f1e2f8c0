# frozen_string_literal: true

# A Thread#raise and Timeout storm under the profiler: does every interrupt that another
# thread sends reach the program, never the profiler's job? (Issue 19: on Ruby 3.4, 1 of 200
# raises was once swallowed by the sampling job's handler.)
#
#   ruby bench/interrupt_storm.rb [--rounds N] [--width W] [--hz N] [--allocations] [--no-signals]
#
# Each round starts 2W busy threads, lets them run 20-40 ms, then raises into W of them while
# a Timeout of 20-40 ms ends each of the other W: rounds x W interrupts of each kind (1,000 by
# default, so 2,000 in all; about 0.2 s each, as each waits for time slices). A victim that has not ended 2 s later lost its interrupt (it is then told to stop
# by a flag, and counted). Prints a table and, as its last line, one JSON object; exits 1 if
# an interrupt was lost.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "ddprof_recorder"
require "json"
require "optparse"
require "timeout"

options = { rounds: 500, width: 2, hz: 999, allocations: false, signals: true }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--width W", Integer) { |v| options[:width] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
  o.on("--allocations", "sample allocations too") { options[:allocations] = true }
  o.on("--no-signals", "safepoint sampling") { options[:signals] = false }
end.parse!

def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

# Ruby bytecode with cheap C calls and allocations, so that the sampling job and the
# allocation job run often in it. It never blocks: the victims and the main thread take the
# GVL from each other at the end of Ruby's 100 ms time slices, at an interrupt check, which
# may be one inside a job. That is when a Thread#raise can land in the job.
def busy
  n = 0
  200.times { |i| n += [i, i.to_s].size }
  n
end

stop = false
lost = Hash.new(0)
profiler = DdprofRecorder::Profiler.new(hz: options[:hz], signals: options[:signals],
                                        allocations: options[:allocations], compression: :none)
profiler.start
started_at = monotonic
options[:rounds].times do
  ready = Queue.new
  victims = Array.new(options[:width]) do
    [:raise, Thread.new do
      ready << true
      busy until stop
      :missed
    rescue RuntimeError
      :raised
    end]
  end
  victims += Array.new(options[:width]) do
    [:timeout, Thread.new do
      ready << true
      Timeout.timeout(0.02 + rand * 0.02) { busy until stop }
      :missed
    rescue Timeout::Error
      :raised
    end]
  end
  victims.size.times { ready.pop }
  sleep(0.02 + rand * 0.02)
  victims.each { |kind, thread| thread.raise(RuntimeError, "storm") if kind == :raise }
  deadline = monotonic + 2
  victims.each { |kind, thread| lost[kind] += 1 unless thread.join([deadline - monotonic, 0].max) }
  stop = true
  victims.each { |_, thread| thread.join }
  stop = false
end
seconds = monotonic - started_at
stats = profiler.stats
native = DdprofRecorder::Profiler._native_sampling_stats
profiler.stop

total = lost.values.sum
puts format("%-28s %s", "Ruby", "#{RUBY_VERSION}#{" +YJIT" if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?}")
puts format("%-28s %d of each kind (%d rounds, %.1f s)", "interrupts", options[:rounds] * options[:width],
            options[:rounds], seconds)
puts format("%-28s %d raise, %d timeout", "lost", lost[:raise], lost[:timeout])
puts format("%-28s %s", "sampling", stats[:sampling_mode])
puts format("%-28s %d", "samples", stats[:on_cpu_samples].to_i + stats[:signal_samples].to_i)
puts format("%-28s %d", "allocation samples", stats[:allocations][:recorded].to_i) if options[:allocations]
puts format("%-28s %d of %d", "jobs deferring interrupts", native[:jobs_deferring_interrupts],
            native[:jobs_deferring_interrupts] + native[:interrupt_deferral_refused])
puts JSON.generate(
  ruby: RUBY_VERSION, yjit: defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? true : false,
  rounds: options[:rounds], width: options[:width], hz: options[:hz], allocations: options[:allocations],
  signals: options[:signals], lost_raise: lost[:raise], lost_timeout: lost[:timeout],
  lost: total, seconds: seconds.round(1), deferred: native[:jobs_deferring_interrupts],
  refused: native[:interrupt_deferral_refused]
)
exit(total.zero? ? 0 : 1)
