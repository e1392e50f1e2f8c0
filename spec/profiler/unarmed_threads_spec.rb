# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"

# Threads with no ticks of their own, left to the wall passes and their own jobs: those that
# block our signal (signal_sampler.rs, "Threads that block our signal"), and those past the
# slots (Profiler::SIGNAL_SLOTS). Each is counted and said, and its CPU goes to its own stacks.
# Before, a thread that blocked it once armed and burned 1.5 s had all of it charged to the
# stack of its last sample before (`burn`, not `blocked_burn`), `signal_blocked_threads` said 0,
# and nothing in the profile said that threads had no slot.
RSpec.describe DdprofRecorder::Profiler, "threads with no ticks" do
  lib = File.expand_path("../../lib", __dir__)

  # ARGV: "after" (the thread blocks the signal once armed) or "before" (it blocks every
  # real-time signal, then the profiler starts). The thread burns 0.2 s, then 1.5 s in `blocked_burn`; main burns
  # 0.3 s in `main_burn`. Prints the profile's path and stats as JSON.
  program = <<~'RUBY'
    require "json"
    require "fiddle"
    require "tmpdir"
    require "ddprof_recorder"
    when_blocked = ARGV[0]
    libc = Fiddle.dlopen(nil)
    sigmask = Fiddle::Function.new(libc["pthread_sigmask"], [Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP, Fiddle::TYPE_VOIDP],
                                   Fiddle::TYPE_INT)
    rtmin = Fiddle::Function.new(libc["__libc_current_sigrtmin"], [], Fiddle::TYPE_INT).call
    def burn(seconds)
      from = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - from < seconds
    end
    def blocked_burn(seconds) = burn(seconds)
    def main_burn(seconds) = burn(seconds)
    profiler = DdprofRecorder::Profiler.new(hz: 99, compression: :none)
    # Once armed, our signal alone; before, every real-time signal (as a C library's worker
    # thread may block all signals).
    block = lambda do
      signals = if profiler.stats[:signals]
                  [rtmin + Integer(profiler.stats.dig(:signals, :signal)[/\+(\d+)\z/, 1])]
                else
                  (rtmin..64).to_a
                end
      set = "\0".b * 128
      signals.each { |signo| set.setbyte((signo - 1) / 8, set.getbyte((signo - 1) / 8) | (1 << ((signo - 1) % 8))) }
      raise "pthread_sigmask failed" unless sigmask.call(0, Fiddle::Pointer[set], nil).zero? # SIG_BLOCK
    end
    ready = Queue.new
    go = Queue.new
    profiler.start if when_blocked == "after"
    thread = Thread.new do
      Thread.current.name = "blocker"
      block.call if when_blocked == "before"
      ready << true
      go.pop
      burn(0.2)
      block.call if when_blocked == "after"
      blocked_burn(1.5)
    end
    ready.pop
    profiler.start if when_blocked == "before"
    go << true
    main_burn(0.3)
    thread.join
    pprof = profiler.stop.last
    path = File.join(Dir.mktmpdir, "profile.pprof")
    File.binwrite(path, pprof)
    puts JSON.generate(path: path, blocked: profiler.stats.dig(:signals, :signal_blocked_threads))
  RUBY

  def run_child(program, lib, *args)
    out, err, status = Open3.capture3("timeout", "120", RbConfig.ruby, "-I", lib, "-e", program, *args)
    expect(status).to be_success, "exit #{status.inspect}\n#{out}\n#{err}"
    [JSON.parse(out.lines.last), err]
  end

  # The CPU of each of the methods in the profile, by function name (the cumulative
  # cpu-time of the samples whose stack holds it).
  def cpu_by_method(samples, names)
    names.to_h do |name|
      [name, samples.select { |s| s[:frames].any? { |f| f[0].end_with?(name) } }.sum { |s| s[:values]["cpu-time"] }]
    end
  end

  # 300 threads (past the 256 slots) and main each burn 30 ms of CPU, all alive at once.
  many_threads = <<~'RUBY'
    require "json"
    require "tmpdir"
    require "ddprof_recorder"
    def burn(seconds)
      from = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - from < seconds
    end
    profiler = DdprofRecorder::Profiler.new(hz: 99, compression: :none)
    profiler.start
    go = Queue.new
    cpu = {}
    threads = Array.new(300) do
      Thread.new do
        go.pop
        burn(0.03)
        cpu[Thread.current.native_thread_id] = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)
      end
    end
    sleep 0.3
    300.times { go << true }
    threads.each(&:join)
    pprof = profiler.stop.last
    path = File.join(Dir.mktmpdir, "profile.pprof")
    File.binwrite(path, pprof)
    puts JSON.generate(path: path, cpu: cpu.values.sum, tids: cpu.keys, slots: DdprofRecorder::Profiler::SIGNAL_SLOTS)
  RUBY

  it "says how many threads had no slot, and charges their CPU to them" do
    result, err = run_child(many_threads, lib)
    pprof = File.binread(result["path"])
    # main and the 300 take the slots in turn: 45 are left without, at most.
    no_slot = pprof_comments(pprof).filter_map { |c| c[/\Asignal slots: (\d+) threads had none \(#{result['slots']} threads/, 1] }
    expect(no_slot.size).to eq(1), pprof_comments(pprof).inspect
    expect(Integer(no_slot.first)).to be_between(1, 301 - result["slots"]), err
    tids = result["tids"].map(&:to_s)
    samples = samples_from(decode_pprof(pprof)).select { |s| tids.include?(s[:labels]["thread id"].to_s[/\A\d+/]) }
    # Their CPU in the profile against their own clocks: within 5%.
    expect(samples.sum { |s| s[:values]["cpu-time"] }).to be_within(0.05 * result["cpu"]).of(result["cpu"])
  end

  ["after", "before"].each do |when_blocked|
    it "charges the CPU of a thread that blocks it #{when_blocked} it is armed to that thread's own stacks, " \
       "and says so once" do
      result, err = run_child(program, lib, when_blocked)
      expect(result["blocked"]).to eq(1)
      expect(err.scan("blocks the profiler's signal").size).to eq(1), err
      pprof = File.binread(result["path"])
      samples = samples_from(decode_pprof(pprof))
      cpu = cpu_by_method(samples, ["blocked_burn", "main_burn"])
      total = samples.sum { |s| s[:values]["cpu-time"] }
      # Truth: 1.5 s of 2.0 in blocked_burn, 0.3 in main_burn. Wide margins: up to 0.1 s of
      # its CPU may go to the stack it had when the block was found.
      expect(cpu["blocked_burn"].fdiv(total)).to be_between(0.6, 0.85), cpu.inspect
      expect(cpu["main_burn"].fdiv(total)).to be_between(0.08, 0.25), cpu.inspect
      comments = pprof_comments(pprof)
      expect(comments.grep(/\Asignal blocked: 1 thread blocked the profiler's signal/).size).to eq(1), comments.inspect
    end
  end
end
