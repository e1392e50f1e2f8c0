# frozen_string_literal: true

# Accuracy workload `rubocop` (bench/accuracy.rb): Debian's rubocop (a program nobody here
# wrote: apt-get install rubocop) linting Ruby's own standard library. No truth measured.
#
#   ruby bench/accuracy/rubocop.rb [SECONDS]     (default 3)
#
# The input is fixed: the 65 top-level files of Ruby's stdlib directory
# (RbConfig::CONFIG["rubylibdir"], /usr/lib/ruby/3.1.0 on Debian 12: English.rb ... yaml.rb,
# 1 MB), in name order, with the configuration in bench/accuracy/rubocop.yml and no result
# cache. RuboCop is run as its executable runs it (`RuboCop::CLI.new.run(args)`), on 5
# files at a time, batch after batch (from the first file again after the last), until
# FILES_PER_SECOND * SECONDS files (rounded up to whole batches: 25 for 3 s) are linted, so
# every run lints the same files in the same order, however fast it runs: 25 files took
# 2.3 s on Ruby 3.1.2 here, 2.5 s on 3.3.8, 3.8 s on 3.4.5 and 5.2 s with YJIT (which
# compiles much of rubocop in so short a run; the files differ per Ruby). Not a deadline:
# the files differ in what they make rubocop do, and a profiler that slows the program down
# (rbspy stops it for each sample) profiled fewer of them (20 against ours' 25 in 3 s, 3.4.5
# with YJIT), a profile of other work. Before that, rubocop's start-up (`require "rubocop"`,
# about 1 s on the dev VM) is in the profiles too. The offenses go to /dev/null.
require "rbconfig"
# Debian 12 packages rubocop and the gems it needs for its own Ruby, 3.1. On the Rubies that
# script/rubies builds (3.3, 3.4) three pure-Ruby libraries that rubocop 1.39 requires are
# not found: unicode-display_width (Debian installs it in vendor_ruby, not as a gem), and
# racc's parser and base64 (default gems in 3.1, bundled gems from 3.4 on, which that build
# does not install). They come from Debian's directories, put after everything else on the
# load path, so that nothing the running Ruby has is taken from there (racc's C parser is not:
# it lives in 3.1's own arch directory, and racc falls back to its Ruby one).
unless RbConfig::CONFIG["rubylibdir"] == "/usr/lib/ruby/3.1.0"
  $LOAD_PATH.push("/usr/lib/ruby/vendor_ruby", "/usr/lib/ruby/3.1.0")
end
require "rubocop"

module RubocopWorkload
  FILES = Dir.glob(File.join(RbConfig::CONFIG["rubylibdir"], "*.rb")).sort.freeze
  BATCH = 5
  FILES_PER_SECOND = 8
  ARGS = ["--cache", "false", "--config", File.join(__dir__, "rubocop.yml"), "--format", "progress",
          "--out", File::NULL].freeze

  module_function

  # @return [Integer] files linted.
  def run(seconds)
    raise "rubocop workload: no Ruby files in #{RbConfig::CONFIG['rubylibdir']}" if FILES.empty?

    files = [(seconds * FILES_PER_SECOND / BATCH).ceil, 1].max * BATCH
    linted = 0
    while linted < files
      batch = FILES.rotate(linted % FILES.size).first(BATCH)
      status = RuboCop::CLI.new.run(ARGS + batch)
      # 0: no offense, 1: offenses; anything else is rubocop failing.
      raise "rubocop workload: rubocop exited with #{status} on #{batch.join(' ')}" if status > 1

      linted += batch.size
    end
    linted
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
  linted = RubocopWorkload.run(seconds)
  took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  puts format("rubocop: %d files linted in %.1f s (%d in the set)", linted, took, RubocopWorkload::FILES.size)
end
