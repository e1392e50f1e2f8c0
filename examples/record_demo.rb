# frozen_string_literal: true

# Records real stacks of a small Ruby program with DdprofRecorder::StackRecorder and writes a
# gzip pprof. A minimal sampler: every 10 ms it takes each other thread's backtrace and
# records it with the wall time since the previous sample (and the process CPU time, split
# evenly, as a rough cpu-time; the Profiler measures each thread's own CPU clock).
#
#   ruby -Ilib examples/record_demo.rb [OUT=profile.pb.gz]
require "ddprof_recorder"

out = ARGV.fetch(0, "profile.pb.gz")
recorder = DdprofRecorder::StackRecorder.new(compression: :gzip)

def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)

def checksum(rounds)
  rounds.times.reduce(0) { |acc, i| (acc * 31 + i.to_s.sum) % 1_000_003 }
end

def for_a_second
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1.0
  yield while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
end

workers = [
  Thread.new { Thread.current.name = "fib"; for_a_second { fib(18) } },
  Thread.new { Thread.current.name = "checksum"; for_a_second { checksum(2_000) } },
  Thread.new { Thread.current.name = "sleeper"; sleep 1.0 },
]

samples = 0
interval_ns = 10_000_000
last_wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
last_cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)
while workers.any?(&:alive?)
  sleep interval_ns / 1e9
  now_wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  now_cpu = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)
  live = workers.select(&:alive?)
  live.each do |thread|
    locations = thread.backtrace_locations
    next if locations.nil? || locations.empty?

    running = thread.status == "run"
    cpu = running ? (now_cpu - last_cpu) / live.count { |t| t.status == "run" } : 0
    recorder.record_sample(
      locations,
      { "cpu-time" => cpu, "cpu-samples" => running ? 1 : 0, "wall-time" => now_wall - last_wall },
      { "thread id" => thread.object_id.to_s, "thread name" => thread.name.to_s },
    )
    samples += 1
  end
  last_wall = now_wall
  last_cpu = now_cpu
end

start, finish, pprof = recorder.serialize
File.binwrite(out, pprof)
puts "recorded #{samples} samples from #{workers.size} threads over #{(finish - start).round(2)} s"
puts "wrote #{out} (#{pprof.bytesize} bytes, gzip pprof)"
