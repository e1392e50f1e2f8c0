# frozen_string_literal: true

require "objspace"

# Issue 22, step 1, "Time on samples": a sample with a numeric "end_timestamp_ns" label is kept
# apart, not aggregated, up to max_timed_samples a window; past that it is aggregated without
# its time. Read back with google-protobuf.
RSpec.describe DdprofRecorder::StackRecorder, "timed samples" do
  key = described_class::END_TIMESTAMP_LABEL
  stack = [["work", "app.rb", 3], ["main", "app.rb", 9]]

  it "keeps each timed sample apart, after the aggregated ones, with its other labels", gc_stress: true do
    recorder = described_class.new
    recorder.record_sample(stack, [1, 1, 10], { "thread name" => "a" })
    recorder.record_sample(stack, [5, 1, 10], { "thread name" => "a", key => 2_000 })
    recorder.record_sample(stack, [7, 1, 10], [[key, 1_000], ["thread name", "a"]])
    recorder.record_sample(stack, [7, 1, 10], { key => 1_000, "thread name" => "a" })
    recorder.record_sample(stack, [1, 1, 10], { "thread name" => "a" })
    samples = serialized_samples(recorder)
    expect(samples.map { [_1[:values]["cpu-time"], _1[:labels]] }).to eq(
      [
        [2, { "thread name" => "a" }],
        [5, { "thread name" => "a", key => 2_000 }],
        [7, { "thread name" => "a", key => 1_000 }],
        [7, { "thread name" => "a", key => 1_000 }], # the same time twice: still two samples
      ],
    )
    expect(samples.map { _1[:frames] }.uniq).to eq([stack])
    expect(value_totals(samples)).to eq("cpu-time" => 21, "cpu-samples" => 5, "wall-time" => 50)
    expect(recorder.stats).to include(samples_recorded: 5, timestamps_dropped: 0, samples_dropped: 0)
  end

  it "links timed samples to their endpoint" do
    recorder = described_class.new
    recorder.record_sample(stack, [1, 1, 1], { "local root span id" => 5, key => 42 })
    recorder.record_endpoint(5, "GET /users")
    expect(serialized_samples(recorder).map { _1[:labels] })
      .to eq([{ "local root span id" => 5, key => 42, "trace endpoint" => "GET /users" }])
  end

  it "aggregates the timed samples over max_timed_samples without their time, totals exact", gc_stress: true do
    recorder = described_class.new(max_timed_samples: 2)
    5.times { |i| recorder.record_sample(stack, [i, 1, 1], { key => i }) }
    samples = serialized_samples(recorder)
    expect(samples.map { _1[:labels] }).to eq([{}, { key => 0 }, { key => 1 }])
    expect(samples.first[:values]).to eq("cpu-time" => 2 + 3 + 4, "cpu-samples" => 3, "wall-time" => 3)
    expect(recorder.stats).to include(samples_recorded: 5, timestamps_dropped: 3, samples_dropped: 0)
    # Per window: the next one has room again.
    recorder.record_sample(stack, [1, 1, 1], { key => 9 })
    expect(serialized_samples(recorder).map { _1[:labels] }).to eq([{ key => 9 }])
  end

  it "rejects a time that is not an Integer >= 0, recording nothing", gc_stress: true do
    recorder = described_class.new
    ["5", -1, 1.5, nil].each do |bad|
      expect { recorder.record_sample(stack, [1, 1, 1], { key => bad }) }
        .to raise_error(bad.is_a?(String) || bad == -1 ? ArgumentError : TypeError, /#{key}|label/)
    end
    expect(recorder.stats).to include(samples_recorded: 0, samples_rejected: 4)
    expect(serialized_samples(recorder)).to be_empty
  end

  it "rejects a bad max_timed_samples, naming it" do
    expect { described_class.new(max_timed_samples: 0) }.to raise_error(ArgumentError, /max_timed_samples/)
    expect { described_class.new(max_timed_samples: "1") }.to raise_error(TypeError, /max_timed_samples/)
    expect(described_class::DEFAULT_MAX_TIMED_SAMPLES).to be >= 1_000_000
  end

  it "counts the timed samples' memory in memsize_of and gives it back at serialize" do
    recorder = described_class.new
    empty = ObjectSpace.memsize_of(recorder)
    100_000.times { |i| recorder.record_sample(stack, [1, 1, 1], { key => i }) }
    # 16 bytes and 8 per value each, at the least.
    expect(ObjectSpace.memsize_of(recorder) - empty).to be >= 100_000 * 40
    recorder.serialize
    recorder.serialize
    expect(ObjectSpace.memsize_of(recorder) - empty).to be < 100_000 * 40 * 3
  end
end
