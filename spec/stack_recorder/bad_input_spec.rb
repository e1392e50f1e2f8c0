# frozen_string_literal: true

# docs/design.md, section 3 (all or nothing): every bad argument raises ArgumentError or TypeError with a
# message naming it, and records nothing (all-or-nothing).
RSpec.describe DdprofRecorder::StackRecorder, "bad input" do
  subject(:stack_recorder) { described_class.new }

  let(:good_frame) { ["good", "/app/good.rb", 1] }
  let(:bad_call_frame) { ["from_bad_call", "/app/bad.rb", 2] }
  let(:good_stack) { [bad_call_frame] }
  let(:good_values) { [1, 1, 1] }

  not_integer = Object.new.tap { |o| o.define_singleton_method(:inspect) { "#<not an Integer>" } }

  # [description, [locations, values, labels], exception class, message pattern]
  # nil entries stand for the valid argument (let above).
  record_sample_cases = [
    # locations
    ["locations that are not an Array", ["frames", nil, nil], TypeError, /locations/],
    ["locations that are nil", [:nil, nil, nil], TypeError, /locations/],
    ["a location that is an Integer", [[1], nil, nil], TypeError, /locations\[0\]/],
    ["a location that is a String", [[["f", "a.rb", 1], "a.rb:1"]], TypeError, /locations\[1\]/],
    ["a location Array with 2 elements", [[["f", "a.rb"]], nil, nil], ArgumentError, /locations\[0\]/],
    ["a location Array with 4 elements", [[["f", "a.rb", 1, 2]], nil, nil], ArgumentError, /locations\[0\]/],
    ["a function name that is not a String", [[[:f, "a.rb", 1]], nil, nil], TypeError, /locations\[0\].*function name/],
    ["a filename that is not a String", [[["f", nil, 1]], nil, nil], TypeError, /locations\[0\].*filename/],
    ["a line that is not an Integer", [[["f", "a.rb", 1.5]], nil, nil], TypeError, /locations\[0\].*line/],
    ["a line that is a numeric String", [[["f", "a.rb", "1"]], nil, nil], TypeError, /locations\[0\].*line/],
    ["a line beyond signed 64-bit", [[["f", "a.rb", 2**63]], nil, nil], ArgumentError, /locations\[0\].*line/],
    ["a bad frame after good ones", [[["f", "a.rb", 1], ["g", "b.rb", 2], ["h", "c.rb", nil]], nil, nil],
     TypeError, /locations\[2\]/],
    ["a bad frame among those truncation would drop", [Array.new(500) { ["f", "a.rb", 1] } + [["f", "a.rb", nil]], nil, nil],
     TypeError, /locations\[500\]/],
    # values
    ["values that are not an Array or Hash", [nil, "1,1,1", nil], TypeError, /values/],
    ["values that are nil", [nil, :nil, nil], TypeError, /values/],
    ["values Array too short", [nil, [1, 1], nil], ArgumentError, /values/],
    ["values Array too long", [nil, [1, 1, 1, 1], nil], ArgumentError, /values/],
    ["an empty values Array", [nil, [], nil], ArgumentError, /values/],
    ["a Float in values", [nil, [1, 1.0, 1], nil], TypeError, /values\[1\]/],
    ["nil in values", [nil, [1, 1, nil], nil], TypeError, /values\[2\]/],
    ["an object in values", [nil, [not_integer, 1, 1], nil], TypeError, /values\[0\]/],
    ["a value of 2**63", [nil, [2**63, 1, 1], nil], ArgumentError, /values\[0\]/],
    ["a value of -(2**63) - 1", [nil, [1, -(2**63) - 1, 1], nil], ArgumentError, /values\[1\]/],
    ["a huge bignum value", [nil, [1, 1, 10**40], nil], ArgumentError, /values\[2\]/],
    ["an unknown value type key", [nil, { "cpu-time" => 1, "heap-size" => 2 }, nil], ArgumentError, /values.*heap-size/],
    ["an unknown value type Symbol key", [nil, { "alloc-samples": 2 }, nil], ArgumentError, /values.*alloc-samples/],
    ["a value type given as String and Symbol", [nil, { "cpu-time" => 1, "cpu-time": 2 }, nil], ArgumentError, /values.*cpu-time/],
    ["a values Hash key that is not a String or Symbol", [nil, { 1 => 2 }, nil], TypeError, /values/],
    ["a non-Integer values Hash value", [nil, { "wall-time" => 1.5 }, nil], TypeError, /values.*wall-time/],
    ["an out-of-range values Hash value", [nil, { "wall-time" => 2**64 }, nil], ArgumentError, /values.*wall-time/],
    # labels
    ["labels that are a String", [nil, nil, "thread id=1"], TypeError, /labels/],
    ["labels that are an Integer", [nil, nil, 1], TypeError, /labels/],
    ["a label pair that is not a pair", [nil, nil, [["a", 1, 2]]], ArgumentError, /labels\[0\]/],
    ["a label pair that is not an Array", [nil, nil, [["a", 1], "b"]], ArgumentError, /labels\[1\]/],
    ["an Integer label key", [nil, nil, { 1 => "x" }], TypeError, /labels.*key/],
    ["a nil label key", [nil, nil, [[nil, "x"]]], TypeError, /labels.*key/],
    ["an empty label key", [nil, nil, { "" => "x" }], ArgumentError, /label/],
    ["an empty Symbol label key", [nil, nil, { "": 1 }], ArgumentError, /label/],
    ["a Float label value", [nil, nil, { "a" => 1.5 }], TypeError, /labels.*value/],
    ["a nil label value", [nil, nil, { "a" => nil }], TypeError, /labels.*value/],
    ["a Symbol label value", [nil, nil, { "a" => :b }], TypeError, /labels.*value/],
    ["a label value of 2**63", [nil, nil, { "a" => 2**63 }], ArgumentError, /labels.*value/],
    ["a label value of -(2**63) - 1", [nil, nil, { "a" => -(2**63) - 1 }], ArgumentError, /labels.*value/],
    ["a duplicate label key in pairs", [nil, nil, [["a", 1], ["a", 2]]], ArgumentError, /labels.*"a"/],
    ["a duplicate label key as String and Symbol", [nil, nil, { "a" => 1, a: "x" }], ArgumentError, /labels.*"a"/],
    ["the reserved \"trace endpoint\" key", [nil, nil, { "trace endpoint" => "GET /" }], ArgumentError, /labels.*trace endpoint/],
    ["the reserved key as a Symbol", [nil, nil, [[:"trace endpoint", "GET /"]]], ArgumentError, /labels.*trace endpoint/],
    ["a bad label after good ones", [nil, nil, { "a" => 1, "b" => "x", "c" => [] }], TypeError, /labels\[2\]/],
  ]

  def call_args(args)
    locations, values, labels = args.map { |arg| arg == :nil ? :explicit_nil : arg }
    [
      locations.nil? ? good_stack : locations,
      values.nil? ? good_values : values,
      labels,
    ].map { |arg| arg == :explicit_nil ? nil : arg }
  end

  record_sample_cases.each do |description, args, error_class, message|
    context "with #{description}" do
      # Bad input goes through the exception paths, which allocate: GC.stress catches an unrooted value.
      it "raises #{error_class} naming the argument and records nothing", gc_stress: description.match?(/after good/) do
        stack_recorder.record_sample([good_frame], [10, 20, 30], { "good" => 1 })

        expect { stack_recorder.record_sample(*call_args(args)) }.to raise_error(error_class, message)

        stats = stack_recorder.stats
        expect(stats[:samples_rejected]).to eq 1
        expect(stats[:samples_recorded]).to eq 1
        profile = decode_pprof(stack_recorder.serialize!)
        expect(samples_from(profile)).to eq [
          { frames: [good_frame], values: { "cpu-time" => 10, "cpu-samples" => 20, "wall-time" => 30 }, labels: { "good" => 1 } },
        ]
        # Nothing of the rejected call was even interned.
        expect(profile.string_table.to_a).not_to include("from_bad_call", "/app/bad.rb")
      end
    end
  end

  it "counts every rejected call in stats[:samples_rejected]" do
    expect { stack_recorder.record_sample(nil, [1, 1, 1]) }.to raise_error(TypeError)
    expect { stack_recorder.record_sample([], [1]) }.to raise_error(ArgumentError)
    expect { stack_recorder.record_sample([], [1, 1, 1], { "" => 1 }) }.to raise_error(ArgumentError)

    expect(stack_recorder.stats).to include(samples_rejected: 3, samples_recorded: 0)
  end

  it "leaves the recorder fully usable after a rejected call" do
    expect { stack_recorder.record_sample([["f", "a.rb", nil]], [1, 1, 1]) }.to raise_error(TypeError)
    stack_recorder.record_sample([good_frame], [1, 2, 3])

    expect(serialized_samples(stack_recorder).map { |s| s[:frames] }).to eq [[good_frame]]
  end

  it "does not let a Location whose method raises record anything", gc_stress: true do
    location = caller_locations(0, 1).first
    location.define_singleton_method(:path) { raise IOError, "boom from path" }

    expect { stack_recorder.record_sample([good_frame, location], [1, 1, 1]) }.to raise_error(IOError, "boom from path")
    expect(serialized_samples(stack_recorder)).to eq []
  end

  it "rejects a wrong number of arguments with ArgumentError" do
    expect { stack_recorder.record_sample([]) }.to raise_error(ArgumentError)
    expect { stack_recorder.record_sample([], [1, 1, 1], nil, nil) }.to raise_error(ArgumentError)
  end

  describe "#record_endpoint" do
    [
      ["a Float span id", [1.5, "GET /"], TypeError, /local_root_span_id/],
      ["a nil span id", [nil, "GET /"], TypeError, /local_root_span_id/],
      ["a Symbol span id", [:id, "GET /"], TypeError, /local_root_span_id/],
      ["a nil endpoint", [1, nil], TypeError, /endpoint/],
      ["a Symbol endpoint", [1, :"GET /"], TypeError, /endpoint/],
      ["an Integer endpoint", [1, 200], TypeError, /endpoint/],
    ].each do |description, args, error_class, message|
      it "raises #{error_class} naming the argument for #{description}, and links nothing" do
        stack_recorder.record_sample([good_frame], [1, 1, 1], { "local root span id" => 1 })

        expect { stack_recorder.record_endpoint(*args) }.to raise_error(error_class, message)
        expect { described_class::Testing._native_record_endpoint(stack_recorder, *args) }
          .to raise_error(error_class, message)

        expect(serialized_samples(stack_recorder).first[:labels]).to eq("local root span id" => 1)
      end
    end
  end
end
