# frozen_string_literal: true

# docs/design.md, section 3 (construction): `StackRecorder.new(value_types:, max_frames:, compression:)`.
RSpec.describe DdprofRecorder::StackRecorder, ".new" do
  def sample_types_of(recorder)
    profile = decode_pprof(recorder.serialize!)
    profile.sample_type.map { |t| [profile.string_table[t.type], profile.string_table[t.unit]] }
  end

  describe "DEFAULT_VALUE_TYPES" do
    it "is dd-trace-rb 1.9.0's enabled types, in order" do
      expect(described_class::DEFAULT_VALUE_TYPES)
        .to eq [["cpu-time", "nanoseconds"], ["cpu-samples", "count"], ["wall-time", "nanoseconds"]]
    end

    it "is frozen" do
      expect(described_class::DEFAULT_VALUE_TYPES).to be_frozen
      expect(described_class::DEFAULT_VALUE_TYPES).to all(be_frozen)
    end
  end

  it "works with no arguments, using DEFAULT_VALUE_TYPES, max_frames 400 and no compression", gc_stress: true do
    recorder = described_class.new

    expect(recorder).to be_a(described_class)
    expect(sample_types_of(recorder)).to eq described_class::DEFAULT_VALUE_TYPES
    expect(recorder.serialize!.b).not_to start_with("\x1f\x8b".b)
  end

  it "accepts every option explicitly" do
    recorder = described_class.new(
      value_types: described_class::DEFAULT_VALUE_TYPES, max_frames: 400, compression: :none,
    )

    expect(sample_types_of(recorder)).to eq described_class::DEFAULT_VALUE_TYPES
  end

  it "cannot be allocated without its native state" do
    expect { described_class.allocate }.to raise_error(TypeError)
  end

  describe "value_types:" do
    it "accepts a single pair" do
      expect(sample_types_of(described_class.new(value_types: [["samples", "count"]]))).to eq [["samples", "count"]]
    end

    it "accepts 16 pairs" do
      types = Array.new(16) { |i| ["type-#{i}", "unit"] }

      expect(sample_types_of(described_class.new(value_types: types))).to eq types
    end

    it "does not keep a reference to the caller's Array", gc_stress: true do
      types = [[+"alloc-samples", +"count"]]
      recorder = described_class.new(value_types: types)
      types.first.first.replace("changed")
      types << ["more", "units"]

      expect(sample_types_of(recorder)).to eq [["alloc-samples", "count"]]
    end

    [
      ["an empty list", [], ArgumentError],
      ["17 pairs", Array.new(17) { |i| ["type-#{i}", "unit"] }, ArgumentError],
      ["a duplicate type", [["cpu-time", "nanoseconds"], ["cpu-time", "count"]], ArgumentError],
      ["an empty type", [["", "count"]], ArgumentError],
      ["an empty unit", [["samples", ""]], ArgumentError],
      ["a pair with one element", [["samples"]], ArgumentError],
      ["a pair with three elements", [["samples", "count", "extra"]], ArgumentError],
      ["a pair that is a String", ["samples/count"], ArgumentError],
      ["a Symbol type", [[:samples, "count"]], TypeError],
      ["a nil unit", [["samples", nil]], TypeError],
      ["a Hash", { "samples" => "count" }, TypeError],
      ["nil", nil, TypeError],
    ].each do |description, value_types, error_class|
      it "raises #{error_class} naming value_types for #{description}" do
        expect { described_class.new(value_types: value_types) }.to raise_error(error_class, /value_types/)
      end
    end
  end

  describe "max_frames:" do
    [2, 3, 10_000].each do |max_frames|
      it "accepts #{max_frames}" do
        recorder = described_class.new(max_frames: max_frames)
        recorder.record_sample(Array.new(max_frames) { |i| ["f#{i}", "a.rb", i] }, [1, 1, 1])

        expect(serialized_samples(recorder).first[:frames].size).to eq max_frames
      end
    end

    it "with 2 keeps the leaf and the placeholder" do
      recorder = described_class.new(max_frames: 2)
      recorder.record_sample([["leaf", "a.rb", 1], ["middle", "a.rb", 2], ["root", "a.rb", 3]], [1, 1, 1])

      expect(serialized_samples(recorder).first[:frames]).to eq [["leaf", "a.rb", 1], ["", "2 frames omitted", 0]]
    end

    [
      ["1", 1, ArgumentError],
      ["0", 0, ArgumentError],
      ["-1", -1, ArgumentError],
      ["10_001", 10_001, ArgumentError],
      ["2**40", 2**40, ArgumentError],
      ["a bignum (2**70)", 2**70, RangeError],
      ["a String", "400", TypeError],
      ["a Float", 400.0, TypeError],
      ["nil", nil, TypeError],
    ].each do |description, max_frames, error_class|
      it "raises #{error_class} naming max_frames for #{description}" do
        expect { described_class.new(max_frames: max_frames) }.to raise_error(error_class, /max_frames/)
      end
    end
  end

  describe "compression:" do
    it "accepts :none and :gzip" do
      expect(described_class.new(compression: :none).serialize!.b).not_to start_with("\x1f\x8b".b)
      expect(described_class.new(compression: :gzip).serialize!.b).to start_with("\x1f\x8b".b)
    end

    [
      ["an unknown Symbol", :zstd],
      ["the String \"gzip\"", "gzip"],
      ["nil", nil],
      ["true", true],
    ].each do |description, compression|
      it "raises ArgumentError naming compression for #{description}" do
        expect { described_class.new(compression: compression) }.to raise_error(ArgumentError, /compression/)
      end
    end
  end

  it "rejects an unknown option with ArgumentError" do
    expect { described_class.new(max_frame: 10) }.to raise_error(ArgumentError, /max_frame/)
  end

  it "gives each recorder its own profiles" do
    one = described_class.new
    two = described_class.new
    one.record_sample([["in_one", "a.rb", 1]], [1, 1, 1])

    expect(serialized_samples(two)).to eq []
    expect(serialized_samples(one).size).to eq 1
  end
end
