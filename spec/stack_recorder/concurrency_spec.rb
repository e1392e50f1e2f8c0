# frozen_string_literal: true

# docs/design.md, section 5 (the two-slot protocol), from Ruby: the GVL is released while a profile is encoded,
# samplers keep recording while another thread serializes, interrupts sent to a serializing
# thread leave the recorder consistent, and a forked child can use the recorder after
# reset_after_fork. No timing assertions: only "made progress" checks with generous bounds.
module ConcurrencySpec
  # The exception the examples send with Thread#raise.
  class SentByTheSpec < StandardError; end

  # A serializer that must never lose a window (spec/reliability/stress_spec.rb's protection):
  # interrupts deferred past the result, let in only at blocking points inside `serialize`.
  # Stores its thread in out[:thread] and what serialize returned in out[:result]; returns
  # :interrupted if a SentByTheSpec came after.
  def self.protected_serializer(recorder, out)
    lambda do
      out[:thread] = Thread.current
      Thread.current.report_on_exception = false # killed or raised into: expected
      Thread.handle_interrupt(Object => :never) do
        out[:result] = Thread.handle_interrupt(Object => :on_blocking) { recorder.serialize }
      end
      :not_interrupted
    rescue SentByTheSpec
      :interrupted
    end
  end

  # Thread#raise and Thread#kill, by name.
  INTERRUPTS = {
    "Thread#raise" => ->(thread) { thread.raise(SentByTheSpec, "sent by the spec") },
    "Thread#kill" => ->(thread) { thread.kill },
  }.freeze

  # `count` distinct stacks of `depth` frames drawn from `pool` distinct frames, built up front:
  # recording from prebuilt Arrays is cheap, so the cost of a big profile is in the recorder.
  def self.stacks(count, depth:, pool:)
    files = Array.new(512) { |i| "/app/lib/component_#{i}/some/deeper/path/file_#{i}.rb" }
    frames = Array.new(pool) { |i| ["Namespace#{i % 97}::Class#{i % 1013}#method_#{i}", files[i % 512], 1 + (i % 997)] }
    Array.new(count) { |i| Array.new(depth) { |d| frames[((i * 7919) + (d * 104_729)) % pool] } }
  end
end

