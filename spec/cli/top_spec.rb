# frozen_string_literal: true

# `ddprof-recorder top` in process (lib/ddprof_recorder/cli/top.rb and top_table.rb), on
# pprofs with known samples (spec/support/cli_helpers.rb).
RSpec.describe "ddprof-recorder top" do
  before { write_profile("hot.pb.gz", CliHelpers::HOT_SAMPLES) }

  it "prints the functions by self value, in columns, with their shares" do
    out, err, status = run_cli("top", "hot.pb.gz")
    expect([err, status]).to eq(["", 0])
    expect(out).to eq(<<~TEXT)
      hot.pb.gz: cpu-time, 1.00s in all, 3 functions
         self  self%    total  total%  function  file
      900.0ms  90.0%  900.0ms   90.0%  crunch    app.rb
      100.0ms  10.0%    1.00s  100.0%  work      app.rb
            0   0.0%    1.00s  100.0%  run       app.rb
    TEXT
  end

  it "sorts by total with --sort total, ties by self value" do
    out, = run_cli("top", "hot.pb.gz", "--sort", "total")
    expect(out.lines.drop(2).map { |l| l.split[4] }).to eq(%w[work run crunch])
  end

  it "with --sort total, orders ties as the core does: by self value, then name, then file" do
    samples = (0...20).map { |i| [[["f", format("f%02d.rb", 19 - i), 1], ["main", "app.rb", 1]], [7, 1, 7], nil] }
    write_profile("ties.pb", samples)
    out, = run_cli("top", "ties.pb", "--sort", "total", "-n", "100")
    rows = out.lines.drop(2).map(&:split)
    expect(rows.first.values_at(4, 5)).to eq(%w[main app.rb])
    expect(rows.drop(1).map { |r| r[5] }).to eq((0...20).map { |i| format("f%02d.rb", i) })
    expect(rows.map { |r| [r[4], r[5]] }).to eq(DdprofRecorder.top(File.binread(File.join(@dir, "ties.pb")), sort: :total)[:rows]
                                                       .map { |r| [r[:name], r[:filename]] })
  end

  it "keeps -n rows of another value type, and says how many there are" do
    out, = run_cli("top", "hot.pb.gz", "--value", "wall-time", "-n", "2")
    expect(out.lines(chomp: true)).to eq(["hot.pb.gz: wall-time, 3.10s in all, 4 functions (top 2)",
                                          " self  self%  total  total%  function  file",
                                          "2.00s  64.5%  2.00s   64.5%  sleep     app.rb",
                                          "1.00s  32.3%  1.00s   32.3%  crunch    app.rb"])
  end

  it "merges several files and names them in the header" do
    write_profile("more.pb", [[CliHelpers::SLEEP, [50_000_000, 1, 50_000_000], { "process id" => 12 }]])
    out, = run_cli("top", "hot.pb.gz", "more.pb", "hot.pb.gz", "more.pb")
    expect(out.lines.first).to eq("4 profiles (hot.pb.gz, more.pb, hot.pb.gz, ...): cpu-time, 2.10s in all, 4 functions\n")
    expect(out.lines[2].split.values_at(0, 4)).to eq(%w[1.80s crunch])
  end

  it "names a function without a name by its file, and a file inside the current directory relatively" do
    write_profile("anon.pb", [[[["", "native.so", 0], ["call", File.join(@dir, "lib", "app.rb"), 2]], [5, 1, 5], nil]])
    out, = run_cli("top", "anon.pb")
    expect(out.lines.drop(2).map(&:split)).to eq([%w[5ns 100.0% 5ns 100.0% (native.so) native.so],
                                                  %w[0 0.0% 5ns 100.0% call lib/app.rb]])
  end

  it "prints only the header for a profile without samples" do
    File.binwrite(File.join(@dir, "empty.pb"), DdprofRecorder::StackRecorder.new.serialize!)
    expect(run_cli("top", "empty.pb")).to eq(["empty.pb: cpu-time, 0 in all, 0 functions\n", "", 0])
  end

  it "rejects a bad -n or --sort with status 2, and an unknown value type with 1, in one line" do
    { %w[-n 0] => /top: -n must be in 1\.\.1000000, got 0$/, %w[-n many] => /invalid argument: -n many/,
      %w[-n 99999999999999999999] => /top: -n must be in 1\.\.1000000, got 99999999999999999999$/,
      %w[--sort name] => /invalid argument: --sort name/ }.each do |args, message|
      out, err, status = run_cli("top", "hot.pb.gz", *args)
      expect([out, status]).to eq(["", 2])
      expect_one_line(err, message)
    end
    _, err, status = run_cli("top", "hot.pb.gz", "--value", "alloc-samples")
    expect(status).to eq(1)
    expect_one_line(err, /\Addprof-recorder: hot\.pb\.gz: unknown value type "alloc-samples"; this profile has: cpu-time, cpu-samples, wall-time$/)
  end
end
