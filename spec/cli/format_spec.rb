# frozen_string_literal: true

# DdprofRecorder::CLI::Format (lib/ddprof_recorder/cli/format.rb): the text that top's table,
# record's summary and the commands' messages share.
RSpec.describe DdprofRecorder::CLI::Format do
  it "writes nanoseconds as s / ms / µs / ns, other units as they are, 0 as 0" do
    expect([0, 999, 1500, -2_500_000, 3_000_000_000].map { |v| described_class.quantity(v, "nanoseconds") })
      .to eq(["0", "999ns", "1.5µs", "-2.5ms", "3.00s"])
    expect(described_class.quantity(42, "count")).to eq("42")
    expect([described_class.percent(1, 3), described_class.percent(1, 0)]).to eq(["33.3%", "-"])
  end

  it "names a view after its pprof, and the files of every process as shell words" do
    expect(%w[hot.pb.gz hot.pb hot.gz .pb notes.txt].map { |p| described_class.view_name(p, ".svg") })
      .to eq(%w[hot.svg hot.svg hot.svg .pb.svg notes.txt.svg])
    expect(described_class.profile_glob("profile.pb.gz", "pid*")).to eq("profile.pid*.pb.gz")
    expect(described_class.profile_glob("out dir/my prof.pb.gz", "[0-9]*")).to eq("out\\ dir/my\\ prof.[0-9]*.pb.gz")
    expect(described_class.profile_glob("noext", nil)).to eq("noext")
  end

  it "quotes the words of a command that a shell would not take as they are" do
    expect(described_class.display_command(["ruby", "-e", "puts \"it's\"", "a=b,c:d/e.rb", "x y"]))
      .to eq(%q(ruby -e 'puts "it'\''s"' a=b,c:d/e.rb 'x y'))
  end

  it "shows a path inside the current directory relative to it" do
    Dir.chdir(@dir) do
      expect(described_class.display_path(File.join(Dir.pwd, "a", "b.pb"))).to eq("a/b.pb")
      expect(described_class.display_path("/elsewhere/b.pb")).to eq("/elsewhere/b.pb")
      expect(described_class.display_path("")).to eq("")
    end
  end

  it "titles one file by its name, several by their count and the first three" do
    expect(described_class.files_title(%w[a])).to eq("a")
    expect(described_class.files_title(%w[a b c d])).to eq("4 profiles (a, b, c, ...)")
  end
end
