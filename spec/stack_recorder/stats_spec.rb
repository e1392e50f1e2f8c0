# frozen_string_literal: true

# docs/design.md, section 3 (honest accounting): `stats`, counters over the recorder's life.
RSpec.describe DdprofRecorder::StackRecorder, "#stats" do
  subject(:stack_recorder) { described_class.new }

  let(:keys) do
    %i[samples_recorded samples_rejected samples_dropped samples_lost serializations
       last_serialization_ns last_serialization_bytes]
  end

  it "is a Hash with Symbol keys and Integer values, all 0 on a new recorder", gc_stress: true do
    stats = stack_recorder.stats

    expect(stats).to be_a(Hash)
    expect(stats.keys).to include(*keys)
    expect(stats.keys).to all(be_a(Symbol))
    expect(stats.slice(*keys)).to eq(keys.to_h { |key| [key, 0] })
  end

  it "counts accepted record_sample calls in :samples_recorded, aggregated or not" do
    3.times { stack_recorder.record_sample([["f", "a.rb", 1]], [1, 1, 1]) }
    stack_recorder.record_sample([["g", "a.rb", 1]], [1, 1, 1])

    expect(stack_recorder.stats[:samples_recorded]).to eq 4
  end

  it "counts calls that raised on bad input in :samples_rejected" do
    expect { stack_recorder.record_sample([["f", "a.rb", 1]], [1, 1]) }.to raise_error(ArgumentError)
    expect { stack_recorder.record_sample("bad", [1, 1, 1]) }.to raise_error(TypeError)

    expect(stack_recorder.stats).to include(samples_rejected: 2, samples_recorded: 0)
  end

  it "keeps :samples_lost and :samples_dropped at 0" do
    100.times { |i| stack_recorder.record_sample([["f", "a.rb", i]], [1, 1, 1]) }
    stack_recorder.serialize

    expect(stack_recorder.stats).to include(samples_lost: 0, samples_dropped: 0)
  end

  it "counts serializations and reports the last one's time and size" do
    stack_recorder.record_sample([["f", "a.rb", 1]], [1, 1, 1])
    _, _, first = stack_recorder.serialize
    expect(stack_recorder.stats).to include(serializations: 1, last_serialization_bytes: first.bytesize)
    expect(stack_recorder.stats[:last_serialization_ns]).to be > 0

    second = stack_recorder.serialize!
    expect(stack_recorder.stats).to include(serializations: 2, last_serialization_bytes: second.bytesize)
  end

  it "reports the size of the returned (gzip) String in :last_serialization_bytes" do
    recorder = described_class.new(compression: :gzip)
    200.times { |i| recorder.record_sample([["f", "a.rb", i]], [1, 1, 1]) }

    gzipped = recorder.serialize!
    expect(recorder.stats[:last_serialization_bytes]).to eq gzipped.bytesize
  end

  it "returns a fresh Hash each time (a snapshot)" do
    before = stack_recorder.stats
    stack_recorder.record_sample([], [1, 1, 1])

    expect(before[:samples_recorded]).to eq 0
    expect(stack_recorder.stats[:samples_recorded]).to eq 1
  end
end
