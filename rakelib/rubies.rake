# frozen_string_literal: true

# The suite on every Ruby that CI tests (README, "Supported Rubies"): Debian 12's own Ruby, which
# runs rake (the Rakefile's `spec` and `spec:gc_stress`), and the Rubies that script/rubies
# builds into its cache. For each of these, `rake rubies`:
#
#   1. runs `script/rubies VERSION...` once for all of them, which builds a Ruby that is not
#      cached (script/test starts that build in the background when it begins: script/rubies
#      takes a lock on its cache, so this waits for that build to end, then finds them cached);
#   2. builds the extension against it (`ruby -S rake compile`, with Debian's rake) in a cargo
#      target directory of its own, target-<version>/, so that going from one Ruby to the next
#      does not rebuild everything;
#   3. runs the whole RSpec suite on it, then spec/profiler again with YJIT on
#      (RUBY_YJIT_ENABLE=1, which the Ruby programs the specs start inherit).
#
# Each run prints its line (`Ruby 3.3.8: 601 examples, 0 failures, 2 pending`) and the end of
# `rake rubies` prints them all again, Debian's Ruby's too, with how long each step took. A
# failing run does not stop the others (under `rake`, not even one on Debian's Ruby): `rake
# rubies` fails at the end.
#
# One library at a time: `rake compile` puts the extension in lib/ddprof_recorder/, where
# `require` finds it whichever Ruby runs. So the Rubies go one after the other, and the
# library that was there (Debian's Ruby's, which `rake rubies` first builds) is put back at the
# end, whatever happened; nothing else may use this checkout's lib/ meanwhile. A library built
# for another Ruby links no libruby, so a Ruby would load it and misbehave: if a run is killed
# midway (SIGKILL: Ctrl-C still puts it back), `rake compile` puts Debian's Ruby's back.
#
# DDPROF_RUBIES: which Rubies, as versions or their first two numbers, separated by commas or
# spaces: "3.1" for Debian's Ruby only (then `rake rubies` does nothing), "3.1,3.4" adds
# 3.4.5. Default: every Ruby script/rubies knows. Debian's Ruby is always tested: it runs rake.
require "fileutils"
require "rbconfig"
require "shellwords"

