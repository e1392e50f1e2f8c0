# frozen_string_literal: true

# Continuous profiling to a directory, as a forking server does it (README, "Continuous
# profiling to a directory"): the master starts the profiler with `directory:`, forks two
# "workers" that crunch for SECONDS (default 3), and each process writes a window every
# second to tmp/profiles (the workers under their own pids: the profiler follows fork).
#
#   ruby examples/to_directory.rb
#   exe/ddprof-recorder merge -o tmp/all.pb.gz tmp/profiles/*.pb.gz
require_relative "../lib/ddprof_recorder"
require_relative "hot_spot"

seconds = Float(ENV.fetch("SECONDS", "3"))
DdprofRecorder::Profiler.start(
  interval: 1,
  exporter: DdprofRecorder::DirectoryExporter.new("tmp/profiles", keep: 10, min_free_bytes: 100 << 20)
)
workers = Array.new(2) do
  fork do
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    HotSpot.work(200_000) while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    DdprofRecorder::Profiler.stop # the last window, as a worker does at shutdown
  end
end
workers.each { |pid| Process.wait(pid) }
DdprofRecorder::Profiler.stop
puts "to_directory: #{Dir.children('tmp/profiles').size} windows in tmp/profiles"
