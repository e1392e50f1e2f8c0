# frozen_string_literal: true

require "open3"
require "rbconfig"

# What the signal handler checks before it reads a stack, beyond "not in a blocking region"
# (ext/ddprof_recorder/src/sampling/signal_sampler.rs, "The handler"), and what the profiler
# refuses or changes when a program does what the handler cannot follow.
RSpec.describe DdprofRecorder::Profiler, "handler guards" do
  lib = File.expand_path("../../lib", __dir__)

  def burn(seconds)
    finish = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < finish
    x
  end

  it "reads the GVL's owner from the thread's Ractor: the holder and no other" do
    testing = described_class::Testing
    expect(testing.holds_gvl?(Thread.current)).to be(true)
    queue = Queue.new
    sleeper = Thread.new { queue.pop }
    Thread.pass until sleeper.status == "sleep"
    expect(testing.holds_gvl?(sleeper)).to be(false)
    # From another thread: a field that named the main thread (the Ractor's `main`) would
    # read true for it here.
    expect(Thread.new { [testing.holds_gvl?(Thread.current), testing.holds_gvl?(Thread.main)] }.value)
      .to eq([true, false])
  ensure
    queue&.push(nil)
    sleeper&.join
  end

  it "reads stacks at the jobs from the moment GC.auto_compact is turned on, before Ruby 3.2" do
    skip "Ruby #{RUBY_VERSION} compacts without a read barrier" unless described_class::AutoCompactGuard::NEEDED
    skip "the handler does not read stacks here" unless described_class._native_handler_can_read_stacks?

    profiler = described_class.new(hz: 999, compression: :none)
    profiler.start
    begin
      burn(0.2)
      expect(profiler.sampling_mode).to eq(:handler)
      GC.auto_compact = true
      read_in_handler = profiler.stats[:signals][:signals_read_in_handler]
      expect(read_in_handler).to be_positive
      burn(0.3)
      GC.start
      burn(0.1)
    ensure
      GC.auto_compact = false
      pprof = profiler.stop.last
    end
    signals = profiler.stats[:signals]
    expect(signals[:signals_read_in_handler]).to eq(read_in_handler)
    expect(signals[:signals_read_at_job]).to be_positive
    expect(profiler.sampling_mode).to eq(:safepoint)
    expect(profiler.sampling_mode_reason).to include("GC.auto_compact")
    expect(pprof_comments(pprof).grep(/stacks read at the next interrupt check \(GC\.auto_compact/)).not_to be_empty
  end

  it "refuses to start with M:N threads on, in one line, and runs the program unprofiled under record" do
    program = "require 'ddprof_recorder'; begin; DdprofRecorder::Profiler.start; rescue DdprofRecorder::Error => e; " \
              "puts e.message; end; puts DdprofRecorder::Profiler::MN_THREADS"
    out, err, status = Open3.capture3({ "RUBY_MN_THREADS" => "1" }, RbConfig.ruby, "-I", lib, "-e", program)
    expect(status).to be_success, err
    if RUBY_VERSION < "3.3"
      expect(out.lines.last).to eq("false\n") # no M:N threads before 3.3: started
      next
    end

    expect(out.lines.map(&:chomp)).to eq(["M:N threads are on (RUBY_MN_THREADS): a Ruby thread moves between " \
                                          "native threads, whose CPU clocks and ticks the profiler uses; " \
                                          "run the program without RUBY_MN_THREADS", "true"])
    Dir.mktmpdir do |dir|
      exe = File.expand_path("../../exe/ddprof-recorder", __dir__)
      out, err, status = Open3.capture3({ "RUBY_MN_THREADS" => "1" }, RbConfig.ruby, exe, "record", "-o",
                                        File.join(dir, "p.pb"), "--", RbConfig.ruby, "-e", "puts :ran")
      expect(out).to eq("ran\n")
      expect(err).to include("not profiling this process: DdprofRecorder::Error: M:N threads are on")
      # No profile: record says so and fails, as for any program whose profiler could not start.
      expect(err).to include("record: no profile: the profiler could not start")
      expect(status).not_to be_success
    end
  end
end
