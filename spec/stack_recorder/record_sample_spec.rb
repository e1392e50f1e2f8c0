# frozen_string_literal: true

# docs/design.md, section 3 (a sample): `record_sample(locations, values, labels = nil)` and what it puts into
# the pprof (values, labels, aggregation, truncation, encodings).
RSpec.describe DdprofRecorder::StackRecorder, "#record_sample" do
  subject(:stack_recorder) { described_class.new }

  let(:stack) { [["leaf", "/app/leaf.rb", 3], ["middle", "/app/middle.rb", 2], ["root", "/app/root.rb", 1]] }

  def values(cpu_time, cpu_samples, wall_time)
    { "cpu-time" => cpu_time, "cpu-samples" => cpu_samples, "wall-time" => wall_time }
  end

  it "returns nil" do
    expect(stack_recorder.record_sample(stack, [1, 2, 3])).to be nil
  end

  describe "locations" do
    it "records [function_name, filename, line] frames, leaf first", gc_stress: true do
      stack_recorder.record_sample(stack, [1, 2, 3])

      expect(serialized_samples(stack_recorder)).to eq [{ frames: stack, values: values(1, 2, 3), labels: {} }]
    end

    it "records Thread::Backtrace::Location frames as base_label, path and lineno", gc_stress: true do
      locations = caller_locations(0, 3)
      expect(locations).to all(be_a(Thread::Backtrace::Location))

      stack_recorder.record_sample(locations, [1, 1, 1])

      expect(serialized_samples(stack_recorder).first[:frames])
        .to eq(locations.map { |location| [location.base_label, location.path, location.lineno] })
    end

    it "accepts Location and Array frames mixed in one stack" do
      location = caller_locations(0, 1).first
      stack_recorder.record_sample([["leaf", "a.rb", 1], location], [1, 1, 1])

      expect(serialized_samples(stack_recorder).first[:frames])
        .to eq [["leaf", "a.rb", 1], [location.base_label, location.path, location.lineno]]
    end

    it "records an empty stack" do
      stack_recorder.record_sample([], [1, 2, 3])

      expect(serialized_samples(stack_recorder)).to eq [{ frames: [], values: values(1, 2, 3), labels: {} }]
    end

    it "accepts lines over the full signed 64-bit range" do
      edges = [["a", "f.rb", (2**63) - 1], ["b", "f.rb", -(2**63)], ["c", "f.rb", 0]]
      stack_recorder.record_sample(edges, [1, 1, 1])

      expect(serialized_samples(stack_recorder).first[:frames]).to eq edges
    end
  end

  describe "truncation to max_frames" do
    subject(:stack_recorder) { described_class.new(max_frames: 5) }

    def deep_stack(depth)
      Array.new(depth) { |i| ["frame_#{i}", "/app/deep.rb", i + 1] }
    end

    it "keeps the first max_frames - 1 (leaf-side) frames and adds a root-most placeholder", gc_stress: true do
      stack_recorder.record_sample(deep_stack(12), [1, 1, 1])

      expect(serialized_samples(stack_recorder).first[:frames])
        .to eq deep_stack(4) + [["", "8 frames omitted", 0]]
    end

    it "keeps a stack of exactly max_frames frames whole" do
      stack_recorder.record_sample(deep_stack(5), [1, 1, 1])

      expect(serialized_samples(stack_recorder).first[:frames]).to eq deep_stack(5)
    end

    it "counts N as the given frames not kept (max_frames + 1 frames: 2 omitted)" do
      stack_recorder.record_sample(deep_stack(6), [1, 1, 1])

      expect(serialized_samples(stack_recorder).first[:frames].last).to eq ["", "2 frames omitted", 0]
    end

    it "makes the placeholder a function named \"\" (string index 0) with that filename, at line 0" do
      stack_recorder.record_sample(deep_stack(7), [1, 1, 1])
      profile = decode_pprof(stack_recorder.serialize!)

      root_location = profile.location.find { |l| l.id == profile.sample.first.location_id.last }
      function = profile.function.find { |f| f.id == root_location.line.first.function_id }
      expect(function.name).to eq 0
      expect(profile.string_table[function.filename]).to eq "3 frames omitted"
      expect(root_location.line.first.line).to eq 0
    end

    it "truncates Thread::Backtrace::Location stacks the same way" do
      locations = Array.new(3) { caller_locations(0, 3) }.flatten
      stack_recorder.record_sample(locations, [1, 1, 1])

      frames = serialized_samples(stack_recorder).first[:frames]
      expect(frames.size).to eq 5
      expect(frames.last).to eq ["", "#{locations.size - 4} frames omitted", 0]
    end

    it "uses max_frames 400 by default" do
      recorder = described_class.new
      recorder.record_sample(deep_stack(401), [1, 1, 1])

      frames = serialized_samples(recorder).first[:frames]
      expect(frames.size).to eq 400
      expect(frames.last).to eq ["", "2 frames omitted", 0]
    end
  end

  describe "values" do
    it "takes an Array of Integers in value_types order (the fast path)" do
      stack_recorder.record_sample(stack, [100, 2, 300])

      expect(serialized_samples(stack_recorder).first[:values]).to eq values(100, 2, 300)
    end

    it "takes a Hash with String keys, missing types being 0", gc_stress: true do
      stack_recorder.record_sample(stack, { "wall-time" => 7, "cpu-time" => 5 })

      expect(serialized_samples(stack_recorder).first[:values]).to eq values(5, 0, 7)
    end

    it "takes a Hash with Symbol keys", gc_stress: true do
      stack_recorder.record_sample(stack, { "cpu-samples": 1, "wall-time": 9 })

      expect(serialized_samples(stack_recorder).first[:values]).to eq values(0, 1, 9)
    end

    it "takes a Hash mixing String and Symbol keys, and an empty Hash (all 0)" do
      stack_recorder.record_sample([["mixed", "a.rb", 1]], { "cpu-time" => 3, "wall-time": 4 })
      stack_recorder.record_sample([["empty", "a.rb", 1]], {})

      expect(serialized_samples(stack_recorder).to_h { |s| [s[:frames][0][0], s[:values]] })
        .to eq("mixed" => values(3, 0, 4), "empty" => values(0, 0, 0))
    end

    it "accepts the full signed 64-bit range, including bignum-sized Integers" do
      stack_recorder.record_sample(stack, [(2**63) - 1, -(2**63), -5])

      expect(serialized_samples(stack_recorder).first[:values]).to eq values((2**63) - 1, -(2**63), -5)
    end

    it "follows custom value_types (names and order)" do
      recorder = described_class.new(value_types: [["alloc-samples", "count"], ["alloc-size", "bytes"]])
      recorder.record_sample(stack, [1, 64])
      recorder.record_sample(stack, { "alloc-size": 32 })

      expect(serialized_samples(recorder).first[:values]).to eq("alloc-samples" => 1, "alloc-size" => 96)
    end
  end

  describe "labels" do
    it "records String values as string labels and Integer values as numeric labels", gc_stress: true do
      stack_recorder.record_sample(stack, [1, 1, 1], { "thread name" => "worker-1", "thread id" => 42 })
      profile = decode_pprof(stack_recorder.serialize!)

      labels = profile.sample.first.label.to_h { |label| [profile.string_table[label.key], label] }
      expect(labels.keys).to contain_exactly("thread name", "thread id")
      expect(profile.string_table[labels["thread name"].str]).to eq "worker-1"
      expect(labels["thread name"].num).to eq 0
      expect(labels["thread id"].num).to eq 42
      expect(labels["thread id"].str).to eq 0
    end

    it "takes a Hash with String or Symbol keys" do
      stack_recorder.record_sample(stack, [1, 1, 1], { "thread id" => 1, "span id": 2 })

      expect(serialized_samples(stack_recorder).first[:labels]).to eq("thread id" => 1, "span id" => 2)
    end

    it "takes an Array of [key, value] pairs", gc_stress: true do
      stack_recorder.record_sample(stack, [1, 1, 1], [["thread id", 1], [:"thread name", "main"]])

      expect(serialized_samples(stack_recorder).first[:labels]).to eq("thread id" => 1, "thread name" => "main")
    end

    it "takes nil, an empty Hash or an empty Array as no labels" do
      stack_recorder.record_sample(stack, [1, 1, 1], nil)
      stack_recorder.record_sample(stack, [1, 1, 1], {})
      stack_recorder.record_sample(stack, [1, 1, 1], [])
      stack_recorder.record_sample(stack, [1, 1, 1])

      expect(serialized_samples(stack_recorder)).to eq [{ frames: stack, values: values(4, 4, 4), labels: {} }]
    end

    it "accepts numeric labels over the full signed 64-bit range" do
      stack_recorder.record_sample(stack, [1, 1, 1], { "max" => (2**63) - 1, "min" => -(2**63), "neg" => -1 })

      expect(serialized_samples(stack_recorder).first[:labels])
        .to eq("max" => (2**63) - 1, "min" => -(2**63), "neg" => -1)
    end
  end

  describe "aggregation" do
    it "sums the values of samples with the same stack and labels", gc_stress: true do
      3.times { |i| stack_recorder.record_sample(stack, [i, 1, 10], { "thread id" => 7 }) }

      expect(serialized_samples(stack_recorder))
        .to eq [{ frames: stack, values: values(3, 3, 30), labels: { "thread id" => 7 } }]
    end

    it "treats the same label pairs in another order as the same label set" do
      stack_recorder.record_sample(stack, [1, 1, 1], { "a" => 1, "b" => "x", "c" => 3 })
      stack_recorder.record_sample(stack, [1, 1, 1], [["c", 3], ["a", 1], ["b", "x"]])
      stack_recorder.record_sample(stack, [1, 1, 1], { b: "x", c: 3, a: 1 })

      expect(serialized_samples(stack_recorder))
        .to eq [{ frames: stack, values: values(3, 3, 3), labels: { "a" => 1, "b" => "x", "c" => 3 } }]
    end

    it "keeps samples with different labels apart" do
      stack_recorder.record_sample(stack, [1, 1, 1], { "thread id" => 1 })
      stack_recorder.record_sample(stack, [2, 2, 2], { "thread id" => 2 })
      stack_recorder.record_sample(stack, [3, 3, 3], { "thread id" => "1" }) # string "1" is not numeric 1
      stack_recorder.record_sample(stack, [4, 4, 4])

      expect(serialized_samples(stack_recorder).map { |s| [s[:labels], s[:values]["cpu-time"]] })
        .to contain_exactly([{ "thread id" => 1 }, 1], [{ "thread id" => 2 }, 2], [{ "thread id" => "1" }, 3], [{}, 4])
    end

    it "keeps samples with different stacks apart (order and line matter)" do
      stack_recorder.record_sample(stack, [1, 1, 1])
      stack_recorder.record_sample(stack.reverse, [2, 2, 2])
      stack_recorder.record_sample(stack.take(2), [3, 3, 3])
      stack_recorder.record_sample([["leaf", "/app/leaf.rb", 4]] + stack.drop(1), [4, 4, 4])

      expect(serialized_samples(stack_recorder).map { |s| s[:values]["cpu-time"] }).to contain_exactly(1, 2, 3, 4)
    end

    it "aggregates a Location stack with the equal Array stack" do
      location = caller_locations(0, 1).first
      stack_recorder.record_sample([location], [1, 1, 1])
      stack_recorder.record_sample([[location.base_label, location.path, location.lineno]], [1, 1, 1])

      expect(serialized_samples(stack_recorder).map { |s| s[:values] }).to eq [values(2, 2, 2)]
    end
  end

  describe "strings that are not UTF-8" do
    let(:cafe_utf8_bytes) { "caf\xC3\xA9".b }

    it "keeps valid UTF-8 bytes exactly, whatever the encoding tag", gc_stress: true do
      binary = cafe_utf8_bytes
      latin1_tagged = cafe_utf8_bytes.dup.force_encoding(Encoding::ISO_8859_1)
      ascii_tagged = "plain".encode(Encoding::US_ASCII)
      stack_recorder.record_sample(
        [[binary, latin1_tagged, 1], [ascii_tagged, binary, 2]],
        [1, 1, 1],
        { binary => latin1_tagged, "k2" => binary },
      )

      sample = serialized_samples(stack_recorder).first
      expect(sample[:frames]).to eq [["café", "café", 1], ["plain", "café", 2]]
      expect(sample[:labels]).to eq("café" => "café", "k2" => "café")
    end

    it "replaces invalid UTF-8 sequences with U+FFFD", gc_stress: true do
      invalid_utf8 = "bad\xFFname".dup.force_encoding(Encoding::UTF_8)
      latin1 = "caf\xE9".dup.force_encoding(Encoding::ISO_8859_1) # é in Latin-1: not UTF-8
      expect(invalid_utf8).not_to be_valid_encoding

      stack_recorder.record_sample([[invalid_utf8, latin1, 1]], [1, 1, 1], { latin1 => invalid_utf8 })

      # google-protobuf refuses to decode a proto3 string that is not valid UTF-8.
      sample = serialized_samples(stack_recorder).first
      expect(sample[:frames]).to eq [["bad\u{FFFD}name", "caf\u{FFFD}", 1]]
      expect(sample[:labels]).to eq("caf\u{FFFD}" => "bad\u{FFFD}name")
    end

    it "makes every string of the profile valid UTF-8" do
      stack_recorder.record_sample([["\xC0\xAF".b, "\xED\xA0\x80".b, 1]], [1, 1, 1], { "\xFE".b => "\xF8\x88".b })

      expect(decode_pprof(stack_recorder.serialize!).string_table.to_a).to all(be_valid_encoding)
    end

    it "aggregates strings with the same bytes but different encoding tags" do
      stack_recorder.record_sample([[cafe_utf8_bytes, "a.rb", 1]], [1, 1, 1])
      stack_recorder.record_sample([[cafe_utf8_bytes.dup.force_encoding(Encoding::UTF_8), "a.rb", 1]], [1, 1, 1])

      expect(serialized_samples(stack_recorder).map { |s| s[:values]["cpu-time"] }).to eq [2]
    end
  end

  it "copies its arguments: changing them afterwards does not change the sample", gc_stress: true do
    name = +"mutable_name"
    labels = { "key" => +"value" }
    locations = [[name, "a.rb", 1]]
    stack_recorder.record_sample(locations, [1, 1, 1], labels)
    name.replace("changed")
    labels["key"].replace("changed")
    locations.clear

    expect(serialized_samples(stack_recorder).first).to include(frames: [["mutable_name", "a.rb", 1]], labels: { "key" => "value" })
  end
end
