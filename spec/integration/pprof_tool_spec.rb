# frozen_string_literal: true

require "open3"
require "tmpdir"

# docs/design.md, section 4 (pprof output): raw and gzip profiles must be readable by the pprof tool
# (`go tool pprof -raw FILE`) with identical sample totals; merged ones too.
RSpec.describe "go tool pprof on the recorder's output" do
  before(:context) do
    skip "`go` is not on PATH: install golang-go to run `go tool pprof` (CI installs it)" unless go_available?
  end

  around do |example|
    Dir.mktmpdir("ddprof_recorder_pprof_tool") do |dir|
      @dir = dir
      example.run
    end
  end

  def go_available?
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).any? do |path|
      File.executable?(File.join(path, "go")) && !File.directory?(File.join(path, "go"))
    end
  end

  # Everything go may write goes under the temporary directory; no network, no toolchain switch.
  def go_env
    home = File.join(@dir, "home")
    {
      "HOME" => home, "GOCACHE" => File.join(home, "gocache"), "GOPATH" => File.join(home, "gopath"),
      "GOFLAGS" => "-mod=mod", "GOTOOLCHAIN" => "local", "GOPROXY" => "off", "PPROF_TMPDIR" => @dir,
    }
  end

  # Runs `go tool pprof -raw` on `file`; returns [stdout, stderr, status].
  def pprof_raw(file)
    Open3.capture3(go_env, "go", "tool", "pprof", "-raw", "-symbolize=none", file)
  end

  # Per sample type totals of a `-raw` listing: the "Samples:" section has a header line of
  # `type/unit` columns, then one line per sample, `v1 v2 ...: location ids`, followed by its
  # label lines.
  def raw_totals(output)
    lines = output.lines.map(&:chomp)
    header_index = lines.index("Samples:") or raise "no Samples: section in:\n#{output}"
    types = lines[header_index + 1].split.map { |column| column.split("/").first }
    totals = types.to_h { |type| [type, 0] }
    lines[(header_index + 2)..].each do |line|
      break unless line.start_with?(" ") || line.empty?

      values = line[/\A\s*(-?\d+(?:\s+-?\d+)*):/, 1] or next
      types.zip(values.split.map(&:to_i)).each { |type, value| totals[type] += value }
    end
    totals
  end

  # A recording with shared frames, deep and truncated stacks, string and numeric labels,
  # endpoints, aggregated samples and timed ones (a third of them). Every stack is non-empty: pprof drops samples without
  # locations.
  def record_workload(recorder)
    expected = Hash.new(0)
    files = Array.new(7) { |i| "/app/lib/file_#{i}.rb" }
    300.times do |i|
      depth = 1 + (i % 40)
      stack = Array.new(depth) { |d| ["method_#{(i + d) % 23}", files[(i * d) % 7], 1 + ((i + d) % 50)] }
      stack = caller_locations(0) + stack if (i % 50).zero?
      values = [1000 * (i + 1), 1 + (i % 3), 2000 * (i + 1)]
      labels = { "thread id" => i % 4, "thread name" => "worker-#{i % 4}", "local root span id" => i % 10 }
      labels[DdprofRecorder::StackRecorder::END_TIMESTAMP_LABEL] = 1_764_000_000_000_000_000 + i if (i % 3).zero?
      recorder.record_sample(stack, values, labels)
      %w[cpu-time cpu-samples wall-time].zip(values).each { |type, value| expected[type] += value }
    end
    10.times { |span| recorder.record_endpoint(span, "GET /endpoint/#{span % 3}") }
    expected
  end

  it "reads the raw and the gzip profile with exit 0 and the totals that were recorded" do
    raw_recorder = DdprofRecorder::StackRecorder.new(compression: :none, max_frames: 30)
    gzip_recorder = DdprofRecorder::StackRecorder.new(compression: :gzip, max_frames: 30)
    expected = record_workload(raw_recorder)
    expect(record_workload(gzip_recorder)).to eq expected

    raw_file = File.join(@dir, "profile.pb")
    gzip_file = File.join(@dir, "profile.pb.gz")
    File.binwrite(raw_file, raw_recorder.serialize!)
    File.binwrite(gzip_file, gzip_recorder.serialize!)
    expect(File.binread(gzip_file, 2).b).to eq "\x1f\x8b".b

    raw_out, raw_err, raw_status = pprof_raw(raw_file)
    gzip_out, gzip_err, gzip_status = pprof_raw(gzip_file)

    expect(raw_status.exitstatus).to eq(0), "go tool pprof -raw #{raw_file} failed:\n#{raw_err}"
    expect(gzip_status.exitstatus).to eq(0), "go tool pprof -raw #{gzip_file} failed:\n#{gzip_err}"
    expect(raw_totals(raw_out)).to eq expected
    expect(raw_totals(gzip_out)).to eq raw_totals(raw_out)
    expect(raw_out.scan("end_timestamp_ns:[").size).to eq(100) # the timed samples, one each
  end

  it "reads a merged profile (DdprofRecorder.merge, raw and gzip) with the totals of its inputs" do
    recorders = Array.new(3) { DdprofRecorder::StackRecorder.new(compression: :gzip, max_frames: 30) }
    expected = recorders.map { |recorder| record_workload(recorder) }
                        .reduce { |a, b| a.merge(b) { |_, x, y| x + y } }
    pprofs = recorders.map(&:serialize!)
    pprofs << DdprofRecorder::StackRecorder.new.serialize! # an empty one, raw
    { "merged.pb.gz" => :gzip, "merged.pb" => :none }.each do |name, compression|
      file = File.join(@dir, name)
      File.binwrite(file, DdprofRecorder.merge(pprofs, compression: compression))

      out, err, status = pprof_raw(file)

      expect(status.exitstatus).to eq(0), "go tool pprof -raw #{name} failed:\n#{err}"
      expect(raw_totals(out)).to eq expected
    end
  end

  it "reads an empty profile (exit 0, no samples)" do
    file = File.join(@dir, "empty.pb.gz")
    File.binwrite(file, DdprofRecorder::StackRecorder.new(compression: :gzip).serialize!)

    out, err, status = pprof_raw(file)

    expect(status.exitstatus).to eq(0), "go tool pprof -raw failed:\n#{err}"
    expect(raw_totals(out)).to eq("cpu-time" => 0, "cpu-samples" => 0, "wall-time" => 0)
  end

  it "shows the labels and the truncation placeholder as pprof sees them" do
    recorder = DdprofRecorder::StackRecorder.new(max_frames: 3)
    recorder.record_sample(
      [["leaf", "/app/a.rb", 3], ["middle", "/app/a.rb", 2], ["root", "/app/a.rb", 1], ["main", "/app/main.rb", 9]],
      [5, 1, 5], { "thread name" => "main", "local root span id" => 42 },
    )
    recorder.record_endpoint(42, "GET /users")
    file = File.join(@dir, "labels.pb")
    File.binwrite(file, recorder.serialize!)

    out, err, status = pprof_raw(file)

    expect(status.exitstatus).to eq(0), "go tool pprof -raw failed:\n#{err}"
    expect(out).to include("thread name:[main]", "trace endpoint:[GET /users]", "2 frames omitted", "leaf /app/a.rb:3")
    expect(raw_totals(out)).to eq("cpu-time" => 5, "cpu-samples" => 1, "wall-time" => 5)
  end

  it "prints the comments (StackRecorder#comments=) with -comments, raw, gzip and merged" do
    comments = ["sampling: at each thread's CPU tick", "recorded by a spec"]
    files = { "commented.pb" => :none, "commented.pb.gz" => :gzip }.map do |name, compression|
      recorder = DdprofRecorder::StackRecorder.new(compression: compression)
      recorder.comments = comments
      recorder.record_sample([["leaf", "/app/a.rb", 3]], [5, 1, 5])
      File.join(@dir, name).tap { |file| File.binwrite(file, recorder.serialize!) }
    end
    merged = File.join(@dir, "merged.pb.gz")
    File.binwrite(merged, DdprofRecorder.merge(files.map { |f| File.binread(f) }))

    (files + [merged]).each do |file|
      out, err, status = Open3.capture3(go_env, "go", "tool", "pprof", "-comments", file)

      expect(status.exitstatus).to eq(0), "go tool pprof -comments #{file} failed:\n#{err}"
      expect(out.lines(chomp: true)).to eq comments
    end
    uncommented = File.join(@dir, "uncommented.pb")
    File.binwrite(uncommented, DdprofRecorder::StackRecorder.new.serialize!)
    out, err, status = Open3.capture3(go_env, "go", "tool", "pprof", "-comments", uncommented)
    expect([out, status.exitstatus]).to eq(["", 0]), err
  end
end
