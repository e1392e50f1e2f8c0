# frozen_string_literal: true

# `ddprof-recorder merge` in process (lib/ddprof_recorder/cli/merge.rb), the result decoded
# with google-protobuf.
RSpec.describe "ddprof-recorder merge" do
  before do
    write_profile("one.pb.gz", CliHelpers::HOT_SAMPLES)
    write_profile("two.pb", [[CliHelpers::CRUNCH, [100, 1, 100], { "process id" => 12 }]])
  end

  it "writes the merge, gzip for a .gz name, raw on stdout with -o -" do
    out, err, status = run_cli("merge", "-o", "all.pb.gz", "one.pb.gz", "two.pb")
    expect([err, status]).to eq(["", 0])
    data = File.binread(File.join(@dir, "all.pb.gz"))
    expect(out).to eq("ddprof-recorder: merged 2 profiles into all.pb.gz (#{data.bytesize} bytes)\n")
    expect(data.b).to start_with(PprofHelpers::GZIP_MAGIC)
    by_pid = samples_from(decode_pprof(data)).group_by { |s| s[:labels]["process id"] }
    expect(by_pid.transform_values { |ss| value_totals(ss)["cpu-time"] }).to eq(11 => 1_000_000_000, 12 => 100)

    out, = run_cli("merge", "-o", "-", "two.pb")
    expect(out.b).not_to start_with(PprofHelpers::GZIP_MAGIC)
    expect(value_totals(samples_from(decode_pprof(out)))["cpu-time"]).to eq(100)
  end

  it "names the file that is not a pprof, and writes nothing" do
    File.write(File.join(@dir, "notes.txt"), "not a profile\n" * 10)
    out, err, status = run_cli("merge", "-o", "all.pb.gz", "one.pb.gz", "notes.txt")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: notes\.txt: not a pprof profile: /)
    expect(File.exist?(File.join(@dir, "all.pb.gz"))).to be(false)
  end

  it "needs -o and a FILE (usage errors, status 2)" do
    [%w[merge one.pb.gz], %w[merge -o all.pb.gz]].each do |argv|
      out, err, status = run_cli(*argv)
      expect([out, status]).to eq(["", 2])
      expect_one_line(err, /\Addprof-recorder: merge: give (the output file with -o OUT|a pprof FILE)/)
    end
  end

  it "keeps the samples of --label, and says how many it kept" do
    File.binwrite(File.join(@dir, "web.pb"), endpoint_pprof)
    out, err, status = run_cli("merge", "-o", "heavy.pb.gz", "web.pb", "--label", "trace endpoint=PagesController#heavy")
    expect([err, status]).to eq(["", 0])
    data = File.binread(File.join(@dir, "heavy.pb.gz"))
    expect(out).to eq("ddprof-recorder: merged 1 profiles into heavy.pb.gz, keeping the 2 samples with " \
                      "trace endpoint=PagesController#heavy (#{data.bytesize} bytes)\n")
    samples = samples_from(decode_pprof(data))
    expect(samples.map { |s| [s[:frames].map(&:first), s[:labels]["trace endpoint"], s[:values]["cpu-time"]] }.sort)
      .to eq([[%w[heavy dispatch], EndpointProfiles::HEAVY, 50_000_000],
              [%w[render_json heavy dispatch], EndpointProfiles::HEAVY, 700_000_000]])

    out, = run_cli("merge", "-o", "none.pb", "web.pb", "web.pb", "--label", "trace endpoint=nope")
    expect(out).to start_with("ddprof-recorder: merged 2 profiles into none.pb, keeping no sample: none has trace endpoint=nope (")
    expect(decode_pprof(File.binread(File.join(@dir, "none.pb"))).sample.to_a).to eq([])

    out, err, status = run_cli("merge", "-o", "x.pb", "web.pb", "--label", "endpoint=x")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: web\.pb: no sample has a label "endpoint"; this profile's labels: /)
    expect(File.exist?(File.join(@dir, "x.pb"))).to be(false)
  end
end
