# frozen_string_literal: true

# DdprofRecorder::ForkHook and Profiler#restart_after_fork: the process-wide profiler follows
# every kind of fork into the child, with a window and a "process id" of its own; other
# profilers stay with their process. Each child sends its pprof back through a pipe (Marshal:
# our own child's data) and leaves with exit! (RSpec's at_exit must not run there).
RSpec.describe DdprofRecorder::ForkHook do
  after { DdprofRecorder::Profiler.stop }

  def burn_cpu(seconds)
    start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start < seconds
    x
  end

  # Long enough for today's sampler, a Ruby thread, to get the GVL from a busy thread (it has
  # to wait for the 100 ms thread switch, twice: to start, then for its first pass).
  def child_work
    burn_cpu(0.4)
  end

  # Runs the block in a child made by `how`, which the block's String result is read back
  # from; returns [child pid, that String].
  def in_child(how, &block)
    if how == :popen
      io = IO.popen("-")
      if io.nil?
        $stdout.binmode
        $stdout.write(block.call)
        $stdout.flush
        exit!(0)
      end
      data = io.binmode.read
      pid = io.pid
      io.close
      return [pid, data]
    end

    reader, writer = IO.pipe
    pid = (how == :process_fork ? Process : Kernel).send(:fork) do
      reader.close
      writer.binmode.write(block.call)
      writer.close
      exit!(0)
    end
    writer.close
    data = reader.binmode.read
    reader.close
    Process.wait(pid)
    [pid, data]
  end

  # What a child reports about itself: its profile, and whether the profiler ran there.
  def child_report(stopper)
    Marshal.dump([DdprofRecorder::Profiler.running?, stopper.call])
  end

  %i[fork process_fork popen].each do |how|
    it "restarts the process-wide profiler in a child made by #{how == :process_fork ? 'Process.fork' : how == :popen ? 'IO.popen("-")' : 'Kernel#fork'}" do
      DdprofRecorder::Profiler.start(hz: 200, compression: :none)
      sleep 0.02
      pid, data = in_child(how) do
        child_work
        child_report(-> { DdprofRecorder::Profiler.stop&.last })
      end
      running, pprof = Marshal.load(data)
      expect(running).to be(true)
      samples = samples_from(decode_pprof(pprof))
      expect(samples.map { |s| s[:labels]["process id"] }.uniq).to eq([pid])
      working = samples.select { |s| s[:frames].any? { |f| f.first.end_with?("#child_work") } }
      # The thread that forked has the parent's id in Ruby 3.1 (bug #19873): its CPU clock is
      # still read, so the child's work has its cpu-time.
      expect(value_totals(working)["cpu-time"]).to be > 0.05e9

      _, _, parent = DdprofRecorder::Profiler.stop
      parent_samples = samples_from(decode_pprof(parent))
      expect(parent_samples.map { |s| s[:labels]["process id"] }.uniq).to eq([Process.pid])
      expect(parent_samples.flat_map { |s| s[:frames].map(&:first) }.grep(/#child_work\z/)).to eq([])
    end
  end

  it "gives the child a window of its own and the same exporter" do
    windows = []
    DdprofRecorder::Profiler.start(hz: 200, interval: 0.1, compression: :none) { |*window| windows << window }
    sleep 0.05
    _, data = in_child(:fork) do
      sleep 0.35
      DdprofRecorder::Profiler.stop
      Marshal.dump(windows.map { |start, _, pprof| [start, DdprofRecorder.summary(pprof)[:process_ids]] })
    end
    child_windows = Marshal.load(data)
    mine = child_windows.reject { |_, pids| pids == [Process.pid] }
    # The windows the child cut: from after the fork, each with only the child's pid.
    expect(mine.size).to be >= 3
    expect(mine.map(&:last).uniq.size).to eq(1)
    expect(mine.first.first).to be > windows.first.first if windows.any?
  end

  # TracePoint.stat counts the VM's event hooks ([active, deleted]). A child inherits the
  # parent's enabled ones, idle there: the hook removes them (ForkHook.remove_parent_hooks).
  it "removes in the child the hooks that the parent's profiler left enabled" do
    active = -> { TracePoint.stat.values.sum(&:first) }
    before = active.call
    own = DdprofRecorder::Profiler.new(hz: 200, gc: true, allocations: true, allocation_overhead: 1).start
    in_parent = active.call - before
    _, data = in_child(:fork) { Marshal.dump(active.call - before) }
    own.stop
    expect(in_parent).to be >= 2 # the GC events' and the allocations' at least
    expect(Marshal.load(data)).to eq(0)
    expect(active.call - before).to eq(0)
  end

  it "leaves a profiler of its own, and a stopped one, to the parent" do
    own = DdprofRecorder::Profiler.new(hz: 200).start
    _, data = in_child(:fork) { Marshal.dump([own.running?, DdprofRecorder::Profiler.running?, own.restart_after_fork.nil?]) }
    # Not restarted by the hook; restart_after_fork would restart it (it was started in the parent).
    expect(Marshal.load(data)).to eq([false, false, false])
    own.stop

    stopped = DdprofRecorder::Profiler.new(hz: 200)
    expect(stopped.restart_after_fork).to be_nil # never started
    stopped.start
    expect(stopped.restart_after_fork).to be_nil # started in this very process
    expect(stopped).to be_running
    stopped.stop
    _, data = in_child(:fork) { Marshal.dump(stopped.restart_after_fork.nil?) }
    expect(Marshal.load(data)).to be(true)
  end
end
