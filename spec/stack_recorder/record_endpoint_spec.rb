# frozen_string_literal: true

# docs/design.md, section 3 (endpoints): `record_endpoint(local_root_span_id, endpoint)` and the
# "trace endpoint" label it puts on samples at serialization.
RSpec.describe DdprofRecorder::StackRecorder, "#record_endpoint" do
  subject(:stack_recorder) { described_class.new }

  def record(name, span_id)
    labels = span_id.nil? ? { "thread id" => 1 } : { "local root span id" => span_id, "thread id" => 1 }
    stack_recorder.record_sample([[name, "/app/#{name}.rb", 1]], [1, 1, 1], labels)
  end

  # function name => labels, for the next serialized profile
  def labels_by_name
    serialized_samples(stack_recorder).to_h { |sample| [sample[:frames].first.first, sample[:labels]] }
  end

  it "returns nil" do
    expect(stack_recorder.record_endpoint(1, "GET /")).to be nil
  end

  it "labels samples recorded before the call", gc_stress: true do
    record("before", 123)
    stack_recorder.record_endpoint(123, "GET /users")

    expect(labels_by_name["before"])
      .to eq("local root span id" => 123, "thread id" => 1, "trace endpoint" => "GET /users")
  end

  it "labels samples recorded after the call", gc_stress: true do
    stack_recorder.record_endpoint(123, "GET /users")
    record("after", 123)

    expect(labels_by_name["after"]).to include("trace endpoint" => "GET /users")
  end

  it "labels only the samples whose local root span id matches" do
    record("matching", 1)
    record("other_span", 2)
    record("no_span", nil)
    stack_recorder.record_endpoint(1, "GET /one")

    labels = labels_by_name
    expect(labels["matching"]).to include("trace endpoint" => "GET /one")
    expect(labels["other_span"]).not_to have_key("trace endpoint")
    expect(labels["no_span"]).not_to have_key("trace endpoint")
  end

  it "gives each span id its own endpoint" do
    record("one", 1)
    record("two", 2)
    stack_recorder.record_endpoint(1, "GET /one")
    stack_recorder.record_endpoint(2, "POST /two")

    expect(labels_by_name.transform_values { |labels| labels["trace endpoint"] })
      .to eq("one" => "GET /one", "two" => "POST /two")
  end

  context "with Integer and String span ids" do
    it "matches an Integer label with a String id of its decimal digits" do
      record("numeric_label", 1234)
      stack_recorder.record_endpoint("1234", "GET /string-id")

      expect(labels_by_name["numeric_label"]).to include("trace endpoint" => "GET /string-id")
    end

    it "matches a String label with an Integer id" do
      record("string_label", "1234")
      stack_recorder.record_endpoint(1234, "GET /integer-id")

      expect(labels_by_name["string_label"]).to include("trace endpoint" => "GET /integer-id")
    end

    it "matches a String label with the same String id" do
      record("string_label", "abc-1")
      stack_recorder.record_endpoint("abc-1", "GET /string")

      expect(labels_by_name["string_label"]).to include("trace endpoint" => "GET /string")
    end

    it "does not match other spellings of the number" do
      record("numeric_label", 12)
      stack_recorder.record_endpoint("012", "GET /leading-zero")
      stack_recorder.record_endpoint("+12", "GET /plus")
      stack_recorder.record_endpoint(" 12", "GET /space")

      expect(labels_by_name["numeric_label"]).not_to have_key("trace endpoint")
    end

    it "matches span ids beyond signed 64-bit (as Integer and String)" do
      big = (2**64) - 1
      record("big_string_label", big.to_s)
      stack_recorder.record_endpoint(big, "GET /big")

      expect(labels_by_name["big_string_label"]).to include("trace endpoint" => "GET /big")
    end
  end

  it "keeps the latest endpoint for an id", gc_stress: true do
    record("sample", 5)
    stack_recorder.record_endpoint(5, "GET /first")
    stack_recorder.record_endpoint("5", "GET /second")
    stack_recorder.record_endpoint(5, "GET /latest")

    expect(labels_by_name["sample"]).to include("trace endpoint" => "GET /latest")
  end

  it "does not carry an endpoint into the next profile" do
    stack_recorder.record_endpoint(7, "GET /first-window")
    record("first_window", 7)
    expect(labels_by_name["first_window"]).to include("trace endpoint" => "GET /first-window")

    record("second_window", 7)
    expect(labels_by_name["second_window"]).not_to have_key("trace endpoint")
  end

  it "does not carry an endpoint over #clear" do
    stack_recorder.record_endpoint(7, "GET /cleared")
    stack_recorder.clear
    record("after_clear", 7)

    expect(labels_by_name["after_clear"]).not_to have_key("trace endpoint")
  end

  it "is dropped by reset_after_fork" do
    record("before_reset", 9)
    stack_recorder.record_endpoint(9, "GET /dropped")
    stack_recorder.reset_after_fork
    record("after_reset", 9)

    expect(labels_by_name).to eq("after_reset" => { "local root span id" => 9, "thread id" => 1 })
  end

  it "writes the endpoint as a string label" do
    record("sample", 1)
    stack_recorder.record_endpoint(1, "GET /string-label")
    profile = decode_pprof(stack_recorder.serialize!)

    label = profile.sample.first.label.find { |l| profile.string_table[l.key] == "trace endpoint" }
    expect(profile.string_table[label.str]).to eq "GET /string-label"
    expect(label.num).to eq 0
  end

  it "aggregates samples of one span id, and keeps apart span ids that share an endpoint" do
    2.times { record("sample", 1) }
    record("sample", 2)
    stack_recorder.record_endpoint(1, "GET /a")
    stack_recorder.record_endpoint(2, "GET /a")

    samples = serialized_samples(stack_recorder)
    expect(samples.map { |s| [s[:labels]["local root span id"], s[:values]["cpu-samples"]] })
      .to contain_exactly([1, 2], [2, 1])
  end

  it "replaces invalid UTF-8 in the endpoint with U+FFFD" do
    record("sample", 3)
    stack_recorder.record_endpoint(3, "GET /caf\xE9".b)

    expect(labels_by_name["sample"]).to include("trace endpoint" => "GET /caf\u{FFFD}")
  end

  it "is also reachable as Testing._native_record_endpoint, which returns true (dd-trace-rb's hook)" do
    record("sample", 11)

    expect(described_class::Testing._native_record_endpoint(stack_recorder, 11, "GET /testing")).to be true
    expect(labels_by_name["sample"]).to include("trace endpoint" => "GET /testing")
  end
end
