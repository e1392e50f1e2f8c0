# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"

# Profiler.start / Profiler.stop (and a profiler's own #start / #stop) called from a `trap`
# handler, as a server's `trap("TERM") { DdprofRecorder::Profiler.stop }` does. A trap
# handler may not lock a Mutex (ThreadError: can't be called from trap context); the
# profiler's start and stop do theirs in a thread of their own, which the handler waits for.
# In a child Ruby, with real signals sent by this process.
RSpec.describe DdprofRecorder::Profiler, "from a trap handler" do
  lib = File.expand_path("../../lib", __dir__)

  # `ruby -e PROGRAM MODE`: MODE `process` traps Profiler.start/stop, `own` a profiler's
  # #start/#stop. It prints `ready`, then a JSON line for each signal's handler: USR1 starts,
  # USR2 starts again (which must raise), TERM stops and the program ends, saying what its
  # exporter got. The exporter locks a Mutex, as a Logger or an HTTP client does: it runs in
  # the profiler's thread, not in the trap handler.
  program = <<~'RUBY'
    require "json"
    require "ddprof_recorder"
    $stdout.sync = true
    mode = ARGV.fetch(0)
    lock = Mutex.new
    exported = []
    exporter = ->(start, finish, pprof) { lock.synchronize { exported << [start.class.name, finish.class.name, pprof.bytesize] } }
    own = DdprofRecorder::Profiler.new(hz: 99, exporter: exporter)
    events = Queue.new
    call = lambda do |what, &block|
      events << [what, block.call]
    rescue Exception => e # rubocop:disable Lint/RescueException
      events << [what, "#{e.class}: #{e.message}"]
    end
    start = -> { mode == "own" ? own.start : DdprofRecorder::Profiler.start(hz: 99, exporter: exporter) }
    trap("USR1") { call.call("start") { start.call.class.name } }
    trap("USR2") { call.call("start again") { start.call.class.name } }
    trap("TERM") do
      call.call("stop") do
        stats = (mode == "own" ? own : DdprofRecorder::Profiler.current).stats # lock-free: fine here
        start, finish, pprof = mode == "own" ? own.stop : DdprofRecorder::Profiler.stop
        [start.class.name, finish.class.name, DdprofRecorder.summary(pprof)[:duration], stats[:exporter]]
      end
    end
    puts "ready"
    loop do
      sleep 0.01 while events.empty? # a server's main thread, waiting (no deadlock check)
      what, value = events.pop
      puts JSON.generate([what, value])
      break if what == "stop"
    end
    running = mode == "own" ? own.running? : DdprofRecorder::Profiler.running?
    puts JSON.generate(["after", running, exported])
  RUBY

  # Runs the program, sending each signal once the previous line came; returns the lines.
  def run_with_signals(program, lib, mode)
    Open3.popen3(RbConfig.ruby, "-I", lib, "-e", program, mode) do |stdin, stdout, stderr, wait|
      stdin.close
      lines = []
      read_line = lambda do
        raise "no line from the program in 30 s (stderr: #{stderr.read_nonblock(65_536, exception: false)})" unless IO.select([stdout], nil, nil, 30)

        line = stdout.gets or raise "the program ended early: #{stderr.read}"
        lines << line.chomp
      end
      read_line.call # ready
      %w[USR1 USR2 TERM].each do |signal|
        sleep 0.2 # some samples
        Process.kill(signal, wait.pid)
        read_line.call
      end
      read_line.call # after
      status = wait.value
      expect(status).to be_success, "status #{status.inspect}, stderr: #{stderr.read}"
      lines.drop(1).map { |line| JSON.parse(line) }
    ensure
      Process.kill(:KILL, wait.pid) if wait&.alive?
    end
  end

  # A TERM whose handler runs while the main thread is inside Profiler.start, which holds the
  # lock Profiler.stop takes: the handler cannot wait for a stop that can only run after it.
  # The handler runs there through the interval's #finite?, which start calls under its lock
  # (Profiler.new checks the option).
  interrupted_start = <<~'RUBY'
    require "ddprof_recorder"
    $stdout.sync = true
    now = -> { Process.clock_gettime(Process::CLOCK_MONOTONIC) }
    returned = Queue.new
    trap("TERM") do
      at = now.call
      returned << [DdprofRecorder::Profiler.stop.inspect, now.call - at]
    end
    interval = Class.new(Numeric) do
      def finite?
        Process.kill("TERM", Process.pid)
        sleep 0.2 # the handler runs here, in Profiler.start
        true
      end

      def >=(other)
        60 >= other
      end

      def *(other)
        60 * other
      end

      # The range check compares it with Floats, both ways (Float#<=> coerces it).
      def coerce(other)
        [other, 60.0]
      end

      def <=>(other)
        60 <=> other
      end
    end.new
    profiler = DdprofRecorder::Profiler.start(hz: 99, interval: interval) { |*| nil }
    value, took = returned.pop
    puts "start returned #{profiler.class}; the handler's stop returned #{value} in #{took < 1 ? 'under' : 'over'} 1 s"
    deadline = now.call + 10
    sleep 0.01 while DdprofRecorder::Profiler.running? && now.call < deadline
    puts "then the profiler stopped: #{!DdprofRecorder::Profiler.running?}; current: #{DdprofRecorder::Profiler.current.inspect}"
  RUBY

  it "does not wait, from a handler that interrupted this thread's Profiler.start, and stops once start returns" do
    out, err, status = Open3.popen3(RbConfig.ruby, "-I", lib, "-e", interrupted_start) do |stdin, stdout, stderr, wait|
      stdin.close
      Process.kill(:KILL, wait.pid) unless wait.join(30) # a handler waiting for its own lock: hung
      [stdout.read, stderr.read, wait.value]
    end
    expect(status).to be_success, "status #{status.inspect}, stderr: #{err}"
    expect(out).to eq("start returned DdprofRecorder::Profiler; the handler's stop returned nil in under 1 s\n" \
                      "then the profiler stopped: true; current: nil\n")
  end

  { "process" => "DdprofRecorder::Profiler.start and .stop", "own" => "a profiler's #start and #stop" }.each do |mode, what|
    it "runs #{what} from trap handlers, and their errors come through", :aggregate_failures do
      start, again, stop, after = run_with_signals(program, lib, mode)
      expect(start).to eq(%w[start DdprofRecorder::Profiler])
      expect(again[0]).to eq("start again")
      expect(again[1]).to match(/\ADdprofRecorder::Error: .*already running/)
      # The window from the start to the stop: 0.4 s or more apart.
      expect(stop[0]).to eq("stop")
      expect(stop[1]).to match([eq("Time"), eq("Time"), be >= 0.35,
                                { "exported" => 0, "failed" => 0, "queued" => 0, "dropped" => 0 }])
      _, running, exported = after
      expect(running).to be(false)
      # The last window, handed to the exporter (which locked its Mutex) by the stop.
      expect(exported.size).to eq(1)
      expect(exported[0][0, 2]).to eq(%w[Time Time])
      expect(exported[0][2]).to be > 0
    end
  end
end
