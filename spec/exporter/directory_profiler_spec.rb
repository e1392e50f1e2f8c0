# frozen_string_literal: true

require "logger"
require "stringio"
require "tmpdir"

# The profiler writing its windows to a directory (`Profiler.start(directory:)`, or a
# DirectoryExporter as its exporter): real windows decoded with google-protobuf, its counts in
# Profiler#stats, a forked child's files, and `ddprof-recorder merge` (the executable) reading
# the directory's files. The exporter on its own: directory_exporter_spec.rb.
RSpec.describe DdprofRecorder::Profiler, "to a directory" do
  include CliHelpers

  let(:log) { StringIO.new }

  before { DdprofRecorder.logger = Logger.new(log, level: Logger::INFO) }

  after { DdprofRecorder::Profiler.stop }

  around do |example|
    Dir.mktmpdir("ddprof_recorder_dir_profiler") do |dir|
      @dir = File.realpath(dir)
      example.run
    end
  end

  # The exporter's files (DirectoryExporter's doc), the pid captured.
  let(:name) { /\Aprofile-\d{8}T\d{6}Z-pid(\d+)-\d{6,}\.pb\.gz\z/ }

  def burn_cpu(seconds)
    start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start < seconds
    x
  end

  # The directory's profiles: name => decoded profile.
  def profiles(dir = @dir)
    Dir.children(dir).grep(name).sort.to_h { |name| [name, decode_pprof(File.binread(File.join(dir, name)))] }
  end

  def process_ids(profile)
    samples_from(profile).map { |s| s[:labels]["process id"] }.uniq
  end

  it "takes directory: for a DirectoryExporter with its defaults, and refuses it with an exporter or bad options" do
    expect { described_class.new(directory: 42) }
      .to raise_error(ArgumentError, "directory must be a non-empty String or Pathname without NUL, got 42")
    expect { described_class.new(directory: @dir, exporter: proc {}) }
      .to raise_error(ArgumentError, "give directory or an exporter (or a block), not both")
    expect { described_class.new(directory: @dir) { nil } }
      .to raise_error(ArgumentError, "give directory or an exporter (or a block), not both")
    target = File.join(@dir, "profiles")
    expect { described_class.new(directory: target, hz: 0) }.to raise_error(ArgumentError, /\Ahz must be/)
    expect { described_class.new(directory: target, compression: :zstd) }.to raise_error(ArgumentError)
    expect(File.exist?(target)).to be(false) # nothing made for a profiler that was refused
    expect(described_class.new(directory: target).interval).to eq(60)
    expect(File.directory?(target)).to be(true)
  end

  it "writes each window to a file of its own that google-protobuf decodes, counted in stats" do
    profiler = DdprofRecorder::Profiler.start(hz: 99, interval: 0.1, directory: @dir)
    wait_until("3 windows written", timeout: 60) { profiler.stats[:exporter][:directory][:written] >= 3 }
    burn_cpu(0.05)
    DdprofRecorder::Profiler.stop
    stats = profiler.stats[:exporter]
    found = profiles
    expect(found.size).to eq(stats[:directory][:written])
    expect(stats[:directory]).to include(skipped: 0, failed: 0, removed: 0, low_space: false)
    expect(stats[:exported]).to eq(stats[:directory][:written]) # every window handed over: written
    expect(found.keys.map { |file| file[name, 1].to_i }.uniq).to eq([Process.pid])
    found.each_value do |profile|
      types = profile.sample_type.map { |t| profile.string_table[t.type] }
      expect(types).to eq(DdprofRecorder::Profiler::VALUE_TYPES.map(&:first))
      expect(process_ids(profile) - [Process.pid]).to eq([])
    end
    expect(Dir.children(@dir).size).to eq(found.size) # no temporary file left
  end

  it "counts the windows skipped under the floor in the profiler's stats, and logs once" do
    exporter = DdprofRecorder::DirectoryExporter.new(@dir, min_free_bytes: 1 << 62)
    profiler = DdprofRecorder::Profiler.start(hz: 99, interval: 0.1, exporter: exporter)
    wait_until("2 windows skipped", timeout: 60) { profiler.stats[:exporter][:directory][:skipped] >= 2 }
    DdprofRecorder::Profiler.stop
    stats = profiler.stats[:exporter]
    expect(stats[:directory]).to include(written: 0, failed: 0, low_space: true)
    expect(stats[:directory][:skipped]).to eq(stats[:exported]) # the last window too
    expect(Dir.children(@dir)).to eq([])
    expect(log.string.lines.size).to eq(1), log.string
    expect(log.string).to include("WARN -- : profiler: directory exporter: #{@dir} has ")
  end

  it "writes a forked child's windows under the child's pid, and merge reads the directory's files" do
    DdprofRecorder::Profiler.start(hz: 99, interval: 0.1, directory: @dir)
    child = fork do
      burn_cpu(0.3)
      DdprofRecorder::Profiler.stop
      exit!(0)
    end
    expect(wait_child(child, 120)&.success?).to be(true)
    DdprofRecorder::Profiler.stop

    found = profiles
    by_pid = found.group_by { |file, _| file[name, 1].to_i }
    expect(by_pid.keys).to contain_exactly(Process.pid, child)
    found.each { |file, profile| expect(process_ids(profile) - [file[name, 1].to_i]).to eq([]), file }
    child_cpu = by_pid.fetch(child).sum { |_, profile| value_totals(samples_from(profile))["cpu-time"] }
    expect(child_cpu).to be > 0

    files = Dir.glob(File.join(@dir, "*.pb.gz")).sort
    out, err, status = run_exe("merge", "-o", "all.pb.gz", *files, dir: @dir)
    expect([err, status]).to eq(["", 0])
    expect(out).to match(/\Addprof-recorder: merged #{files.size} profiles into all\.pb\.gz \(\d+ bytes\)\n\z/)
    merged = decode_pprof(File.binread(File.join(@dir, "all.pb.gz")))
    expect(process_ids(merged)).to contain_exactly(Process.pid, child)
    totals = found.values.map { |profile| value_totals(samples_from(profile)) }
    expect(value_totals(samples_from(merged))["cpu-time"]).to eq(totals.sum { |t| t["cpu-time"] })
  end
end
