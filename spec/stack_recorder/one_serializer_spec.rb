# frozen_string_literal: true

# Issue 10, item 3: no blocking lock is taken with the GVL held. `_native_serialize` is public:
# called from two threads, the second must not wait (with the GVL, the whole VM would stop for
# the first one's encode) but return [:error, message] at once; a by-hand reset_after_fork
# during a serialization must not wait for it either. The first serialization is held in its
# flip by a thread holding the active slot (see spec/support/slot_holding.rb): were the second
# call, or the reset, to wait with the GVL, the holder could not be released by this thread
# until it lets go by itself (after `hold_seconds`), and the examples fail.
RSpec.describe DdprofRecorder::StackRecorder, "one serializer at a time" do
  let(:testing) { described_class::Testing }
  let(:recorder) { described_class.new }
  let(:busy) { "another serialization of this recorder is in progress (one serializer at a time)" }

  def frames_of(result)
    expect(result&.first).to eq(:ok)
    samples_from(decode_pprof(result[1][2])).map { _1[:frames] }
  end

  it "a second _native_serialize while one is in progress returns [:error, message] without waiting" do
    recorder.record_sample([["first", "a.rb", 1]], [1, 1, 1])
    second = nil
    released, first = with_parked_serializer(recorder, hold_seconds: 5,
                                                       serialize: -> { described_class._native_serialize(recorder) }) do
      second = Thread.new { described_class._native_serialize(recorder) }.join(30)&.value
      # _native_clear is the same serializer side.
      expect(described_class._native_clear(recorder)).to eq([:error, busy])
    end

    expect(second).to eq([:error, busy])
    expect(released).to be(true) # by this thread, not by the holder's own timeout
    expect(frames_of(first)).to eq([[["first", "a.rb", 1]]])
    # The refused calls took and recorded nothing: the next window is empty and the slots are
    # as after one serialization.
    expect(frames_of(described_class._native_serialize(recorder))).to eq([])
    expect([testing._native_active_slot(recorder), testing._native_slot_one_mutex_locked?(recorder),
            testing._native_slot_two_mutex_locked?(recorder)]).to eq([1, false, true])
    expect(recorder.stats).to include(serializations: 2, samples_lost: 0)
  end

  it "serialize! raises and serialize returns nil when a direct _native_serialize holds the recorder" do
    released, = with_parked_serializer(recorder, hold_seconds: 5,
                                                 serialize: -> { described_class._native_serialize(recorder) }) do
      # The Ruby Mutex is free (the parked call went around it), so these reach the native side.
      expect { recorder.serialize! }
        .to raise_error(DdprofRecorder::Error, "Failed to serialize profiling data: #{busy}")
      expect { recorder.clear }.to raise_error(DdprofRecorder::Error, "Failed to clear profiling data: #{busy}")
      expect(DdprofRecorder.logger).to receive(:error).with("Failed to serialize profiling data: #{busy}")
      expect(recorder.serialize).to be_nil
    end
    expect(released).to be(true)
  end

  it "a by-hand reset_after_fork during a serialization does not wait for it; each window keeps its samples" do
    recorder.record_sample([["before_reset", "a.rb", 1]], [1, 1, 1])
    after_reset = nil
    released, first = with_parked_serializer(recorder, hold_seconds: 5) do
      expect(recorder.reset_after_fork).to be(true)
      recorder.record_sample([["after_reset", "a.rb", 2]], [1, 1, 1])
      after_reset = recorder.serialize
    end

    expect(released).to be(true)
    expect(samples_from(decode_pprof(first[2])).map { _1[:frames] }).to eq([[["before_reset", "a.rb", 1]]])
    expect(samples_from(decode_pprof(after_reset[2])).map { _1[:frames] }).to eq([[["after_reset", "a.rb", 2]]])
    # One set of counters over the recorder's life, both serializations included.
    expect(recorder.stats).to include(samples_recorded: 2, serializations: 2, samples_lost: 0)
  end
end
