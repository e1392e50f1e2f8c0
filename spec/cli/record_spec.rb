# frozen_string_literal: true

require "fileutils"
require "rbconfig"

# `ddprof-recorder record` in process (lib/ddprof_recorder/cli/record.rb and
# record_summary.rb). The program runs as a child with this process's stdout; the summary
# goes to the StringIO. spec/integration/exe_spec.rb and spec/integration/record_forks_spec.rb run it as users do.
RSpec.describe "ddprof-recorder record" do
  # A real Process::Status: how a `ruby -e CODE` child ended.
  def status_of(code)
    Process.wait2(Process.spawn(RbConfig.ruby, "-e", code)).last
  end

  # The loop is about 0.1 s of CPU, some 20 samples at 200 Hz: with 300_000 turns (10 ms, two
  # samples at most) a run got none once in CI, and no hottest line.
  it "runs the program, exits with its status and prints the summary of its profile" do
    out, err, status = run_cli("record", "-o", "r.pb", "--hz", "200", "--",
                               RbConfig.ruby, "-e", "x = 0; 3_000_000.times { x += 1 }; exit 3")
    expect([err, status]).to eq(["", 3])
    lines = out.lines(chomp: true)
    # A tick inside the GC (ext/ddprof_recorder/src/sampling/signal_sampler/gc_ticks.rs), by Ruby
    # version.
    gc_note = RUBY_VERSION >= "3.3" ? "\\(in the GC: at its step's end\\)" : "\\(in the GC: at the next interrupt check, Ruby < 3.3\\)"
    expect(lines.first).to match(/\Addprof-recorder: recorded `\S+ -e 'x = 0; 3_000_000\.times \{ x \+= 1 \}; exit 3'` \(exit status 3, \d+\.\d\d s\)\z/)
    expect(lines.drop(1).map { |l| l[0, 12].strip }).to eq(["duration", "samples", "sampling", "threads", "cpu-time",
                                                          "hottest", "written", "view it", "", ""])
    expect(lines[3]).to match(/\A  sampling  each thread at each 1\/200 s of its CPU \(perf events\) \(SIGRTMIN\+\d+\), stacks read in the signal handler #{gc_note}, 200 Hz\z/)
    expect(lines[4]).to eq("  threads   1: main")
    expect(lines[7]).to eq("  written   r.pb (#{File.size(File.join(@dir, 'r.pb'))} bytes)")
    expect(lines.last(3)).to eq(["  view it   ddprof-recorder top r.pb", "            ddprof-recorder flamegraph r.pb -o r.svg",
                                 "            go tool pprof -top r.pb"])
    expect(DdprofRecorder.summary(File.binread(File.join(@dir, "r.pb")))[:thread_names]).to eq(["main"])
  end

  # Process.spawn never raises EPIPE (a failed exec is its errno, ENOENT...): the one EPIPE of
  # `record` is the summary's, when its reader has gone (`record ... | head`; from a shell the
  # exe's buffered $stdout only meets it at exit, here the IO is sync).
  it "still exits with the program's status when the reader of the summary has gone" do
    reader, writer = IO.pipe
    reader.close
    writer.sync = true
    err = StringIO.new
    status = Dir.chdir(@dir) do
      DdprofRecorder::CLI.run(["record", "-o", "r.pb", "--", RbConfig.ruby, "-e", "exit 3"], out: writer, err: err)
    end
    expect([err.string, status]).to eq(["", 3])
    expect(DdprofRecorder.summary(File.binread(File.join(@dir, "r.pb")))[:comments]).to include(start_with("sampling: "))
  ensure
    writer&.close
  end

  it "summarizes the processes of a forking program, one line each, and how to view them together" do
    one = write_profile("srv.pb.gz", CliHelpers::HOT_SAMPLES)
    two = write_profile("srv.pid12.pb.gz", [[CliHelpers::CRUNCH, [500_000_000, 50, 500_000_000],
                                              { "thread name" => "main", "process id" => 12 }]])
    options = DdprofRecorder::CLI::Record::Options.new(command: ["puma", "-w", "2"], out: "srv.pb.gz", hz: 99)
    summary = DdprofRecorder::CLI::RecordSummary.new(options, status_of("exit 0"), 2.5, { nil => [one], 12 => [two] })
    lines = Dir.chdir(@dir) { summary.lines }
    expect(lines[0]).to eq("ddprof-recorder: recorded `puma -w 2` (exit status 0, 2.50 s)")
    expect(lines[2]).to start_with("  samples   260") # 90 + 10 + 110 + 50
    expect(lines[3]).to eq("  threads   0 in 2 processes: cruncher, sleeper, main") # no "thread id" labels here
    expect(lines[4]).to eq("  cpu-time  1.50 s   wall-time 3.60 s")
    expect(lines[5]).to eq("  hottest   crunch (app.rb) 93.3% of cpu-time")
    expect(lines.drop(6)).to eq([
      "  processes 2: the command's and 1 forked",
      "            11  samples 210    cpu-time   1.00 s  srv.pb.gz (#{File.size(one)} bytes)",
      "            12  samples 50     cpu-time   0.50 s  srv.pid12.pb.gz (#{File.size(two)} bytes)",
      "  written   2 files, #{File.size(one) + File.size(two)} bytes in all",
      "  view it   ddprof-recorder top srv.pb.gz srv.pid*.pb.gz",
      "            ddprof-recorder flamegraph --by-process srv.pb.gz srv.pid*.pb.gz -o srv.svg",
      "            go tool pprof -top srv.pb.gz srv.pid*.pb.gz",
    ])
  end

  # Before, it deleted every file whose name had the form of a profile file's before it ran
  # the program: `-o backup.tar.gz` deleted backup.2024.tar.gz, backup.20240101.tar.gz and
  # backup.pid1.tar.gz; `-o report.txt` deleted report.2023.txt.
  it "removes no file: lists what this run wrote, and says what it replaced and what it left untouched" do
    mine = %w[backup.2024.tar.gz backup.20240101.tar.gz backup.pid1.tar.gz report.2023.txt]
    mine.each { |name| File.write(File.join(@dir, name), "mine") }
    File.write(File.join(@dir, "backup.tar.gz"), "an earlier run's")
    out, err, status = run_cli("record", "-o", "backup.tar.gz", "--", RbConfig.ruby, "-e", "exit 0")
    expect([err, status]).to eq(["", 0])
    expect(mine.map { |name| File.read(File.join(@dir, name)) }).to eq(%w[mine] * 4)
    path = File.join(@dir, "backup.tar.gz")
    expect(DdprofRecorder.summary(File.binread(path))[:comments]).to include(start_with("sampling: "))
    expect(out.lines(chomp: true)).to include(
      "  written   backup.tar.gz (#{File.size(path)} bytes)",
      "  replaced  backup.tar.gz, from before this run",
      "  untouched 3 files not from this run (names of the same form): backup.2024.tar.gz, backup.20240101.tar.gz, " \
      "backup.pid1.tar.gz",
      "  view it   ddprof-recorder top backup.tar.gz",
    )

    out, err, status = run_cli("record", "-o", "report.txt", "--", RbConfig.ruby, "-e", "exit 0")
    expect([err, status]).to eq(["", 0])
    expect(mine.map { |name| File.read(File.join(@dir, name)) }).to eq(%w[mine] * 4)
    lines = out.lines(chomp: true)
    expect(lines).to include("  untouched report.2023.txt: not from this run (a name of the same form)")
    expect(lines.grep(/replaced/)).to be_empty
  end

  describe "with files from before the run that have names of the same form" do
    def summary_lines(files, left)
      options = DdprofRecorder::CLI::Record::Options.new(command: ["puma"], out: "srv.pb", hz: 99)
      summary = DdprofRecorder::CLI::RecordSummary.new(options, status_of("exit 0"), 1, files, replaced: [files[nil].first],
                                                                                             left: left)
      Dir.chdir(@dir) { summary.lines }
    end

    # The patterns would read them: srv.pid*.pb matches srv.pid9.pb.
    it "names this run's files in the commands to view them, if there are a few" do
      files = { nil => [write_profile("srv.pb", CliHelpers::HOT_SAMPLES)],
                12 => [write_profile("srv.pid12.pb", CliHelpers::HOT_SAMPLES)] }
      lines = summary_lines(files, [File.join(@dir, "srv.pid9.pb"), File.join(@dir, "srv.pid10.pb")])
      expect(lines.drop_while { |l| !l.start_with?("  written") }).to eq([
        "  written   2 files, #{files.values.flatten.sum { |f| File.size(f) }} bytes in all",
        "  replaced  srv.pb, from before this run",
        "  untouched 2 files not from this run (names of the same form): srv.pid9.pb, srv.pid10.pb",
        "  view it   ddprof-recorder top srv.pb srv.pid12.pb",
        "            ddprof-recorder flamegraph --by-process srv.pb srv.pid12.pb -o srv.svg",
        "            go tool pprof -top srv.pb srv.pid12.pb",
      ])
    end

    it "or keeps the patterns, and says that they match those files too" do
      files = { nil => [write_profile("srv.pb", CliHelpers::HOT_SAMPLES)] }
      (12..20).each { |pid| files[pid] = [write_profile("srv.pid#{pid}.pb", CliHelpers::HOT_SAMPLES)] }
      lines = summary_lines(files, [File.join(@dir, "srv.pid9.pb")])
      expect(lines).to include("  untouched srv.pid9.pb: not from this run (a name of the same form); the patterns below " \
                               "match it too",
                               "  view it   ddprof-recorder top srv.pb srv.pid*.pb")
    end
  end

  # Through the executable, as users see it.
  it "names each thread name once with the number of processes that have it, for a forking program" do
    # Each process burns 0.2 s of CPU, 20 periods at 99 Hz: with 0.02 s (5 scheduler ticks,
    # each a sample with probability 0.4) a process could end with no sample, and the spec
    # failed once in CI on 3.3.8.
    program = "def burn = (t = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.2; nil while " \
              "Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < t); pid = fork { burn }; burn; Process.wait(pid)"
    out, err, status = run_exe("record", "-o", "f.pb", "--", RbConfig.ruby, "-e", program, env: { "RUBYOPT" => nil })
    expect([err, status]).to eq(["", 0])
    # The whole summary in the message: RSpec's own cuts a long text short.
    expect(out).to include("\n  threads   2 in 2 processes: main (in each)\n",
                           "\n  processes 2: the command's and 1 forked\n"), "the summary:\n#{out}"
  end

  it "says that a program shorter than one sampling period has no samples, and names no hottest function" do
    # At 1 Hz without signals the first tick comes 0.5-1.5 s after the start (with signals, any
    # CPU tick may be a sample, with a small chance: it was once, in a CI run).
    out, err, status = run_exe("record", "-o", "e.pb", "--hz", "1", "--no-signals", "--", RbConfig.ruby, "-e", "exit 3",
                               env: { "RUBYOPT" => nil })
    expect([err, status]).to eq(["", 3])
    lines = out.lines(chomp: true)
    expect(lines).to include("  samples   0: the profiled run was shorter than one sampling period (1.00 s at 1 Hz)")
    expect(lines.drop(1).map { |l| l[0, 12].strip }).to eq(["duration", "samples", "sampling", "threads", "cpu-time",
                                                          "written", "view it", "", ""])
    expect(out).not_to include("recording.rb")
  end

  # Issue 21: `record -- ruby -e 'exit 3'` charged its whole profile (554 µs) to
  # DdprofRecorder::Recording.start, the profiler's own start and stop work.
  it "keeps the profiler's own start and stop work out of the profile (999 Hz, allocations with a duty cycle)" do
    files = (1..4).map do |i|
      out, err, status = run_exe("record", "-o", "own#{i}.pb", "--hz", "999", "--allocations", "--allocation-overhead", "0.02", "--",
                                 RbConfig.ruby, "-e", "x = 0; 100_000.times { x += 1 }; exit 3")
      expect([err, status]).to eq(["", 3])
      expect(out).not_to include("recording.rb")
      File.binread(File.join(@dir, "own#{i}.pb"))
    end
    files_of = files.flat_map { |pprof| samples_from(decode_pprof(pprof)).flat_map { _1[:frames] }.map { _1[1] } }
    expect(files_of).to include("-e")
    expect(files_of.uniq.grep(%r{lib/ddprof_recorder/})).to eq([])
  end

  describe "the sampling line" do
    def summary_lines(files)
      options = DdprofRecorder::CLI::Record::Options.new(command: ["ruby", "app.rb"], out: "s.pb", hz: 99)
      summary = DdprofRecorder::CLI::RecordSummary.new(options, status_of("exit 0"), 1, files)
      Dir.chdir(@dir) { summary.lines }
    end

    let(:signals) { "sampling: at each thread's CPU tick, stacks read in the signal handler (SIGRTMIN+8)" }

    it "says how the profiles were sampled, from their \"sampling: \" comment, after the samples" do
      files = %w[s.0001.pb s.0002.pb].map do |name|
        write_profile(name, CliHelpers::HOT_SAMPLES, comments: ["by: a spec", signals])
      end
      lines = summary_lines({ nil => files })
      expect(lines[2]).to start_with("  samples   ")
      expect(lines[3]).to eq("  sampling  at each thread's CPU tick, stacks read in the signal handler (SIGRTMIN+8)")
      expect(lines.grep(/sampling|by: a spec/).size).to eq(1)
    end

    it "lists each distinct text once when the processes differ" do
      safepoint = "sampling: at safepoints, in a postponed job"
      one = write_profile("s.pb", CliHelpers::HOT_SAMPLES, comments: [signals])
      two = write_profile("s.pid12.pb", CliHelpers::HOT_SAMPLES, comments: [safepoint])
      three = write_profile("s.pid13.pb", CliHelpers::HOT_SAMPLES, comments: [signals])
      lines = summary_lines({ nil => [one], 12 => [two], 13 => [three] })
      expect(lines[3, 3]).to eq([
        "  sampling  at each thread's CPU tick, stacks read in the signal handler (SIGRTMIN+8)",
        "            at safepoints, in a postponed job",
        "  threads   0 in 3 processes: cruncher (in each), sleeper (in each)",
      ])
    end

    it "is not printed when no file has a \"sampling: \" comment" do
      one = write_profile("s.pb", CliHelpers::HOT_SAMPLES, comments: ["by: a spec", "sampling:no space"])
      two = write_profile("s.pid12.pb", CliHelpers::HOT_SAMPLES)
      lines = summary_lines({ nil => [one], 12 => [two] })
      expect(lines.map { |l| l[0, 12].strip }).not_to include("sampling")
      expect(lines[3]).to start_with("  threads   ")
    end
  end

  it "records allocations, the live heap and GC time when asked, and names the hottest allocator" do
    program = <<~RUBY
      KEEP = []
      def ten = 100_000.times { |i| (i % 10).zero? ? KEEP << [0] : [1] }
      def one = 10_000.times { [2] }
      3.times { ten; one }
      GC.start
    RUBY
    # The hook always on (--allocation-overhead 1): a program this short gets few slots seen.
    out, err, status = run_cli("record", "-o", "m.pb", "--heap", "--gc", "--allocation-interval", "64",
                               "--allocation-overhead", "1", "--", RbConfig.ruby, "-e", program)
    expect([err, status]).to eq(["", 0])
    allocator = out.lines(chomp: true).find { |l| l.start_with?("  allocator") }
    expect(allocator).to match(/\A  allocator Object#ten \(-e\) (\d+\.\d)% of about \d+ allocations\z/)
    expect(Float(allocator[/(\d+\.\d)%/, 1])).to be_within(5).of(100.0 * 10 / 11)
    samples = samples_from(decode_pprof(File.binread(File.join(@dir, "m.pb"))))
    totals = value_totals(samples)
    expect(totals["alloc-count"]).to be_within(33_000).of(330_000)
    expect(totals["heap-live-samples"]).to be_positive
    expect(samples.map { |s| s[:frames].last&.first }).to include("(garbage collection)")
  end

  it "dates each thread sample with --timeline, and the views still read the file" do
    key = DdprofRecorder::StackRecorder::END_TIMESTAMP_LABEL
    before = Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
    out, err, status = run_cli("record", "-o", "t.pb", "--timeline", "--hz", "200", "--",
                               RbConfig.ruby, "-e", "x = 0; 3_000_000.times { x += 1 }")
    after = Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)
    expect([err, status]).to eq(["", 0])
    expect(out).to include("hottest")
    pprof = File.binread(File.join(@dir, "t.pb"))
    samples = samples_from(decode_pprof(pprof))
    on_cpu = samples.select { |s| s[:values]["cpu-samples"].positive? }
    expect(on_cpu.size).to be >= 5
    expect(on_cpu.map { |s| s[:labels][key] }).to all(be_between(before, after))
    # The summary's reader adds up the timed samples as google-protobuf's decoding does.
    expect(Integer(out[/^  samples +(\d+)/, 1])).to eq(value_totals(samples)["cpu-samples"])
    expect(DdprofRecorder.summary(pprof)[:samples]).to eq(samples.size)
  end

  it "prints each thread's states with --timeline, and names the timeline view" do
    out, err, status = run_cli("record", "-o", "s.pb", "--timeline", "--hz", "200", "--", RbConfig.ruby, "-e", <<~RUBY)
      t = Thread.new { sleep 0.2 }
      t.name = "napper"
      x = "x" * 200 while t.alive? # allocates: the GC runs
    RUBY
    expect([err, status]).to eq(["", 0])
    rows = out.lines.grep(/running .* waiting for GVL.* blocked .* gc /)
    expect(rows.first).to start_with("  states    ")
    napper = rows.find { |l| l.include?("napper") }
    main = rows.find { |l| l.include?("main") }
    # The napper sleeps: blocked for most of its life; main counts while it sleeps: running.
    # Not "main runs > 50%": on a loaded machine main is off the CPU much of the time, which
    # 3.1 counts as blocked (45% running, 27% blocked at load 4.5 on 2 cores).
    expect(Float(napper[/blocked +([\d.]+)%/, 1])).to be > 50
    expect(Float(main[/running +([\d.]+)%/, 1])).to be > Float(napper[/running +([\d.]+)%/, 1]) + 10
    expect(out).to include("ddprof-recorder timeline s.pb -o s.timeline.html")
    # --timeline implies --gc: the GC's frames are there.
    expect(DdprofRecorder.folded(File.binread(File.join(@dir, "s.pb")), value: "wall-time")).to include("(garbage collection)")
  end

  describe "the endpoints line" do
    def summary_lines(files)
      options = DdprofRecorder::CLI::Record::Options.new(command: %w[puma], out: "web.pb", hz: 99)
      Dir.chdir(@dir) { DdprofRecorder::CLI::RecordSummary.new(options, status_of("exit 0"), 1, files).lines }
    end

    it "names the endpoints with the most cpu-time, and the share outside any, when samples have them" do
      path = File.join(@dir, "web.pb")
      File.binwrite(path, endpoint_pprof)
      lines = summary_lines({ nil => [path] })
      expect(lines.grep(/\A  (hottest|endpoints)/)).to eq([
        "  hottest   render_json (pages.rb) 70.0% of cpu-time",
        "  endpoints PagesController#heavy 75.0%, PagesController#index 20.0% of cpu-time, 5.0% outside any endpoint",
      ])
      expect(lines.last(4)).to eq(["  view it   ddprof-recorder top web.pb", "            ddprof-recorder top --by 'trace endpoint' web.pb",
                                   "            ddprof-recorder flamegraph web.pb -o web.svg", "            go tool pprof -top web.pb"])
    end

    it "names three, counts the others, over every process's files" do
      files = { nil => [], 12 => [] }
      (1..5).each do |i|
        recorder = DdprofRecorder::StackRecorder.new
        recorder.record_sample([["work", "app.rb", 1]], [i * 10_000_000, i, i], { "local root span id" => i })
        recorder.record_endpoint(i, "GET /#{i}")
        path = File.join(@dir, i.odd? ? "web.#{i}.pb" : "web.pid12.#{i}.pb")
        File.binwrite(path, recorder.serialize!)
        files[i.odd? ? nil : 12] << path
      end
      # 150 ms in all: /5 50 ms, /4 40 ms, /3 30 ms; nothing outside an endpoint.
      expect(summary_lines(files).grep(/\A  endpoints/))
        .to eq(["  endpoints GET /5 33.3%, GET /4 26.7%, GET /3 20.0% (+2 more) of cpu-time"])
    end

    it "is not there when no sample has an endpoint" do
      path = write_profile("hot.pb", CliHelpers::HOT_SAMPLES)
      lines = summary_lines({ nil => [path] })
      expect(lines.grep(/endpoint/)).to eq([])
    end
  end

  it "says how a signal ended the program, and names windows" do
    windows = %w[w.0001.pb w.0002.pb].map { |name| write_profile(name, CliHelpers::HOT_SAMPLES) }
    options = DdprofRecorder::CLI::Record::Options.new(command: ["ruby", "it's.rb"], out: "w.pb", hz: 99, interval: 0.5)
    summary = DdprofRecorder::CLI::RecordSummary.new(options, status_of("Process.kill(:TERM, $$)"), 1, { nil => windows })
    lines = Dir.chdir(@dir) { summary.lines }
    expect(lines[0]).to eq("ddprof-recorder: recorded `ruby 'it'\\''s.rb'` (killed by signal 15, 1.00 s)")
    expect(lines).to include("  written   2 windows of 0.5 s: w.0001.pb ... w.0002.pb",
                             "            ddprof-recorder flamegraph w.0001.pb -o w.0001.svg")
  end

  it "is not disturbed by a file name in the output directory that is not valid UTF-8" do
    File.write(File.join(@dir, "caf\xE9.pb".b), "")
    out, err, status = run_cli("record", "-o", "r.pb", "--", RbConfig.ruby, "-e", "exit 0")
    expect([err, status]).to eq(["", 0])
    expect(out).to include("  written   r.pb (")
  end

  it "rejects a missing command or a bad rate or interval with status 2, in one line" do
    { [] => /record: no COMMAND given \(usage: ddprof-recorder record \[-o FILE\]/,
      %w[--hz 0 -- ruby] => /record: --hz must be in 1\.\.1000, got 0$/,
      %w[--hz fast -- ruby] => /record: invalid argument: --hz fast/,
      %w[--interval 0 -- ruby] => /record: --interval must be in 0\.1\.\.31536000 \(seconds\), got 0\.0$/,
      %w[--interval 1e-12 -- ruby] => /record: --interval must be in 0\.1\.\.31536000 \(seconds\), got 1\.0e-12$/,
      %w[--interval 1e308 -- ruby] => /record: --interval must be in 0\.1\.\.31536000 \(seconds\), got 1\.0e\+308$/,
      %w[--allocation-interval 0 -- ruby] => /record: --allocation-interval must be in 1\.\.\d+, got 0$/,
      %w[--allocation-interval many -- ruby] => /record: invalid argument: --allocation-interval many/,
      %w[--allocation-overhead 0 -- ruby] => /record: --allocation-overhead must be in \(0, 1\], got 0\.0$/,
      %w[--allocation-overhead 2 -- ruby] => /record: --allocation-overhead must be in \(0, 1\], got 2\.0$/ }
      .each do |args, message|
      out, err, status = run_cli("record", *args)
      expect([out, status]).to eq(["", 2])
      expect_one_line(err, message)
    end
  end

  it "says when it cannot run the command (127) or the output's directory does not exist (1)" do
    _, err, status = run_cli("record", "-o", "x.pb", "--", "/nonexistent/program")
    expect(status).to eq(127)
    expect_one_line(err, %r{\Addprof-recorder: record: cannot run /nonexistent/program: No such file or directory})
    _, err, status = run_cli("record", "-o", "nowhere/x.pb", "--", "true")
    expect(status).to eq(1)
    expect_one_line(err, %r{record: nowhere/x\.pb: directory does not exist$})
  end

  # Through the executable, with no RUBYOPT of the user's, and a TMPDIR of the example's, which
  # the note from the program's Ruby (Recording::STARTED) must leave empty.
  # The status is the command's, or 1 if that was 0: `--help` says so (a launcher that exec'd a
  # program that is not Ruby exited 1 while the help said "COMMAND's exit status").
  describe "a command that wrote no profile: why, in one line, with its status, or 1 if that was 0" do
    def record(*command)
      tmp = File.join(@dir, "tmp")
      FileUtils.mkdir_p(tmp)
      out, err, status = run_exe("record", "-o", "x.pb", "--", *command, env: { "TMPDIR" => tmp, "RUBYOPT" => nil })
      expect(Dir.children(tmp)).to be_empty
      expect(File.exist?(File.join(@dir, "x.pb"))).to be(false)
      [out, err, status]
    end

    it "when no Ruby ran, or none loaded the profiler" do
      out, err, status = record("echo", "hi")
      expect([out, status]).to eq(["hi\n", 1])
      expect_one_line(err, /\Addprof-recorder: record: no profile: `echo hi` ran no Ruby that loaded the profiler \(record profiles Ruby programs through RUBYOPT: ruby, bundle exec, rake, \.\.\.\)$/)
      _, err, status = record(RbConfig.ruby, "--disable-rubyopt", "-e", "1")
      expect(status).to eq(1)
      expect_one_line(err, /: no profile: `\S+ --disable-rubyopt -e 1` ran no Ruby that loaded the profiler /)
      _, err, status = record("sh", "-c", "exit 3")
      expect(status).to eq(3)
      expect_one_line(err, /: no profile: `sh -c 'exit 3'` ran no Ruby that loaded the profiler /)
    end

    it "when its Ruby was killed by a signal that Ruby does not handle, or exec'd another program" do
      _, err, status = record(RbConfig.ruby, "-e", "Process.kill(:KILL, $$)")
      expect(status).to eq(128 + 9)
      expect_one_line(err, /: no profile: `\S+ -e 'Process\.kill\(:KILL, \$\$\)'` was killed by signal 9 before its Ruby \(process \d+\) could write one \(a signal that Ruby does not handle, such as SIGKILL, or a crash\)$/)
      _, err, status = record(RbConfig.ruby, "-e", "exec('true')")
      expect(status).to eq(1)
      expect_one_line(err, /: no profile: `\S+ -e 'exec\('\\''true'\\''\)'` started the profiler \(process \d+\) but wrote nothing at its end \(did it exec a program that is not Ruby\?\)$/)
      _, err, status = record(RbConfig.ruby, "-e", "exec('sh', '-c', 'exit 5')")
      expect(status).to eq(5)
      expect_one_line(err, /: no profile: .* \(did it exec a program that is not Ruby\?\)$/)
    end

    it "when the profiler could not start in its Ruby: the Ruby's message, then record's" do
      _, err, status = record("env", "DDPROF_RECORDER_HZ=fast", RbConfig.ruby, "-e", "1")
      expect(status).to eq(1)
      expect(err.lines.size).to eq(2), err
      expect(err.lines.first).to eq("ddprof-recorder: not profiling this process: DDPROF_RECORDER_HZ must be an integer " \
                                    "in 1..1000, got \"fast\"\n")
      expect(err.lines.last).to match(/\Addprof-recorder: record: no profile: the profiler could not start in `env DDPROF_RECORDER_HZ=fast \S+ -e 1` \(process \d+; its message is above\)$/)
    end

    # The variables that `record` sets from its options, set by hand: each bad value is named
    # with its text (an Integer was `#<Integer:0x0000000000000001>`).
    it "when a variable of the profiler's has a bad value: the variable and its value as written" do
      { "DDPROF_RECORDER_HZ=0" => "DDPROF_RECORDER_HZ must be an integer in 1..1000, got \"0\"",
        "DDPROF_RECORDER_ALLOCATIONS=0" => "DDPROF_RECORDER_ALLOCATIONS must be an integer in 1..1099511627776, got \"0\"",
        "DDPROF_RECORDER_ALLOCATION_OVERHEAD=2" => "DDPROF_RECORDER_ALLOCATION_OVERHEAD must be a number in (0, 1], got \"2\"",
        "DDPROF_RECORDER_INTERVAL=1e-12" => "DDPROF_RECORDER_INTERVAL must be a number of seconds in 0.1..31536000, got \"1e-12\"",
        # Finite, but not as nanoseconds: it was `FloatDomainError: Infinity`.
        "DDPROF_RECORDER_INTERVAL=1e308" => "DDPROF_RECORDER_INTERVAL must be a number of seconds in 0.1..31536000, got \"1e308\"" }
        .each do |setting, message|
        _, err, status = record("env", setting, RbConfig.ruby, "-e", "1")
        expect(status).to eq(1)
        expect(err.lines.first).to eq("ddprof-recorder: not profiling this process: #{message}\n"), err
      end
    end
  end
end
