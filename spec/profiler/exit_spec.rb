# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

# A process that ends while the profiler samples at 999 Hz neither crashes nor hangs, however
# it ends: normal exit (the profiler still running, from Profiler.start or from
# `ddprof-recorder record`), exit!, an uncaught exception, SIGTERM from outside, and fork
# (child and parent).
# Each run is a fresh `ruby` with a busy thread, so that the trigger thread is ticking and
# jobs are running when the process goes; each run's status must be the expected one (not a
# signal death such as SIGSEGV or SIGABRT, unless it is the SIGTERM we sent) and its stderr
# must say nothing of a crash. The trigger thread's end-of-life rules are in trigger.rs's
# module doc ("Lifecycle").
#
# 100 runs, two at a time (the machine has 2 cores): about 30-40 s in all; a hung run is
# killed after 15 s and fails its example, naming the threads it still had.
RSpec.describe DdprofRecorder::Profiler, "at exit" do
  root = File.expand_path("../..", __dir__)
  lib = File.join(root, "lib")
  exe = File.join(root, "exe", "ddprof-recorder")

  # The program of every run: `ruby -e PROGRAM MODE SECONDS`. It starts the profiler (unless
  # `ddprof-recorder record` did), keeps a thread busy, works SECONDS on the main thread,
  # prints the sampling counters (the parent checks that jobs were running), then ends the
  # way MODE says.
  program = <<~'RUBY'
    mode, seconds = ARGV[0], Float(ARGV[1])
    $stdout.sync = true
    require "ddprof_recorder"

    # Busy for `seconds` of `clock`. Before the counters are printed, of the thread's CPU: under
    # load a tenth of a second of wall time held too little CPU for a job to run (2 runs of 15
    # "not sampling before the exit" on 3.4.5, beside other jobs).
    def busy(seconds, clock = Process::CLOCK_MONOTONIC)
      deadline = Process.clock_gettime(clock) + seconds
      x = 0
      x = (x + [x, 3].max) % 1_000_003 while Process.clock_gettime(clock) < deadline
      x
    end

    def sampling(who)
      stats = DdprofRecorder::Profiler._native_sampling_stats
      "#{who} jobs=#{stats[:jobs]} trigger=#{stats[:trigger_running]}"
    end

    DdprofRecorder::Profiler.start(hz: 999) unless mode == "record"
    Thread.new { loop { busy(1) } }
    busy(seconds, Process::CLOCK_THREAD_CPUTIME_ID)
    puts sampling("main")
    case mode
    when "normal", "record" then nil # the end of the program: exit 0, the profiler running
    when "exit!" then exit!(5)
    when "raise" then raise "uncaught on purpose"
    when "sigterm"
      puts "ready"
      busy(30) # the parent sends SIGTERM long before
      exit 9
    when "fork", "fork_profiled"
      pid = fork do
        # The process-wide profiler follows the fork (ForkHook restarts it here, with threads
        # of the child's own); "fork_profiled" stops that one and starts another.
        if mode == "fork_profiled"
          DdprofRecorder::Profiler.stop
          DdprofRecorder::Profiler.start(hz: 999)
        end
        Thread.new { loop { busy(1) } }
        busy(seconds, Process::CLOCK_THREAD_CPUTIME_ID)
        puts sampling("child")
        exit 4
      end
      _, status = Process.wait2(pid)
      puts "child status: exited=#{status.exitstatus.inspect} signal=#{status.termsig.inspect}"
      busy(seconds / 2)
    end
  RUBY

  crash = /\[BUG\]|Segmentation fault|SIGSEGV|SIGABRT|SIGBUS|Abort|core dumped|panicked|double free|corrupted/i

  # [mode, how many runs]: 100 in all.
  plan = [["normal", 20], ["record", 15], ["exit!", 15], ["raise", 15], ["sigterm", 15],
          ["fork", 10], ["fork_profiled", 10]]

  before(:context) { @dir = Dir.mktmpdir("ddprof_recorder_exit") }
  after(:context) { FileUtils.remove_entry(@dir, true) }

  # One run: returns {out:, err:, status:, hung:}. A run that has not ended after `timeout`
  # seconds is killed and reported as hung, with the names of the threads it still had.
  define_method(:run_once) do |mode, index, timeout: 15|
    seconds = format("%.2f", 0.1 + (0.2 * rand))
    ruby = [RbConfig.ruby, "-I", lib, "-e", program, mode, seconds]
    command =
      if mode == "record"
        [RbConfig.ruby, exe, "record", "-o", File.join(@dir, "run#{index}.pb"), "--hz", "999", "--", *ruby]
      else
        ruby
      end
    Open3.popen3(*command, pgroup: true) do |stdin, stdout, stderr, wait|
      stdin.close
      err_reader = Thread.new { stderr.read }
      out = +""
      hung = nil
      watchdog = Thread.new do
        sleep timeout
        hung = thread_names(wait.pid)
        Process.kill(:KILL, -wait.pid) # the group: a forked child or the program under `record` too
      rescue Errno::ESRCH
        nil
      end
      if mode == "sigterm"
        out << (stdout.gets("ready\n") || "")
        # Mid-run: sampling is on (the line above says so), the program is busy for 30 s.
        sleep(0.15 * rand)
        begin
          Process.kill(:TERM, wait.pid)
        rescue Errno::ESRCH
          nil
        end
      end
      out << stdout.read
      status = wait.value
      watchdog.kill
      { out: out, err: err_reader.value, status: status, hung: hung }
    end
  end

  # The names of the threads of the processes in process group `pgid` (Ruby names its threads
  # after where they were made; the trigger thread is "ddprof-trigger").
  def thread_names(pgid)
    Dir.glob("/proc/[0-9]*/stat").flat_map do |stat|
      fields = File.read(stat).split(") ").last.split
      next [] unless Integer(fields[2]) == pgid

      pid = File.basename(File.dirname(stat))
      Dir.glob("/proc/#{pid}/task/*/comm").map { |comm| "#{pid}:#{File.read(comm).strip}" }
    rescue SystemCallError
      []
    end
  end

  # Runs `count` runs of `mode`, two at a time; returns their results.
  define_method(:run_all) do |mode, count|
    indexes = Queue.new
    count.times { |i| indexes << i }
    indexes.close
    results = []
    lock = Mutex.new
    Array.new(2) do
      Thread.new do
        while (i = indexes.pop)
          result = run_once(mode, i)
          lock.synchronize { results << result }
        end
      end
    end.each(&:join)
    results
  end

  # What is wrong with a run: nil, or one message naming its problems, with its output.
  define_method(:problems) do |result, expected_exit: nil, expected_signal: nil, expected_err: nil|
    status = result[:status]
    found = []
    found << "hung (killed after the timeout; threads left: #{result[:hung].join(', ')})" if result[:hung]
    if expected_signal
      found << "expected death by SIG#{Signal.signame(expected_signal)}" unless status.termsig == expected_signal
    elsif status.exitstatus != expected_exit
      found << "expected exit status #{expected_exit}"
    end
    found << "stderr reports a crash" if result[:err].match?(crash)
    found << "unexpected stderr" unless expected_err ? result[:err].match?(expected_err) : result[:err].empty?
    jobs = result[:out][/^main jobs=(\d+) trigger=true$/, 1]
    found << "the profiler was not sampling before the exit" unless jobs && Integer(jobs).positive?
    return nil if found.empty?

    "#{found.join(', ')}: #{status.inspect}\n--- stdout:\n#{result[:out]}--- stderr (head):\n" \
      "#{result[:err].lines.first(15).join}"
  end

  def expect_no_problems(results, **expected)
    found = results.filter_map { |r| problems(r, **expected) }
    expect(found).to be_empty, "#{found.size} of #{results.size} runs went wrong; the first:\n#{found.first(2).join("\n")}"
  end

  counts = plan.to_h

  it "exits 0 at the end of the program with the profiler running (#{counts['normal']} runs)" do
    expect_no_problems(run_all("normal", counts["normal"]), expected_exit: 0)
  end

  it "exits 0 under `ddprof-recorder record --hz 999`, and writes the profile (#{counts['record']} runs)" do
    results = run_all("record", counts["record"])
    expect_no_problems(results, expected_exit: 0)
    results.each { |r| expect(r[:out]).to match(/ddprof-recorder: recorded .*\(exit status 0,/m) }
    expect(Dir.children(@dir).grep(/\Arun\d+\.pb\z/).size).to eq(counts["record"])
  end

  it "exits with exit!'s status (#{counts['exit!']} runs)" do
    expect_no_problems(run_all("exit!", counts["exit!"]), expected_exit: 5)
  end

  it "exits 1 on an uncaught exception (#{counts['raise']} runs)" do
    report = /\A-e:\d+:in [`']<main>': uncaught on purpose \(RuntimeError\)\n\z/
    expect_no_problems(run_all("raise", counts["raise"]), expected_exit: 1, expected_err: report)
  end

  it "dies of the SIGTERM sent mid-run, not of another signal (#{counts['sigterm']} runs)" do
    expect_no_problems(run_all("sigterm", counts["sigterm"]), expected_signal: Signal.list.fetch("TERM"))
  end

  it "forks, the profiler follows into the child, the child exits 4 and the parent 0 (#{counts['fork']} runs)" do
    results = run_all("fork", counts["fork"])
    expect_no_problems(results, expected_exit: 0)
    results.each do |r|
      expect(r[:out]).to include("child status: exited=4 signal=nil"), r[:out]
      expect(r[:out]).to match(/^child jobs=\d+ trigger=true$/) # restarted by the fork hook
    end
  end

  it "forks, the child restarts the profiler and exits 4 sampling, the parent 0 (#{counts['fork_profiled']} runs)" do
    results = run_all("fork_profiled", counts["fork_profiled"])
    expect_no_problems(results, expected_exit: 0)
    results.each do |r|
      expect(r[:out]).to include("child status: exited=4 signal=nil"), r[:out]
      expect(r[:out]).to match(/^child jobs=\d+ trigger=true$/)
    end
  end
end
