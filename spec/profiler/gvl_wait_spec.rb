# frozen_string_literal: true

require_relative "../../bench/support/clock_helpers"

# Issue 22, step 2 (GVL waits): with `timeline: true` on Ruby 3.3+, ext/ddprof_recorder/src/
# gvl_events.rs measures how long each thread was ready to run without the GVL, and the
# sampler charges it as `gvl-wait-time`. The truth of a busy thread's wait: its wall time (from
# when it was made ready to its end) minus its own CPU time, minus the time the kernel kept it
# waiting for a CPU (/proc/thread-self/schedstat, the second field: on a loaded machine a
# thread that holds the GVL may wait for a CPU too, which is no GVL wait).
RSpec.describe DdprofRecorder::Profiler, "gvl-wait-time" do
  include ClockHelpers # mono_ns, thread_cpu_ns, runqueue_ns, busy_for

  context "on a Ruby without GVL events", if: !DdprofRecorder::Profiler::GVL_EVENTS do
    it "has no gvl-wait-time (Ruby 3.1: no thread event API)" do
      pprof = described_class.profile(timeline: true, compression: :none) { busy_for(20_000_000) }
      expect(DdprofRecorder.summary(pprof)[:value_types].map(&:first)).not_to include("gvl-wait-time")
    end
  end

  context "on Ruby 3.3+", if: DdprofRecorder::Profiler::GVL_EVENTS do
    it "charges each busy thread its wall time minus its CPU time, and a sleeper its wait after the sleep" do
      profiler = described_class.new(hz: 99, compression: :none, timeline: true)
      profiler.start
      truth = {}
      go = Queue.new
      # Each one named before it runs: its samples, and waits, carry its name from the first.
      busy = Array.new(4) do |i|
        Thread.new do
          released = go.pop
          cpu = thread_cpu_ns
          queued = runqueue_ns
          busy_for(600_000_000)
          # The read gives up the lock and waits for it again (a GVL wait, before the end).
          queued = runqueue_ns - queued
          truth["busy-#{i}"] = [mono_ns - released, thread_cpu_ns - cpu, queued]
        end.tap { |t| t.name = "busy-#{i}" }
      end
      # Ready from the push on (Queue#pop wakes it): its wait for the lock starts there.
      4.times { go << mono_ns }
      sleeper_wait = nil
      created = mono_ns
      sleeper = Thread.new do
        # Its first line and its line after the sleep run once it has the lock: what it waited
        # for the lock is its start's wait and its wake-up's.
        from = mono_ns
        sleep 0.6
        sleeper_wait = (from - created) + (mono_ns - from - 600_000_000)
      end.tap { |t| t.name = "sleeper" }
      busy.each(&:join)
      sleeper.join
      samples = samples_from(decode_pprof(profiler.stop.last))
      waits = samples.group_by { |s| s[:labels]["thread name"] }.transform_values do |ss|
        ss.sum { |s| s[:values]["gvl-wait-time"] }
      end
      truth.each do |name, (wall, cpu, queued)|
        # Its wait is its wall time less its CPU, less the part of its time in the kernel's run
        # queue that was not a wait for the lock: none of it, or all of it. Time runnable while
        # holding the lock (preempted) is no wait for it; time runnable once woken to take it is
        # (the GVL's wake-up to its resume), and on a loaded machine that is much of the run
        # queue's (busy-2: 1,528 ms measured, 2,202 ms wall, 856 ms in the run queue, beside two
        # busy loops). Within 5 points of the wall time outside that range: the issue's margin.
        measured = waits.fetch(name)
        context = "#{name}: #{measured} ns measured, wall #{wall}, cpu #{cpu}, run queue #{queued}"
        expect(measured).to be > wall - cpu - queued - (0.05 * wall), context
        expect(measured).to be < wall - cpu + (0.05 * wall), context
      end
      # The sleeper waits only for the lock after its sleep: a few of the busy threads' 100 ms
      # slices, more on a loaded machine (a bound of half a busy thread's wall time failed on
      # 3.4.5 beside other jobs), never its sleep. Within 5 points of a busy thread's wall time
      # of its own measure of that wait.
      wall = truth.values.map(&:first).max
      expect((waits.fetch("sleeper", 0) - sleeper_wait).abs).to be < 0.05 * wall,
                                                                "sleeper: #{waits['sleeper']} ns measured, " \
                                                                "#{sleeper_wait} ns waited to start and after its sleep"
      expect(samples.sum { |s| s[:values]["gvl-wait-time"] }).to be_positive
    end

    it "measures in a forked child too: the parent's hook goes and a new one comes" do
      reader, writer = IO.pipe
      described_class.start(hz: 99, timeline: true, compression: :none)
      pid = fork do
        reader.close
        Array.new(2) { Thread.new { busy_for(150_000_000) } }.each(&:join)
        writer.write(DdprofRecorder.summary(described_class.stop.last)[:totals]["gvl-wait-time"].to_s)
        exit!(0)
      end
      writer.close
      Process.wait(pid)
      described_class.stop
      # Two threads of 150 ms each sharing the lock: each waits most of the other's time.
      expect([$?.exitstatus, Integer(reader.read)]).to match([0, be > 50_000_000])
    ensure
      described_class.stop
    end

    it "removes its hook at stop: a take after it reads what was left, then nothing" do
      profiler = described_class.new(hz: 99, compression: :none, timeline: true)
      profiler.start
      profiler.stop
      t = Thread.new { busy_for(30_000_000) }
      busy_for(30_000_000)
      t.join
      expect(described_class._native_gvl_take(Thread.current)).to eq(0).or be_nil
      expect { described_class._native_gvl_take(1) }.to raise_error(TypeError)
    end
  end
end
