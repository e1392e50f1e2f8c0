# frozen_string_literal: true

# The on-CPU sampling rate of a thread that works in bursts: it burns --burst ms of CPU, then
# waits --wait ms in IO.select, --cycles times (a Unicorn or Puma worker's shape: a request's
# work, then the wait for the next). A sampler that is right gets `hz` samples per second of
# the thread's CPU, whatever the shape and the load. Each run is a fresh process; the kinds
# of ticks (--ticks: `auto`, the default, perf events where the kernel allows them, see
# Profiler#initialize; `cpu`, the CPU-clock timers) take turns, run after run. With
# --load N, N busy processes (`yes`-like Ruby loops, niced 0) compete for the CPUs during
# every run, so that the thread is preempted and waits for a CPU.
#
#   ruby bench/bursty_rate.rb [--hz 99,999] [--runs 3] [--burst 10] [--wait 20] [--cycles 100]
#                             [--load 2] [--ticks auto,cpu]
#
# Prints, per hz and ticks, each run's signal samples per CPU-second of the thread, and the
# median; its last line is one JSON object.
require "json"
require "optparse"
require "rbconfig"

options = { hz: [99, 999], runs: 3, burst: 10, wait: 20, cycles: 100, load: 0, ticks: %i[auto cpu] }
OptionParser.new do |o|
  o.on("--hz LIST", Array) { |v| options[:hz] = v.map { |h| Integer(h) } }
  o.on("--runs N", Integer) { |v| options[:runs] = v }
  o.on("--burst MS", Float) { |v| options[:burst] = v }
  o.on("--wait MS", Float) { |v| options[:wait] = v }
  o.on("--cycles N", Integer) { |v| options[:cycles] = v }
  o.on("--load N", Integer) { |v| options[:load] = v }
  o.on("--ticks LIST", Array) { |v| options[:ticks] = v.map(&:to_sym) }
end.parse!

CHILD = <<~RUBY
  require "ddprof_recorder"
  require "json"
  hz, burst, wait, cycles, ticks = ARGV[0].to_i, ARGV[1].to_f / 1000, ARGV[2].to_f / 1000, ARGV[3].to_i, ARGV[4].to_sym
  def burn(sec)
    t = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + sec
    nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < t
  end
  profiler = DdprofRecorder::Profiler.new(hz: hz, ticks: ticks, compression: :none).start
  cpu0 = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
  cycles.times { burn(burst); IO.select(nil, nil, nil, wait) }
  cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - cpu0
  stats = profiler.stats
  profiler.stop
  puts JSON.generate(per_cpu_second: stats[:signal_samples] / cpu, cpu: cpu, ticks: stats[:ticks])
RUBY

lib = File.expand_path("../lib", __dir__)
loaders = Array.new(options[:load]) do
  spawn(RbConfig.ruby, "-e", "x = 0; loop { x += 1 }", %i[out err] => File::NULL)
end
results = {}
begin
  options[:hz].each do |hz|
    options[:runs].times do |run|
      order = options[:ticks].rotate(run)
      order.each do |ticks|
        out = IO.popen([RbConfig.ruby, "-I", lib, "-e", CHILD, "--", hz.to_s, options[:burst].to_s, options[:wait].to_s,
                        options[:cycles].to_s, ticks.to_s], &:read)
        (results[[hz, ticks]] ||= []) << JSON.parse(out).fetch("per_cpu_second").round
      end
    end
  end
ensure
  loaders.each { |pid| Process.kill(:KILL, pid) }
  loaders.each { |pid| Process.wait(pid) }
end

median = ->(a) { a.sort[a.size / 2] }
puts format("bursty thread: %<burst>g ms of CPU, %<wait>g ms in IO.select, %<cycles>d cycles; %<load>d busy processes beside",
            options)
results.each do |(hz, ticks), rates|
  puts format("  %4d Hz  %-4s ticks  samples per CPU-second: %-24s median %d", hz, ticks, rates.join(", "), median.(rates))
end
puts JSON.generate(options.merge(results: results.map { |(hz, ticks), r| { hz: hz, ticks: ticks, rates: r, median: median.(r) } }))
