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

  context "with labels (spec/support/endpoint_profiles.rb)" do
    before { File.binwrite(File.join(@dir, "web.pb"), endpoint_pprof) }

    it "--by LABEL: the value per label value, its share, and a row for the samples without it" do
      out, err, status = run_cli("top", "web.pb", "--by", "trace endpoint")
      expect([err, status]).to eq(["", 0])
      expect(out).to eq(<<~TEXT)
        web.pb: cpu-time by trace endpoint, 1.00s in all, 2 values
          total  total%  trace endpoint
        750.0ms   75.0%  PagesController#heavy
        200.0ms   20.0%  PagesController#index
         50.0ms    5.0%  (no trace endpoint)
      TEXT
    end

    it "--by a numeric label, with another value, -n, and several files" do
      out, = run_cli("top", "web.pb", "web.pb", "--by", "process id", "--value", "wall-time", "-n", "1")
      expect(out.lines(chomp: true)).to eq(["2 profiles (web.pb, web.pb): wall-time by process id, 3.24s in all, 2 values (top 1)",
                                            "total  total%  process id", "3.12s   96.3%  11"])
    end

    it "--label KEY=VALUE: that endpoint's functions, with its share of the profile" do
      out, err, status = run_cli("top", "web.pb", "--label", "trace endpoint=PagesController#heavy")
      expect([err, status]).to eq(["", 0])
      expect(out).to eq(<<~TEXT)
        web.pb (trace endpoint=PagesController#heavy): cpu-time, 750.0ms in all (75.0% of the profile's 1.00s), 3 functions
           self  self%    total  total%  function     file
        700.0ms  93.3%  700.0ms   93.3%  render_json  pages.rb
         50.0ms   6.7%  750.0ms  100.0%  heavy        pages.rb
              0   0.0%  750.0ms  100.0%  dispatch     metal.rb
      TEXT
      out, = run_cli("top", "web.pb", "--label", "trace endpoint=PagesController#heavy", "--label", "process id=12")
      expect(out.lines.first).to start_with("web.pb (trace endpoint=PagesController#heavy and process id=12): cpu-time, 50.0ms in all (5.0% of")
      out, = run_cli("top", "web.pb", "--by", "thread name", "--label", "trace endpoint=PagesController#heavy")
      expect(out.lines(chomp: true).drop(2)).to eq(["700.0ms   93.3%  puma 1", " 50.0ms    6.7%  puma 2"])
    end

    it "says so when no sample has the label's value, and how to list the values" do
      out, err, status = run_cli("top", "web.pb", "--label", "trace endpoint=Pages#nope")
      expect([err, status]).to eq(["", 0])
      expect(out).to eq("web.pb (trace endpoint=Pages#nope): cpu-time, 0 in all (0.0% of the profile's 1.00s), 0 functions\n" \
                        "no sample has trace endpoint=Pages#nope; `ddprof-recorder top --by 'trace endpoint' web.pb` lists " \
                        "the values of trace endpoint\n")
    end

    it "rejects a label key that no sample has with status 1, and a malformed --label or --by with 2, in one line" do
      %w[--by --label].each do |flag|
        out, err, status = run_cli("top", "web.pb", flag, flag == "--by" ? "endpoint" : "endpoint=x")
        expect([out, status]).to eq(["", 1])
        expect_one_line(err, /\Addprof-recorder: web\.pb: no sample has a label "endpoint"; this profile's labels: local root span id, process id, thread name, trace endpoint$/)
      end
      { %w[--label x] => /top: --label takes KEY=VALUE, got "x"$/,
        %w[--label =x] => /top: --label "=x": the KEY before = is empty$/,
        ["--label", "trace endpoint="] => /top: --label "trace endpoint=": the VALUE after = is empty$/,
        %w[--label a=1 --label a=2] => /top: --label "a" is given twice: a sample has one value per key, and every --label must match$/,
        %w[--by] => /missing argument: --by/,
        ["--by", ""] => /top: --by needs a label key, got an empty one$/,
        %w[--by x --sort total] => /top: --sort orders functions; --by's rows are ordered by their value \(give one\)$/ }.each do |args, message|
        out, err, status = run_cli("top", "web.pb", *args)
        expect([out, status]).to eq(["", 2]), args.inspect
        expect_one_line(err, message)
      end
    end

    it "takes a VALUE with = in it: the KEY is what comes before the first" do
      recorder = DdprofRecorder::StackRecorder.new
      recorder.record_sample([["search", "app.rb", 1]], [5, 1, 5], { "local root span id" => 7 })
      recorder.record_endpoint(7, "GET /search?q=a=b")
      File.binwrite(File.join(@dir, "q.pb"), recorder.serialize!)
      out, = run_cli("top", "q.pb", "--label", "trace endpoint=GET /search?q=a=b")
      expect(out.lines.last.split.values_at(0, 4)).to eq(%w[5ns search])
    end
  end
end
