# frozen_string_literal: true

require "json"

# `ddprof-recorder speedscope` in process (lib/ddprof_recorder/cli/speedscope.rb); the files
# themselves are checked against speedscope's schema and viewer in spec/views/speedscope_spec.rb.
RSpec.describe "ddprof-recorder speedscope" do
  before { write_profile("hot.pb.gz", CliHelpers::HOT_SAMPLES) }

  it "writes one profile per value type, or the ones asked, after the first FILE's name" do
    out, err, status = run_cli("speedscope", "hot.pb.gz")
    expect([err, status]).to eq(["", 0])
    json = File.read(File.join(@dir, "hot.speedscope.json"))
    expect(out).to eq("ddprof-recorder: wrote hot.speedscope.json (3 profiles, #{json.bytesize} bytes)\n")
    doc = JSON.parse(json)
    expect(doc["name"]).to eq("hot.pb.gz")
    expect(doc["profiles"].map { |p| p["name"] }).to eq(%w[cpu-time cpu-samples wall-time])

    out, = run_cli("speedscope", "hot.pb.gz", "--value", "wall-time", "-o", "wall.json")
    expect(out).to start_with("ddprof-recorder: wrote wall.json (1 profile, ")
    out, = run_cli("speedscope", "hot.pb.gz", "--value", "wall-time", "--by-thread", "-o", "-")
    expect(JSON.parse(out)["profiles"].size).to eq(2) # sleeper and cruncher
  end

  it "writes one profile per value of --group-by LABEL, of the samples of --label" do
    File.binwrite(File.join(@dir, "web.pb"), endpoint_pprof)
    out, err, status = run_cli("speedscope", "web.pb", "--value", "cpu-time", "--group-by", "trace endpoint", "-o", "-")
    expect([err, status]).to eq(["", 0])
    expect(JSON.parse(out)["profiles"].map { |p| [p["name"], p["weights"].sum] }).to eq(
      [["cpu-time, trace endpoint=PagesController#heavy", 750_000_000],
       ["cpu-time, trace endpoint=PagesController#index", 200_000_000], ["cpu-time, (no trace endpoint)", 50_000_000]]
    )
    out, = run_cli("speedscope", "web.pb", "--value", "cpu-time", "--label", "process id=12", "-o", "-")
    doc = JSON.parse(out)
    expect(doc["name"]).to eq("web.pb (process id=12)")
    expect(doc["profiles"].map { |p| p["weights"] }).to eq([[50_000_000]])
  end
end
