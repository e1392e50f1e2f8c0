# frozen_string_literal: true

require "rexml/document"

# `ddprof-recorder timeline` in process (lib/ddprof_recorder/cli/timeline.rb): its --label.
# The drawing itself is checked in spec/views/timeline_spec.rb.
RSpec.describe "ddprof-recorder timeline" do
  before { File.binwrite(File.join(@dir, "dated.pb"), dated_endpoint_pprof) }

  def lanes(svg)
    REXML::XPath.match(REXML::Document.new(svg), "//g[@class='lane']/title").map(&:text)
  end

  it "draws the samples of --label only, titled with it" do
    out, err, status = run_cli("timeline", "dated.pb", "-o", "heavy.svg", "--label", "trace endpoint=PagesController#heavy")
    expect([err, status]).to eq(["", 0])
    expect(out).to start_with("ddprof-recorder: wrote heavy.svg (2 threads, ")
    svg = File.read(File.join(@dir, "heavy.svg"))
    expect(svg).to include(">dated.pb (trace endpoint=PagesController#heavy)<")
    expect(lanes(svg)).to eq(["t1 (1 (1))\nrunning 100.0%, blocked or waiting 0.0%, gc 0.0%",
                              "t2 (2 (2))\nrunning 0.0%, blocked or waiting 100.0%, gc 0.0%"])
    out, = run_cli("timeline", "dated.pb", "-o", "t2.svg", "--label", "thread id=2 (2)")
    expect(out).to start_with("ddprof-recorder: wrote t2.svg (1 thread, ")

    out, err, status = run_cli("timeline", "dated.pb", "--label", "thread id=3 (3)")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: nothing to draw: no sample has thread id=3 \(3\)$/)
  end
end
