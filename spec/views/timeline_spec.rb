# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"
require "tmpdir"

# DdprofRecorder.timeline, DdprofRecorder.speedscope(timeline: true) and `ddprof-recorder
# timeline`: what each thread of a profile recorded with `timeline: true` did, and when. The
# documents are checked as a browser shows them (headless Chromium: lanes, colours, the hover
# panel) and, for speedscope, against its schema and in its own page.
RSpec.describe "timeline views" do
  root = File.expand_path("../..", __dir__)
  exe = File.join(root, "exe", "ddprof-recorder")
  # The busy method's frame name (docs/profiler.md, "Frame names").
  busy_name = "#{self}.timeline_busy_method"

  def self.timeline_busy_method(ns)
    from = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - from < ns
    x
  end

  STATE_FRAMES = ["[running]", "[waiting for GVL]", "[blocked]", "[gc]", "[(no state)]"].freeze
  COLOURS = { "running" => "#2e7d32", "waiting for GVL" => "#d32f2f", "blocked" => "#b0b0b0" }.freeze

  # Two busy threads that share the GVL and one that sleeps, recorded with the timeline.
  before(:context) do
    @dir = Dir.mktmpdir("ddprof_recorder_timeline")
    profiler = DdprofRecorder::Profiler.new(hz: 199, timeline: true)
    profiler.start
    # The sleeper starts first, and is asleep before the busy threads start: on Ruby 3.1 a
    # thread made while two others take turns on the GVL waited up to 200 ms to run its first
    # line, and its first sample (on-CPU, so `running`) got that wait's wall time, the widest
    # running span of the page, which the browser check hovers (a CI run failed so).
    sleeper = Thread.new { sleep 0.3 }.tap { |t| t.name = "timeline-sleeper" }
    Thread.pass until sleeper.status == "sleep"
    threads = Array.new(2) do |i|
      Thread.new { self.class.timeline_busy_method(300_000_000) }.tap { |t| t.name = "timeline-busy-#{i}" }
    end
    threads << sleeper
    threads.each(&:join)
    @pprof = profiler.stop.last
    @path = File.join(@dir, "t.pb.gz")
    File.binwrite(@path, @pprof)
    @plain = DdprofRecorder::Profiler.profile(hz: 199) { self.class.timeline_busy_method(20_000_000) }
    File.binwrite(File.join(@dir, "plain.pb.gz"), @plain)
  end

  after(:context) { FileUtils.remove_entry(@dir, true) }

  describe "DdprofRecorder.timeline" do
    it "draws one lane per thread, each span coloured by its state, with the stack in its title" do
      svg = DdprofRecorder.timeline(@pprof, format: :svg, title: "t <1>")
      expect(svg).to start_with("<?xml")
      expect(svg).to include("t &lt;1&gt;")
      lanes = svg.scan(%r{<g class="lane"><title>([^<]*)</title>}).flatten
      names = DdprofRecorder.summary(@pprof)[:threads].map { |t| t[:name] }
      expect(lanes.size).to eq(names.size)
      expect(lanes.join("\n")).to include("timeline-busy-0", "timeline-busy-1", "timeline-sleeper")
      expect(svg).to include(COLOURS["running"], COLOURS["blocked"])
      expect(svg).to match(/timeline-busy-0 \([^)]*\)\): running\n.*\n.*\n(  .*\n)*  #{Regexp.escape(busy_name)}\n/)
    end

    it "writes a page with the SVG, a hover panel and a table of each thread's shares" do
      html = DdprofRecorder.timeline(@pprof, format: :html)
      expect(html).to start_with("<!DOCTYPE html>")
      expect(html).to include("<svg ", 'id="hover"', "<th>waiting for GVL</th>", "timeline-sleeper")
      expect(html.scan("<tr><td>").size).to eq(DdprofRecorder.summary(@pprof)[:threads].size)
    end

    it "lays out several processes' profiles as one lane per process and thread" do
      svg = DdprofRecorder.timeline([@pprof, @pprof])
      # The same pid twice: merged, so the same lanes.
      expect(svg.scan('<g class="lane">').size).to eq(DdprofRecorder.summary(@pprof)[:threads].size)
    end

    it "raises on a profile without times and on bad arguments" do
      expect { DdprofRecorder.timeline(@plain) }
        .to raise_error(DdprofRecorder::Error, /no sample has a time \(label end_timestamp_ns\); record with --timeline/)
      expect { DdprofRecorder.timeline(@pprof, format: :png) }.to raise_error(ArgumentError, /format must be :svg or :html/)
      expect { DdprofRecorder.timeline(@pprof, title: 1) }.to raise_error(TypeError, /title must be a String/)
      expect { DdprofRecorder.timeline("nope") }.to raise_error(ArgumentError, /not a pprof/)
    end
  end

  describe "DdprofRecorder.speedscope(timeline: true)" do
    it "writes one wall-time profile per thread, its dated samples in time order under their states" do
      doc = JSON.parse(DdprofRecorder.speedscope(@pprof, timeline: true))
      frames = doc.dig("shared", "frames").map { |f| f["name"] }
      expect(frames.first(5)).to eq(STATE_FRAMES)
      samples = samples_from(decode_pprof(@pprof))
      doc["profiles"].each do |p|
        expect(p).to include("type" => "sampled", "unit" => "nanoseconds", "startValue" => 0)
        expect(p["samples"].map { |s| frames[s.first] }).to all(be_start_with("["))
        name = p["name"][/\A(?:pid \d+ )?(.+?) \(/, 1]
        dated = samples.select do |s|
          s[:labels]["thread name"] == name && s[:labels].key?(DdprofRecorder::StackRecorder::END_TIMESTAMP_LABEL)
        end
        expect(p["weights"].sum).to eq(dated.sum { |s| s[:values]["wall-time"] })
        expect(p["endValue"]).to eq(p["weights"].sum)
      end
      busy = doc["profiles"].find { |p| p["name"].include?("timeline-busy-0") }
      states = busy["samples"].map { |s| frames[s.first] }.uniq
      expect(states).to include("[running]")
      expect(busy["samples"].flat_map { |s| s.map { |i| frames[i] } }).to include(busy_name)
      # The thread that ran most first: speedscope opens it.
      expect(doc["profiles"].first["name"]).to include("timeline-busy")
    end

    it "raises on a profile without times, and with value: or group_by:" do
      expect { DdprofRecorder.speedscope(@plain, timeline: true) }.to raise_error(DdprofRecorder::Error, /no sample has a time/)
      expect { DdprofRecorder.speedscope(@pprof, timeline: true, group_by: "thread name") }
        .to raise_error(ArgumentError, /timeline: true takes no value: or group_by:/)
    end
  end

  describe "ddprof-recorder timeline" do
    it "writes FILE.timeline.html, or an SVG where -o or --format says, or to stdout" do
      out, err, status = Open3.capture3(RbConfig.ruby, exe, "timeline", "t.pb.gz", chdir: @dir)
      expect([status.exitstatus, err]).to eq([0, ""])
      threads = DdprofRecorder.summary(@pprof)[:threads].size
      expect(out).to match(/\Addprof-recorder: wrote t\.timeline\.html \(#{threads} threads, \d+ bytes\)\n\z/)
      expect(File.read(File.join(@dir, "t.timeline.html"))).to start_with("<!DOCTYPE html>")

      out, err, status = Open3.capture3(RbConfig.ruby, exe, "timeline", "t.pb.gz", "-o", "x.svg", chdir: @dir)
      expect([status.exitstatus, err]).to eq([0, ""])
      expect(out).to start_with("ddprof-recorder: wrote x.svg")
      expect(File.read(File.join(@dir, "x.svg"))).to start_with("<?xml")

      out, err, status = Open3.capture3(RbConfig.ruby, exe, "timeline", "t.pb.gz", "--format", "svg", "-o", "-", chdir: @dir)
      expect([status.exitstatus, err]).to eq([0, ""])
      expect(out).to start_with("<?xml")
    end

    it "says why it cannot draw a profile recorded without --timeline" do
      _, err, status = Open3.capture3(RbConfig.ruby, exe, "timeline", "plain.pb.gz", chdir: @dir)
      expect(status.exitstatus).to eq(1)
      expect(err).to eq("ddprof-recorder: nothing to draw: no sample has a time (label end_timestamp_ns); " \
                        "record with --timeline (Profiler.new(timeline: true))\n")
      _, err, status = Open3.capture3(RbConfig.ruby, exe, "timeline", "t.pb.gz", "--format", "png", chdir: @dir)
      expect(status.exitstatus).to eq(2)
      expect(err).to include("--format png")
    end

    it "has speedscope --timeline, which takes no --by-thread" do
      out, err, status = Open3.capture3(RbConfig.ruby, exe, "speedscope", "--timeline", "t.pb.gz", chdir: @dir)
      expect([status.exitstatus, err]).to eq([0, ""])
      threads = DdprofRecorder.summary(@pprof)[:threads].size
      expect(out).to match(/wrote t\.speedscope\.json \(#{threads} profiles, \d+ bytes\)/)
      _, err, status = Open3.capture3(RbConfig.ruby, exe, "speedscope", "--timeline", "--by-thread", "t.pb.gz", chdir: @dir)
      expect([status.exitstatus, err]).to eq([2, "ddprof-recorder: speedscope: --timeline takes no --value, --by-thread, --by-process or --group-by\n"])
    end
  end

  describe "in a real browser" do
    before(:context) do
      viewers_ready!
      @shots = File.join(root, "tmp", "viewers")
      FileUtils.mkdir_p(@shots)
      @html = File.join(@dir, "t.timeline.html").tap { |f| File.write(f, DdprofRecorder.timeline(@pprof, format: :html)) }
      @svg = File.join(@dir, "t.timeline.svg").tap { |f| File.write(f, DdprofRecorder.timeline(@pprof)) }
      @speedscope = File.join(@dir, "t.speedscope.json").tap do |f|
        File.write(f, DdprofRecorder.speedscope(@pprof, timeline: true, name: "t.pb.gz"))
      end
    end

    it "the speedscope timeline is valid against speedscope's schema" do
      report = Viewers.check("schema", @speedscope)
      expect(report["results"].first).to include("valid" => true, "errors" => [])
    end

    it "Chromium draws the page's lanes in their states and shows a span's stack on hover" do
      viewers_ready!(browser: true)
      report = Viewers.check("timeline", @html, File.join(@shots, "timeline_html.png"))
      expect(report["errors"]).to eq([])
      expect(report["refused"]).to eq([])
      expect(report["lanes"].join("\n")).to include("timeline-busy-0", "timeline-sleeper")
      expect(report["spans"].keys).to include(COLOURS["running"], COLOURS["blocked"])
      expect(report["hovered"][COLOURS["running"]]).to include(": running", busy_name)
      expect(report["hovered"][COLOURS["blocked"]]).to include(": blocked")
      expect(report["coloured_share"]).to be > 0.02

      svg = Viewers.check("timeline", @svg, File.join(@shots, "timeline_svg.png"))
      expect(svg["errors"]).to eq([])
      expect(svg["lanes"]).to eq(report["lanes"])
    end

    it "speedscope's own page loads the timeline and draws the states" do
      viewers_ready!(browser: true)
      report = Viewers.check("speedscope", @speedscope, File.join(@shots, "timeline_speedscope.png"))
      expect(report["errors"]).to eq([])
      expect(report["refused"]).to eq([])
      # Names too long for their box are cut in the middle ("RSpec::...Time…iews.timeline_busy_method").
      expect(report["drawn"]).to include("[running]", end_with("timeline_busy_method"))
      expect(report["coloured_share"]).to be > 0.02
    end
  end
end
