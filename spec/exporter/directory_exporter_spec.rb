# frozen_string_literal: true

require "io/wait"
require "logger"
require "pathname"
require "stringio"
require "tmpdir"

# DdprofRecorder::DirectoryExporter through its public API, on real files in a temporary
# directory: names, binary writes, keep (in one process and in several at once), the free-space
# floor (above the real free space; and on a small tmpfs when this process may mount one),
# failed writes. The profiler's side (windows, fork, merge): directory_profiler_spec.rb.
# What the examples share (constants of their own, not the top level's).
module DirectoryExporterSpec
  # The exporter's files, by the documented form: time, pid, number.
  NAME = /\Aprofile-(\d{8}T\d{6}Z)-pid(\d+)-(\d{6,})\.pb\.gz\z/.freeze
  # The start of the first window the examples hand over.
  START = Time.utc(2025, 3, 14, 9, 30, 0)
end

RSpec.describe DdprofRecorder::DirectoryExporter do
  let(:log) { StringIO.new }

  before { DdprofRecorder.logger = Logger.new(log, level: Logger::INFO) }

  around do |example|
    Dir.mktmpdir("ddprof_recorder_dir_exporter") do |dir|
      @dir = File.realpath(dir)
      example.run
    end
  end

  # A gzip pprof of the profiler's value types with `samples` distinct stacks, all of process
  # `pid`.
  def pprof(samples: 1, pid: Process.pid, compression: :gzip)
    recorder = DdprofRecorder::StackRecorder.new(compression: compression)
    samples.times do |i|
      recorder.record_sample([["work#{i}", "app.rb", i + 1], ["run", "app.rb", 1]], [i + 1, 1, i + 2],
                             { "process id" => pid })
    end
    recorder.serialize!
  end

  def ours
    Dir.children(@dir).grep(DirectoryExporterSpec::NAME).sort
  end

  def export_at(exporter, seconds, data = pprof)
    exporter.export(DirectoryExporterSpec::START + seconds, DirectoryExporterSpec::START + seconds + 60, data)
  end

  it "rejects bad arguments, naming them, and creates nothing" do
    target = File.join(@dir, "new")
    bad = {
      directory: [nil, 42, "", "a\0b"],
      keep: [0, -1, 1.5, "3"],
      min_free_bytes: [-1, 1.5, nil, "1"],
      min_free_fraction: [-0.1, 1, 1.5, Float::NAN, "0.1", nil],
      prefix: ["", ".hidden", "-x", "a/b", "a b", 3, nil],
    }
    bad.each do |name, values|
      values.each do |value|
        args = name == :directory ? [value] : [target, { name => value }]
        expect { described_class.new(args[0], **(args[1] || {})) }
          .to raise_error(ArgumentError, /\A#{name} must be .*, got #{Regexp.escape(value.inspect)}\z/)
      end
    end
    expect { described_class.new(target, keep: BasicObject.new) }
      .to raise_error(ArgumentError, /\Akeep must be a positive Integer or nil, got #<BasicObject/)
    expect(File.exist?(target)).to be(false)

    file = File.join(@dir, "file")
    File.write(file, "x")
    expect { described_class.new(file) }.to raise_error(ArgumentError, "directory #{file} exists and is not a directory")
    exporter = described_class.new(Pathname.new(target))
    expect([exporter.directory, exporter.keep, exporter.min_free_bytes]).to eq([target, 60, 100 << 20])
    expect(File.directory?(target)).to be(true)
    expect { exporter.export("now", DirectoryExporterSpec::START, pprof) }.to raise_error(TypeError, 'start must be a Time, got "now"')
    expect { exporter.export(DirectoryExporterSpec::START, DirectoryExporterSpec::START, nil) }.to raise_error(TypeError, "pprof must be a String, got nil")
  end

  it "writes each window whole, named by its UTC start, pid and number, in binary whatever Encoding.default_internal is" do
    exporter = described_class.new(@dir, min_free_bytes: 0)
    data = pprof(samples: 50)
    external = Encoding.default_external
    internal = Encoding.default_internal
    begin
      # A text-mode file would transcode the bytes from the internal to the external encoding
      # (and raise on the first byte that has no mapping). Rails sets both to UTF-8.
      Encoding.default_external = Encoding::ISO_8859_1
      Encoding.default_internal = Encoding::UTF_8
      export_at(exporter, 0, data)
      export_at(exporter, 0.5, data)
      export_at(exporter, 61, data)
    ensure
      Encoding.default_external = external
      Encoding.default_internal = internal
    end
    pid = Process.pid
    expect(ours).to eq(["profile-20250314T093000Z-pid#{pid}-000001.pb.gz", "profile-20250314T093000Z-pid#{pid}-000002.pb.gz",
                        "profile-20250314T093101Z-pid#{pid}-000003.pb.gz"])
    ours.each do |name|
      bytes = File.binread(File.join(@dir, name))
      expect(bytes).to eq(data.b)
      expect(samples_from(decode_pprof(bytes)).size).to eq(50)
    end
    expect(Dir.children(@dir).size).to eq(3) # no temporary file left
    expect(exporter.stats).to eq(written: 3, skipped: 0, failed: 0, removed: 0, low_space: false)

    # A local time is named in UTC; an uncompressed pprof is `.pb`.
    export_at(described_class.new(@dir, min_free_bytes: 0, prefix: "raw"), 0, pprof(compression: :none))
    expect(Dir.children(@dir).grep(/\Araw-/)).to eq(["raw-20250314T093000Z-pid#{pid}-000001.pb"])
    described_class.new(@dir, min_free_bytes: 0, prefix: "local").export(DirectoryExporterSpec::START.getlocal("+09:00"), DirectoryExporterSpec::START, data)
    expect(Dir.children(@dir).grep(/\Alocal-/)).to eq(["local-20250314T093000Z-pid#{pid}-000001.pb.gz"])
  end

  it "keeps the keep newest files of its naming, whichever process wrote them, and no other file" do
    foreign = ["notes.txt", "other-20250314T093000Z-pid1-000001.pb.gz", "profile-backup.pb.gz",
               "profile-20000101T000000Z-pid1-000001.pb.gz.bak", "profile-20000101T000000Z-1-000001.pb.gz"]
    foreign.each { |name| File.write(File.join(@dir, name), "x") }
    Dir.mkdir(File.join(@dir, "profile-20000101T000000Z-pid1-000002.pb.gz.d"))
    # An older window of another process (of this naming): the oldest of the directory.
    older = "profile-20000101T000000Z-pid1-000001.pb.gz"
    File.binwrite(File.join(@dir, older), pprof)

    exporter = described_class.new(@dir, keep: 3, min_free_bytes: 0)
    8.times { |i| export_at(exporter, i * 60) }
    expect(ours.map { |name| name[DirectoryExporterSpec::NAME, 3] }).to eq(%w[000006 000007 000008])
    expect(Dir.children(@dir) - ours).to match_array(foreign + ["profile-20000101T000000Z-pid1-000002.pb.gz.d"])
    expect(exporter.stats).to include(written: 8, removed: 6)

    # A name from a process of another pid namespace, or an earlier process with this pid, is
    # never replaced: the window takes the next number.
    clash = "profile-20250314T100000Z-pid#{Process.pid}-000009.pb.gz"
    File.write(File.join(@dir, clash), "theirs")
    export_at(exporter, 1800)
    expect(File.read(File.join(@dir, clash))).to eq("theirs")
    expect(ours.last).to eq("profile-20250314T100000Z-pid#{Process.pid}-000010.pb.gz")

    unlimited = described_class.new(@dir, keep: nil, min_free_bytes: 0)
    5.times { |i| export_at(unlimited, 7200 + i) }
    expect(ours.size).to eq(8)
  end

  it "keeps exactly the keep newest of several processes writing at once, none removing another's wrongly" do
    exporter = described_class.new(@dir, keep: 10, min_free_bytes: 0)
    data = pprof(samples: 200)
    processes = 4
    children = Array.new(processes) do |k|
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        # Windows of distinct start times, interleaved across the processes: window i of
        # process k starts at i * processes + k seconds.
        names = Array.new(30) { |i| File.basename(export_at(exporter, (i * processes) + k, data)) }
        writer.write(Marshal.dump([names, exporter.stats]))
        writer.close
        exit!(0)
      end
      writer.close
      [pid, reader]
    end
    reports = children.map do |pid, reader|
      report = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad -- our own child's data
      reader.close
      expect(wait_child(pid, 120)&.success?).to be(true)
      report
    end
    written = reports.flat_map(&:first)
    expect(written.size).to eq(120)
    reports.zip(children) do |(names, stats), (pid, _)|
      expect(names).to all(include("-pid#{pid}-"))
      expect(stats).to include(written: 30, failed: 0)
    end
    newest = written.sort_by { |name| name[DirectoryExporterSpec::NAME, 1] }.last(10)
    expect(ours).to eq(newest.sort)
    expect(reports.sum { |_, stats| stats[:removed] }).to eq(110) # each file removed once
    expect(Dir.children(@dir).size).to eq(10) # no temporary file either
    expect(exporter.stats[:written]).to eq(0) # the children's counts stayed theirs
  end

  it "never shows a partial .pb.gz to a reader listing the directory while windows are written" do
    # A reader process (no GVL shared with the writer) lists the directory in a tight loop and
    # reads each .pb.gz the first time it sees it, which is when a file written in place would
    # be unfinished, whole (gzip's CRC and length, then the protobuf decoder), until told to
    # stop. It lists once more after it is told, so it reads the last files even if the writes
    # were done before its first pass ended.
    stop_reader, stop_writer = IO.pipe
    results, results_writer = IO.pipe
    ready, ready_writer = IO.pipe
    reader = fork do
      stop_writer.close
      results.close
      ready.close
      seen = {}
      bad = []
      loop do
        stopped = stop_reader.wait_readable(0)
        Dir.children(@dir).each do |name|
          next unless name.end_with?(".pb.gz") && !seen[name]

          seen[name] = true
          bytes = begin
            File.binread(File.join(@dir, name))
          rescue Errno::ENOENT # removed for keep since the listing
            next
          end
          begin
            samples = decode_pprof(bytes).sample.size
            bad << "#{name}: #{samples} samples" unless samples == 2_000
          rescue StandardError => e
            bad << "#{name} (#{bytes.bytesize} bytes): #{e.class}: #{e.message}"
          end
        end
        ready_writer.close unless ready_writer.closed?
        break if stopped
      end
      decoded = seen.size
      results_writer.write(Marshal.dump([decoded, bad.first(5)]))
      results_writer.close
      exit!(0)
    end
    stop_reader.close
    results_writer.close
    ready_writer.close
    ready.read # its first pass is done: it reads while the windows are written
    ready.close

    exporter = described_class.new(@dir, keep: 3, min_free_bytes: 0)
    data = pprof(samples: 2_000)
    expect(data.bytesize).to be > 20_000
    # Paced as a profiler's windows are, so that the reader looks at each (not timed: a slower
    # reader only sees fewer files).
    100.times do |i|
      export_at(exporter, i, data)
      sleep 0.005
    end
    stop_writer.close
    decoded, bad = Marshal.load(results.read) # rubocop:disable Security/MarshalLoad -- our own child's data
    results.close
    expect(wait_child(reader, 120)&.success?).to be(true)
    expect(bad).to eq([])
    expect(decoded).to be > 0
    expect(exporter.stats).to include(written: 100, failed: 0, removed: 97)
  end

  it "skips the windows below the floor, counted, and says so once" do
    # Floors above the real free space: more bytes than any disk has, or (almost) all of it.
    [{ min_free_bytes: 1 << 62 }, { min_free_bytes: 0, min_free_fraction: 0.999999 }].each do |floor|
      log.truncate(0)
      log.rewind
      exporter = described_class.new(@dir, **floor)
      3.times { |i| expect(export_at(exporter, i)).to be_nil }
      expect(Dir.children(@dir)).to eq([])
      expect(exporter.stats).to eq(written: 0, skipped: 3, failed: 0, removed: 0, low_space: true)
      expect(log.string.lines.size).to eq(1), log.string
      expect(log.string).to match(%r{WARN -- : profiler: directory exporter: #{Regexp.escape(@dir)} has \d+\.\d MiB free, under the floor of \d+\.\d MiB \(min_free_bytes: #{floor[:min_free_bytes]}, min_free_fraction: #{floor.fetch(:min_free_fraction, 0.0)}\): not writing windows until there is room})
    end
  end

  context "on a small tmpfs" do
    around do |example|
      @mount = File.join(@dir, "tmpfs")
      Dir.mkdir(@mount)
      # 4 MiB and 64 inodes; root on Linux only, and not in every container.
      mounted = Process.uid.zero? &&
                system("mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=64", "tmpfs", @mount, err: File::NULL)
      skip "cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)" unless mounted
      begin
        example.run
      ensure
        system("umount", @mount) || system("umount", "-l", @mount)
      end
    end

    it "stops writing under the floor and starts again when there is room, saying each once" do
      exporter = described_class.new(@mount, min_free_bytes: 1 << 20)
      expect(export_at(exporter, 0)).to be_a(String)
      filler = File.join(@mount, "filler")
      File.binwrite(filler, "\0".b * (3_600 << 10)) # leaves about 0.4 MiB of the 4
      expect(described_class.free_space(@mount).first).to be < (1 << 20)
      3.times { |i| expect(export_at(exporter, 60 + i)).to be_nil }
      expect(exporter.stats).to include(written: 1, skipped: 3, low_space: true)
      File.delete(filler)
      expect(export_at(exporter, 120)).to be_a(String)
      export_at(exporter, 180)
      expect(exporter.stats).to eq(written: 3, skipped: 3, failed: 0, removed: 0, low_space: false)
      lines = log.string.lines
      expect(lines.size).to eq(2), log.string
      expect(lines[0]).to include("WARN -- : profiler: directory exporter: #{@mount} has 0.").and include("under the floor of 1.0 MiB")
      expect(lines[1]).to match(/WARN -- : profiler: directory exporter: #{Regexp.escape(@mount)} has room again \(\d\.\d MiB free, floor 1\.0 MiB\): writing windows again; 3 skipped meanwhile/)
      expect(Dir.children(@mount).grep(DirectoryExporterSpec::NAME).size).to eq(3)
    end

    it "counts a failed write, logs it once per kind, and leaves no temporary file" do
      exporter = described_class.new(@mount, min_free_bytes: 0)
      # Every inode taken: creating the temporary file fails with ENOSPC, with room to spare.
      fillers = (1..100).map do |i|
        File.write(File.join(@mount, "f#{i}"), "")
        i
      rescue Errno::ENOSPC
        break i
      end
      expect(fillers).to be < 100
      3.times { |i| expect(export_at(exporter, i)).to be_nil }
      expect(exporter.stats).to include(written: 0, failed: 3, skipped: 0)
      expect(log.string.lines.size).to eq(1), log.string
      expect(log.string).to match(%r{ERROR -- : profiler: directory exporter: could not write a window to #{Regexp.escape(@mount)}: No space left on device .*\(Errno::ENOSPC\); not logging Errno::ENOSPC again until a window is written})

      File.delete(File.join(@mount, "f1"), File.join(@mount, "f2"))
      expect(export_at(exporter, 60)).to be_a(String)
      expect(log.string.lines.last).to include("WARN -- : profiler: directory exporter: wrote a window to #{@mount} again, after 3 failed")
      expect(Dir.children(@mount).grep(/\.tmp/)).to eq([])

      # A write that fails once the temporary file exists (a file size limit: EFBIG), in a
      # child: the temporary file goes too.
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        trap("XFSZ", "IGNORE")
        Process.setrlimit(Process::RLIMIT_FSIZE, 100)
        result = export_at(exporter, 120, pprof(samples: 100))
        writer.write(Marshal.dump([result, exporter.stats, log.string]))
        writer.close
        exit!(0)
      end
      writer.close
      result, stats, child_log = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad -- our own child's data
      reader.close
      expect(wait_child(pid, 60)&.success?).to be(true)
      expect([result, stats[:failed]]).to eq([nil, 1])
      expect(child_log).to include("(Errno::EFBIG)")
      expect(Dir.children(@mount).grep(/\.tmp/)).to eq([])
    end
  end

  it "removes a temporary file of its naming that a killed process left, once it is old, and makes a removed directory again" do
    exporter = described_class.new(@dir, min_free_bytes: 0)
    stale = "profile-20250314T093000Z-pid1-000001.pb.gz.tmp1-0123456789ab"
    fresh = "profile-20250314T093000Z-pid2-000001.pb.gz.tmp2-0123456789ab"
    theirs = "other-20250314T093000Z-pid1-000001.pb.gz.tmp1-0123456789ab"
    [stale, fresh, theirs].each { |name| File.write(File.join(@dir, name), "half") }
    old = Time.now - described_class::STALE_TEMP_SECONDS - 60
    [stale, theirs].each { |name| File.utime(old, old, File.join(@dir, name)) }
    export_at(exporter, 0)
    expect(Dir.children(@dir)).to match_array([fresh, theirs, "profile-20250314T093000Z-pid#{Process.pid}-000001.pb.gz"])
    expect(exporter.stats[:removed]).to eq(1)

    FileUtils.rm_rf(@dir)
    export_at(exporter, 60)
    expect(Dir.children(@dir)).to eq(["profile-20250314T093100Z-pid#{Process.pid}-000002.pb.gz"])
  end

  it "reads a filesystem's free space with statvfs" do
    available, total = described_class.free_space(@dir)
    expect(total).to be > 0
    expect(available).to be_between(0, total)
    expect { described_class.free_space(File.join(@dir, "missing")) }
      .to raise_error(Errno::ENOENT, /statvfs #{Regexp.escape(@dir)}/)
    expect { described_class.free_space("a\0b") }.to raise_error(ArgumentError, "path must not contain a NUL byte")
  end
end
