# frozen_string_literal: true

# Accuracy workload `c_heavy` (bench/accuracy.rb): a loop that spends most of its time in C
# methods that do not call back into Ruby, each called from a Ruby wrapper of its own.
#
#   ruby bench/accuracy/c_heavy.rb [SECONDS]     (default 3)
#
# Each round: `sort_numbers` twice (`Array#sort` of 8,000 Integers), `make_json`
# (`JSON.generate` of 1,000 small Hashes; the C leaf is `JSON::Ext::Generator::State#generate`),
# `scan_text` (`Regexp#match?` over 700 kB that never match) and `checksum` (`Zlib.crc32` of
# 1 MiB): self time in `sort`, `generate`, `match?` and `crc32`, each call measured
# (truth.rb). Every C call takes 0.3 to 1 ms on the dev VM, shorter than the ~4 ms between
# two of stackprof's SIGPROFs there on purpose: stackprof keeps one pending sample until the
# postponed job that records it runs, after the C call returns, and drops the signals that
# come meanwhile, so longer calls would get too few samples and the reference would be wrong
# (measured in bench/RESULTS.md, "Sampling accuracy").
require "json"
require "zlib"
require_relative "truth"

module CHeavy
  random = Random.new(42)
  NUMBERS = Array.new(8_000) { random.rand(1 << 30) }.freeze
  DOCUMENT = Array.new(1_000) do |i|
    { "id" => i, "name" => "item #{i}", "tags" => %w[red green blue], "score" => i * 3 }
  end.freeze
  TEXT = ("lorem ipsum dolor sit amet " * 26_000).freeze
  NEVER = /qu[aeiou]x\d{3}/.freeze
  BLOB = random.bytes(1 << 20).freeze

  module_function

  def sort_numbers
    NUMBERS.sort
  end

  def make_json
    JSON.generate(DOCUMENT)
  end

  def scan_text
    NEVER.match?(TEXT)
  end

  def checksum
    Zlib.crc32(BLOB)
  end

  def round
    AccuracyTruth.measure("sort") { sort_numbers }
    AccuracyTruth.measure("sort") { sort_numbers }
    AccuracyTruth.measure("generate") { make_json }
    AccuracyTruth.measure("match?") { scan_text }
    AccuracyTruth.measure("crc32") { checksum }
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
  puts "c_heavy: #{CHeavy.run(seconds)} rounds in #{seconds} s"
end
