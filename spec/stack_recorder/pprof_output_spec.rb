# frozen_string_literal: true

# docs/design.md, section 4 (pprof output): the shape of the perftools.profiles.Profile the recorder emits,
# decoded with google-protobuf.
RSpec.describe DdprofRecorder::StackRecorder, "pprof output" do
  subject(:stack_recorder) { described_class.new }

  # A small but varied recording: shared frames, the same function on two lines, labels.
  def record_varied_samples(recorder)
    recorder.record_sample([["leaf", "/app/a.rb", 10], ["main", "/app/main.rb", 1]], [1, 1, 1], { "thread id" => 1 })
    recorder.record_sample([["leaf", "/app/a.rb", 11], ["main", "/app/main.rb", 1]], [2, 1, 2], { "thread name" => "worker" })
    recorder.record_sample([["other", "/app/b.rb", 5], ["leaf", "/app/a.rb", 10], ["main", "/app/main.rb", 1]], [3, 1, 3])
    recorder.record_sample([["leaf", "/app/other_file.rb", 10]], [4, 1, 4])
  end

  let(:profile) do
    record_varied_samples(stack_recorder)
    decode_pprof(stack_recorder.serialize!)
  end

  describe "an empty profile", gc_stress: true do
    let(:start_finish_profile) do
      start, finish, encoded_pprof = stack_recorder.serialize
      [start, finish, decode_pprof(encoded_pprof)]
    end

    it "has the sample types, no samples, no mapping, no locations and no functions" do
      _, _, empty = start_finish_profile

      expect(empty.sample_type.map { |t| [empty.string_table[t.type], empty.string_table[t.unit]] })
        .to eq DdprofRecorder::StackRecorder::DEFAULT_VALUE_TYPES
      expect(empty.sample.to_a).to eq []
      expect(empty.mapping.to_a).to eq []
      expect(empty.location.to_a).to eq []
      expect(empty.function.to_a).to eq []
    end

    it "has a string table of \"\" and the value type names and units, each once" do
      _, _, empty = start_finish_profile

      expect(empty.string_table.first).to eq ""
      expect(empty.string_table.to_a)
        .to contain_exactly("", "cpu-time", "nanoseconds", "cpu-samples", "count", "wall-time")
    end

    it "has the window's time_nanos and duration_nanos" do
      start, finish, empty = start_finish_profile

      expect(empty.time_nanos).to eq unix_ns(start)
      expect(empty.duration_nanos).to eq unix_ns(finish) - unix_ns(start)
      expect(empty.duration_nanos).to be >= 0
    end

    it "sets no other Profile field" do
      _, _, empty = start_finish_profile

      expect([empty.drop_frames, empty.keep_frames, empty.period, empty.default_sample_type]).to eq [0, 0, 0, 0]
      expect(empty.period_type).to be_nil
      expect(empty.comment.to_a).to eq []
    end
  end

  it "starts the string table with \"\"" do
    expect(profile.string_table.first).to eq ""
  end

  it "has every string once", gc_stress: true do
    strings = profile.string_table.to_a

    expect(strings.uniq).to eq strings
    expect(strings).to include("leaf", "/app/a.rb", "main", "thread id", "thread name", "worker")
  end

  it "lists sample_type in value_types order" do
    value_types = [["wall-time", "nanoseconds"], ["alloc-size", "bytes"], ["cpu-samples", "count"], ["z", "u"]]
    recorder = described_class.new(value_types: value_types)
    decoded = decode_pprof(recorder.serialize!)

    expect(decoded.sample_type.map { |t| [decoded.string_table[t.type], decoded.string_table[t.unit]] })
      .to eq value_types
  end

  describe "the mapping" do
    it "is exactly one, id 1, with every other field 0 or false (as dd-trace-rb emits)", gc_stress: true do
      expect(profile.mapping.size).to eq 1
      expect(profile.mapping.first.to_h).to eq(
        id: 1, memory_start: 0, memory_limit: 0, file_offset: 0, filename: 0, build_id: 0,
        has_functions: false, has_filenames: false, has_line_numbers: false, has_inline_frames: false,
      )
    end

    it "is referenced by every location" do
      expect(profile.location.map(&:mapping_id)).to all(eq 1)
    end

    it "exists for a profile with only an empty-stack sample" do
      stack_recorder.record_sample([], [1, 1, 1])

      expect(decode_pprof(stack_recorder.serialize!).mapping.map(&:id)).to eq [1]
    end
  end

  describe "locations and functions" do
    it "has 1-based dense ids" do
      expect(profile.location.map(&:id)).to contain_exactly(*1..profile.location.size)
      expect(profile.function.map(&:id)).to contain_exactly(*1..profile.function.size)
    end

    it "references only existing locations and functions" do
      location_ids = profile.location.map(&:id)
      function_ids = profile.function.map(&:id)

      expect(profile.sample.flat_map { |s| s.location_id.to_a }).to all(satisfy { |id| location_ids.include?(id) })
      expect(profile.location.flat_map { |l| l.line.map(&:function_id) }).to all(satisfy { |id| function_ids.include?(id) })
    end

    it "gives each location exactly one line with its function id and line number, and no address" do
      expect(profile.location.map { |l| l.line.size }).to all(eq 1)
      expect(profile.location.map(&:address)).to all(eq 0)
      expect(profile.location.map(&:is_folded)).to all(be false)
      expect(profile.location.map { |l| l.line.first.line }).to contain_exactly(10, 11, 1, 5, 10)
    end

    it "has one location per distinct frame (name, filename, line)" do
      frames = profile.location.map do |location|
        line = location.line.first
        function = profile.function.find { |f| f.id == line.function_id }
        [profile.string_table[function.name], profile.string_table[function.filename], line.line]
      end

      expect(frames).to contain_exactly(
        ["leaf", "/app/a.rb", 10], ["leaf", "/app/a.rb", 11], ["main", "/app/main.rb", 1],
        ["other", "/app/b.rb", 5], ["leaf", "/app/other_file.rb", 10],
      )
    end

    it "has one function per distinct (name, filename), with system_name equal to name", gc_stress: true do
      functions = profile.function.map do |f|
        [profile.string_table[f.name], profile.string_table[f.system_name], profile.string_table[f.filename]]
      end

      expect(functions).to contain_exactly(
        ["leaf", "leaf", "/app/a.rb"], ["main", "main", "/app/main.rb"], ["other", "other", "/app/b.rb"],
        ["leaf", "leaf", "/app/other_file.rb"],
      )
      expect(profile.function.map(&:start_line)).to all(eq 0)
    end
  end

  describe "samples" do
    it "reference their locations leaf first, with one value per sample type" do
      expect(samples_from(profile)).to contain_exactly(
        { frames: [["leaf", "/app/a.rb", 10], ["main", "/app/main.rb", 1]],
          values: { "cpu-time" => 1, "cpu-samples" => 1, "wall-time" => 1 }, labels: { "thread id" => 1 } },
        { frames: [["leaf", "/app/a.rb", 11], ["main", "/app/main.rb", 1]],
          values: { "cpu-time" => 2, "cpu-samples" => 1, "wall-time" => 2 }, labels: { "thread name" => "worker" } },
        { frames: [["other", "/app/b.rb", 5], ["leaf", "/app/a.rb", 10], ["main", "/app/main.rb", 1]],
          values: { "cpu-time" => 3, "cpu-samples" => 1, "wall-time" => 3 }, labels: {} },
        { frames: [["leaf", "/app/other_file.rb", 10]],
          values: { "cpu-time" => 4, "cpu-samples" => 1, "wall-time" => 4 }, labels: {} },
      )
      expect(profile.sample.map { |s| s.value.size }).to all(eq 3)
    end

    it "use num for numeric labels and str for string labels, with no num_unit" do
      labels = profile.sample.flat_map(&:label)
      numeric = labels.find { |l| profile.string_table[l.key] == "thread id" }
      string = labels.find { |l| profile.string_table[l.key] == "thread name" }

      expect([numeric.num, numeric.str, numeric.num_unit]).to eq [1, 0, 0]
      expect(profile.string_table[string.str]).to eq "worker"
      expect([string.num, string.num_unit]).to eq [0, 0]
    end
  end

  describe "compression: :gzip" do
    subject(:stack_recorder) { described_class.new(compression: :gzip) }

    it "returns a gzip stream of a pprof with the same content", gc_stress: true do
      record_varied_samples(stack_recorder)
      raw_recorder = described_class.new
      record_varied_samples(raw_recorder)

      gzipped = stack_recorder.serialize!
      expect(gzipped.b).to start_with("\x1f\x8b".b)
      inflated = Perftools::Profiles::Profile.decode(Zlib.gunzip(gzipped))
      raw = Perftools::Profiles::Profile.decode(raw_recorder.serialize!)
      expect(samples_from(inflated)).to match_array samples_from(raw)
      expect(inflated.string_table.to_a).to match_array raw.string_table.to_a
    end

    it "gzips the empty profile too" do
      start, finish, gzipped = stack_recorder.serialize
      inflated = Perftools::Profiles::Profile.decode(Zlib.gunzip(gzipped))

      expect(inflated.sample.to_a).to eq []
      expect([inflated.time_nanos, inflated.duration_nanos]).to eq [unix_ns(start), unix_ns(finish) - unix_ns(start)]
    end

    it "is what serialize! returns too" do
      expect(stack_recorder.serialize!.b).to start_with("\x1f\x8b".b)
    end
  end

  it "returns a raw (uncompressed) protobuf with compression: :none" do
    recorder = described_class.new(compression: :none)
    recorder.record_sample([["f", "a.rb", 1]], [1, 1, 1])

    encoded = recorder.serialize!
    expect(encoded.b).not_to start_with("\x1f\x8b".b)
    expect(samples_from(Perftools::Profiles::Profile.decode(encoded)).size).to eq 1
  end
end
