# frozen_string_literal: true

# Accuracy workload `sleepy` (bench/accuracy.rb): pure-Ruby work alternating with a short
# sleep and a small read, in one thread.
#
#   ruby bench/accuracy/sleepy.rb [SECONDS]      (default 3)
#
# Each round runs `alpha_work` (78,000 iterations) and `beta_work` (52,000 iterations of the
# same loop body): 60% and 40% of the Ruby work, about 5 ms together on the dev VM. Then
# `sleep 0.001` and a `File.read` of this file (`read`), which use little CPU but let go of
# the GVL. Self time belongs to `alpha_work`, `beta_work`, `sleep` and `read`; each call is
# measured (truth.rb).
require_relative "truth"

module Sleepy
  ALPHA_ITERATIONS = 78_000
  BETA_ITERATIONS = 52_000

  module_function

  def alpha_work(iterations)
    x = 0
    i = 0
    while i < iterations
      x = (x * 31 + i) % 1_000_003
      i += 1
    end
    x
  end

  # The same loop as alpha_work, so that the iteration counts give the proportions.
  def beta_work(iterations)
    x = 0
    i = 0
    while i < iterations
      x = (x * 31 + i) % 1_000_003
      i += 1
    end
    x
  end

  def round
    AccuracyTruth.measure("alpha_work") { alpha_work(ALPHA_ITERATIONS) }
    AccuracyTruth.measure("beta_work") { beta_work(BETA_ITERATIONS) }
    AccuracyTruth.measure("sleep") { sleep(0.001) }
    AccuracyTruth.measure("read") { File.read(__FILE__) }
  end

  def run(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    rounds = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      round
      rounds += 1
    end
    rounds
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  puts "sleepy: #{Sleepy.run(seconds)} rounds in #{seconds} s"
end
