# frozen_string_literal: true

# docs/design.md, section 5 (observable state), read through the Testing module, as
# dd-trace-rb's spec checks it.
RSpec.describe DdprofRecorder::StackRecorder do
  subject(:stack_recorder) { described_class.new }

  let(:testing) { described_class::Testing }

  def active_slot
    testing._native_active_slot(stack_recorder)
  end

  def slot_one_mutex_locked?
    testing._native_slot_one_mutex_locked?(stack_recorder)
  end

  def slot_two_mutex_locked?
    testing._native_slot_two_mutex_locked?(stack_recorder)
  end

  def serialize
    stack_recorder.serialize.tap { |result| expect(result).not_to be_nil }
  end

  describe "Testing module" do
    it "exposes dd-trace-rb's test-only hooks" do
      expect(testing).to be_a(Module)
      expect(testing).to respond_to(
        :_native_active_slot, :_native_slot_one_mutex_locked?, :_native_slot_two_mutex_locked?,
        :_native_record_endpoint
      )
    end

    it "rejects an object that is not a StackRecorder with TypeError" do
      expect { testing._native_active_slot(Object.new) }.to raise_error(TypeError)
      expect { testing._native_slot_one_mutex_locked?("recorder") }.to raise_error(TypeError)
    end
  end

  context "when a new instance is created", gc_stress: true do
    it "sets slot one as the active slot" do
      expect(active_slot).to be 1
    end

    it "keeps the slot one mutex unlocked" do
      expect(slot_one_mutex_locked?).to be false
    end

    it "keeps the slot two mutex locked" do
      expect(slot_two_mutex_locked?).to be true
    end

    it "does not change the mutex states when they are observed" do
      3.times { [slot_one_mutex_locked?, slot_two_mutex_locked?] }
      expect([active_slot, slot_one_mutex_locked?, slot_two_mutex_locked?]).to eq [1, false, true]
    end
  end

  describe "#serialize" do
    context "when slot one was the active slot", gc_stress: true do
      it "sets slot two as the active slot" do
        expect { serialize }.to change { active_slot }.from(1).to(2)
      end

      it "locks the slot one mutex" do
        expect { serialize }.to change { slot_one_mutex_locked? }.from(false).to(true)
      end

      it "unlocks the slot two mutex" do
        expect { serialize }.to change { slot_two_mutex_locked? }.from(true).to(false)
      end
    end

    context "when slot two was the active slot" do
      before { serialize }

      it "sets slot one as the active slot" do
        expect { serialize }.to change { active_slot }.from(2).to(1)
      end

      it "unlocks the slot one mutex" do
        expect { serialize }.to change { slot_one_mutex_locked? }.from(true).to(false)
      end

      it "locks the slot two mutex" do
        expect { serialize }.to change { slot_two_mutex_locked? }.from(false).to(true)
      end
    end

    it "keeps exactly one slot locked, the inactive one, over many flips" do
      states = Array.new(10) do
        serialize
        [active_slot, slot_one_mutex_locked?, slot_two_mutex_locked?]
      end

      expect(states).to eq [[2, true, false], [1, false, true]] * 5
    end

    it "flips the slots the same way with compression: :gzip" do
      gzip_recorder = described_class.new(compression: :gzip)

      expect { gzip_recorder.serialize }
        .to change { testing._native_active_slot(gzip_recorder) }.from(1).to(2)
        .and change { testing._native_slot_one_mutex_locked?(gzip_recorder) }.from(false).to(true)
        .and change { testing._native_slot_two_mutex_locked?(gzip_recorder) }.from(true).to(false)
    end
  end

  describe "#serialize!" do
    it "flips the slots like #serialize" do
      expect { stack_recorder.serialize! }
        .to change { active_slot }.from(1).to(2)
        .and change { slot_one_mutex_locked? }.from(false).to(true)
        .and change { slot_two_mutex_locked? }.from(true).to(false)
    end
  end

  describe "#clear" do
    it "flips the slots like #serialize", gc_stress: true do
      expect { stack_recorder.clear }
        .to change { active_slot }.from(1).to(2)
        .and change { slot_one_mutex_locked? }.from(false).to(true)
        .and change { slot_two_mutex_locked? }.from(true).to(false)
    end
  end

  describe "#reset_after_fork" do
    it "returns true" do
      expect(stack_recorder.reset_after_fork).to be true
    end

    it "also works through the native entry point, returning true" do
      expect(described_class._native_reset_after_fork(stack_recorder)).to be true
    end

    context "when slot one was the active slot", gc_stress: true do
      it "keeps slot one as the active slot" do
        expect(active_slot).to be 1

        stack_recorder.reset_after_fork

        expect(active_slot).to be 1
      end

      it "keeps the slot one mutex unlocked and the slot two mutex locked" do
        stack_recorder.reset_after_fork

        expect(slot_one_mutex_locked?).to be false
        expect(slot_two_mutex_locked?).to be true
      end
    end

    context "when slot two was the active slot", gc_stress: true do
      before { serialize }

      it "sets slot one as the active slot" do
        expect { stack_recorder.reset_after_fork }.to change { active_slot }.from(2).to(1)
      end

      it "unlocks the slot one mutex" do
        expect { stack_recorder.reset_after_fork }.to change { slot_one_mutex_locked? }.from(true).to(false)
      end

      it "locks the slot two mutex" do
        expect { stack_recorder.reset_after_fork }.to change { slot_two_mutex_locked? }.from(false).to(true)
      end
    end

    it "leaves a recorder whose next serializations flip normally" do
      serialize
      stack_recorder.reset_after_fork

      expect { serialize }.to change { active_slot }.from(1).to(2)
      expect { serialize }.to change { active_slot }.from(2).to(1)
    end

    it "drops the samples of both slots" do
      stack_recorder.record_sample([["in_slot_one", "a.rb", 1]], [1, 1, 1])
      serialize # the sample above is now serialized; record another in slot two
      stack_recorder.record_sample([["in_slot_two", "a.rb", 2]], [1, 1, 1])

      stack_recorder.reset_after_fork

      expect(serialized_samples(stack_recorder)).to eq []
      expect(serialized_samples(stack_recorder)).to eq []
    end

    it "drops the endpoints recorded before it" do
      stack_recorder.record_endpoint(123, "GET /before-reset")
      stack_recorder.reset_after_fork
      stack_recorder.record_sample([["f", "a.rb", 1]], [1, 1, 1], { "local root span id" => 123 })

      expect(serialized_samples(stack_recorder).first[:labels]).to eq("local root span id" => 123)
    end

    it "starts the next profile now" do
      before_reset = Time.now
      stack_recorder.reset_after_fork
      after_reset = Time.now

      start, = serialize
      expect(start).to be_between(before_reset, after_reset)
    end

    it "works while another thread holds the serializer guard (as a parent thread may have at fork)" do
      entered = Queue.new
      release = Queue.new
      allow(described_class).to receive(:_native_serialize).and_wrap_original do |original, recorder|
        entered << true
        release.pop
        original.call(recorder)
      end
      serializer = Thread.new { stack_recorder.serialize }
      entered.pop

      expect(stack_recorder.reset_after_fork).to be true
      release << true
      serializer.join
    end
  end
end
