# frozen_string_literal: true

# DdprofRecorder::Profiler::ThreadSampler's accounting, driven by hand with fake clocks: where
# CPU and wall time are charged, carried and added up. Profiles are decoded with
# google-protobuf (spec_helper), never with the gem's decoder.
RSpec.describe DdprofRecorder::Profiler::ThreadSampler do
  # Clocks the test sets: the monotonic clock, and a CPU clock per native thread id.
  let(:clock) do
    Class.new do
      attr_accessor :now_ns

      def initialize
        @now_ns = 1_000_000_000
        @cpu = {}
      end

      def set_cpu(tid, ns)
        @cpu[tid] = ns
      end

      def thread_cpu_ns(tid)
        @cpu[tid]
      end

      def current_cpu_ns
        @cpu.fetch(Thread.current.native_thread_id)
      end

      def moved(tids, seen)
        tids.each_index.select { |i| tids[i].nil? || seen[i].nil? || @cpu[tids[i]] != seen[i] }
      end
    end.new
  end
  let(:recorder) { DdprofRecorder::StackRecorder.new(compression: :none) }
  let(:me) { Thread.current.native_thread_id }
  let(:sampler) do
    clock.set_cpu(me, 0)
    described_class.new(recorder, internal: ->(_) { false }, clock: clock).tap do |s|
      s.baseline([me], [Thread.current])
    end
  end

  def profile_samples
    samples_from(decode_pprof(recorder.serialize!))
  end

  def mine(samples, thread = Thread.current)
    name = thread.equal?(Thread.main) ? "main" : thread.name
    samples.select { |s| s[:labels]["thread name"] == name }
  end

  # A sampling job's call, from a method of its own so that its stack is known.
  def job_in_busy_method(on_time, cpu_ns, now_ns)
    sampler.call(on_time, cpu_ns, now_ns)
  end

  it "charges an on-time job the CPU its thread used since its previous on-CPU sample" do
    sampler
    [7_000_000, 12_000_000].each do |cpu|
      clock.set_cpu(me, cpu) # the job's own work costs nothing here
      job_in_busy_method(true, cpu, clock.now_ns += 10_000_000)
    end
    samples = mine(profile_samples)
    expect(samples.size).to eq(1)
    expect(samples.first[:frames].first.first).to eq("#{self.class}#job_in_busy_method")
    expect(samples.first[:values]).to eq("cpu-time" => 12_000_000, "cpu-samples" => 2, "wall-time" => 20_000_000)
    expect(sampler.counts).to include(on_cpu_samples: 2, carried_cpu_samples: 0)
  end

  # Issue 21: the profiler's own start work was charged to the program (all of a short
  # program's profile, in DdprofRecorder::Recording.start).
  it "leaves out Profiler#start's and #stop's own work on the thread that calls them" do
    clock.set_cpu(me, 0)
    starting = described_class.new(recorder, internal: ->(_) { false }, clock: clock)
    starting.baseline([me], [Thread.current], starting: true)
    clock.set_cpu(me, 3_000_000)
    starting.call(true, 3_000_000, clock.now_ns += 10_000_000) # a job inside start: nothing
    clock.set_cpu(me, 4_000_000)
    starting.started # start returns: 4 ms were its own
    slack = described_class::START_SLACK_NS
    clock.set_cpu(me, 4_000_000 + slack - 1)
    starting.call(true, 4_000_000 + slack - 1, clock.now_ns += 10_000) # on start's way out: nothing
    clock.set_cpu(me, 9_000_000)
    starting.call(true, 9_000_000, clock.now_ns += 10_000_000) # the program's 5 ms
    clock.set_cpu(me, 10_000_000)
    starting.stopping # stop is called
    clock.set_cpu(me, 11_000_000)
    starting.call(true, 11_000_000, clock.now_ns += 10_000_000) # a job inside stop: nothing
    samples = mine(profile_samples)
    expect(samples.sum { |s| s[:values]["cpu-time"] }).to eq(5_000_000)
    expect(samples.sum { |s| s[:values]["cpu-samples"] }).to eq(1)
    expect(starting.counts).to include(start_cpu_ns: 4_000_000, on_cpu_samples: 1)
  end

  it "leaves out the CPU of the job's own work" do
    sampler
    clock.set_cpu(me, 7_500_000) # the clock when the job ends: 0.5 ms of its own
    job_in_busy_method(true, 7_000_000, clock.now_ns += 10_000_000)
    clock.set_cpu(me, 10_500_000)
    job_in_busy_method(true, 10_500_000, clock.now_ns += 10_000_000)
    cpu = mine(profile_samples).sum { |s| s[:values]["cpu-time"] }
    expect(cpu).to eq(7_000_000 + 3_000_000)
    expect(sampler.counts[:job_cpu_ns]).to eq(500_000)
  end

  it "carries the CPU of a late job (its thread was blocked) to the next on-time sample" do
    sampler
    clock.set_cpu(me, 5_000_000)
    job_in_busy_method(false, 5_000_000, clock.now_ns += 10_000_000) # woke up from a sleep
    late = mine(profile_samples)
    expect(late.map { |s| s[:values] }).to eq([{ "cpu-time" => 0, "cpu-samples" => 1, "wall-time" => 10_000_000 }])

    clock.set_cpu(me, 8_000_000)
    job_in_busy_method(true, 8_000_000, clock.now_ns += 10_000_000)
    on_time = mine(profile_samples)
    expect(on_time.sum { |s| s[:values]["cpu-time"] }).to eq(8_000_000)
    expect(sampler.counts).to include(on_cpu_samples: 1, carried_cpu_samples: 1)
  end

  describe "a pass over the other threads" do
    let(:queue) { Queue.new }
    let!(:other) do
      q = queue # not from the thread: rspec's `let` memoizes under a Mutex
      Thread.new { q.pop }.tap do |t|
        t.name = "other"
        Thread.pass until t.status == "sleep"
      end
    end

    after do
      queue << :done
      other.join
    end

    def start_with_other
      clock.set_cpu(other.native_thread_id, 1_000)
      sampler.baseline([me, other.native_thread_id], [Thread.current, other])
    end

    it "gives a blocked thread wall-time, and carries the CPU it used before blocking" do
      start_with_other
      clock.set_cpu(other.native_thread_id, 4_001_000) # it ran 4 ms, then blocked again
      sampler.pass(clock.now_ns += 10_000_000, except: Thread.current)
      wall = mine(profile_samples, other)
      expect(wall.map { |s| s[:values] }).to eq([{ "cpu-time" => 0, "cpu-samples" => 1, "wall-time" => 10_000_000 }])
      expect(wall.first[:frames].first.first).to eq("Thread::Queue#pop")

      # The window closes: the carried 4 ms go to its stack then (no on-CPU stack was seen),
      # as CPU without a sample.
      sampler.flush
      carried = mine(profile_samples, other)
      expect(carried.map { |s| s[:values] }).to eq([{ "cpu-time" => 4_000_000, "cpu-samples" => 0, "wall-time" => 0 }])
    end

    it "adds up the passes over an idle thread and records them as one sample" do
      start_with_other
      sampler.pass(clock.now_ns += 10_000_000, except: Thread.current) # it started: one sample
      3.times { sampler.pass(clock.now_ns += 10_000_000, except: Thread.current) } # idle
      first = mine(profile_samples, other)
      expect(first.sum { |s| s[:values]["cpu-samples"] }).to eq(1)
      sampler.flush
      idle = mine(profile_samples, other)
      expect(idle.map { |s| s[:values] }).to eq([{ "cpu-time" => 0, "cpu-samples" => 3, "wall-time" => 30_000_000 }])
      # Threads of the process that outlive their examples (Ruby 3.3's Timeout keeps one
      # thread for every Timeout.timeout) are passed over too, as idle as `other`.
      idle_others = Thread.list - [Thread.current, other]
      expect(sampler.counts[:samples]).to eq(4 * (1 + idle_others.size))
    end

    it "records an idle thread's passes on its stack now when the stack its pass kept is gone" do
      start_with_other
      sampler.pass(clock.now_ns += 10_000_000, except: Thread.current) # read and kept natively
      2.times { sampler.pass(clock.now_ns += 10_000_000, except: Thread.current) } # idle
      mine(profile_samples, other)
      # What the frame cache starting over does to every kept stack (the passes' keys count
      # down from PASS_STACK_KEYS, one per thread state).
      (1..Thread.list.size + 2).each { |i| DdprofRecorder::Profiler._native_forget_stack(described_class::PASS_STACK_KEYS - i) }
      sampler.flush
      idle = mine(profile_samples, other)
      expect(idle.map { |s| s[:values] }).to eq([{ "cpu-time" => 0, "cpu-samples" => 2, "wall-time" => 20_000_000 }])
      expect(idle.first[:frames].first.first).to eq("Thread::Queue#pop")
    end
  end

  it "counts a failing pass, logs it later (not from the job), and gives up after #{described_class::MAX_CONSECUTIVE_ERRORS}" do
    log = StringIO.new
    broken = DdprofRecorder::StackRecorder.new(compression: :none)
    def broken.record_sample(*)
      raise IOError, "broken recorder"
    end

    # A blocked thread's pass records the stack it read natively, by its key.
    def broken._native_record_captured(*)
      raise IOError, "broken recorder"
    end
    queue = Queue.new
    other = Thread.new { queue.pop }
    Thread.pass until other.status == "sleep"
    sampler = described_class.new(broken, internal: ->(_) { false }, clock: clock, logger: Logger.new(log))
    clock.set_cpu(other.native_thread_id, 1)
    described_class::MAX_CONSECUTIVE_ERRORS.times do |i|
      clock.set_cpu(other.native_thread_id, i + 2) # it ran: a sample is recorded, and fails
      sampler.pass(clock.now_ns += 10_000_000)
    end
    expect(log.string).to be_empty
    expect(sampler).to be_gave_up
    sampler.write_log
    expect(log.string).to include("sampling failed: IOError: broken recorder", "sampling stops")
    expect(sampler.pass(clock.now_ns += 10_000_000)).to be(false)
  ensure
    queue << :done
    other.join
  end

  describe "looking for new threads (#list_threads)" do
    # The thread-event hook's count of threads begun (ext/ddprof_recorder/src/sampling/thread_end.rs).
    let(:begun) { [0] }

    before do
      b = begun
      clock.define_singleton_method(:threads_begun) { b[0] }
    end

    def late_thread(queue)
      Thread.new do
        Thread.current.name = "late"
        queue.pop
      end.tap do |t|
        Thread.pass until t.status == "sleep"
        clock.set_cpu(t.native_thread_id, 1_000_000)
      end
    end

    def passes(count)
      count.times { sampler.pass(clock.now_ns += 10_000_000, except: Thread.current) }
    end

    it "finds a thread at the first pass after the hook counted it begin" do
      passes(1) # the first look
      queue = Queue.new
      late = late_thread(queue)
      begun[0] += 1
      passes(1)
      expect(mine(profile_samples, late)).not_to be_empty
    ensure
      queue&.close
      late&.join
    end

    it "finds a thread the hook did not count within LIST_EVERY passes, and at every pass without a count" do
      passes(1)
      queue = Queue.new
      late = late_thread(queue)
      passes(described_class::LIST_EVERY)
      expect(mine(profile_samples, late)).not_to be_empty

      begun[0] = nil # the hook is off: every pass looks
      other = late_thread(queue)
      passes(1)
      expect(mine(profile_samples, other)).not_to be_empty
    ensure
      queue&.close
      [late, other].compact.each(&:join)
    end
  end

  describe "thread ends (ext/ddprof_recorder/src/sampling/thread_end.rs)" do
    # What the end hook and the exit watches would have queued, taken at the next pass.
    let(:queued) { [] }

    before do
      q = queued
      clock.define_singleton_method(:thread_ends) do
        next nil if q.empty?

        ends = q.select { |r| r.size == 4 }.flatten
        exits = q.reject { |r| r.size == 4 }.flatten
        q.clear
        [ends, exits]
      end
    end

    def ended_thread(name)
      Thread.new { Thread.current.name = name }.tap(&:join)
    end

    it "charges a thread no pass saw all its native thread's CPU, on (thread exit)" do
      sampler
      short = ended_thread("short")
      queued << [short, 4242, 3_000_000, clock.now_ns] # a native thread born after the start
      sampler.pass(clock.now_ns += 10_000_000, except: Thread.current)
      exits = mine(profile_samples, short)
      expect(exits.map { |s| [s[:frames].map(&:first), s[:values]] })
        .to eq([[["(thread exit)"], { "cpu-time" => 3_000_000, "cpu-samples" => 0, "wall-time" => 0 }]])
      expect(exits.first[:labels]["thread id"]).to start_with("4242 (")
      expect(sampler.counts).to include(thread_ends: 1, thread_end_cpu_ns: 3_000_000)

      # Its native thread exits 0.1 ms of cleanup later: that goes there too, and no more.
      queued << [4242, 3_100_000]
      sampler.pass(clock.now_ns += 10_000_000, except: Thread.current)
      expect(mine(profile_samples, short).map { |s| s[:values]["cpu-time"] }).to eq([100_000])
      expect(sampler.counts).to include(thread_exits: 1, thread_end_cpu_ns: 3_100_000)
    end

    it "charges a native thread that exited unseen and without an end to (unsampled thread)" do
      sampler
      queued << [4343, 2_000_000]
      sampler.pass(clock.now_ns += 10_000_000, except: Thread.current)
      unsampled = profile_samples.select { |s| s[:labels]["thread name"] == "(unsampled thread)" }
      expect(unsampled.map { |s| [s[:frames].map(&:first), s[:values]["cpu-time"]] })
        .to eq([[["(unsampled thread)"], 2_000_000]])
      expect(sampler.counts).to include(unsampled_thread_cpu_ns: 2_000_000)
    end

    it "charges a thread the passes knew the CPU since its last charge, and forgets it" do
      queue = Queue.new
      other = Thread.new { queue.pop }.tap { |t| t.name = "other" }
      Thread.pass until other.status == "sleep"
      tid = other.native_thread_id
      clock.set_cpu(tid, 1_000)
      sampler.baseline([me, tid], [Thread.current, other])
      clock.set_cpu(tid, 2_001_000) # ran 2 ms, blocked: carried
      sampler.pass(clock.now_ns += 10_000_000, except: Thread.current)
      profile_samples
      queue << :done
      other.join
      queued << [other, tid, 2_501_000, clock.now_ns] # 0.5 ms more before its end
      sampler.pass(clock.now_ns += 10_000_000, except: Thread.current)
      ended = mine(profile_samples, other)
      # Never seen on the CPU: not on Thread::Queue#pop, where its passes found it waiting and
      # it spent none, but on (CPU not sampled), as CPU without a sample.
      expect(ended.map { |s| [s[:frames].first.first, s[:values]] })
        .to eq([["(CPU not sampled)", { "cpu-time" => 2_500_000, "cpu-samples" => 0, "wall-time" => 0 }]])
      sampler.flush
      expect(mine(profile_samples, other)).to be_empty
    end
  end
end
