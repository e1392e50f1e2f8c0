# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

# Allocation sampling, GC time and Ractors (Profiler::RactorGuard): Ruby's NEWOBJ hook crashes the
# VM on a Ractor's thread (Ruby 3.1's own trace_object_allocations does too), and so did the
# GC-event hook of gc: true on 3.1, so the hooks stop when a Ractor starts, and a start with
# allocations or gc refuses while one runs. Each case runs in a fresh
# Ruby: a crash there is a failed example, not a dead suite.
RSpec.describe DdprofRecorder::Profiler, "with Ractors" do
  root = File.expand_path("../..", __dir__)
  lib = File.join(root, "lib")
  exe = File.join(root, "exe", "ddprof-recorder")

  # A Ractor that allocates: what crashed the VM with the hooks on.
  ractor = "Ractor.new { 20_000.times.map(&:to_s).size }.take"

  # 5 x 3 Ractors that allocate: with the GC-event hook left on, Ruby 3.1 crashed 8 runs of 10.
  ractors = "5.times { 3.times.map { Ractor.new { 20_000.times.map(&:to_s).size } }.each(&:take) }"

  def ruby(*args, **options)
    Open3.capture3(RbConfig.ruby, "-W0", *args, **options)
  end

  it "stops allocation sampling when a Ractor starts, and says so in the profile, stats and log" do
    script = <<~RUBY
      profiler = DdprofRecorder::Profiler.new(allocations: true, heap: true, allocation_interval: 1,
                                              compression: :none).start
      kept = Array.new(100) { "before" * 2 }
      #{ractor}
      after = Array.new(1_000) { "after" * 2 }
      pprof = profiler.stop[2]
      print Marshal.dump([profiler.stats[:allocations], DdprofRecorder.summary(pprof)[:comments], kept.size + after.size])
    RUBY
    out, err, status = ruby("-I", lib, "-rddprof_recorder", "-e", script)
    expect(status).to be_success, err
    stats, comments, = Marshal.load(out) # rubocop:disable Security/MarshalLoad -- our own child's output
    expect(stats[:stopped]).to eq(DdprofRecorder::Profiler::RactorGuard::REASON)
    expect(stats[:recorded]).to be >= 100 # the allocations before the Ractor
    expect(comments).to include(a_string_matching(/\Aallocations: stopped at \d\d:\d\d:\d\d UTC: a Ractor started/))
    expect(err).to include("profiler: allocation sampling stopped: a Ractor started")
  end

  # A child that starts a profiler with `options` while a Ractor waits, prints the error or
  # "started", runs `after` (Ruby source) and lets the Ractor end; its output.
  def start_beside_a_ractor(options, after: "")
    script = <<~RUBY
      r = Ractor.new { Ractor.receive }
      begin
        DdprofRecorder::Profiler.new(#{options}).start
        puts "started"
      rescue DdprofRecorder::Error => e
        puts e.message
      end
      #{after}
      r.send(1)
      r.take
    RUBY
    out, err, status = ruby("-I", File.expand_path("../../lib", __dir__), "-rddprof_recorder", "-e", script)
    expect(status).to be_success, err
    out
  end

  it "refuses to start allocation sampling while a Ractor runs, and profiles stacks as usual" do
    out = start_beside_a_ractor("allocations: true", after: "DdprofRecorder::Profiler.new.start.stop; puts :done")
    expect(out).to eq("allocation sampling cannot start while a Ractor other than the main one runs: " \
                      "Ruby's allocation hooks are not safe with Ractors; start without allocations: and heap:\ndone\n")
  end

  it "records a program that starts a Ractor with --allocations to its end, and the summary says why they stopped" do
    Dir.mktmpdir("ddprof_recorder_ractor") do |dir|
      out, err, status = ruby(exe, "record", "--allocations", "-o", "r.pb.gz", "--", RbConfig.ruby, "-W0", "-e",
                              "#{ractor}; puts :ok", chdir: dir)
      expect(status).to be_success, err
      expect(out).to include("ok\n")
      expect(out).to match(/^\s+allocations: stopped at \d\d:\d\d:\d\d UTC: a Ractor started \(Ruby's allocation hooks are not safe with Ractors\)$/)
      expect(File.size(File.join(dir, "r.pb.gz"))).to be_positive
    end
  end

  it "stops GC time when a Ractor starts, once, and says so in the profile, stats and log" do
    script = <<~RUBY
      profiler = DdprofRecorder::Profiler.new(gc: true, compression: :none).start
      #{ractors}
      pprof = profiler.stop[2]
      print Marshal.dump([profiler.stats, DdprofRecorder.summary(pprof)[:comments]])
    RUBY
    out, err, status = ruby("-I", lib, "-rddprof_recorder", "-e", script)
    expect(status).to be_success, err
    stats, comments = Marshal.load(out) # rubocop:disable Security/MarshalLoad -- our own child's output
    expect(stats[:gc_stopped]).to eq(DdprofRecorder::Profiler::RactorGuard::GC_REASON)
    expect(stats).to include(:gc_lost_ns)
    expect(comments.grep(/\Agc: stopped/))
      .to match([a_string_matching(/\Agc: stopped at \d\d:\d\d:\d\d UTC: a Ractor started \(Ruby's GC-event hooks/)])
    expect(err.scan("profiler: GC time stopped: a Ractor started").size).to eq(1)
  end

  it "refuses to start GC time while a Ractor runs" do
    out = start_beside_a_ractor("gc: true")
    expect(out).to eq("GC time cannot be measured while a Ractor other than the main one runs: " \
                      "Ruby's GC-event hooks are not safe with Ractors; start without gc:\n")
  end

  it "records a program that starts Ractors with --gc to its end, and the summary says why GC time stopped" do
    Dir.mktmpdir("ddprof_recorder_ractor") do |dir|
      out, err, status = ruby(exe, "record", "--gc", "-o", "r.pb.gz", "--", RbConfig.ruby, "-W0", "-e",
                              "#{ractors}; puts :ok", chdir: dir)
      expect(status).to be_success, err
      expect(out).to include("ok\n")
      expect(out).to match(/^\s+gc: stopped at \d\d:\d\d:\d\d UTC: a Ractor started \(Ruby's GC-event hooks are not safe with Ractors\)$/)
    end
  end
end
