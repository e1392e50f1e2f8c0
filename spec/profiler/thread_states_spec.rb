# frozen_string_literal: true

# Issue 22, thread states: with `timeline: true` each dated sample says what its thread was
# doing (label "thread state": running, waiting for GVL, blocked, gc), and
# DdprofRecorder.summary's `:threads` gives each thread's shares of its wall time, which
# `record` prints. Checked against truths measured inside the program: its threads' own CPU
# and wall clocks, the kernel's run-queue time, the time it asked to sleep, and GC.stat(:time).
RSpec.describe DdprofRecorder::Profiler, "thread states" do
  def mono_ns = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)

  def thread_cpu_ns = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)

  # Ns the calling thread spent runnable but not on a CPU, as the kernel counts it.
  def runqueue_ns = Integer(File.read("/proc/thread-self/schedstat").split[1])

  def busy_for(ns)
    from = mono_ns
    x = 0
    x += 1 while mono_ns - from < ns
    x
  end

  STATES = ["running", "waiting for GVL", "blocked", "gc"].freeze

  # 4 busy threads and a sleeper, as the issue's GVL truth asks: per thread name, the truth
  # `[wall, cpu, run queue, slept]` (ns) and the profile.
  def busy_threads_and_a_sleeper
    profiler = described_class.new(hz: 99, compression: :none, timeline: true)
    profiler.start
    truth = {}
    go = Queue.new
    threads = Array.new(4) do |i|
      Thread.new do
        released = go.pop
        cpu = thread_cpu_ns
        queued = runqueue_ns
        busy_for(600_000_000)
        truth["busy-#{i}"] = [mono_ns - released, thread_cpu_ns - cpu, runqueue_ns - queued, 0]
      end.tap { |t| t.name = "busy-#{i}" }
    end
    4.times { go << mono_ns }
    threads << Thread.new do
      Thread.current.name = "sleeper"
      from = mono_ns
      cpu = thread_cpu_ns
      # Long sleeps: each wake-up waits for the GVL (up to a busy thread's 100 ms slice),
      # which is a GVL wait, not sleep.
      3.times { sleep 0.2 }
      truth["sleeper"] = [mono_ns - from, thread_cpu_ns - cpu, 0, 600_000_000]
    end
    threads.each(&:join)
    [truth, profiler.stop.last]
  end

  it "labels every dated sample with one of the four states, and each thread's shares add up to its wall time" do
    truth, pprof = busy_threads_and_a_sleeper
    samples = samples_from(decode_pprof(pprof))
    dated = samples.select { |s| s[:labels].key?(DdprofRecorder::StackRecorder::END_TIMESTAMP_LABEL) }
    expect(dated.size).to be > 50
    expect(dated.map { |s| s[:labels]["thread state"] }.uniq - STATES).to eq([])
    by_thread = dated.group_by { |s| s[:labels]["thread name"] }
    truth.each_key do |name|
      states = by_thread.fetch(name).map { |s| s[:labels]["thread state"] }
      # Busy threads run and wait their turn (Ruby 3.1's waits come from the thread status).
      expect(states).to include("running", "waiting for GVL"), name if name.start_with?("busy")
      expect(states).to include("blocked"), name if name == "sleeper"
    end

    # The summary's shares, from the values, agree with google-protobuf's sums of them.
    threads = DdprofRecorder.summary(pprof)[:threads]
    truth.each_key do |name|
      t = threads.find { |x| x[:name] == name }
      mine = samples.select { |s| s[:labels]["thread name"] == name }
      expect(t[:wall]).to eq(mine.sum { |s| s[:values]["wall-time"] })
      expect(t[:running] + t[:gc] + t[:blocked] + t[:waiting]).to be_within(t[:wall] / 50).of(t[:wall])
      expect(t[:waiting_estimated]).to be(!described_class::GVL_EVENTS)
    end
  end

  context "on Ruby 3.3+ (GVL events)", if: DdprofRecorder::Profiler::GVL_EVENTS do
    it "gives each busy thread its GVL wait within 5 points, and the sleeper its sleep as blocked" do
      truth, pprof = busy_threads_and_a_sleeper
      threads = DdprofRecorder.summary(pprof)[:threads].to_h { |t| [t[:name], t] }
      truth.each do |name, (wall, cpu, queued, slept)|
        t = threads.fetch(name)
        share = ->(ns) { 100.0 * ns / t[:wall] }
        if slept.zero?
          # Waiting: its wall time less its CPU and the kernel's run queue (a wait for a CPU,
          # not for the lock), over its wall time from its release.
          expected = 100.0 * (wall - cpu - queued) / wall
          expect(share.call(t[:waiting])).to be_within(5).of(expected), "#{name}: #{t.inspect}, truth #{expected}%"
        else
          # Blocked: the time it asked to sleep; the rest of its wall time was its wake-ups' wait.
          expected = 100.0 * slept / wall
          expect(share.call(t[:blocked])).to be_within(5).of(expected), "#{name}: #{t.inspect}, truth #{expected}%"
          expect(share.call(t[:waiting])).to be_within(5).of(100.0 * (wall - slept - cpu) / wall)
        end
      end
    end
  end

  it "gives the GC its share of wall time within 5 points of GC.stat(:time)" do
    profiler = described_class.new(hz: 99, compression: :none, timeline: true, gc: true)
    profiler.start
    gc_ms = GC.stat(:time)
    cpu = thread_cpu_ns
    keep = []
    # Allocation-heavy: strings kept for a while (old objects to mark), hashes dropped at once.
    150_000.times do |i|
      keep << (("x" * 100) + i.to_s)
      keep.shift if keep.size > 50_000
      { a: i, b: [i] }
    end
    cpu = thread_cpu_ns - cpu
    # GC.stat(:time) is the process's CPU time in the GC (Ruby's gc.c, gc_clock_start:
    # current_process_time), all of it on this thread here. Its share of this thread's CPU is
    # its share of the thread's wall time as long as the kernel's preemptions fall alike on
    # the GC and the rest, which a loaded machine keeps true but a GC.stat share of wall
    # time would not (CPU never waits for a CPU; wall time does).
    gc_ns = (GC.stat(:time) - gc_ms) * 1_000_000
    pprof = profiler.stop.last
    main = DdprofRecorder.summary(pprof)[:threads].find { |t| t[:name] == "main" }
    expect(gc_ns).to be > cpu / 20 # the program does spend time in the GC
    expect(100.0 * main[:gc] / main[:wall]).to be_within(5).of(100.0 * gc_ns / cpu),
                                                   "#{main.inspect}: GC.stat #{gc_ns} ns of #{cpu} ns CPU; " \
                                                   "#{DdprofRecorder.summary(pprof)[:threads].inspect}"
    gc_samples = samples_from(decode_pprof(pprof)).select { |s| s[:labels]["thread state"] == "gc" }
    expect(gc_samples).not_to be_empty
    expect(gc_samples.map { |s| s[:labels]["gc kind"] }.uniq - %w[minor major]).to eq([])
  end

  it "adds no state label without the timeline" do
    pprof = described_class.profile(compression: :none) { busy_for(30_000_000) }
    labels = samples_from(decode_pprof(pprof)).flat_map { |s| s[:labels].keys }.uniq
    expect(labels).not_to include("thread state", DdprofRecorder::StackRecorder::END_TIMESTAMP_LABEL)
  end
end