# rspec runs, and their summary lines, for the list at the end.
module SpecRuns
  Run = Struct.new(:label, :summary, :seconds, :ok, :failed, :details)
  # The line RSpec ends with: "601 examples, 0 failures, 2 pending" (", N errors occurred
  # outside of examples" when a file did not load).
  SUMMARY = /^\d+ examples?, \d+ failures?.*$/
  # A line of RSpec's list of failed examples: "rspec ./spec/x_spec.rb:12 # what it does", or
  # "rspec './spec/x_spec.rb[1:2:3]' # ..." for an example that its line does not tell apart.
  FAILED = %r{^rspec '?\./spec/\S+ # .*$}
  # RSpec's account of its failures: from "Failures:" to the timing that follows them.
  DETAILS = /^Failures:\n(.*?)(?=^(?:Top \d+ slowest|Finished in ))/m
  # The report keeps this much of each run's failures (the end of the log is read first).
  MAX_DETAILS = 6000

  @runs = []

  class << self
    attr_reader :runs

    def now
      Process.clock_gettime(Process::CLOCK_MONOTONIC)
    end

    def duration(seconds)
      format("%dm%02ds", seconds / 60, seconds % 60)
    end

    # Runs `command` (an rspec) with `env`, passing its output through as it comes, and keeps
    # its summary line under `label`.
    #
    # @return [Boolean] whether it passed.
    def run(label, env, command)
      puts "==> #{label}: #{command.shelljoin}"
      started = now
      tail = +""
      output = +""
      summary = nil
      failed = []
      IO.popen(env, command, err: %i[child out]) do |io|
        loop do
          chunk = io.readpartial(65_536) # as it comes: RSpec's progress dots end no line
          $stdout.write(chunk)
          $stdout.flush
          output << chunk
          # The summary line is followed by the list of failed examples: keep it when it passes.
          seen = tail + chunk
          summary = seen.scan(SUMMARY).last || summary
          failed |= seen.scan(FAILED) # the tail overlaps: each line once
          tail = seen[-4096..] || seen
        rescue EOFError
          break
        end
      end
      status = $?
      summary ||= "no summary line (#{status})"
      details = failed.empty? ? nil : output.scrub[DETAILS, 1]&.then { |text| text[0, MAX_DETAILS] }
      @runs << Run.new(label, summary, now - started, status.success?, failed, details)
      puts "#{label}: #{summary}"
      status.success?
    end

    # {.run}, for a task of its own: it fails if the run did, except under `rake` (default),
    # where `rubies`, the last task, fails for it at the end (a failure on Debian's Ruby then
    # does not keep the other Rubies from being tested).
    def run!(label, env, command)
      return if run(label, env, command)

      abort "#{label}: rspec failed" unless Rake.application.top_level_tasks == ["default"]
      puts "#{label}: rspec failed; `rake` goes on, and fails at its end"
    end

    # Every run so far, one line each: label, summary, time; and under it, its failed
    # examples; then what RSpec said of each failure, up to MAX_DETAILS characters a run (the
    # end of a CI log is sometimes all there is to read).
    def report
      width = @runs.map { |run| run.label.size }.max
      lines = @runs.flat_map do |run|
        [format("%-#{width}s  %s (%s)", "#{run.label}:", run.summary, duration(run.seconds)),
         *run.failed.map { |line| "  #{line}" }]
      end
      @runs.select(&:details).each do |run|
        lines << "" << "==> #{run.label}: failures" << run.details.rstrip
      end
      lines
    end
  end
end

module Rubies
  SCRIPT = File.expand_path("../script/rubies", __dir__)
  ROOT = File.expand_path("..", __dir__)
  # Where Debian's Ruby's library waits while the others are tested.
  PARKED = File.join(ROOT, "tmp", "rubies", "ddprof_recorder-#{RUBY_VERSION}.so")
  RSPEC = File.join(RbConfig::CONFIG["bindir"], "rspec")

  module_function

  # @return [Array<String>] the versions script/rubies knows (`script/rubies --list`).
  def known
    out = IO.popen([SCRIPT, "--list"], &:read)
    abort "rubies: `script/rubies --list` failed" unless $?.success?
    out.lines.map { |line| line.split.first }
  end

  # @return [Array<String>] the versions DDPROF_RUBIES asks for, besides Debian's Ruby.
  def selected
    others = known
    wanted = ENV.fetch("DDPROF_RUBIES", "").split(/[\s,]+/).reject(&:empty?)
    return others if wanted.empty?

    wanted.filter_map do |name|
      matches = ->(version) { version == name || version.start_with?("#{name}.") }
      next if matches.call(RUBY_VERSION)

      others.find(&matches) or abort "DDPROF_RUBIES: no Ruby #{name} here (Debian's #{RUBY_VERSION}, and #{others.join(', ')})"
    end.uniq
  end

  # script/rubies' cache, where it put `version`.
  def prefix(version)
    line = IO.popen([SCRIPT, "--list"], &:read).lines.find { |l| l.start_with?("#{version} ") }
    path = line&.split&.[](2)
    abort "rubies: Ruby #{version} is not built (script/rubies --list: #{line&.strip})" unless path

    File.dirname(path, 2)
  end

  # The environment of every command run on `version`: its bin/ first on PATH (`ruby`, `gem`
  # and `bundle` in the specs are its own), the RUBYLIB that loads Debian's rspec and rexml and
  # that Ruby's google-protobuf, no gem path of Debian's Ruby, the cargo target directory of
  # that Ruby (for the specs that build the gem), and DDPROF_RECORDER_BUILD=0: a program that
  # cannot load the library (Debian's puma, on Debian's Ruby) must not build one into lib/ in
  # the middle of the run.
  def env(version, prefix)
    rubylib = IO.popen([SCRIPT, "--rubylib", version], &:read).strip
    abort "rubies: `script/rubies --rubylib #{version}` failed" unless $?.success?
    { "PATH" => [File.join(prefix, "bin"), ENV.fetch("PATH", "")].join(File::PATH_SEPARATOR),
      "RUBYLIB" => rubylib, "GEM_PATH" => nil, "GEM_HOME" => nil, "DDPROF_RECORDER_BUILD" => "0",
      "CARGO_TARGET_DIR" => File.join(ROOT, "target-#{version}") }
  end

  # Builds the extension for `version` (built by script/rubies) and runs the suite on it, then
  # spec/profiler with YJIT.
  #
  # @return [Array<String>] what each step took, for the timing line.
  def test(version)
    steps = []
    prefix = prefix(version)
    ruby = File.join(prefix, "bin", "ruby")
    env = env(version, prefix)

    started = SpecRuns.now
    # Debian's rake (pure Ruby) on that Ruby, through Debian's gem directory.
    Rake::FileUtilsExt.sh(env.merge("GEM_PATH" => "/usr/share/rubygems-integration/all"), ruby, "-S", "rake", "compile")
    steps << "extension #{SpecRuns.duration(SpecRuns.now - started)}"

    # Debian's rspec executable (`require "rspec/core"`, then run), on that Ruby; the ten
    # slowest examples listed at the end, for the CI time.
    rspec = [ruby, RSPEC, "--profile", "10"]
    SpecRuns.run("Ruby #{version}", env, rspec)
    steps << "rspec #{SpecRuns.duration(SpecRuns.runs.last.seconds)}"

    yjit = env.merge("RUBY_YJIT_ENABLE" => "1")
    on = IO.popen(yjit, [ruby, "-e", "print RubyVM::YJIT.enabled?"], &:read)
    abort "rubies: RUBY_YJIT_ENABLE=1 does not turn YJIT on in #{ruby} (#{on})" unless on == "true"
    SpecRuns.run("Ruby #{version} --yjit spec/profiler", yjit, [*rspec, "spec/profiler"])
    steps << "--yjit spec/profiler #{SpecRuns.duration(SpecRuns.runs.last.seconds)}"
    steps
  end
end

namespace :rubies do
  desc "Print the Rubies that `rake rubies` tests besides Debian's (DDPROF_RUBIES)"
  task :versions do
    puts Rubies.selected.join(" ")
  end
end

desc "Build the extension for and run the suite on Ruby 3.3 and 3.4 too, with YJIT for spec/profiler (DDPROF_RUBIES)"
task rubies: :compile do
  versions = Rubies.selected
  started = SpecRuns.now
  timings = {}
  waited = nil
  unless versions.empty?
    FileUtils.mkdir_p(File.dirname(Rubies::PARKED))
    FileUtils.cp(EXT_SO, Rubies::PARKED)
    begin
      sh(Rubies::SCRIPT, *versions)
      waited = SpecRuns.duration(SpecRuns.now - started)
      if (log = ENV["DDPROF_RUBIES_LOG"]) && File.exist?(log)
        puts "==> script/rubies, started in the background by script/test (#{log}):", File.read(log)
      end
      versions.each { |version| timings[version] = Rubies.test(version) }
    ensure
      File.rename(Rubies::PARKED, EXT_SO)
      puts "put Debian's Ruby's #{EXT_SO} back"
    end
  end
  puts "", "==> Specs, by Ruby", *SpecRuns.report
  puts "timing: script/rubies #{waited} (building what was not cached, or waiting for script/test's build)" if waited
  timings.each { |version, steps| puts "timing: Ruby #{version}: #{steps.join(', ')}" }
  puts "timing: rake rubies #{SpecRuns.duration(SpecRuns.now - started)} (#{versions.size} Rubies besides Debian's #{RUBY_VERSION})"
  failed = SpecRuns.runs.reject(&:ok)
  abort "rubies: failed: #{failed.map(&:label).join('; ')}" unless failed.empty?
end
