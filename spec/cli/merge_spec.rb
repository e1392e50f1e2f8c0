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
end
