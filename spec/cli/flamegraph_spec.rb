# frozen_string_literal: true

require "rexml/document"

# `ddprof-recorder flamegraph` in process (lib/ddprof_recorder/cli/flamegraph.rb).
RSpec.describe "ddprof-recorder flamegraph" do
  before { write_profile("hot.pb.gz", CliHelpers::HOT_SAMPLES) }

  def titles(svg)
    REXML::XPath.match(REXML::Document.new(svg), "//title").map(&:text)
  end

  it "writes the SVG after the first FILE's name, or where -o says, or to stdout with -o -" do
    out, err, status = run_cli("flamegraph", "hot.pb.gz")
    expect([err, status]).to eq(["", 0])
    svg = File.read(File.join(@dir, "hot.svg"))
    expect(out).to eq("ddprof-recorder: wrote hot.svg (cpu-time, #{svg.bytesize} bytes)\n")
    expect(titles(svg)).to include("crunch (900 ms of cpu-time, 90.00%)")

    out, = run_cli("flamegraph", "hot.pb.gz", "-o", "wall.svg", "--value", "wall-time", "--by-thread", "--title", "Wall")
    expect(out).to start_with("ddprof-recorder: wrote wall.svg (wall-time, ")
    svg = File.read(File.join(@dir, "wall.svg"))
    expect(svg).to include(">Wall<")
    expect(titles(svg)).to include(a_string_starting_with("thread name=sleeper ("))

    out, _, status = run_cli("flamegraph", "hot.pb.gz", "-o", "-")
    expect(status).to eq(0)
    expect(titles(out)).to include("crunch (900 ms of cpu-time, 90.00%)")
  end

  it "says when there is nothing to draw, in one line" do
    write_profile("idle.pb", [[CliHelpers::SLEEP, [0, 1, 10], nil]])
    out, err, status = run_cli("flamegraph", "idle.pb")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: nothing to draw: no sample has a non-zero cpu-time$/)
  end

  it "draws one tower per value of --group-by LABEL, and only the samples of --label" do
    File.binwrite(File.join(@dir, "web.pb"), endpoint_pprof)
    out, err, status = run_cli("flamegraph", "web.pb", "--group-by", "trace endpoint")
    expect([err, status]).to eq(["", 0])
    expect(out).to start_with("ddprof-recorder: wrote web.svg (cpu-time, ")
    expect(titles(File.read(File.join(@dir, "web.svg")))).to include(
      "trace endpoint=PagesController#heavy (750 ms of cpu-time, 75.00%)",
      "trace endpoint=PagesController#index (200 ms of cpu-time, 20.00%)",
      "(no trace endpoint) (50 ms of cpu-time, 5.00%)"
    )

    out, = run_cli("flamegraph", "web.pb", "-o", "heavy.svg", "--label", "trace endpoint=PagesController#heavy")
    expect(out).to start_with("ddprof-recorder: wrote heavy.svg (cpu-time (trace endpoint=PagesController#heavy), ")
    svg = File.read(File.join(@dir, "heavy.svg"))
    expect(svg).to include(">cpu-time flamegraph (trace endpoint=PagesController#heavy)<")
    expect(titles(svg)).to include("render_json (700 ms of cpu-time, 93.33%)")
    expect(titles(svg).grep(/index|gc/)).to eq([])

    out, err, status = run_cli("flamegraph", "web.pb", "--label", "trace endpoint=nope")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: nothing to draw: no sample has trace endpoint=nope$/)
    out, err, status = run_cli("flamegraph", "web.pb", "--group-by", "endpoint")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: web\.pb: no sample has a label "endpoint"; this profile's labels: /)
  end
end
