# frozen_string_literal: true

require "fiddle"
require "io/nonblock"
require "json"
require "open3"
require "rbconfig"
require "timeout"
require "tmpdir"

# The profiler does not disturb the program it profiles: with `signals: false` no signal is
# delivered and no handler installed (trigger.rs); by default only its own real-time signal,
# and only to a thread that is using the CPU (signal_sampler.rs). Either way, blocked threads
# are neither woken early nor see EINTR, the program's own trap("PROF") stays its own, and
# interrupts sent between the program's threads (Thread#kill, Thread#raise, Timeout) still
# arrive. All at 999 Hz; the margins are wide (a shared 2-core VM).
RSpec.describe DdprofRecorder::Profiler, "does not disturb the program" do
  root = File.expand_path("../..", __dir__)
  lib = File.join(root, "lib")

  # libc through Fiddle. A Fiddle::Function releases the GVL around the call unless made with
  # `need_gvl: true` (Fiddle 1.1.0, Ruby 3.1's: checked with usleep(3), other threads run
  # meanwhile only without it), so by default the call blocks like a C extension's blocking
  # region; with need_gvl: true it blocks holding the GVL, like a C extension that does not
  # release it. Fiddle.last_error is the errno of the calling thread's last call. Ruby 3 makes
  # its pipes O_NONBLOCK, so the fds given to read(2) are made blocking first.
  libc = Fiddle::Handle::DEFAULT
  types = [Fiddle::TYPE_INT, Fiddle::TYPE_VOIDP, Fiddle::TYPE_SIZE_T]
  c_read = Fiddle::Function.new(libc["read"], types, Fiddle::TYPE_SSIZE_T)
  c_read_gvl = Fiddle::Function.new(libc["read"], types, Fiddle::TYPE_SSIZE_T, need_gvl: true)
  poll_types = [Fiddle::TYPE_VOIDP, Fiddle::TYPE_SIZE_T, Fiddle::TYPE_INT]
  c_poll = Fiddle::Function.new(libc["poll"], poll_types, Fiddle::TYPE_INT)
  c_poll_gvl = Fiddle::Function.new(libc["poll"], poll_types, Fiddle::TYPE_INT, need_gvl: true)
  pollin = 1

  # A blocking call told to return after 0.3 s (a timeout, or another thread acting then)
  # must not return before this: the slack is for the clocks, not for early wake-ups.
  min_wait = 0.28
  max_wait = 10 # a call this late is hung, not slow

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def busy(seconds)
    deadline = monotonic + seconds
    x = 0
    x = (x + [x, 3].max) % 1_000_003 while monotonic < deadline
    x
  end

  # A thread running Ruby code (so the jobs run) until `stop` says so.
  def burner(stop)
    Thread.new { busy(0.01) until stop.call }.tap { |t| t.name = "burner" }
  end

  # {thread name => {value type => total}} of a pprof.
  def sampled_threads(pprof)
    samples_from(decode_pprof(pprof)).group_by { |s| s[:labels]["thread name"] }
                                     .transform_values { |ss| value_totals(ss) }
  end

  describe "signals" do
    # A fresh process (in the spec's own process, another example's profiler may have run
    # already): the main thread loops over Ruby work until it used 0.5 s of CPU while another sleeps 5 ms
    # at a time, profiled at 999 Hz. It reads its signal masks before loading the gem, after
    # loading it, while profiling and after stopping, and prints them with the profiler's
    # counters, the sampling signal and the sleeper's native id as JSON. glibc (2.34+)
    # installs its SIGSETXID handler at the process's first pthread_create, which is not the
    # profiler's doing: a thread is made before the first read. DDPROF_RECORDER_SIGNALS picks
    # the mode (Profiler.signals_default).
    program = <<~'RUBY'
      def masks = File.read("/proc/self/status").scan(/^(Sig\w+|ShdPnd):\s*(\S+)$/).to_h
      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      Thread.new {}.join
      seen = { "before" => masks }
      require "ddprof_recorder"
      require "json"
      seen["loaded"] = masks
      profiler = DdprofRecorder::Profiler.new(hz: 999, compression: :none).start
      done = false
      # Its native id comes from itself: Thread#native_thread_id is nil once a thread has
      # ended (Ruby 3.3), and it may end before the main thread asks.
      sleeper = Thread.new do
        sleep 0.005 until done
        [Thread.current.native_thread_id, Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)]
      end
      # Busy until this thread has used 0.5 s of CPU (a loaded machine gives it less than the
      # wall time), or 20 s went by.
      cpu = -> { Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) }
      main_cpu0 = cpu.call
      cpu_until = main_cpu0 + 0.5
      deadline = now + 20
      x = 0
      while cpu.call < cpu_until && now < deadline
        1000.times { x += [x % 7, 1].map { |v| v * 2 }.sum }
      end
      done = true
      main_cpu = cpu.call - main_cpu0
      sleeper_id, sleeper_cpu = sleeper.value
      # A tick's signal can be on its way to this thread while it reads its status: pending
      # for that moment only. One left pending (blocked, or never handled) shows in every read.
      seen["running"] = masks
      20.times do
        break if seen["running"].values_at("SigPnd", "ShdPnd").all?(/\A0+\z/)

        seen["running"] = masks
      end
      profiler.stop
      seen["stopped"] = masks
      stats = profiler.stats
      puts JSON.generate("masks" => seen, "stats" => stats.slice(:on_cpu_samples, :samples, :sampling_mode, :ticks),
                         "signal" => stats[:signals]&.fetch(:signal), "sleeper" => sleeper_id, "main" => Process.pid,
                         "cpu" => { "main" => main_cpu, "sleeper" => sleeper_cpu })
    RUBY

    # Runs the program (after `prefix`, e.g. strace) with `env`; returns its JSON output, parsed.
    define_method(:run_program) do |*prefix, env: {}|
      out, err, status = Open3.capture3(env, *prefix, RbConfig.ruby, "-I", lib, "-e", program)
      expect(status.success?).to be(true), "#{status.inspect}\n#{err}"
      JSON.parse(out)
    end

    def expect_no_pending(masks)
      %w[loaded running stopped].each do |moment|
        expect(masks[moment].values_at("SigPnd", "ShdPnd")).to all(match(/\A0+\z/)), "pending signals #{moment}"
      end
    end

    # The handled signals at each moment, as signal numbers.
    def handled(masks, moment)
      bits = masks[moment]["SigCgt"].to_i(16)
      (1..64).select { |n| bits[n - 1] == 1 }
    end

    # strace's `PID --- SIGxxx {...} ---` lines: one per signal delivered.
    def traced_signals(prefix_ok, env)
      _, probe_err, probe = begin
        Open3.capture3("strace", "-qq", "-e", "trace=none", "-o", File::NULL, "true")
      rescue Errno::ENOENT
        skip "strace is not installed (apt-get install strace)"
      end
      skip "strace cannot trace here (ptrace not permitted?): #{probe_err.strip}" unless probe.success? && prefix_ok

      Dir.mktmpdir("ddprof_recorder_strace") do |dir|
        trace = File.join(dir, "strace.out")
        result = run_program("strace", "-f", "-qq", "-e", "trace=none", "-e", "signal=all", "-o", trace, env: env)
        [result, File.readlines(trace).grep(/--- SIG/)]
      end
    end

    context "with signals: false" do
      env = { "DDPROF_RECORDER_SIGNALS" => "0" }

      it "installs no signal handler and leaves no signal pending" do
        result = run_program(env: env)
        expect(result["stats"]["sampling_mode"]).to eq("off")
        expect(result["stats"]["on_cpu_samples"]).to be > 50 # it sampled meanwhile (999 Hz for 0.5 s of CPU)
        %w[loaded running stopped].each do |moment|
          expect(handled(result["masks"], moment)).to eq(handled(result["masks"], "before")), "handled signals #{moment}"
        end
        expect_no_pending(result["masks"])
      end

      it "delivers no signal to the process (strace)" do
        result, signals = traced_signals(true, env)
        expect(signals).to eq([])
        # But sampling: a pass at each of the trigger's ticks, two threads each. Under strace
        # nearly every job is late (ptrace stops the thread at each of its syscalls, its CPU
        # clock reads too, and a job more than 30 us after its tick with little CPU since is:
        # sampling/job.rs, `on_time`), so few are on-CPU samples: 2 to 38 seen, 992 late jobs
        # of 997 in a quiet run.
        expect(result["stats"]["samples"]).to be > 200
        expect_no_pending(result["masks"])
      end
    end

    context "with signals (the default)" do
      it "handles one real-time signal more, and leaves none pending" do
        result = run_program
        # With YJIT on (RUBY_YJIT_ENABLE, which the program inherits) on Ruby 3.1, the handler
        # only marks the tick; the stack is read at the next interrupt check.
        at_job = defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? && !DdprofRecorder::Profiler::HANDLER_READS_UNDER_YJIT
        expect(result["stats"]["sampling_mode"]).to eq(at_job ? "safepoint" : "handler")
        expect(result["stats"]["on_cpu_samples"]).to be > 50
        before = handled(result["masks"], "before")
        added = handled(result["masks"], "running") - before
        expect(added.size).to eq(1)
        expect(added.first).to be > 32 # a real-time signal: not SIGPROF nor any other that trap can take
        expect(result["signal"]).to match(/\ASIGRTMIN\+\d+\z/)
        expect(handled(result["masks"], "stopped")).to eq(handled(result["masks"], "running")) # it stays, harmless
        expect_no_pending(result["masks"])
      end

      # CPU ticks' signals are the timers' (SI_TIMER); perf events' are F_SETSIG's (a POLL_*
      # band: POLL_HUP, 0x6 to strace, the event reaching its one-overflow limit), beside their
      # threads' timers. Neither is the SI_QUEUE of a signal sent from this process, as the wall
      # ticks were.
      { "auto" => ["perf_events", "POLL_HUP|POLL_IN|0x6|0x1|SI_TIMER"], "cpu" => ["cpu_timers", "SI_TIMER"] }.each do |ticks, (kind, code)|
        it "signals a thread for the CPU it uses: the busy one, the sleeping one hardly (strace, #{ticks} ticks)" do
          result, signals = traced_signals(true, { "DDPROF_RECORDER_TICKS" => ticks })
          expect(result["stats"]["ticks"]).to eq(kind)
          expect(result["stats"]["on_cpu_samples"]).to be > 10
          expect(signals).not_to be_empty
          # The sleeper runs for some microseconds between its 5 ms naps, so now and then a
          # tick comes while it runs (the blocked-thread examples check that it is never woken):
          # for its CPU, as the busy thread's (under strace its CPU grew: 181 and 233 signals
          # against the busy one's 441 and 303 once in CI).
          expect(signals).to all(match(/\A\d+ +--- SIGRT_\d+ \{si_signo=SIGRT_\d+, si_code=(#{code}),/))
          main = signals.grep(/\A#{result["main"]} +---/).size
          sleeper = signals.grep(/\A#{result["sleeper"]} +---/).size
          # No other thread armed (the profiler's own are not).
          expect(main + sleeper).to eq(signals.size), "signals by thread id: #{signals.map { |l| l[/\A\d+/] }.tally}"
          cpu = result["cpu"]
          expect(sleeper).to be <= (3 * main * cpu["sleeper"] / cpu["main"]) + 10,
                             "CPU: #{cpu}, signals: main #{main}, sleeper #{sleeper}"
        end
      end
    end
  end

  describe "blocked threads" do
    it "are not woken early and see no EINTR while another thread burns CPU", :aggregate_failures do
      stop = false
      busy_thread = burner(-> { stop })
      profiler = described_class.new(hz: 999, compression: :none).start
      pipe_r, pipe_w = IO.pipe
      c_pipe_r, c_pipe_w = IO.pipe
      c_pipe_r.nonblock = false
      never_r, never_w = IO.pipe # nobody writes: only timeouts end the waits on it
      queue = Queue.new
      lock = Mutex.new
      cond = ConditionVariable.new
      signalled = false

      # name => the blocking call; each thread returns [its value, seconds it took, errno].
      calls = {
        "IO#read" => -> { pipe_r.read(5) },
        "sleep" => -> { sleep 0.3 },
        "IO.select" => -> { IO.select([never_r], nil, nil, 0.3) },
        "Queue#pop" => -> { queue.pop },
        "ConditionVariable#wait" => -> { lock.synchronize { cond.wait(lock) && signalled } },
        "read(2)" => lambda {
          buffer = Fiddle::Pointer.malloc(8, Fiddle::RUBY_FREE)
          n = c_read.call(c_pipe_r.fileno, buffer, 5)
          [n, n == 5 ? buffer.to_s(5) : nil]
        },
        "poll(2)" => -> { c_poll.call([never_r.fileno, pollin, 0].pack("is!s!"), 1, 300) },
      }
      waiters = calls.to_h do |name, call|
        thread = Thread.new do
          started = monotonic
          value = call.call
          [value, monotonic - started, Fiddle.last_error]
        end
        thread.name = name
        [name, thread]
      end
      # Release the ones that wait for another thread 0.3 s after they all block.
      wait_until("every waiter blocks", timeout: 10) { waiters.values.all? { |t| t.status == "sleep" || !t.alive? } }
      sleep 0.3
      pipe_w.write("hello")
      c_pipe_w.write("hello")
      queue << :pushed
      lock.synchronize do
        signalled = true
        cond.signal
      end

      results = waiters.transform_values { |t| t.join(max_wait)&.value }
      pprof = profiler.stop.last
      stop = true
      busy_thread.join

      expect(results.compact.size).to eq(calls.size), "still blocked: #{results.select { |_, r| r.nil? }.keys}"
      # Kernel#sleep returns whole seconds of time(2): 0.3 s that cross a second boundary are 1.
      expect(results.transform_values(&:first)).to match(
        "IO#read" => "hello", "sleep" => a_value_between(0, 1), "IO.select" => nil, "Queue#pop" => :pushed,
        "ConditionVariable#wait" => true, "read(2)" => [5, "hello"], "poll(2)" => 0,
      )
      results.each do |name, (_, seconds, errno)|
        expect(seconds).to be_between(min_wait, max_wait), "#{name} returned after #{seconds} s"
        expect(errno).not_to eq(Errno::EINTR::Errno), name if %w[read(2) poll(2)].include?(name)
      end
      # The profiler did look at them while they were blocked, at the rate asked for.
      by_thread = sampled_threads(pprof)
      calls.each_key { |name| expect(by_thread.dig(name, "wall-time")).to be > 0.2e9, name }
      expect(by_thread.dig("burner", "cpu-time")).to be > 0.1e9
    ensure
      stop = true
      [pipe_r, pipe_w, c_pipe_r, c_pipe_w, never_r, never_w].each { |io| io&.close }
    end

    it "are not interrupted when they block in C holding the GVL", :aggregate_failures do
      stop = false
      busy_thread = burner(-> { stop })
      profiler = described_class.new(hz: 999, compression: :none).start
      never_r, never_w = IO.pipe
      # The ticks ask for jobs on this thread (it holds the GVL) while it waits in poll(2)...
      started = monotonic
      polled = c_poll_gvl.call([never_r.fileno, pollin, 0].pack("is!s!"), 1, 300)
      poll_seconds = monotonic - started
      poll_errno = Fiddle.last_error
      # ... and in read(2) on a pipe that another process writes to after 0.3 s (no thread of
      # ours can run meanwhile). It lives on until we close its stdin: its SIGCHLD, which Ruby
      # catches without SA_RESTART, must not be what interrupts the read.
      # The child's 0.3 s count from our "go", and ours from before it: getting the GVL back
      # after writing "go" can take the burner's 100 ms time slice (a 0.20 s read was seen
      # when the child counted from its start).
      child = "$stdin.gets; sleep 0.3; $stdout.write('hello'); $stdout.flush; $stdin.read"
      Open3.popen2(RbConfig.ruby, "-e", child) do |stdin, stdout, wait|
        stdout.nonblock = false
        buffer = Fiddle::Pointer.malloc(8, Fiddle::RUBY_FREE)
        started = monotonic
        stdin.puts("go")
        stdin.flush
        read = c_read_gvl.call(stdout.fileno, buffer, 5)
        read_seconds = monotonic - started
        read_errno = Fiddle.last_error
        stdin.close
        wait.join
        expect([read, read == 5 ? buffer.to_s(5) : nil]).to eq([5, "hello"]), "read(2): errno #{read_errno}"
        expect(read_seconds).to be_between(min_wait, max_wait)
      end
      # Let the jobs asked for meanwhile run, and the profiler sample (a loaded machine gives
      # this thread less of the wall time).
      deadline = monotonic + 20
      busy(0.01) until profiler.stats[:on_cpu_samples] > 10 || monotonic > deadline
      profiler.stop
      stop = true
      busy_thread.join
      expect(polled).to eq(0), "poll(2) returned #{polled}, errno #{poll_errno}"
      expect(poll_seconds).to be_between(min_wait, max_wait)
      expect(profiler.stats[:on_cpu_samples]).to be > 10
    ensure
      stop = true
      [never_r, never_w].each { |io| io&.close }
    end
  end

  it "leaves the program's own trap(\"PROF\") its own, set before or while it runs" do
    # Process.kill(:PROF, Process.pid) from the main thread does not go through the kernel:
    # Ruby queues the signal for its own handler at once (signal.c, rb_f_kill). kill(2)
    # through libc sends a real SIGPROF. Each phase sends 3 of each and counts the handler's
    # runs; a profiler that sent SIGPROF or replaced the handler would change the count.
    program = <<~'RUBY'
      require "fiddle"
      require "json"
      require "ddprof_recorder"
      def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      def prof_caught? = (Integer(File.read("/proc/self/status")[/^SigCgt:\s*(\h+)/, 1], 16) >> (Signal.list["PROF"] - 1)).odd?
      c_kill = Fiddle::Function.new(Fiddle::Handle::DEFAULT["kill"], [Fiddle::TYPE_INT, Fiddle::TYPE_INT], Fiddle::TYPE_INT)
      $count = 0
      def wait_count(n)
        deadline = now + 5
        sleep 0.001 until $count >= n || now > deadline
      end
      def send_six(c_kill)
        base = $count
        3.times { |i| Process.kill(:PROF, Process.pid); wait_count(base + i + 1) }
        3.times { |i| c_kill.call(Process.pid, Signal.list["PROF"]); wait_count(base + i + 4) }
        x = 0
        # Profiling on: any other SIGPROF would be counted. At least 0.3 s, and until the
        # profiler ran 100 jobs (a loaded machine gives this thread less of that time).
        shortest = now + 0.3
        deadline = now + 20
        until now > deadline || (now > shortest && DdprofRecorder::Profiler._native_sampling_stats[:jobs] > 100)
          10_000.times { x += 1 }
        end
        $count - base
      end
      stop = false
      Thread.new { x = 0; x += 1 until stop }
      handler = proc { $count += 1 }
      result = {}

      trap("PROF", handler)
      DdprofRecorder::Profiler.start(hz: 999)
      result["before_start"] = send_six(c_kill)
      result["caught_while_running"] = prof_caught?
      result["jobs"] = DdprofRecorder::Profiler._native_sampling_stats[:jobs]
      DdprofRecorder::Profiler.stop
      result["kept_after_stop"] = trap("PROF", handler).equal?(handler)
      base = $count
      c_kill.call(Process.pid, Signal.list["PROF"])
      wait_count(base + 1)
      result["after_stop"] = $count - base

      trap("PROF", "DEFAULT")
      $count = 0
      DdprofRecorder::Profiler.start(hz: 999)
      second = proc { $count += 1 }
      trap("PROF", second)
      result["while_running"] = send_six(c_kill)
      DdprofRecorder::Profiler.stop
      result["second_kept_after_stop"] = trap("PROF", "DEFAULT").equal?(second)
      stop = true
      puts JSON.generate(result)
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, "-e", program)
    expect(status.success?).to be(true), "#{status.inspect}\n#{err}"
    expect(err).to eq("")
    expect(JSON.parse(out)).to match(
      "before_start" => 6, "caught_while_running" => true, "jobs" => be > 100, "kept_after_stop" => true,
      "after_stop" => 1, "while_running" => 6, "second_kept_after_stop" => true,
    )
  end

  # Thread#kill, Thread#raise and Timeout.timeout (a Thread#raise from Timeout's thread) are
  # delivered at the target's next interrupt check. The job runs Ruby code at such checks on
  # the busy threads; what it receives there must still reach the program. Each round kills,
  # raises into and times out busy threads at once; all must end within a wide margin. A
  # victim that missed its interrupt is told to stop by a flag instead (it may be unkillable).
  # Allocation sampling is on too: its job runs a Ruby handler as well.
  it "lets Thread#kill, Thread#raise and Timeout.timeout reach busy threads" do
    rounds = 25
    width = 3
    done = false
    lost = Hash.new(0)
    # The busy loop allocates nothing: the samples come from the threads, queues and timeouts
    # made, about 2,000 objects, which at the default interval and duty cycle gave none at all
    # in a loaded CI run. One in 16 with the hook always on (issue 20's item 5 lost raises at
    # 16) keeps the allocation job running through every round.
    profiler = described_class.new(hz: 999, allocations: true, allocation_interval: 16, allocation_overhead: 1.0,
                                   compression: :none).start
    victims = []
    rounds.times do
      kinds = Array.new(width) { |i| %i[kill raise timeout][i % 3] }
      started = kinds.map { Queue.new }
      round = kinds.each_with_index.map do |kind, i|
        Thread.new do
          work = proc {
            started[i] << true
            busy(0.005) until done
            :missed
          }
          kind == :timeout ? Timeout.timeout(0.05, &work) : work.call
        rescue RuntimeError # the raise, and Timeout::Error
          :raised
        end
      end
      victims.concat(round)
      started.each(&:pop)
      sleep 0.05
      round.each_with_index do |thread, i|
        case kinds[i]
        when :kill then thread.kill
        when :raise then thread.raise(RuntimeError, "from another thread")
        end
      end
      deadline = monotonic + 2
      round.each_with_index do |thread, i|
        lost[kinds[i]] += 1 unless thread.join([deadline - monotonic, 0].max)
      end
    end
    # The victims end before the profiler stops: one that missed its interrupt may hold the
    # sampler's lock (the interrupt can land in the job's `ensure`), which stop waits for.
    done = true
    victims.each { |t| t.join(5) }
    stats = profiler.stats
    native = described_class._native_sampling_stats
    profiler.stop
    expect(lost).to be_empty, "interrupts that never arrived, of #{rounds * width} sent: #{lost}"
    expect(stats[:on_cpu_samples] + stats[:signal_samples]).to be > 100
    expect(stats[:allocations][:recorded]).to be > 0
    # The deferral works on this Ruby: its layout checks passed at start and in every job.
    expect(stats[:interrupt_deferral]).to be(true)
    expect(native).to include(interrupt_deferral_refused: 0)
    expect(native[:jobs_deferring_interrupts]).to be > 0
  ensure
    done = true
    victims&.each { |t| t.join(5) }
  end
end
