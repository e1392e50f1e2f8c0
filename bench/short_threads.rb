# frozen_string_literal: true

# Short-lived threads under the profiler: how much of the process's CPU is in neither the
# profile's cpu-time nor the profiler's own counters (stats[:sampler_cpu_ns] and
# stats[:trigger_cpu_ns])? Issue 20, item 9: with 5,000 threads of 4 ms each, 3.2-3.9% of it on
# Ruby 3.1.2 before the thread-end accounting (ext/ddprof_recorder/src/sampling/thread_end.rs).
#
#   ruby bench/short_threads.rb [--threads N] [--ms M] [--at-once K] [--hz N] [--runs R]
#                               [--long] [--no-signals]
#
# Each run starts N threads, K at a time, each spinning M ms on its own CPU clock, under a
# profiler started just before (the process's CPU clock is read right before start and
# right before stop, whose own work is not charged to the program). --long runs K long-lived
# threads doing the same total work instead, the comparison. The gap is the process's CPU
# less the profile's cpu-time and the two counters. Prints a table and, as its last line,
# one JSON object.
$LOAD_PATH.unshift(File.expand_path("../lib", __dir__))
require "ddprof_recorder"
require "json"
require "optparse"

options = { threads: 5000, ms: 4.0, at_once: 1, hz: 99, runs: 3, long: false, signals: true }
OptionParser.new do |o|
  o.on("--threads N", Integer) { |v| options[:threads] = v }
  o.on("--ms M", Float, "CPU each thread spins") { |v| options[:ms] = v }
  o.on("--at-once K", Integer, "threads running at a time") { |v| options[:at_once] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
  o.on("--runs R", Integer) { |v| options[:runs] = v }
  o.on("--long", "K long-lived threads doing the same work") { options[:long] = true }
  o.on("--no-signals", "sampling at interrupt checks") { options[:signals] = false }
end.parse!

def process_cpu_ns = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)

def spin(seconds)
  deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
  x = 0
  x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
  x
end

def short_threads(count, seconds, at_once)
  queue = Queue.new
  count.times { queue << true }
  at_once.times { queue << nil }
  starters = Array.new(at_once) do
    Thread.new do
      while queue.pop
        Thread.new { spin(seconds) }.join
      end
    end
  end
  starters.each(&:join)
end

def long_threads(count, seconds, at_once)
  per_thread = count / at_once
  Array.new(at_once) { Thread.new { per_thread.times { spin(seconds) } } }.each(&:join)
end

rows = Array.new(options[:runs]) do
  profiler = DdprofRecorder::Profiler.new(hz: options[:hz], signals: options[:signals])
  before = process_cpu_ns
  profiler.start
  if options[:long]
    long_threads(options[:threads], options[:ms] / 1000.0, options[:at_once])
  else
    short_threads(options[:threads], options[:ms] / 1000.0, options[:at_once])
  end
  process = process_cpu_ns - before
  pprof = profiler.stop.last
  stats = profiler.stats
  profile = DdprofRecorder.summary(pprof)[:totals]["cpu-time"]
  own = stats[:sampler_cpu_ns] + stats[:trigger_cpu_ns]
  gap = process - profile - own
  { process_ns: process, profile_ns: profile, own_ns: own, gap_ns: gap, gap_share: gap.to_f / process,
    thread_ends: stats[:thread_ends], accounting: stats[:thread_end_accounting] }
end

puts format("Ruby %s%s, %d threads of %.1f ms, %d at once%s, %d Hz",
            RUBY_VERSION, defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? " --yjit" : "",
            options[:threads], options[:ms], options[:at_once], options[:long] ? " (long-lived instead)" : "",
            options[:hz])
puts format("%-4s %10s %10s %8s %9s %7s %7s %8s", "run", "process s", "profile s", "own s", "gap s", "gap %",
            "ends", "exits")
rows.each_with_index do |r, i|
  puts format("%-4d %10.3f %10.3f %8.3f %9.4f %6.2f%% %7d %8s", i + 1, r[:process_ns] / 1e9, r[:profile_ns] / 1e9,
              r[:own_ns] / 1e9, r[:gap_ns] / 1e9, 100 * r[:gap_share], r[:thread_ends] || 0,
              r.dig(:accounting, :exits) || "-")
end
shares = rows.map { |r| r[:gap_share] }.sort
puts JSON.generate(ruby: RUBY_VERSION, yjit: defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? true : false,
                   options: options, median_gap_share: shares[shares.size / 2], runs: rows)