RSpec.describe DdprofRecorder::StackRecorder, "across threads and processes" do
  let(:testing) { described_class::Testing }

  def stacks(...)
    ConcurrencySpec.stacks(...)
  end

  # Records every stack once with cpu-samples 1; returns how many samples were recorded.
  def record_all(recorder, stacks)
    stacks.each_with_index { |stack, i| recorder.record_sample(stack, [i, 1, i], { "thread id" => i % 8 }) }
    stacks.size
  end

  # The cpu-samples total of a serialized profile (each recorded sample counts 1 there).
  def sample_count(encoded_pprof)
    decode_pprof(encoded_pprof).sample.sum { |sample| sample.value[1] }
  end

  # Exactly one slot locked, the inactive one.
  def expect_consistent_slots(recorder)
    active = testing._native_active_slot(recorder)
    locks = [testing._native_slot_one_mutex_locked?(recorder), testing._native_slot_two_mutex_locked?(recorder)]

    expect([active, locks]).to eq(active == 1 ? [1, [false, true]] : [2, [true, false]])
  end

  describe "serializing a large profile" do
    # Measured when written: ~40k distinct stacks of 48 frames from 60k distinct frames take
    # ~1 s to record and ~100 ms to serialize with gzip (much more with the machine busy).
    large_stacks = nil
    before(:context) { large_stacks = ConcurrencySpec.stacks(40_000, depth: 48, pool: 60_000) }
    after(:context) { large_stacks = nil }

    it "releases the GVL: another Ruby thread makes progress while the profile is encoded" do
      recorder = described_class.new(compression: :gzip)
      record_all(recorder, large_stacks)

      serializing = false
      serializer = Thread.new do
        Thread.stop # started below, once the other thread runs
        serializing = true
        result = recorder.serialize
        serializing = false
        result
      end
      wait_until("the serializer thread sleeps in Thread.stop") { serializer.status == "sleep" }

      # Counts its loop iterations. Those that saw the serializer "sleep" inside `serialize` ran
      # while the serializer was in a blocking region, i.e. had released the GVL: Ruby marks a
      # thread "sleep" from the moment it releases the GVL for a blocking call until that call
      # is over, while a thread running Ruby or C code with the GVL is "run". (Nothing else in
      # `serialize` sleeps here: its Mutex is uncontended.)
      counts = { total: 0, while_serializer_blocked: 0 }
      stop = false
      spinner = Thread.new do
        until stop
          counts[:total] += 1
          counts[:while_serializer_blocked] += 1 if serializing && serializer.status == "sleep"
        end
      end
      begin
        wait_until("the spinning thread runs") { counts[:total] > 0 }
        serializer.wakeup
        start, finish, encoded_pprof = serializer.value
      ensure
        stop = true
        spinner.join
        serializer.kill.join
      end

      expect(encoded_pprof.bytesize).to be > 1_000_000 # a large profile, not a trivial one
      expect(start).to be <= finish
      expect(counts[:while_serializer_blocked]).to be >= 100
      expect(sample_count(encoded_pprof)).to eq large_stacks.size
    end

    # The first large pprof does not fit the String made before the flip (sized by the last
    # window's), so it is copied into one after the window is taken: that copy must not
    # process the interrupt that arrived meanwhile.
    ConcurrencySpec::INTERRUPTS.each do |name, interrupt|
      it "hands a large pprof copied after the flip to a caller that defers interrupts (#{name} during the flip)" do
        recorder = described_class.new # raw: well over 4 MiB
        record_all(recorder, large_stacks)
        DdprofRecorder.logger = Logger.new(StringIO.new) # made already: only the native side is tested
        out = {}
        released, outcome = with_parked_serializer(recorder, hold_seconds: 30,
                                                             serialize: ConcurrencySpec.protected_serializer(recorder, out)) do
          interrupt.call(out.fetch(:thread))
        end

        expect(released).to be true
        expect(outcome).to eq(name == "Thread#raise" ? :interrupted : nil)
        expect(out[:result]).not_to be_nil, "the window was taken (serializations: #{recorder.stats[:serializations]}) but lost"
        expect(out[:result][2].bytesize).to be > 4 * 1024 * 1024
        expect(sample_count(out[:result][2])).to eq large_stacks.size
        expect(recorder.stats[:serializations]).to eq 1
        expect_consistent_slots(recorder)
      end
    end
  end

  it "never loses a sample recorded while another thread serializes in a loop" do
    recorder = described_class.new
    stacks = stacks(200, depth: 20, pool: 1000)
    serializations = 0
    done = false

    serializer = Thread.new do
      counted = 0
      until done
        counted += sample_count(recorder.serialize!)
        serializations += 1
      end
      counted
    end
    sampler = Thread.new do
      recorded = 0
      # Until the serializer has flipped the slots many times under it (Thread.pass lets it in).
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
      while serializations < 50 && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
        recorded += record_all(recorder, stacks.sample(20))
        Thread.pass
      end
      recorded
    ensure
      done = true
    end

    recorded = sampler.value
    serialized = serializer.value + sample_count(recorder.serialize!)

    expect(serializations).to be >= 50
    expect(serialized).to eq recorded
    expect(recorder.stats).to include(samples_lost: 0, samples_recorded: recorded)
    expect_consistent_slots(recorder)
  end

  describe "Ruby code run while converting a sample (before any slot is taken)" do
    # docs/design.md, section 5: arguments are converted, and Location methods called, before the slot lock is
    # taken; otherwise another thread running meanwhile would find both slots taken.
    def location_calling(method_name, &block)
      location = caller_locations(0, 1).first
      original = location.method(method_name)
      location.define_singleton_method(method_name) do
        block.call
        original.call
      end
      location
    end

    it "lets another thread record while a Location method runs", gc_stress: true do
      recorder = described_class.new
      location = location_calling(:path) do
        Thread.new { recorder.record_sample([["from_other_thread", "b.rb", 2]], [1, 1, 1]) }.join
      end

      recorder.record_sample([location], [1, 1, 1])

      expect(serialized_samples(recorder).map { |s| s[:frames].first.first })
        .to contain_exactly("from_other_thread", location.base_label)
      expect(recorder.stats).to include(samples_recorded: 2, samples_lost: 0)
    end

    it "lets the same thread record from inside a Location method (re-entrant call)", gc_stress: true do
      recorder = described_class.new
      location = location_calling(:base_label) do
        recorder.record_sample([["nested", "b.rb", 2]], { "wall-time" => 5 }, { "nested" => "yes" })
      end

      recorder.record_sample([["leaf", "a.rb", 1], location], [1, 1, 1], { "outer" => 1 })

      expect(serialized_samples(recorder).map { |s| [s[:frames].first.first, s[:labels]] })
        .to contain_exactly(["nested", { "nested" => "yes" }], ["leaf", { "outer" => 1 }])
    end

    it "lets another thread serialize while a Location method runs" do
      recorder = described_class.new
      recorder.record_sample([["earlier", "a.rb", 1]], [1, 1, 1])
      serialized_meanwhile = nil
      location = location_calling(:lineno) { serialized_meanwhile = Thread.new { recorder.serialize! }.value }

      recorder.record_sample([location], [1, 1, 1])

      expect(samples_from(decode_pprof(serialized_meanwhile)).map { |s| s[:frames].first.first }).to eq ["earlier"]
      expect(serialized_samples(recorder).map { |s| s[:frames].first.first }).to eq [location.base_label]
    end
  end

  describe "interrupting a thread inside serialize" do
    # Each round: record a batch, start a thread that serializes it, interrupt that thread
    # after a delay, then check the slots and serialize what is left from the main thread.
    # The batch is accounted for exactly: it is in the interrupted thread's result if that
    # serialize returned, in the main thread's serialize if the interrupt came before the
    # flip, or lost as a whole window if the interrupt came after the flip but before the
    # result reached the thread (stats[:serializations] tells which).
    def interrupt_rounds(rounds, &interrupt)
      recorder = described_class.new(compression: :gzip)
      stacks = stacks(2_000, depth: 30, pool: 8_000)
      outcomes = Hash.new(0)

      rounds.times do |round|
        batch = record_all(recorder, stacks)
        serializations_before = recorder.stats[:serializations]

        thread = Thread.new { Thread.current[:result] = recorder.serialize }
        thread.report_on_exception = false # set before the interrupt can arrive
        # From "before the thread even started" to "after serialize returned".
        delay = [0, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05][round % 8] * (0.5 + rand)
        sleep(delay) if delay > 0
        interrupt.call(thread)

        begin
          thread.join
        rescue ConcurrencySpec::SentByTheSpec
          nil # the exception we sent; anything else fails the example
        end
        expect_consistent_slots(recorder)

        flipped = recorder.stats[:serializations] - serializations_before
        thread_result = thread[:result]
        leftover = recorder.serialize
        expect(leftover).not_to be_nil
        left = sample_count(leftover[2])

        if thread_result
          outcomes[:serialized] += 1
          expect([flipped, sample_count(thread_result[2]), left]).to eq [1, batch, 0]
        elsif flipped == 1
          outcomes[:lost_after_flip] += 1
          expect(left).to eq 0
        else
          outcomes[:interrupted_before_flip] += 1
          expect([flipped, left]).to eq [0, batch]
        end
      end

      # Still a working recorder.
      recorder.record_sample([["after_interrupts", "a.rb", 1]], [1, 1, 1])
      expect(samples_from(decode_pprof(recorder.serialize!)).map { |s| s[:frames] }).to eq [[["after_interrupts", "a.rb", 1]]]
      expect(recorder.stats[:samples_lost]).to eq 0
      outcomes
    end

    it "survives Thread#raise at any point: only the sent exception, consistent slots, a working recorder" do
      outcomes = interrupt_rounds(48) { |thread| thread.raise(ConcurrencySpec::SentByTheSpec, "sent by the spec") }

      expect(outcomes.values.sum).to eq 48
    end

    it "survives Thread#kill at any point: consistent slots, a working recorder" do
      outcomes = interrupt_rounds(48, &:kill)

      expect(outcomes.values.sum).to eq 48
    end

    # After the native call took the window, `serialize` logs it: a DEBUG logger writes to its
    # file, a blocking point where Ruby processes interrupts deferred to blocking points (so
    # does making the default logger on Ruby 3.3 and 3.4, see StackRecorder#serialize). The
    # interrupt must wait until the result is the caller's.
    ConcurrencySpec::INTERRUPTS.each do |name, interrupt|
      it "hands the window to a caller that defers interrupts even if it logs at DEBUG (#{name} during the flip)" do
        recorder = described_class.new
        recorder.record_sample([["kept", "a.rb", 1]], [1, 1, 1])
        Dir.mktmpdir do |dir|
          log = File.join(dir, "ddprof.log")
          DdprofRecorder.logger = Logger.new(log, level: Logger::DEBUG)
          out = {}
          released, outcome = with_parked_serializer(recorder, hold_seconds: 30,
                                                               serialize: ConcurrencySpec.protected_serializer(recorder, out)) do
            interrupt.call(out.fetch(:thread))
          end
          DdprofRecorder.logger.close

          expect(released).to be true
          expect(outcome).to eq(name == "Thread#raise" ? :interrupted : nil)
          expect(out[:result]).not_to be_nil, "the window was taken (serializations: #{recorder.stats[:serializations]}) but lost"
          expect(samples_from(decode_pprof(out[:result][2])).map { |s| s[:frames] }).to eq [[["kept", "a.rb", 1]]]
          expect(File.read(log)).to include("Encoded profile covering")
        end
        expect(recorder.stats[:serializations]).to eq 1
        expect_consistent_slots(recorder)
      end
    end

    # spec/reliability/stress_spec.rb lost the first windows of a run this way on Ruby 3.3 and 3.4:
    # the default logger, made by the first serialization, stats $stderr.path (logger 1.6).
    ConcurrencySpec::INTERRUPTS.each do |name, interrupt|
      it "hands the window to a caller that defers interrupts while the default logger is made (#{name} during the flip)" do
        recorder = described_class.new
        recorder.record_sample([["kept", "a.rb", 1]], [1, 1, 1])
        DdprofRecorder.logger = nil # the next use makes the default one
        out = {}
        released, outcome = with_parked_serializer(recorder, hold_seconds: 30,
                                                             serialize: ConcurrencySpec.protected_serializer(recorder, out)) do
          interrupt.call(out.fetch(:thread))
        end

        expect(released).to be true
        expect(outcome).to eq(name == "Thread#raise" ? :interrupted : nil)
        expect(out[:result]).not_to be_nil, "the window was taken (serializations: #{recorder.stats[:serializations]}) but lost"
        expect(samples_from(decode_pprof(out[:result][2])).map { |s| s[:frames] }).to eq [[["kept", "a.rb", 1]]]
        expect(DdprofRecorder.instance_variable_get(:@logger)).to be_a(Logger)
        expect_consistent_slots(recorder)
      end
    end

    it "processes an interrupt that arrived before the native call without flipping anything" do
      recorder = described_class.new
      recorder.record_sample([["kept", "a.rb", 1]], [1, 1, 1])
      ready = Queue.new
      thread = Thread.new do
        Thread.handle_interrupt(ConcurrencySpec::SentByTheSpec => :never) do
          ready << true
          Thread.stop
          # The interrupt is pending here; serialize processes it before flipping.
          Thread.handle_interrupt(ConcurrencySpec::SentByTheSpec => :immediate) { described_class._native_serialize(recorder) }
        end
      end
      thread.report_on_exception = false
      ready.pop
      wait_until("the thread sleeps in Thread.stop") { thread.status == "sleep" }
      thread.raise(ConcurrencySpec::SentByTheSpec)
      thread.wakeup

      expect { thread.join }.to raise_error(ConcurrencySpec::SentByTheSpec)
      expect(testing._native_active_slot(recorder)).to eq 1
      expect_consistent_slots(recorder)
      expect(samples_from(decode_pprof(recorder.serialize!)).map { |s| s[:frames] }).to eq [[["kept", "a.rb", 1]]]
    end
  end

  describe "fork" do
    before do
      skip "Process.fork is not available here" unless Process.respond_to?(:fork)
    end

    # Forks a child that runs the block; the child exits 0 if the block returns and 1 with the
    # error's message (read back through a pipe) if it raises. Returns [status, message].
    def in_child(timeout: 60)
      reader, writer = IO.pipe
      pid = Process.fork do
        reader.close
        begin
          yield
          writer.write("ok")
          writer.close
          exit!(0)
        rescue Exception => e # rubocop:disable Lint/RescueException
          writer.write("#{e.class}: #{e.message}\n#{e.backtrace&.first(5)&.join("\n")}")
          writer.close
          exit!(1)
        end
      end
      writer.close
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      status = nil
      until (status = Process.wait2(pid, Process::WNOHANG)&.last)
        if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
          Process.kill(:KILL, pid)
          Process.wait(pid)
          reader.close
          return [nil, "the child did not finish within #{timeout} s (deadlock?)"]
        end
        sleep 0.01
      end
      message = reader.read
      reader.close
      [status, message]
    end

    # What a child checks after reset_after_fork: the initial state, then a working recorder
    # holding only what the child recorded.
    def check_child_recorder(recorder)
      raise "reset_after_fork did not return true" unless recorder.reset_after_fork == true

      state = [testing._native_active_slot(recorder), testing._native_slot_one_mutex_locked?(recorder),
               testing._native_slot_two_mutex_locked?(recorder)]
      raise "state after reset_after_fork: #{state.inspect}" unless state == [1, false, true]

      recorder.record_sample([["in_child", "child.rb", Process.pid]], [1, 2, 3], { "pid" => Process.pid })
      recorder.record_endpoint(Process.pid, "GET /child")
      samples = samples_from(decode_pprof(recorder.serialize!))
      expected = [{ frames: [["in_child", "child.rb", Process.pid]],
                    values: { "cpu-time" => 1, "cpu-samples" => 2, "wall-time" => 3 },
                    labels: { "pid" => Process.pid } }]
      raise "child's profile: #{samples.inspect}" unless samples == expected
      raise "second serialize failed" if recorder.serialize.nil?
    end

    it "lets a child reset_after_fork, record and serialize, and exit 0" do
      recorder = described_class.new
      recorder.record_sample([["in_parent", "parent.rb", 1]], [1, 1, 1])
      recorder.serialize # slot two active in the parent
      recorder.record_sample([["in_parent_again", "parent.rb", 2]], [1, 1, 1])

      status, message = in_child { check_child_recorder(recorder) }

      expect(status&.exitstatus).to eq(0), message
      # The parent's recorder is untouched by the child.
      expect(testing._native_active_slot(recorder)).to eq 2
      expect(serialized_samples(recorder).map { |s| s[:frames] }).to eq [[["in_parent_again", "parent.rb", 2]]]
    end

    it "lets a child that forked while a parent thread was serializing in a loop use the recorder" do
      recorder = described_class.new(compression: :gzip)
      stacks = stacks(1_000, depth: 30, pool: 5_000)
      record_all(recorder, stacks)
      stop = false
      serializations = 0
      serializer = Thread.new do
        until stop
          recorder.serialize
          serializations += 1
        end
      end
      results = begin
        wait_until("the serializer thread serialized once") { serializations > 0 }
        Array.new(12) do |i|
          record_all(recorder, stacks.take(200 * (1 + (i % 5)))) # the parent keeps recording
          sleep(0.001 * (i % 4) * rand)
          in_child { check_child_recorder(recorder) }
        end
      ensure
        stop = true
        serializer.join
      end

      results.each { |status, message| expect(status&.exitstatus).to eq(0), message }
      expect(recorder.serialize).not_to be_nil
      expect(recorder.stats[:samples_lost]).to eq 0
    end
  end
end
