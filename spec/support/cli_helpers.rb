# frozen_string_literal: true

require "open3"
require "rbconfig"
require "stringio"
require "tmpdir"

require_relative "../../lib/ddprof_recorder/cli"

# The CLI specs (spec/cli/): DdprofRecorder::CLI.run in process with StringIOs, or the
# executable, in a temporary directory, on pprofs made by the recorder with known samples.
module CliHelpers
  # Runs the command line in this process, in `dir` (default: the example's @dir).
  #
  # @return [Array(String, String, Integer)] stdout, stderr and the exit status.
  def run_cli(*argv, dir: @dir)
    out = StringIO.new
    err = StringIO.new
    status = Dir.chdir(dir) { DdprofRecorder::CLI.run(argv, out: out, err: err) }
    [out.string, err.string, status]
  end

  EXE = File.expand_path("../../exe/ddprof-recorder", __dir__)

  # Runs exe/ddprof-recorder as a user does, a process of its own, in `dir`; under the
  # command `wrapper` if given (`unshare ...`: it runs the rest of its arguments).
  #
  # @return [Array(String, String, Integer)] stdout, stderr and the exit status.
  def run_exe(*argv, dir: @dir, env: {}, wrapper: [])
    out, err, status = Open3.capture3(env, *wrapper, RbConfig.ruby, EXE, *argv, chdir: dir)
    [out, err, status.exitstatus]
  end

  # Writes `name` in @dir: a pprof of the profiler's value types (cpu-time, cpu-samples,
  # wall-time) with `samples`, `[stack (leaf first), [cpu, count, wall], labels]` each, and
  # `comments` (StackRecorder#comments=).
  #
  # @return [String] the file's path.
  def write_profile(name, samples, comments: [])
    recorder = DdprofRecorder::StackRecorder.new(compression: name.end_with?(".gz") ? :gzip : :none)
    recorder.comments = comments
    samples.each { |stack, values, labels| recorder.record_sample(stack, values, labels) }
    path = File.join(@dir, name)
    File.binwrite(path, recorder.serialize!)
    path
  end

  # An error the user caused: one line on stderr, no Ruby backtrace.
  def expect_one_line(err, message)
    expect(err).to match(message)
    expect(err.lines.size).to eq(1), err
    expect(err).not_to match(/\.rb:\d+:in /)
  end

  # The CLI specs' two programs' worth of samples: "cruncher" burns cpu-time in `crunch`,
  # "sleeper" has only wall-time in `sleep`; process 11.
  CRUNCH = [["crunch", "app.rb", 3], ["work", "app.rb", 7], ["run", "app.rb", 1]].freeze
  SLEEP = [["sleep", "app.rb", 9], ["run", "app.rb", 1]].freeze
  HOT_SAMPLES = [
    [CRUNCH, [900_000_000, 90, 1_000_000_000], { "thread name" => "cruncher", "process id" => 11 }],
    [[["work", "app.rb", 8], ["run", "app.rb", 1]], [100_000_000, 10, 100_000_000],
     { "thread name" => "cruncher", "process id" => 11 }],
    [SLEEP, [0, 110, 2_000_000_000], { "thread name" => "sleeper", "process id" => 11 }],
  ].freeze
end

RSpec.configure do |config|
  config.include CliHelpers, file_path: %r{/spec/cli/}
  config.around(:example, file_path: %r{/spec/cli/}) do |example|
    Dir.mktmpdir("ddprof_recorder_cli") do |dir|
      @dir = File.realpath(dir)
      example.run
    end
  end
end
