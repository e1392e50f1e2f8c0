# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"

require_relative "signal_work"

# No tick of ours outside the running code (signal_sampler.rs, "Perf-event ticks", "Exec"), and
# our signal stays ours ("Our signal"; SignalGuard). Each program runs in a child Ruby and
# prints what it counted; the examples check counts, never times.
RSpec.describe DdprofRecorder::Profiler, "ticks" do
  lib = File.expand_path("../../lib", __dir__)

  # Runs `program` (Ruby source) with ARGV `args` in a child Ruby; its last stdout line is JSON.
  def run_child(program, *args, lib:)
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, "-e", program, *args.map(&:to_s))
    expect(status).to be_success, "exit #{status.inspect}\n#{out}\n#{err}"
    [JSON.parse(out.lines.last), err]
  end

  # A nonblocking pipe read in a loop (IO#sysread waits in Ruby's internal poll(2), which
  # SA_RESTART does not restart: a signal there raises Errno::EAGAIN into the program), and a C
  # poll(2) that does not retry (Fiddle: a C extension's wait, where a signal returns EINTR),
  # while another thread burns CPU. Before, the wall ticks landed there (the C poll: 44 EINTR in
  # 5 s at 999 Hz with the old build).
  blocking_program = <<~'RUBY'
    require "json"
    require "fiddle"
    require "io/nonblock"
    require "ddprof_recorder"
    hz, seconds, burn = Integer(ARGV[0]), Float(ARGV[1]), ARGV[2] == "burn"
    poll = Fiddle::Function.new(Fiddle.dlopen(nil)["poll"], [Fiddle::TYPE_VOIDP, Fiddle::TYPE_LONG, Fiddle::TYPE_INT],
                                Fiddle::TYPE_INT)
    r, w = IO.pipe
    r.nonblock = true
    writer = spawn(RbConfig.ruby, "-e", "w = IO.for_fd(3); w.sync = true; loop { w.write(%(x)); sleep 0.0005 }", 3 => w)
    w.close
    profiler = DdprofRecorder::Profiler.new(hz: hz)
    profiler.start
    stop = false
    burner = Thread.new { x = 0; x += 1 until stop } if burn
    eagain = reads = eintr = polls = 0
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      begin
        r.sysread(1)
        reads += 1
      rescue Errno::EAGAIN
        eagain += 1
      end
      eintr += 1 if poll.call(nil, 0, 1) == -1
      polls += 1
    end
    stop = true
    burner&.join
    profiler.stop
    Process.kill(:KILL, writer)
    Process.wait(writer)
    stats = profiler.stats
    puts JSON.generate(eagain: eagain, reads: reads, eintr: eintr, polls: polls, ticks: stats[:ticks],
                       signals: stats[:signals][:signals], samples: stats[:signal_samples])
  RUBY

  [999, 99].each do |hz|
    it "at #{hz} Hz never cuts a blocking call short: no EAGAIN from a nonblocking sysread, no EINTR from a C poll" do
      result, = run_child(blocking_program, hz, 2, "burn", lib: lib)
      expect(result).to include("eagain" => 0, "eintr" => 0, "ticks" => "perf_events")
      expect(result["reads"]).to be > 0
      expect(result["polls"]).to be > 0
      expect(result["samples"]).to be > 0 # it sampled meanwhile (the burner)
    end
  end

  it "never cuts a blocking call short when the only running thread is the one that blocks" do
    result, = run_child(blocking_program, 999, 2, "alone", lib: lib)
    expect(result).to include("eagain" => 0, "eintr" => 0)
    expect(result["polls"]).to be > 100
    expect(result["signals"]).to be > 0 # its CPU between the waits got ticks, in user mode
  end

  # Starts the profiler at 999 Hz, burns a little CPU, then replaces itself with a shell
  # (ARGV[0] `exec`), or starts one and waits (`system`, `spawn`), or execs a missing program
  # and goes on (`failed`): that must raise and leave sampling as it was.
  exec_program = <<~'RUBY'
    require "json"
    require "ddprof_recorder"
    profiler = DdprofRecorder::Profiler.new(hz: 999)
    profiler.start
    burn = lambda do |seconds|
      t = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < t
    end
    burn.call(0.02)
    case ARGV[0]
    when "exec" then exec("/bin/sh", "-c", "exit 0")
    when "process_exec" then Process.exec("/bin/sh", "-c", "exit 0")
    when "system" then exit(system("/bin/sh", "-c", "exit 0") ? 0 : 3)
    when "spawn" then exit(Process.wait2(spawn("/bin/sh", "-c", "exit 0")).last.success? ? 0 : 3)
    when "failed"
      before = profiler.stats[:signals][:threads_armed]
      raised = begin
        exec("/nonexistent/program")
      rescue SystemCallError => e
        e.class.name
      end
      samples = profiler.stats[:signal_samples]
      burn.call(0.3)
      stats = profiler.stats
      profiler.stop
      puts JSON.generate(raised: raised, armed_before: before, armed_after: stats[:signals][:threads_armed],
                         samples_after: stats[:signal_samples] - samples,
                         drained: stats[:signals][:signals_drained_at_exec])
    end
  RUBY

  it "leaves no signal to kill a program it execs: 0 of 30 children die of it" do
    killed = Array.new(30) do |i|
      kind = %w[exec process_exec system spawn][i % 4]
      _, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, "-e", exec_program, kind)
      status.signaled? ? "#{kind}: signal #{status.termsig} #{err}" : nil.tap { expect(status.exitstatus).to eq(0), err }
    end.compact
    expect(killed).to eq([])
  end

  it "samples on after an exec that failed, its threads armed again" do
    result, = run_child(exec_program, "failed", lib: lib)
    expect(result["raised"]).to eq("Errno::ENOENT")
    expect(result["armed_after"]).to eq(result["armed_before"])
    expect(result["armed_before"]).to be >= 1
    expect(result["samples_after"]).to be > 0
  end

  # Traps the profiler's own signal (by number: `trap("RTMIN+8")` is unsupported by name on
  # Ruby 3.1), or replaces its handler with SIG_IGN from C (ARGV[0] `sigaction`, Fiddle), then
  # burns CPU: the program's handler must never run for our ticks, and sampling goes on.
  trap_program = <<~'RUBY'
    require "json"
    require "fiddle"
    require "logger"
    require "stringio"
    require "ddprof_recorder"
    log = StringIO.new
    DdprofRecorder.logger = Logger.new(log)
    profiler = DdprofRecorder::Profiler.new(hz: 999, compression: :none)
    profiler.start
    signal = profiler.stats[:signals][:signal]
    rtmin = 34 # glibc's SIGRTMIN
    signo = rtmin + Integer(signal[/\d+\z/])
    ran = 0
    if ARGV[0] == "sigaction"
      Fiddle::Function.new(Fiddle.dlopen(nil)["signal"], [Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP], Fiddle::TYPE_VOIDP)
                      .call(signo, 1) # SIG_IGN
    else
      trap(signo) { ran += 1 }
    end
    samples = profiler.stats[:signal_samples]
    t = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < t
    stats = profiler.stats
    pprof = profiler.stop.last # [start, finish, pprof]
    puts JSON.generate(ran: ran, signal: signal, now: profiler.stats[:signals][:signal], samples: stats[:signal_samples] - samples,
                       taken: profiler.stats[:signals][:signal_taken], log: log.string, pprof: [pprof].pack("m0"))
  RUBY

  it "moves its ticks off a signal the program traps before the trap takes it: the program's handler never runs for them" do
    result, = run_child(trap_program, "trap", lib: lib)
    expect(result["ran"]).to eq(0)
    expect(result["samples"]).to be > 0
    expect(result["now"]).not_to eq(result["signal"])
    expect(result["taken"]).to eq("the program traps it (#{result['signal']}): ticks moved to #{result['now']}")
    expect(result["log"]).to include("WARN").and include(result["taken"])
    expect(pprof_comments(result["pprof"].unpack1("m0"))).to include("signal: #{result['taken']}")
  end

  it "sees a handler a C extension put on its signal, and moves" do
    result, = run_child(trap_program, "sigaction", lib: lib)
    expect(result["taken"]).to eq("the program replaced our handler (#{result['signal']}): ticks moved to #{result['now']}")
    expect(result["now"]).not_to eq(result["signal"])
    expect(result["samples"]).to be > 0
    expect(result["log"]).to include(result["taken"])
  end

  it "samples a thread that spends its CPU in system calls, where its perf event never overflows" do
    profiler = described_class.new(hz: 99, compression: :none)
    cpu_ns = nil
    pprof = profiler.profile do
      Thread.new do
        clock = Process::CLOCK_THREAD_CPUTIME_ID # a system call each (no vDSO for a thread's clock)
        start = Process.clock_gettime(clock, :nanosecond)
        nil while Process.clock_gettime(clock, :nanosecond) - start < 400_000_000
        cpu_ns = Process.clock_gettime(clock, :nanosecond) - start
      end.join
    end
    expect(profiler.stats).to include(ticks: :perf_events)
    # About 99 a CPU-second from its CPU timer's ticks (8 for 0.3 s with the event alone);
    # the margin is for a loaded machine.
    expect(profiler.stats[:signal_samples]).to be > cpu_ns / 1e9 * 99 * 0.5
    expect(samples_from(decode_pprof(pprof)).sum { |s| s[:values]["cpu-time"] }).to be > 0
  end

  it "without perf events (refused), takes CPU timers and says why in stats and the profile" do
    described_class::Testing.refuse_perf_events(true)
    profiler = described_class.new(hz: 999, compression: :none)
    pprof = profiler.profile { SignalSpecWork.run(0.5) }
    stats = profiler.stats
    expect(stats).to include(ticks: :cpu_timers)
    expect(stats[:signals]).to include(perf_threads: 0, perf_ticks: 0, perf_refused: a_string_starting_with("perf_event_open refused"))
    expect(stats[:signal_samples]).to be > 0
    expect(pprof_comments(pprof).grep(/\Asampling: .*at most the kernel's tick rate \(CPU timers: perf_event_open refused/).size).to eq(1)
  ensure
    described_class::Testing.refuse_perf_events(false)
    described_class.stop
  end
end
