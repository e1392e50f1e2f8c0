# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"
require "tmpdir"

# DdprofRecorder.speedscope and `ddprof-recorder speedscope`: the file is valid against the
# schema that speedscope ships, and speedscope's own page, in headless Chromium, draws its
# flame chart with the hot method in it.
RSpec.describe "speedscope output" do
  root = File.expand_path("../..", __dir__)
  exe = File.join(root, "exe", "ddprof-recorder")

  # The hot method of the profiled block (a name no other frame has): busy until this thread
  # used `seconds` of CPU, however loaded the machine is.
  # Its frame name: the method's owner and name (docs/profiler.md, "Frame names").
  hot_name = "#{self}.speedscope_hot_method"

  def self.speedscope_hot_method(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
    x
  end

  # One profile for the file: the main thread in the hot method, a thread that waits.
  before(:context) do
    @dir = Dir.mktmpdir("ddprof_recorder_speedscope")
    release = Queue.new
    sleeper = Thread.new { release.pop }
    sleeper.name = "speedscope_sleeper"
    # Waiting in `pop` before the profile starts: a thread that has not run yet has no stack to
    # sample, and the busy main thread may keep it from running for the whole profile (seen
    # once in CI at load ~5: no sleeper profile).
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    Thread.pass until sleeper.status == "sleep" || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    @pprof = DdprofRecorder::Profiler.profile(hz: 499) { self.class.speedscope_hot_method(0.2) }
    release << :go
    sleeper.join
    @pprof_path = File.join(@dir, "hot.pb.gz")
    File.binwrite(@pprof_path, @pprof)
  end

  after(:context) { FileUtils.remove_entry(@dir, true) }

  # Each profile of a speedscope document: name, unit and its stacks as frame names, with
  # weights.
  def profiles_of(json)
    doc = JSON.parse(json)
    frames = doc.dig("shared", "frames").map { |f| f["name"] }
    doc["profiles"].map do |p|
      stacks = p["samples"].map { |s| s.map { |i| frames.fetch(i) } }
      { name: p["name"], unit: p["unit"], type: p["type"], end: p["endValue"],
        stacks: stacks.zip(p["weights"]) }
    end
  end

  describe "DdprofRecorder.speedscope" do
    it "writes one sampled profile per value type, whose weights are the pprof's totals" do
      doc = JSON.parse(DdprofRecorder.speedscope(@pprof, name: "hot.pb.gz"))
      expect(doc["$schema"]).to eq("https://www.speedscope.app/file-format-schema.json")
      expect(doc).to include("name" => "hot.pb.gz", "activeProfileIndex" => 0,
                             "exporter" => "ddprof_recorder #{DdprofRecorder::VERSION}")
      profiles = profiles_of(JSON.generate(doc))
      expect(profiles.map { |p| [p[:name], p[:unit], p[:type]] })
        .to eq([%w[cpu-time nanoseconds sampled], %w[cpu-samples none sampled], %w[wall-time nanoseconds sampled]])
      totals = DdprofRecorder.summary(@pprof)[:totals]
      profiles.each do |p|
        expect(p[:stacks].sum(&:last)).to eq(totals.fetch(p[:name]))
        expect(p[:end]).to eq(totals.fetch(p[:name]))
      end
      cpu = profiles.first[:stacks]
      hot = cpu.select { |stack, _| stack.include?(hot_name) }.sum(&:last)
      expect(hot).to be > 0.8 * totals["cpu-time"]
      # Root first, as speedscope reads them.
      expect(cpu.map { |stack, _| stack }).to all(satisfy { |s| s.first != hot_name })
    end

    it "picks value types and groups by a label: one profile per thread" do
      profiles = profiles_of(DdprofRecorder.speedscope(@pprof, value: :"wall-time", group_by: "thread name"))
      names = profiles.map { |p| p[:name] }
      expect(names).to include("wall-time, thread name=main", "wall-time, thread name=speedscope_sleeper")
      sleeper = profiles.find { |p| p[:name].end_with?("speedscope_sleeper") }
      expect(sleeper[:stacks].map { |stack, _| stack.last }).to include("Thread::Queue#pop")

      two = profiles_of(DdprofRecorder.speedscope([@pprof, @pprof], value: %w[wall-time cpu-time]))
      expect(two.map { |p| p[:name] }).to eq(%w[wall-time cpu-time])
      expect(two.last[:stacks].sum(&:last)).to eq(2 * DdprofRecorder.summary(@pprof)[:totals]["cpu-time"])
    end

    it "raises on bad arguments" do
      expect { DdprofRecorder.speedscope(@pprof, value: "bogus") }
        .to raise_error(ArgumentError, /unknown value type "bogus"; this profile has: cpu-time, cpu-samples, wall-time/)
      expect { DdprofRecorder.speedscope(@pprof, value: []) }.to raise_error(ArgumentError, /at least one/)
      expect { DdprofRecorder.speedscope("not a pprof") }.to raise_error(ArgumentError, /not a pprof/)
      expect { DdprofRecorder.speedscope(@pprof, name: 1) }.to raise_error(TypeError, /name must be a String/)
      expect { DdprofRecorder.speedscope(@pprof, group_by: 1) }.to raise_error(TypeError, /group_by/)
    end
  end

  describe "ddprof-recorder speedscope" do
    it "writes FILE.speedscope.json next to the pprof, or where -o says, or to stdout" do
      out, err, status = Open3.capture3(RbConfig.ruby, exe, "speedscope", "hot.pb.gz", chdir: @dir)
      expect([status.exitstatus, err]).to eq([0, ""])
      expect(out).to match(/\Addprof-recorder: wrote hot\.speedscope\.json \(3 profiles, \d+ bytes\)\n\z/)
      expect(profiles_of(File.read(File.join(@dir, "hot.speedscope.json"))).size).to eq(3)

      out, err, status = Open3.capture3(RbConfig.ruby, exe, "speedscope", "hot.pb.gz", "--by-thread", "--value", "wall-time",
                                        "-o", "-", chdir: @dir)
      expect([status.exitstatus, err]).to eq([0, ""])
      expect(profiles_of(out).map { |p| p[:name] }).to all(start_with("wall-time, thread name="))

      _, err, status = Open3.capture3(RbConfig.ruby, exe, "speedscope", "hot.pb.gz", "--value", "bogus", chdir: @dir)
      expect(status.exitstatus).to eq(1)
      expect(err).to eq("ddprof-recorder: hot.pb.gz: unknown value type \"bogus\"; this profile has: cpu-time, cpu-samples, wall-time\n")
    end
  end

  describe "in speedscope itself" do
    before(:context) do
      viewers_ready!
      @files = {
        "all" => DdprofRecorder.speedscope(@pprof, name: "hot.pb.gz"),
        "by_thread" => DdprofRecorder.speedscope(@pprof, group_by: "thread name"),
        "merged" => DdprofRecorder.speedscope([@pprof, @pprof], value: "wall-time", group_by: "process id"),
      }.to_h { |name, json| [name, File.join(@dir, "#{name}.speedscope.json").tap { |f| File.write(f, json) }] }
    end

    it "is valid against the JSON schema of the speedscope package" do
      # A file that is not: pprof's unit name, and no weights. The check must catch it.
      broken = JSON.parse(File.read(@files["all"]))
      broken["profiles"][1]["unit"] = "count"
      broken["profiles"][0].delete("weights")
      broken_file = File.join(@dir, "broken.speedscope.json")
      File.write(broken_file, JSON.generate(broken))

      report = Viewers.check("schema", *@files.values, broken_file)
      expect(report["schema"]).to eq("http://json-schema.org/draft-07/schema#")
      *ours, theirs = report["results"]
      ours.each { |r| expect(r).to include("valid" => true, "errors" => []) }
      expect(theirs["valid"]).to be(false)
      expect(theirs["errors"].map { |e| e["message"] }).to include("must have required property 'weights'")
    end

    it "loads in speedscope's own page in headless Chromium, offline, and draws the hot method" do
      viewers_ready!(browser: true)
      png = File.join(@dir, "speedscope.png")
      report = Viewers.check("speedscope", @files["all"], png)
      expect(report["errors"]).to eq([])
      expect(report["refused"]).to eq([]), "speedscope asked the network for #{report['refused']}"
      expect(report["title"]).to eq("hot.pb.gz - speedscope")
      expect(report["toolbar"]).to include("cpu-time (1/3)")
      # Frame names speedscope drew on its canvas: the hot method and its callers.
      expect(report["drawn"]).to include(hot_name)
      # The flame chart's frames are colour: an empty chart is white and grey.
      expect(report["coloured_share"]).to be > 0.02
      expect(File.size(png)).to be > 10_000
    end
  end
end
