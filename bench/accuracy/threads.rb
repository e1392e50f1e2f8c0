# frozen_string_literal: true

# Accuracy workload `threads` (bench/accuracy.rb): three threads of different kinds while the
# main thread waits for them.
#
#   ruby bench/accuracy/threads.rb [SECONDS]     (default 3)
#
# - "spinner": pure Ruby, `spin_ruby` (a 20,000-iteration integer loop, about 0.8 ms);
# - "c_worker": `sort_chunk` (`Array#sort` of 8,000 Integers) and `crc_chunk` (`Zlib.crc32`
#   of 1 MiB), C methods that keep the GVL (calls under 1 ms, see c_heavy.rb for why);
# - "napper": `sleep 0.001`, a `File.read` of this file and `tally` (2,000 iterations);
# - main: `join`s each thread.
# The first two compete for the GVL (Ruby hands it over every 100 ms), the napper gets it in
# between. Self time belongs to `spin_ruby`, `sort`, `crc32`, `sleep`, `read`, `tally` and
# `join`; each call is measured with its thread's CPU clock (truth.rb).
require "zlib"
require_relative "truth"

module Threads
  random = Random.new(7)
  NUMBERS = Array.new(8_000) { random.rand(1 << 30) }.freeze
  BLOB = random.bytes(1 << 20).freeze

  module_function

  def spin_ruby(iterations)
    x = 0
    i = 0
    while i < iterations
      x = (x * 31 + i) % 1_000_003
      i += 1
    end
    x
  end

  def tally(iterations)
    x = 0
    i = 0
    while i < iterations
      x = (x * 17 + i) % 65_521
      i += 1
    end
    x
  end

  def sort_chunk
    NUMBERS.sort
  end

  def crc_chunk
    Zlib.crc32(BLOB)
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def spinner(deadline)
    AccuracyTruth.measure("spin_ruby") { spin_ruby(20_000) } while now < deadline
  end

  def c_worker(deadline)
    while now < deadline
      AccuracyTruth.measure("sort") { sort_chunk }
      AccuracyTruth.measure("crc32") { crc_chunk }
    end
  end

  def napper(deadline)
    while now < deadline
      AccuracyTruth.measure("sleep") { sleep(0.001) }
      AccuracyTruth.measure("read") { File.read(__FILE__) }
      AccuracyTruth.measure("tally") { tally(2_000) }
    end
  end

  def run(seconds)
    deadline = now + seconds
    threads = %i[spinner c_worker napper].map do |kind|
      Thread.new { send(kind, deadline) }.tap { |t| t.name = kind.to_s }
    end
    threads.each { |t| AccuracyTruth.measure("join") { t.join } }
    threads.size
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  puts "threads: #{Threads.run(seconds)} threads for #{seconds} s"
end
