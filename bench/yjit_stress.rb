# frozen_string_literal: true

# Reading stacks in the signal handler while YJIT's machine code runs (Ruby 3.3+, see
# `vm::HANDLER_READS_UNDER_YJIT`): fresh `ruby --yjit` processes, each profiled at 999 Hz
# while three threads run code that makes YJIT push and pop frames all the time (recursion,
# blocks, `define_method` methods, `super`, C methods, exceptions raised and rescued, a Fiber),
# with GC.compact now and then (moving the iseqs the frames point at). Each process must exit
# 0 with its stacks read in the handler; a crash prints Ruby's `[BUG]` report. A tick that
# lands in the GC (a compaction among them) has its stack read at that GC step's end
# (`read_at_gc_exit`, ext/ddprof_recorder/src/sampling/signal_sampler/gc_ticks.rs).
#
#   ruby bench/yjit_stress.rb [--runs 20] [--seconds 3] [--hz 999]
#
# Prints one line per run and a JSON summary. On Ruby 3.1 the handler does not read under
# YJIT (the runs then check the :safepoint mode instead).
require "json"
require "open3"
require "optparse"
require "rbconfig"

options = { runs: 20, seconds: 3.0, hz: 999 }
OptionParser.new do |o|
  o.on("--runs N", Integer) { |v| options[:runs] = v }
  o.on("--seconds S", Float) { |v| options[:seconds] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
end.parse!

LIB = File.expand_path("../lib", __dir__)

PROGRAM = <<~'RUBY'
  require "json"
  require "ddprof_recorder"
  seconds, hz = Float(ARGV[0]), Integer(ARGV[1])

  class Shape
    def area = 0
    def describe(n) = n.even? ? "#{self.class.name} #{area}" : [area, n].sum.to_s
  end
  class Square < Shape
    def initialize(s) = @s = s
    def area = @s * @s
    def describe(n) = super + "!"
  end
  class Circle < Shape
    def initialize(r) = @r = r
    define_method(:area) { (3.14159 * @r * @r).round }
    %i[grow shrink].each_with_index { |name, i| define_method(name) { |k| Circle.new(@r + (i.zero? ? k : -k)) } }
  end

  def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)

  def shapes(round)
    list = Array.new(50) { |i| i.odd? ? Square.new(i) : Circle.new(i).grow(round % 3).shrink(1) }
    list.map.with_index { |s, i| s.describe(i) }.select { |d| d.size > 3 }.sort.first(5)
  end

  def faults(round)
    Integer("x#{round}")
  rescue ArgumentError => e
    e.message.size
  end

  profiler = DdprofRecorder::Profiler.new(hz: hz, compression: :none)
  profiler.start
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
  threads = Array.new(3) do |t|
    Thread.new do
      fiber = Fiber.new { loop { Fiber.yield fib(12) } } # a Fiber is resumed by its own thread only
      round = 0
      while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        fib(16 + t)
        shapes(round)
        faults(round)
        fiber.resume if t.zero?
        JSON.generate({ round: round, t: t }) if (round % 7).zero?
        GC.compact if t == 1 && (round % 200).zero? && GC.respond_to?(:compact)
        round += 1
      end
      round
    end
  end
  rounds = threads.sum(&:value)
  profiler.stop
  stats = profiler.stats
  puts JSON.generate(rounds: rounds, yjit: defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?,
                     mode: stats[:sampling_mode],
                     expected: DdprofRecorder::Profiler::HANDLER_READS_UNDER_YJIT ? "handler" : "safepoint",
                     signal_samples: stats[:signal_samples],
                     read_in_handler: stats[:signals][:signals_read_in_handler],
                     read_at_gc_exit: stats[:signals][:signals_read_at_gc_exit])
RUBY

results = Array.new(options[:runs]) do |i|
  out, err, status = Open3.capture3(RbConfig.ruby, "--yjit", "-I", LIB, "-e", PROGRAM,
                                    options[:seconds].to_s, options[:hz].to_s)
  line = out.lines.last
  result = status.success? && line ? JSON.parse(line, symbolize_names: true) : {}
  result[:exit] = status.exitstatus || "signal #{status.termsig}"
  result[:bug] = err.include?("[BUG]")
  puts format("run %2d: exit %s, %s", i + 1, result[:exit], result.except(:exit).to_json)
  warn err.lines.first(20).join if result[:bug] || !status.success?
  result
end
good = results.count { |r| r[:exit].zero? && !r[:bug] && r[:yjit] && r[:mode] == r[:expected] }
summary = { bench: "yjit_stress", ruby: RUBY_VERSION, runs: options[:runs], hz: options[:hz],
            seconds: options[:seconds], good: good, crashes: results.count { |r| r[:bug] },
            signal_samples: results.sum { |r| r[:signal_samples].to_i },
            read_in_handler: results.sum { |r| r[:read_in_handler].to_i },
            read_at_gc_exit: results.sum { |r| r[:read_at_gc_exit].to_i } }
puts JSON.generate(summary)
exit(good == options[:runs] ? 0 : 1)
