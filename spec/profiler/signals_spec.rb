# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"
require "tmpdir"

require_relative "signal_work"

# On-CPU stacks read at each thread's CPU tick, in a signal handler (signal_sampler.rs), and
# the modes around it. Where the time goes is checked with wide margins: the shares are of
# cpu-time (thread CPU clocks), which other load on the machine does not change.
RSpec.describe DdprofRecorder::Profiler, "signals" do
  root = File.expand_path("../..", __dir__)
  lib = File.join(root, "lib")

  # Self cpu-time share per method name (qualifiers dropped: `SignalSpecWork.work` and `work`
  # are both `work`), from the pprof decoded with google-protobuf.
  def self_shares(pprof)
    cpu = Hash.new(0)
    samples_from(decode_pprof(pprof)).each do |s|
      name = s[:frames].first&.first.to_s
      cpu[name.sub(/\A.*[#.]/, "")] += s[:values]["cpu-time"]
    end
    total = cpu.values.sum.to_f
    cpu.transform_values { |v| v / total }
  end

  after { described_class.stop }

  # Profiles SignalSpecWork for 1.5 s of CPU at `hz` (not with YJIT on Ruby 3.1: stacks are
  # read at interrupt checks there, with the bias these examples rule out). Returns the self shares, the
  # stats and the profile's cpu-time in seconds.
  def profile_signal_work(hz)
    if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? && !DdprofRecorder::Profiler::HANDLER_READS_UNDER_YJIT
      skip "YJIT is on (Ruby < 3.3): stacks are read at the next interrupt check (:safepoint), with the bias this example rules out"
    end
    profiler = described_class.new(hz: hz, compression: :none)
    pprof = profiler.profile { SignalSpecWork.run(1.5) }
    cpu_seconds = samples_from(decode_pprof(pprof)).sum { |s| s[:values]["cpu-time"] } / 1e9
    [self_shares(pprof), profiler.stats, cpu_seconds]
  end

  it "charges the Ruby code's CPU to it, not to the cheap C methods it calls" do
    shares, stats, cpu_seconds = profile_signal_work(199)
    expect(stats[:sampling_mode]).to eq(:handler)
    # About 199 a second of CPU (the rate is bench/profiler_rate.rb's to measure; a loaded
    # machine makes it lower).
    expect(stats[:signal_samples]).to be > [cpu_seconds * 199 * 0.2, 20].max
    expect(stats[:signals][:signal]).to match(/\ASIGRTMIN\+\d+\z/)
    # Every stack read at its tick: in the handler, or, for a tick inside the GC, at the end of
    # its step (3.3+, signal_sampler/gc_ticks.rs); none at a job.
    signals = stats[:signals]
    expect(signals[:signals_read_in_handler] + signals[:signals_read_at_gc_exit] + signals[:signals_read_after_gc])
      .to be >= stats[:signal_samples]
    expect(signals[:signals_read_at_job]).to eq(0)
    # Truth about 70%; at interrupt checks it came out 6% (issue "Samples where the CPU is").
    # 0.41 once on 3.3.8 with YJIT, two busy loops and a suite beside it: the bound tells the
    # two apart, not the load.
    expect(shares.fetch("work", 0)).to be > 0.3
    expect(shares.fetch("is_a?", 0)).to be < 0.15
  end

  it "takes a busy thread's samples in batches, a job for several, while an idle thread still gets a sample each period" do
    if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? && !DdprofRecorder::Profiler::HANDLER_READS_UNDER_YJIT
      skip "YJIT is on (Ruby < 3.3): stacks are read at the next interrupt check (:safepoint), a job for each sample"
    end
    sleeper = Thread.new { sleep }
    sleep 0.01 until sleeper.status == "sleep"
    profiler = described_class.new(hz: 99, compression: :none)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    pprof = profiler.profile { SignalSpecWork.run(1.5) }
    seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    sleeper_id = described_class::ThreadSampler.thread_id(sleeper)
    sleeper.kill.join
    stats = profiler.stats
    expect(stats[:sampling_mode]).to eq(:handler)
    expect(stats[:signal_samples]).to be > 20
    # signal_sampler.rs, "Batches": about one job for every 4 samples (a job for each before).
    expect(stats[:signals][:signal_jobs]).to be < stats[:signal_samples] * 0.6, stats.except(:recorder).inspect
    # The passes wait while nothing else runs, and count the periods that went by: the sleeper
    # has about 99 samples a second and all of its wall time (a pass per period, as before).
    sleeping = samples_from(decode_pprof(pprof)).select { |s| s[:labels]["thread id"] == sleeper_id }
    expect(sleeping.sum { |s| s[:values]["cpu-samples"] }).to be_between(seconds * 99 * 0.5, seconds * 99 * 1.6)
    expect(sleeping.sum { |s| s[:values]["wall-time"] } / 1e9).to be_between(seconds * 0.8, seconds * 1.05)
    expect(sleeping.sum { |s| s[:values]["cpu-time"] }).to eq(0)
  end

  it "at 999 Hz samples a busy thread past the kernel's tick, from its perf event, with no bias" do
    shares, stats, cpu_seconds = profile_signal_work(999)
    expect(stats).to include(sampling_mode: :handler, ticks: :perf_events)
    signals = stats[:signals]
    expect(signals[:perf_threads]).to be >= 1
    expect(signals[:perf_ticks]).to be > 0
    # Each perf-event tick is a sample (none drawn out): CPU-clock timers fire at the kernel's
    # tick only, about 250 a CPU-second on Debian's kernels, and beside the events theirs are
    # samples only where the events fell behind. The margin is for a loaded machine
    # (bench/RESULTS.md, "Sampling rate").
    expect(signals[:perf_ticks]).to be > cpu_seconds * 300
    expect(stats[:signal_samples]).to be > cpu_seconds * 300
    expect(shares.fetch("work", 0)).to be > 0.45
    expect(shares.fetch("is_a?", 0)).to be < 0.15
  end

  it "takes perf events unless told :cpu, and says so" do
    expect(described_class.new(hz: 99).ticks).to eq(:auto)
    expect(described_class.new(hz: 999, ticks: :cpu).ticks).to eq(:cpu)
    expect(described_class.ticks_default({ "DDPROF_RECORDER_TICKS" => " CPU " })).to eq(:cpu)
    expect(described_class.ticks_default({ "DDPROF_RECORDER_TICKS" => "wall" })).to eq(:auto)
    expect(described_class.ticks_default({})).to eq(:auto)
    expect { described_class.new(ticks: :wall) }
      .to raise_error(ArgumentError, "ticks must be one of :auto, :cpu, got :wall")
    profiler = described_class.new(hz: 99, ticks: :cpu, compression: :none)
    pprof = profiler.profile { SignalSpecWork.run(0.3) }
    expect(profiler.stats).to include(ticks: :cpu_timers)
    expect(profiler.stats[:signals]).to include(perf_threads: 0, perf_ticks: 0, perf_refused: nil)
    expect(pprof_comments(pprof)).to include(a_string_matching(/CPU timers: ticks: :cpu/))
  end

  it "with signals: false reads stacks at interrupt checks (the bias this mode has)" do
    if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled?
      # YJIT compiles is_a? and respond_to? into `work` itself (no C frame is pushed for them),
      # so this loop shows no bias at interrupt checks: 92% in `work` in a Ruby 3.4.5 run.
      skip "YJIT is on: this loop's C methods get no frame, so there is no bias here to show"
    end
    profiler = described_class.new(hz: 199, compression: :none, signals: false)
    pprof = profiler.profile { SignalSpecWork.run(1.5) }
    shares = self_shares(pprof)
    expect(profiler.stats[:sampling_mode]).to eq(:off)
    expect(profiler.stats[:signal_samples]).to eq(0)
    expect(profiler.stats[:signals]).to be_nil
    expect(shares.fetch("work", 0)).to be < 0.35 # 6% measured: the contrast that shows the test can fail
  end

  it "turns signals off from the environment (DDPROF_RECORDER_SIGNALS=0)" do
    expect(described_class.signals_default({ "DDPROF_RECORDER_SIGNALS" => "0" })).to be(false)
    expect(described_class.signals_default({ "DDPROF_RECORDER_SIGNALS" => "off" })).to be(false)
    expect(described_class.signals_default({})).to be(true)
  end

  it "refuses a signals: that is not true or false" do
    expect { described_class.new(signals: "yes") }.to raise_error(ArgumentError, /signals must be true or false/)
  end

  it "samples each of two busy threads on its own CPU, and stops their timers at stop" do
    stop = false
    busy = Array.new(2) { Thread.new { SignalSpecWork.run(0.01) until stop } }
    sleeper = Thread.new { sleep 0.002 until stop }
    profiler = described_class.new(hz: 99, compression: :none).start
    sleep 1.2
    busy_ids = busy.map { |t| described_class::ThreadSampler.thread_id(t) }
    stop = true
    [*busy, sleeper].each(&:join)
    pprof = profiler.stop.last
    by_thread = samples_from(decode_pprof(pprof)).group_by { |s| s[:labels]["thread id"] }
    busy_ids.each do |id|
      cpu = by_thread.fetch(id).sum { |s| s[:values]["cpu-time"] }
      expect(cpu).to be > 100_000_000 # each had about half of the GVL
    end
    expect(profiler.stats[:signals][:threads_armed]).to eq(0) # disarmed at stop
    expect(profiler.stats[:signal_samples]).to be > 10, profiler.stats.except(:recorder).inspect
  end

  it "lets only one profiler sample in a process, and says so" do
    first = described_class.new(hz: 99, compression: :none).start
    second = described_class.new(hz: 99, compression: :none)
    expect { second.start }.to raise_error(DdprofRecorder::Error, /another DdprofRecorder::Profiler is already sampling/)
    expect(second.running?).to be(false)
    SignalSpecWork.run(0.6)
    expect(first.running?).to be(true)
    expect(described_class._native_sampling_stats[:trigger_running]).to be(true)
    second.stop # never started: changes nothing
    expect(described_class._native_sampling_stats[:trigger_running]).to be(true)
    result = first.stop
    expect(first.stats[:signal_samples]).to be > 3
    expect(result.last).not_to be_empty
    # Free again.
    expect(second.profile { SignalSpecWork.run(0.1) }).not_to be_empty
  end

  # A profiler of its own started in a forked child (a worker's, or after Process.daemon), not
  # restarted by the fork hook: on Ruby 3.1 the thread that forked still says its parent's
  # native id (Ruby bug #19873), and its timer could not be armed (signal_arm_failures 1, no
  # signal sample: every stack read at interrupt checks).
  it "arms the forked thread's timer in a child that starts a profiler of its own" do
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", lib, "-rddprof_recorder", "-rjson", "-r", File.join(__dir__, "signal_work.rb"),
                                      "-e", <<~'RUBY', chdir: root)
      DdprofRecorder::Profiler.new(hz: 99, compression: :none).profile { SignalSpecWork.run(0.1) } # in the parent too
      reader, writer = IO.pipe
      pid = fork do
        profiler = DdprofRecorder::Profiler.new(hz: 99, compression: :none)
        # 0.6 s of this thread's CPU (a loaded machine gives it less of the wall time), at most 20 s.
        cpu = -> { Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) }
        until_cpu = cpu.call + 0.6
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
        profiler.profile do
          SignalSpecWork.run(0.05) until cpu.call > until_cpu || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        end
        writer.write(JSON.generate(profiler.stats.slice(:signal_samples, :sampling_mode).merge(profiler.stats[:signals])))
        writer.close
        exit!(0)
      end
      writer.close
      puts reader.read
      Process.wait(pid)
    RUBY
    expect(status.success?).to be(true), err
    stats = JSON.parse(out.lines.last)
    skip "YJIT is on: the stack is read at the job" if stats["sampling_mode"] == "safepoint"
    expect(stats["signal_arm_failures"]).to eq(0)
    expect(stats["signal_samples"]).to be > 20, stats.inspect
  end

  # With YJIT on, a C method that takes a while (Array#sort of 20,000 Integers, ~1 ms) called
  # from Ruby: read at the next interrupt check, its CPU went to its Ruby caller (the check
  # comes after it returns: bench/accuracy's c_heavy scored 0.11 so on 3.4.5). Read in the
  # handler (3.3 on), it is the C method's. The truth is each call's thread CPU, measured.
  it "with YJIT on, reads the stack in the handler from Ruby 3.3 (a long C method gets its own CPU), at the job on 3.1" do
    Dir.mktmpdir("yjit_signals") do |dir|
      out_path = File.join(dir, "profile.pprof")
      out, err, status = Open3.capture3(RbConfig.ruby, "--yjit", "-I", lib, "-rddprof_recorder", "-rjson",
                                        "-e", <<~'RUBY', out_path, chdir: root)
        NUMBERS = Array.new(20_000) { |i| (i * 7919) % 100_003 }.freeze
        def sort_numbers = NUMBERS.sort
        def ruby_loop
          x = 0
          i = 0
          while i < 60_000
            x += i & 7
            i += 1
          end
          x
        end
        cpu = -> { Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) }
        profiler = DdprofRecorder::Profiler.new(hz: 199, compression: :none)
        sorting = 0.0
        started = nil
        pprof = profiler.profile do
          started = cpu.call
          deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
          until cpu.call - started > 1.5 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
            t = cpu.call
            sort_numbers
            sorting += cpu.call - t
            ruby_loop
          end
        end
        File.binwrite(ARGV[0], pprof)
        stats = profiler.stats
        puts JSON.generate(stats.slice(:sampling_mode, :sampling_mode_reason, :signal_samples).merge(stats[:signals])
                               .merge(yjit: RubyVM::YJIT.enabled?, sort_truth: sorting / (cpu.call - started)))
      RUBY
      skip "no YJIT in this Ruby: #{err.lines.first}" if err.include?("yjit") && !status.success?
      expect(status.success?).to be(true), err
      stats = JSON.parse(out.lines.last)
      expect(stats["yjit"]).to be(true)
      expect(stats["signal_samples"]).to be > 20
      sort_share = self_shares(File.binread(out_path)).fetch("sort", 0)
      summary = "sort: #{(100 * sort_share).round(1)}% of the profile, truth #{(100 * stats['sort_truth']).round(1)}%; #{stats}"
      if DdprofRecorder::Profiler::HANDLER_READS_UNDER_YJIT
        expect(stats["sampling_mode"]).to eq("handler"), summary
        # A tick inside the GC is read at the end of its step (signal_sampler/gc_ticks.rs).
        expect(stats["signals_read_in_handler"] + stats["signals_read_at_gc_exit"] + stats["signals_read_after_gc"])
          .to be >= stats["signal_samples"]
        expect(stats["signals_read_at_job"]).to eq(0)
        # Truth about half; at the next interrupt check it was near 0.
        expect(sort_share).to be_within(0.2).of(stats["sort_truth"]), summary
      else
        expect(stats["sampling_mode"]).to eq("safepoint")
        expect(stats["sampling_mode_reason"]).to eq("YJIT is on (Ruby < 3.3)")
        expect(stats["signals_read_in_handler"]).to eq(0)
      end
    end
  end
end
