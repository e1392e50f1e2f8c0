# frozen_string_literal: true

# DdprofRecorder.summary (lib/ddprof_recorder/pprof_views.rb): what a profile holds, on pprofs
# made by the recorder. Its other keys are checked where they are used (cli/record_spec.rb,
# views/merge_spec.rb); here its comments.
RSpec.describe "DdprofRecorder.summary" do
  # A pprof with one sample and `comments`.
  def pprof_with(comments, compression: :none)
    recorder = DdprofRecorder::StackRecorder.new(compression: compression)
    recorder.comments = comments
    recorder.record_sample([["crunch", "app.rb", 3]], [5, 1, 7])
    recorder.serialize!
  end

  it "returns the pprof's comments, in order, each once", gc_stress: true do
    summary = DdprofRecorder.summary(pprof_with(["sampling: at each tick", "by: spec", "sampling: at each tick"]))
    expect(summary[:comments]).to eq(["sampling: at each tick", "by: spec"])
    expect(summary[:totals]).to eq("cpu-time" => 5, "cpu-samples" => 1, "wall-time" => 7)
    expect(DdprofRecorder.summary(pprof_with(["gzip too"], compression: :gzip))[:comments]).to eq(["gzip too"])
  end

  it "returns [] for a pprof without comments" do
    expect(DdprofRecorder.summary(pprof_with([]))[:comments]).to eq([])
  end

  it "returns each distinct comment of several pprofs once, in the order they first appear" do
    pprofs = [pprof_with(["sampling: signals", "a"]), pprof_with([]), pprof_with(["b", "sampling: signals"])]
    expect(DdprofRecorder.summary(pprofs)[:comments]).to eq(["sampling: signals", "a", "b"])
  end
end
