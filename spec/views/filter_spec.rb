# frozen_string_literal: true

# DdprofRecorder.filter: the samples of some label values, as a pprof (decoded here with
# google-protobuf).
RSpec.describe "DdprofRecorder.filter" do
  let(:recorder) { DdprofRecorder::StackRecorder.new(compression: :none) }
  let(:pprof) do
    recorder.record_sample([["a", "x.rb", 1]], [1, 1, 10], { "thread id" => "7 (1)", "process id" => 10 })
    recorder.record_sample([["b", "x.rb", 2]], [2, 1, 20], { "thread id" => "8 (2)", "process id" => 10 })
    recorder.record_sample([["c", "x.rb", 3]], [4, 1, 40], { "thread id" => "7 (1)", "process id" => 11 })
    recorder.serialize!
  end

  def leaves(bytes)
    samples_from(decode_pprof(bytes)).map { |s| [s[:frames].first.first, s[:values]["cpu-time"]] }.sort
  end

  it "keeps the samples with every label given, a String for a string label, an Integer for a number" do
    expect(leaves(DdprofRecorder.filter(pprof, labels: { "thread id" => "7 (1)" }))).to eq([["a", 1], ["c", 4]])
    expect(leaves(DdprofRecorder.filter(pprof, labels: { "thread id" => "7 (1)", :"process id" => 11 }))).to eq([["c", 4]])
    expect(leaves(DdprofRecorder.filter(pprof, labels: { "process id" => 10 }))).to eq([["a", 1], ["b", 2]])
    expect(leaves(DdprofRecorder.filter(pprof, labels: { "process id" => "10" }))).to eq([])
    expect(leaves(DdprofRecorder.filter(pprof, labels: {}))).to eq([["a", 1], ["b", 2], ["c", 4]])
  end

  it "writes gzip by default, and takes several pprofs (their merge)" do
    gz = DdprofRecorder.filter([pprof, pprof], labels: { "thread id" => "8 (2)" })
    expect(gz.b).to start_with("\x1f\x8b".b)
    expect(leaves(gz)).to eq([["b", 4]])
    expect(DdprofRecorder.filter(pprof, labels: {}, compression: :none).b).not_to start_with("\x1f\x8b".b)
  end

  it "raises on bad arguments" do
    expect { DdprofRecorder.filter(pprof, labels: [["a", "b"]]) }.to raise_error(TypeError, /labels must be a Hash/)
    expect { DdprofRecorder.filter(pprof, labels: { 1 => "x" }) }.to raise_error(TypeError, /label keys must be Strings or Symbols, got Integer/)
    expect { DdprofRecorder.filter(pprof, labels: { "x" => 1.5 }) }.to raise_error(TypeError, /label "x" must be a String or an Integer, got Float/)
    expect { DdprofRecorder.filter(pprof, labels: {}, compression: :zstd) }.to raise_error(ArgumentError, /compression/)
    expect { DdprofRecorder.filter("nope", labels: {}) }.to raise_error(ArgumentError, /not a pprof/)
  end
end
