# frozen_string_literal: true

# DdprofRecorder::CLI.run (lib/ddprof_recorder/cli.rb): picking the command, --help and
# --version, and the one error path (in process, and through exe/ddprof-recorder where said);
# spec/integration/exe_spec.rb runs the commands' work as a user does.
RSpec.describe "DdprofRecorder::CLI.run" do
  it "lists the commands with --help, and on stderr with status 2 when none is given" do
    out, err, status = run_cli("--help")
    expect([err, status]).to eq(["", 0])
    DdprofRecorder::CLI::COMMANDS.each_value do |command|
      expect(out).to match(/^  #{command::NAME} +#{Regexp.escape(command::DESCRIPTION)}$/)
    end
    expect(run_cli("help")).to eq([out, "", 0])
    expect(run_cli).to eq(["", out, 2])
    expect(run_cli("-v")).to eq(["ddprof-recorder #{DdprofRecorder::VERSION}\n", "", 0])
  end

  it "prints each command's help" do
    DdprofRecorder::CLI::COMMANDS.each_key do |name|
      out, err, status = run_cli(name, "--help")
      expect([err, status]).to eq(["", 0])
      expect(out).to start_with("Usage: ddprof-recorder #{name}").and include("-h, --help")
    end
  end

  it "reports an unknown command or option with status 2, in one line" do
    _, err, status = run_cli("frobnicate")
    expect(status).to eq(2)
    expect_one_line(err, /\Addprof-recorder: unknown command "frobnicate" \(commands: record, top, flamegraph, speedscope, timeline, folded, merge\)$/)
    _, err, status = run_cli("folded", "x.pb", "--bogus")
    expect(status).to eq(2)
    expect_one_line(err, /\Addprof-recorder: folded: invalid option: --bogus \(see `ddprof-recorder folded --help`\)$/)
    _, err, status = run_cli("flamegraph")
    expect(status).to eq(2)
    expect_one_line(err, /\Addprof-recorder: flamegraph: give a pprof FILE/)
  end

  it "reports a missing file, a directory, a file that is not a pprof and an output it cannot write, in one line" do
    write_profile("hot.pb.gz", CliHelpers::HOT_SAMPLES)
    File.write(File.join(@dir, "notes.txt"), "these are not the bytes you are looking for\n" * 20)
    File.write(File.join(@dir, "empty.pb"), "")
    Dir.mkdir(File.join(@dir, "adir"))
    { %w[top missing.pb.gz] => /\Addprof-recorder: missing\.pb\.gz: no such file$/,
      %w[folded adir] => /\Addprof-recorder: adir: is a directory, not a pprof file$/,
      %w[speedscope notes.txt] => /\Addprof-recorder: notes\.txt: not a pprof profile: /,
      %w[flamegraph hot.pb.gz notes.txt] => /\Addprof-recorder: notes\.txt: not a pprof profile: /,
      %w[top empty.pb] => /\Addprof-recorder: empty\.pb: not a pprof profile: the input is empty$/,
      %w[top hot.pb.gz hot.pb.gz --value bogus] => /\Addprof-recorder: unknown value type "bogus"; this profile has: /,
      %w[flamegraph hot.pb.gz -o nowhere/x.svg] => %r{\Addprof-recorder: flamegraph: nowhere/x\.svg: directory does not exist$} }
      .each do |argv, message|
        out, err, status = run_cli(*argv)
        expect([out, status]).to eq(["", 1]), argv.inspect
        expect_one_line(err, message)
      end
  end

  it "says the same of an -o it cannot write, in every command that takes one, as the executable" do
    write_profile("hot.pb", CliHelpers::HOT_SAMPLES)
    Dir.mkdir(File.join(@dir, "adir"))
    commands = { "record" => ["--", RbConfig.ruby, "-e", "exit 0"], "flamegraph" => ["hot.pb"],
                 "speedscope" => ["hot.pb"], "merge" => ["hot.pb"] }
    commands.each do |command, args|
      out, err, status = run_exe(command, "-o", "/nonexistent/dir/x.out", *args)
      expect([out, status]).to eq(["", 1]), command
      expect_one_line(err, %r{\Addprof-recorder: #{command}: /nonexistent/dir/x\.out: directory does not exist$})
      # `record` too, before it runs the program (which writes the file at its exit).
      out, err, status = run_exe(command, "-o", "adir", *args)
      expect([out, status]).to eq(["", 1]), command
      expect_one_line(err, /\Addprof-recorder: #{command}: adir: cannot write it: Is a directory$/)
    end
    expect(Dir.children(@dir).sort).to eq(%w[adir hot.pb]) # no temporary file left by merge
  end

  # The write is a rename, which replaced whatever was there: a FIFO, a device node (a copy
  # of /dev/null became a regular file), a symlink (the link itself). And `record` ran the
  # program first.
  it "refuses an -o that exists and is not a regular file, before it runs anything, in one line" do
    write_profile("hot.pb", CliHelpers::HOT_SAMPLES)
    File.mkfifo(File.join(@dir, "fifo"))
    File.write(File.join(@dir, "target"), "mine")
    File.symlink("target", File.join(@dir, "link"))
    outs = { "fifo" => "a FIFO", "link" => "a symbolic link" }
    # As root, a copy of /dev/null too.
    if Process.uid.zero? && system("mknod", File.join(@dir, "null"), "c", "1", "3", err: File::NULL)
      outs["null"] = "a character device"
    end
    commands = { "record" => ["--", RbConfig.ruby, "-e", "File.write('ran', '')"], "merge" => ["hot.pb"],
                 "flamegraph" => ["hot.pb"], "speedscope" => ["hot.pb"] }
    commands.each do |command, args|
      outs.each do |out, kind|
        stdout, err, status = run_cli(command, "-o", out, *args)
        expect([stdout, status]).to eq(["", 1]), "#{command} -o #{out}"
        expect_one_line(err, /\Addprof-recorder: #{command}: #{out}: is #{kind}, not a regular file: not replacing it$/)
      end
    end
    expect(outs.keys.map { |out| File.ftype(File.join(@dir, out)) }).to eq(%w[fifo link characterSpecial].first(outs.size))
    expect(File.read(File.join(@dir, "target"))).to eq("mine")
    expect(Dir.children(@dir).sort).to eq((%w[hot.pb target] + outs.keys).sort) # nothing ran ('ran'), no temporary file
  end

  # It was `<out>.tmp<PID>`, written by File.binwrite: through a symlink that someone who can
  # write the directory planted there, for a pid to come.
  it "writes -o through a temporary file of its own, never through a symlink planted for it" do
    write_profile("hot.pb", CliHelpers::HOT_SAMPLES)
    File.write(File.join(@dir, "victim"), "mine")
    planted = "all.pb.tmp#{Process.pid}"
    File.symlink("victim", File.join(@dir, planted))
    out, err, status = run_cli("merge", "-o", "all.pb", "hot.pb")
    expect([err, status]).to eq(["", 0])
    expect(out).to start_with("ddprof-recorder: merged 1 profiles into all.pb (")
    expect(File.read(File.join(@dir, "victim"))).to eq("mine")
    expect(File.ftype(File.join(@dir, "all.pb"))).to eq("file")
    expect(DdprofRecorder.summary(File.binread(File.join(@dir, "all.pb")))[:samples]).to eq(3)
    expect(Dir.children(@dir).sort).to eq(["all.pb", planted, "hot.pb", "victim"].sort) # the planted link is left alone
  end

  it "reads each FILE within --max-decompressed BYTES: over it, one line naming the file and the flag" do
    path = write_profile("hot.pb", CliHelpers::HOT_SAMPLES)
    size = File.size(path)
    [%w[top], %w[flamegraph -o -], %w[speedscope -o -], %w[folded], %w[merge -o -]].each do |command, *args|
      out, err, status = run_cli(command, "hot.pb", *args, "--max-decompressed", (size - 1).to_s)
      expect([out, status]).to eq(["", 1]), command
      expect_one_line(err, /\Addprof-recorder: hot\.pb: the pprof is more than #{size - 1} bytes \(--max-decompressed: #{size - 1}\); raise --max-decompressed to read it$/)
      out, err, status = run_cli(command, "hot.pb", *args, "--max-decompressed", size.to_s)
      expect([err, status]).to eq(["", 0]), command
      expect(out).not_to be_empty
    end
    _, err, status = run_cli("top", "hot.pb", "hot.pb", "--max-decompressed", (size - 1).to_s)
    expect(status).to eq(1)
    expect_one_line(err, /\Addprof-recorder: hot\.pb: the pprof is more than/)
    %w[0 -5 many].each do |bytes|
      _, err, status = run_cli("folded", "hot.pb", "--max-decompressed", bytes)
      expect(status).to eq(2)
      expect_one_line(err, /\Addprof-recorder: folded: (--max-decompressed must be positive|invalid argument: --max-decompressed)/)
    end
  end

  # A raw FILE larger than --max-decompressed was read whole, then copied, to be refused: 604 MB
  # of RSS for a 300 MB file with --max-decompressed 1000000.
  it "reads a raw FILE only as far as --max-decompressed: a larger one is refused from its size" do
    File.open(File.join(@dir, "big.pb"), "wb") { |f| f.truncate(512 << 20) } # sparse: 512 MiB, no disk
    # In 1 GiB of address space: reading it and copying it would fail (NoMemoryError).
    out, err, status = Open3.capture3(RbConfig.ruby, CliHelpers::EXE, "top", "big.pb", "--max-decompressed", "1000000",
                                      chdir: @dir, rlimit_as: 1 << 30)
    expect([out, status.exitstatus]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: big\.pb: the pprof is more than 1000000 bytes \(--max-decompressed: 1000000\); raise --max-decompressed to read it$/)
  end

  # folded wrote 1.05 GB (2.07 GB of RSS) from a 2,978-byte pprof.
  it "writes each view within --max-output BYTES, by default a multiple of what it read: past it, one line" do
    # 10 stacks of a 16 KiB name 400 deep: 66 MB of folded text, held twice, from 4 KB.
    name = "m" * (16 << 10)
    write_profile("long.pb.gz", Array.new(10) { |i| [[["leaf#{i}", "a.rb", 1]] + Array.new(399) { [name, "a.rb", 2] }, [1, 1, 1]] })
    out, err, status = run_cli("folded", "long.pb.gz")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: long\.pb\.gz: the folded stacks would be more than 67108864 bytes \(--max-output: by default 64 x the pprof's protobuf bytes, at least 64 MiB\); raise --max-output to write them$/)
    [%w[speedscope -o -], %w[timeline -o -]].each do |command, *args|
      _, err, = run_cli(command, "long.pb.gz", *args, "--max-output", "1000")
      expect(err).to match(/--max-output: 1000\)|no sample has a time/), command
    end
    out, err, status = run_cli("flamegraph", "long.pb.gz", "-o", "-")
    expect([err, status]).to eq(["", 0])
    expect(out.bytesize).to be < 2 << 20 # the name cut, a drawing of its first 500 characters
    out, err, status = run_cli("folded", "long.pb.gz", "--max-output", (256 << 20).to_s)
    expect([err, status]).to eq(["", 0])
    expect(out.lines.size).to eq(10)
    _, err, status = run_cli("folded", "long.pb.gz", "--max-output", "0")
    expect(status).to eq(2)
    expect_one_line(err, /\Addprof-recorder: folded: --max-output must be positive/)
    _, err, status = run_cli("top", "long.pb.gz", "--max-output", "1000") # top writes a table of what it read
    expect(status).to eq(2)
    expect(err).to start_with("ddprof-recorder: top: invalid option: --max-output")
  end

  # Before --max-input, a FILE was read whole before any limit: `folded /dev/zero
  # --max-decompressed 1000` until NoMemoryError, and `top` on a 2 GB sparse file with 4.2 GB
  # of memory before refusing it.
  describe "--max-input BYTES" do
    def expect_over(err, file, bytes)
      expect_one_line(err, /\Addprof-recorder: #{Regexp.escape(file)}: the file is more than #{bytes} bytes \(--max-input: #{bytes}\); raise --max-input to read it$/)
    end

    it "reads each FILE within it, as stored: over it, one line naming the file and the flag" do
      path = write_profile("hot.pb.gz", CliHelpers::HOT_SAMPLES)
      size = File.size(path)
      [%w[top], %w[flamegraph -o -], %w[speedscope -o -], %w[folded], %w[merge -o -]].each do |command, *args|
        out, err, status = run_cli(command, "hot.pb.gz", *args, "--max-input", (size - 1).to_s)
        expect([out, status]).to eq(["", 1]), command
        expect_over(err, "hot.pb.gz", size - 1)
        out, err, status = run_cli(command, "hot.pb.gz", *args, "--max-input", size.to_s)
        expect([err, status]).to eq(["", 0]), command
        expect(out).not_to be_empty
      end
      %w[0 -5 many].each do |bytes|
        _, err, status = run_cli("top", "hot.pb.gz", "--max-input", bytes)
        expect(status).to eq(2)
        expect_one_line(err, /\Addprof-recorder: top: (--max-input must be positive and below 2\*\*64, got -?\d+|invalid argument: --max-input many)/)
      end
    end

    it "reads a device or a pipe only that far" do
      out, err, status = run_cli("folded", "/dev/zero", "--max-decompressed", "1000", "--max-input", "1000")
      expect([out, status]).to eq(["", 1])
      expect_over(err, "/dev/zero", 1000)

      fifo = File.join(@dir, "pipe")
      File.mkfifo(fifo)
      writer = Thread.new do
        File.open(fifo, "wb") { |f| loop { f.write("\0" * 65_536) } }
      rescue Errno::EPIPE
        nil # the reader had enough
      end
      out, err, status = run_cli("top", "pipe", "--max-input", "100000")
      expect([out, status]).to eq(["", 1])
      expect_over(err, "pipe", 100_000)
    ensure
      # A reader that never opened the pipe leaves the writer in open(2): open it to let it go.
      File.open(fifo, File::RDONLY | File::NONBLOCK, &:close) if writer&.join(0.1).nil? && fifo
      writer&.join
    end

    it "refuses a larger regular file from its size, without reading it (by default, 1 GiB)" do
      File.open(File.join(@dir, "big.pb"), "wb") { |f| f.truncate(2 << 30) } # sparse: 2 GiB, no disk
      # In 1 GiB of address space: reading it would fail (NoMemoryError).
      out, err, status = Open3.capture3(RbConfig.ruby, CliHelpers::EXE, "top", "big.pb", chdir: @dir, rlimit_as: 1 << 30)
      expect([out, status.exitstatus]).to eq(["", 1])
      expect_over(err, "big.pb", 1 << 30)
      expect(DdprofRecorder::CLI::Command::DEFAULT_MAX_INPUT).to eq(1 << 30)
    end
  end

  it "rejects an argument that is not valid in its encoding, in one line" do
    out, err, status = run_cli("top", "caf\xE9.pb.gz")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: "caf\\xE9\.pb\.gz": not valid UTF-8 \(the locale's encoding\)$/)
  end

  # A bug, simulated by making the CLI's own code (or its call of the library) raise: shown
  # with its backtrace, whatever its class, while a user error stays one line (above).
  describe "a bug in a command" do
    before { write_profile("hot.pb.gz", CliHelpers::HOT_SAMPLES) }

    def expect_backtrace(err, message, frame)
      lines = err.lines
      expect(lines.first).to eq("ddprof-recorder: this is a bug in ddprof-recorder #{DdprofRecorder::VERSION}; " \
                                "please report it with what follows:\n")
      expect(lines[1]).to include(message)
      expect(lines.drop(2)).to include(a_string_matching(frame))
    end

    it "a TypeError from the library (a CLI that passes it a wrong type): its backtrace, status 1" do
      allow(DdprofRecorder).to receive(:top).and_raise(TypeError, "value must be a String or Symbol, got Integer")
      out, err, status = run_cli("top", "hot.pb.gz")
      expect([out, status]).to eq(["", 1])
      expect_backtrace(err, "value must be a String or Symbol, got Integer (TypeError)",
                       %r{lib/ddprof_recorder/cli/top\.rb:\d+:in [`'](DdprofRecorder::CLI::Top#)?run'})
    end

    it "a NoMethodError or an ArgumentError in the CLI's own code: its backtrace, status 1" do
      [[NoMethodError, "undefined method `name' for nil:NilClass"], [ArgumentError, "comparison of String with 0 failed"]]
        .each do |klass, message|
          allow_any_instance_of(DdprofRecorder::CLI::TopTable).to receive(:print).and_raise(klass, message)
          out, err, status = run_cli("top", "hot.pb.gz")
          expect([out, status]).to eq(["", 1])
          expect_backtrace(err, "#{message} (#{klass})", %r{lib/ddprof_recorder/cli/top\.rb:\d+:in [`'](DdprofRecorder::CLI::Top#)?run'})
        end
    end
  end

  it "says nothing more once the reader has gone (EPIPE)" do
    write_profile("hot.pb.gz", CliHelpers::HOT_SAMPLES)
    reader, writer = IO.pipe
    reader.close
    status = DdprofRecorder::CLI.run(["folded", File.join(@dir, "hot.pb.gz")], out: writer, err: (err = StringIO.new))
    expect([err.string, status]).to eq(["", 0])
  ensure
    writer&.close
  end
end
