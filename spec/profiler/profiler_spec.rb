# frozen_string_literal: true

require "logger"
require "rexml/document"
require "stringio"
require "zlib"

require_relative "../../examples/hot_spot"

# DdprofRecorder::Profiler, the per-thread CPU clock behind it, and the pprof views
# (folded stacks, flamegraph, top, summary) on what it records. Profiles are checked with
# google-protobuf (spec_helper's decode_pprof / samples_from), never with the gem's decoder.
RSpec.describe DdprofRecorder::Profiler do
  # The samples of a pprof grouped by thread name: {name => {"cpu-time" => sum, ...}}.
  def totals_by_thread(samples)
    samples.group_by { |s| s[:labels]["thread name"] }.transform_values { |ss| value_totals(ss) }
  end

  # Self cpu-time per leaf function name, decoded independently.
  def leaf_cpu(samples)
    samples.each_with_object(Hash.new(0)) do |s, acc|
      acc[s[:frames].first&.first] += s[:values]["cpu-time"]
    end
  end

  def burn_cpu(ns)
    id = Thread.current.native_thread_id
    start = described_class._native_thread_cpu_time_ns(id)
    x = 0
    x += 1 while described_class._native_thread_cpu_time_ns(id) - start < ns
    x
  end

  describe "._native_thread_cpu_time_ns" do
    it "reads a thread's own CPU clock by its native id" do
      id = Thread.current.native_thread_id
      before = described_class._native_thread_cpu_time_ns(id)
      burn_cpu(20_000_000)
      after = described_class._native_thread_cpu_time_ns(id)
      expect(after - before).to be >= 20_000_000
      expect(after).to be <= Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :nanosecond)
    end

    it "does not count the time a thread sleeps, and reads other threads" do
      sleeper = Thread.new { sleep 0.3 }
      sleep 0.05 until sleeper.native_thread_id && sleeper.status == "sleep"
      before = described_class._native_thread_cpu_time_ns(sleeper.native_thread_id)
      burn_cpu(50_000_000) # in this thread, while the other one sleeps
      after = described_class._native_thread_cpu_time_ns(sleeper.native_thread_id)
      expect(after - before).to be < 5_000_000
      sleeper.join
    end

    it "returns nil for nil, or an id that is not a thread of this process (any more)" do
      pid = Process.spawn(RbConfig.ruby, "-e", "sleep 0.2")
      expect(described_class._native_thread_cpu_time_ns(pid)).to be_nil # another process
      Process.wait(pid)
      expect(described_class._native_thread_cpu_time_ns(pid)).to be_nil # gone
      expect(described_class._native_thread_cpu_time_ns(nil)).to be_nil
      expect(described_class._native_thread_cpu_time_ns(0)).to be_nil
      expect(described_class._native_thread_cpu_time_ns(-1)).to be_nil
      expect(described_class._native_thread_cpu_time_ns(2**40)).to be_nil
      expect(described_class._native_thread_cpu_time_ns(1)).to be_nil # init, another process
      expect { described_class._native_thread_cpu_time_ns("1") }.to raise_error(TypeError)
    end
  end

  it "does not charge a new thread with CPU time used before it existed" do
    # The CPU clock is the native thread's, which may be older than the Ruby thread (Ruby
    # can reuse the native thread of a finished one): a busy thread just before...
    Thread.new { burn_cpu(150_000_000) }.join
    profiler = described_class.new(hz: 200, compression: :none)
    profiler.start
    newcomer = Thread.new { sleep 0.2 }
    newcomer.name = "newcomer"
    newcomer.join
    pprof = profiler.stop.last
    mine = samples_from(decode_pprof(pprof)).select { |s| s[:labels]["thread name"] == "newcomer" }
    expect(value_totals(mine)["wall-time"]).to be > 0.1e9
    expect(value_totals(mine)["cpu-time"]).to be < 20_000_000
  end

  describe "idle threads" do
    def nap_a(seconds) = sleep(seconds)
    def nap_b(seconds) = sleep(seconds)

    it "records a thread that did not run once per stack, with the number of passes and the time it waited" do
      profiler = described_class.new(hz: 200, compression: :none)
      profiler.start
      napper = Thread.new do
        nap_a(0.3)
        nap_b(0.3)
      end
      napper.name = "napper"
      napper.join
      pprof = profiler.stop.last
      mine = samples_from(decode_pprof(pprof)).select { |s| s[:labels]["thread name"] == "napper" }
      wall_by_nap = Hash.new(0)
      mine.each do |s|
        nap = s[:frames].map(&:first).filter_map { |name| name[/#(nap_[ab])\z/, 1] }.first
        wall_by_nap[nap] += s[:values]["wall-time"]
      end
      expect(wall_by_nap["nap_a"]).to be_within(0.1e9).of(0.3e9)
      expect(wall_by_nap["nap_b"]).to be_within(0.1e9).of(0.3e9)
      expect(value_totals(mine)["cpu-samples"]).to be > 10 # one per pass, though recorded at once
      expect(profiler.stats[:samples]).to eq(value_totals(samples_from(decode_pprof(pprof)))["cpu-samples"])
    end

    it "closes each window with the idle time it holds" do
      windows = Queue.new
      sleeper = Thread.new { sleep 0.8 }
      sleeper.name = "sleeper"
      profiler = described_class.new(hz: 200, interval: 0.2, compression: :none) { |*window| windows << window }
      profiler.start
      sleeper.join
      profiler.stop
      got = []
      got << windows.pop until windows.empty?
      expect(got.size).to be >= 3
      got[0..-2].each do |start, finish, pprof|
        mine = samples_from(decode_pprof(pprof)).select { |s| s[:labels]["thread name"] == "sleeper" }
        expect(value_totals(mine)["wall-time"]).to be > 0.5 * (finish - start) * 1e9
      end
    end
  end

  describe "timeline: true" do
    key = DdprofRecorder::StackRecorder::END_TIMESTAMP_LABEL

    def realtime_ns = Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond)

    it "dates each thread sample with when it was taken, within the thread's life" do
      profiler = described_class.new(hz: 99, compression: :none, timeline: true)
      profiler.start
      busy_from = realtime_ns
      busy = Thread.new { burn_cpu(300_000_000) }
      busy.name = "busy"
      busy.join
      busy_to = realtime_ns
      napper = Thread.new { sleep 0.2 }
      napper.name = "napper"
      napper.join
      start, finish, pprof = profiler.stop
      samples = samples_from(decode_pprof(pprof))
      busy_samples = samples.select { |s| s[:labels]["thread name"] == "busy" && s[:values]["cpu-samples"].positive? }
      times = busy_samples.map { |s| s[:labels][key] }
      expect(times).to all(be_a(Integer))
      expect(times.size).to be >= 10 # 0.3 s of CPU at 99 Hz: about 30
      # Within the thread's life (a tick is read before its job runs: 50 ms of slack after),
      # and spread over it, not bunched at one end.
      expect(times.min).to be >= busy_from - 5_000_000
      expect(times.max).to be <= busy_to + 50_000_000
      # (CI, 3.4.5 with YJIT, where on-CPU stacks are read at interrupt checks: 149 ms of 301.)
      expect(times.max - times.min).to be > 0.3 * (busy_to - busy_from)
      # Its wall time from its last sample to its end is not dated (it goes with its last CPU).
      naps = samples.select do |s|
        s[:labels]["thread name"] == "napper" && s[:values]["wall-time"].positive? && s[:values]["cpu-samples"].positive?
      end
      expect(naps).not_to be_empty
      expect(naps.map { |s| s[:labels][key] }).to all(be_between(busy_to - 5_000_000, unix_ns(finish)))
      expect(samples.filter_map { |s| s[:labels][key] }).to all(be_between(unix_ns(start), unix_ns(finish)))
      # Nothing lost or counted twice for being kept apart.
      expect(profiler.stats[:samples]).to eq(value_totals(samples)["cpu-samples"])
    end

    it "is off by default: no sample has a time" do
      profiler = described_class.new(hz: 99, compression: :none)
      profiler.start
      burn_cpu(100_000_000)
      samples = samples_from(decode_pprof(profiler.stop.last))
      expect(samples).not_to be_empty
      expect(samples.map { |s| s[:labels] }).to all(satisfy { |labels| !labels.key?(key) })
    end
  end

  describe "options" do
    it "rejects a bad rate, interval or exporter" do
      expect { described_class.new(hz: 0) }.to raise_error(ArgumentError, /hz/)
      expect { described_class.new(timeline: 1) }.to raise_error(ArgumentError, /timeline must be true or false/)
      expect { described_class.new(hz: 1001) }.to raise_error(ArgumentError, /hz/)
      expect { described_class.new(hz: 9.5) }.to raise_error(ArgumentError, /hz/)
      expect { described_class.new(interval: 1) }.to raise_error(ArgumentError, /exporter/)
      expect { described_class.new(interval: 0, exporter: proc {}) }.to raise_error(ArgumentError, /interval/)
      expect { described_class.new(exporter: Object.new) }.to raise_error(ArgumentError, /export/)
      expect { described_class.new(exporter: proc {}) { nil } }.to raise_error(ArgumentError, /not both/)
      expect { described_class.new(compression: :zstd) }.to raise_error(ArgumentError, /compression/)
    end

    # At 1e-12 s the sampler thread cut windows in a busy loop; and a bad number was shown by
    # Kernel#inspect (`got #<Integer:0x0000000000000001>`).
    it "rejects an interval under MIN_INTERVAL, and names a bad number as Ruby writes it" do
      expect(described_class::MIN_INTERVAL).to eq(0.1)
      expect { described_class.new(interval: 1e-12, exporter: proc {}) }
        .to raise_error(ArgumentError, "interval must be a number of seconds in 0.1..31536000, got 1.0e-12")
      # Finite, but Infinity as nanoseconds: start died with FloatDomainError.
      expect { described_class.new(interval: 1e308, exporter: proc {}) }
        .to raise_error(ArgumentError, "interval must be a number of seconds in 0.1..31536000, got 1.0e+308")
      expect { described_class.new(interval: Float::INFINITY, exporter: proc {}) }.to raise_error(ArgumentError, /got Infinity\z/)
      expect(described_class.new(interval: 0.1, exporter: proc {}).interval).to eq(0.1)
      expect(described_class.new(interval: described_class::MAX_INTERVAL, exporter: proc {}).interval).to eq(31_536_000)
      expect { described_class.new(allocation_interval: 0) }.to raise_error(ArgumentError, /, got 0\z/)
      expect { described_class.new(allocation_overhead: 2.0) }.to raise_error(ArgumentError, /, got 2\.0\z/)
      expect { described_class.new(gc: "yes") }.to raise_error(ArgumentError, "gc must be true or false, got \"yes\"")
      expect { described_class.new(gc: Object.new) }.to raise_error(ArgumentError, /\Agc must be true or false, got #<Object:0x\h+>\z/)
    end

    it "defaults to 99 Hz, gzip, and a 60 s interval when there is an exporter" do
      expect(described_class.new.hz).to eq(99)
      expect(described_class.new.interval).to be_nil
      expect(described_class.new(exporter: proc {}).interval).to eq(60)
      pprof = described_class.profile { sleep 0.05 }
      expect(pprof.b).to start_with("\x1f\x8b".b)
      expect(described_class.profile(compression: :none) { sleep 0.05 }.b).not_to start_with("\x1f\x8b".b)
    end
  end

  describe "profiling examples/hot_spot.rb" do
    # One run for the whole group: it takes a while.
    before(:context) do
      @profiler = described_class.new(hz: 99, compression: :none)
      @profiler.start
      HotSpot.run(1.5)
      @start, @finish, @pprof = @profiler.stop
    end

    let(:samples) { samples_from(decode_pprof(@pprof)) }
    let(:by_thread) { totals_by_thread(samples) }

    it "records the three value types and the thread and process labels on every sample" do
      profile = decode_pprof(@pprof)
      types = profile.sample_type.map { |t| [profile.string_table[t.type], profile.string_table[t.unit]] }
      expect(types).to eq(described_class::VALUE_TYPES)
      expect(samples).not_to be_empty
      samples.each do |s|
        expect(s[:labels].keys).to contain_exactly("thread id", "thread name", "process id")
        expect(s[:labels]["thread id"]).to match(/\A\d+ \(\d+\)\z/)
        expect(s[:labels]["process id"]).to eq(Process.pid) # a number
      end
      # cpu-samples 0: CPU carried to the window's end, recorded on the thread's last on-CPU
      # stack (no wall time), and a thread's wall time from its last sample to the window's
      # end, on the stack it is at then: one such per thread.
      tails = samples.select { |s| s[:values]["cpu-samples"].zero? && s[:values]["wall-time"].positive? }
      expect(tails.group_by { |s| s[:labels]["thread id"] }.values.map(&:size)).to all(eq(1))
      expect(by_thread.keys).to include("cruncher", "sleeper", "main")
    end

    it "leaves its own thread out" do
      expect(by_thread.keys.grep(/ddprof_recorder/)).to be_empty
      frames = samples.flat_map { |s| s[:frames].map(&:first) }
      expect(frames).not_to include("run_sampler", "sample_pass")
    end

    it "makes the hot method the top of the cpu-time ranking" do
      expect(leaf_cpu(samples).max_by { |_, v| v }.first).to eq("HotSpot.crunch")
      top = DdprofRecorder.top(@pprof, value: "cpu-time")
      expect(top[:rows].first).to include(name: "HotSpot.crunch", filename: end_with("examples/hot_spot.rb"))
      # A majority, not a tighter share: on a shared 2-core machine the cruncher's share of the
      # process CPU varies (75-99% seen), and "top of the ranking" is what the example proves.
      expect(top[:rows].first[:self]).to be > 0.5 * top[:total]
      run = top[:rows].find { |r| r[:name] == "HotSpot.run" } # HotSpot.run and its threads' blocks
      # The main thread's own CPU in it (making the two threads, ~0.2 ms) is a sample now and
      # then (a CPU tick there: once in a full run of spec/profiler), never a share.
      expect(run[:self]).to be < 0.05 * top[:total]
      expect(run[:total]).to be >= top[:rows].first[:self]
    end

    it "gives the sleeping thread wall-time but (almost) no cpu-time" do
      sleeper = by_thread.fetch("sleeper")
      cruncher = by_thread.fetch("cruncher")
      expect(sleeper["wall-time"]).to be > 0.8 * 1.5e9
      expect(sleeper["cpu-time"]).to be < 0.02 * sleeper["wall-time"]
      expect(cruncher["cpu-time"]).to be > 20 * [sleeper["cpu-time"], 1].max
      sleeping = samples.select { |s| s[:labels]["thread name"] == "sleeper" }
      # What its native thread used after it ended, when it exits before the profile is cut
      # (Ruby's cleanup of the thread, docs/profiler.md "Thread ends"), is on (thread exit); the
      # CPU of its wake-ups, never sampled on a CPU, on (CPU not sampled), not on Kernel#sleep.
      expect(sleeping.map { |s| s[:frames].first.first }.uniq - ["(thread exit)", "(CPU not sampled)"])
        .to eq(["Kernel#sleep"])
    end

    it "adds up per thread to no more than the profile's duration" do
      duration_ns = unix_ns(@finish) - unix_ns(@start)
      by_thread.each_value do |totals|
        expect(totals["wall-time"]).to be <= duration_ns
        expect(totals["cpu-time"]).to be <= totals["wall-time"] + 20_000_000
      end
      expect(by_thread.fetch("cruncher")["wall-time"]).to be > 0.8 * 1.5e9
    end

    it "reports what it did" do
      stats = @profiler.stats
      expect(stats).to include(errors: 0, recorder: include(samples_lost: 0, samples_rejected: 0))
      expect(stats[:passes]).to be > 3
      expect(stats[:samples]).to eq(value_totals(samples)["cpu-samples"])
      # Ticks are randomized around 99 Hz, and a batch of signal samples half a period after
      # the last pass makes one too: passes follow the samples, 92-115 a second measured with
      # the wall ticks there were (120.3 once, in CI).
      expect(stats[:effective_hz]).to be_between(1, 1.5 * 99)
      expect(stats[:seconds]).to be_within(0.5).of(1.5)
    end

    it "folds the same data natively: root first, one line per stack, values summing to the total" do
      folded = DdprofRecorder.folded(@pprof, value: "cpu-time")
      lines = folded.lines(chomp: true)
      expect(lines).to all(match(/\A\S.* \d+\z/))
      expect(lines.sum { |l| l.split.last.to_i }).to eq(value_totals(samples)["cpu-time"])
      heaviest = lines.max_by { |l| l.split.last.to_i }
      expect(heaviest).to match(/\AHotSpot\.run;HotSpot\.cruncher;HotSpot\.work;HotSpot\.crunch \d+\z/)
      expect(DdprofRecorder.folded(Zlib.gzip(@pprof), value: :"cpu-time")).to eq(folded)

      by_thread = DdprofRecorder.folded(@pprof, value: "wall-time", group_by: "thread name")
      expect(by_thread).to match(/^thread name=sleeper;HotSpot\.run;HotSpot\.nap;Kernel#sleep \d+$/)
      with_files = DdprofRecorder.folded(@pprof, filenames: true)
      expect(with_files).to include("HotSpot.crunch (#{File.expand_path('../../examples/hot_spot.rb', __dir__)})")
    end

    it "draws a flamegraph SVG that parses as XML and names the hot method" do
      svg = DdprofRecorder.flamegraph(@pprof, value: "cpu-time")
      expect(svg.encoding).to eq(Encoding::UTF_8)
      doc = REXML::Document.new(svg)
      expect(doc.root.name).to eq("svg")
      titles = REXML::XPath.match(doc, "//title").map(&:text)
      expect(titles).to include(a_string_starting_with("HotSpot.crunch ("))
      expect(svg).to include("cpu-time flamegraph")

      wall = REXML::Document.new(DdprofRecorder.flamegraph(@pprof, value: "wall-time", title: "Wall", group_by: "thread name"))
      expect(REXML::XPath.match(wall, "//title").map(&:text)).to include(a_string_starting_with("thread name=sleeper"))
    end

    it "summarizes the profile" do
      summary = DdprofRecorder.summary(@pprof)
      expect(summary[:value_types]).to eq(described_class::VALUE_TYPES)
      expect(summary[:totals]).to eq(value_totals(samples))
      expect(summary[:thread_names]).to include("cruncher", "main", "sleeper")
      expect(summary[:thread_ids].size).to eq(summary[:thread_names].size)
      expect(summary[:process_ids]).to eq([Process.pid])
      expect(summary[:duration]).to be_within(0.001).of(@finish - @start)
      expect(summary[:start]).to be_within(0.001).of(@start)
    end
  end

  describe "the views' errors" do
    let(:pprof) { described_class.profile { sleep 0.05 } }

    it "names the value types a profile has when asked for another" do
      expect { DdprofRecorder.folded(pprof, value: "alloc-samples") }
        .to raise_error(ArgumentError, /unknown value type "alloc-samples"; this profile has: cpu-time, cpu-samples, wall-time/)
      expect { DdprofRecorder.top(pprof, value: "nope") }.to raise_error(ArgumentError, /unknown value type/)
    end

    it "rejects what is not a pprof, and what is not a String" do
      expect { DdprofRecorder.folded("") }.to raise_error(ArgumentError, /not a pprof profile: the input is empty/)
      expect { DdprofRecorder.flamegraph("hello world\n" * 10) }.to raise_error(ArgumentError, /not a pprof profile/)
      expect { DdprofRecorder.summary("\x1f\x8b\x08garbage".b) }.to raise_error(ArgumentError, /gzip/)
      expect { DdprofRecorder.folded(nil) }.to raise_error(TypeError, /pprof must be a String/)
      expect { DdprofRecorder.folded(pprof, value: 1) }.to raise_error(TypeError, /value/)
    end

    it "builds its Ruby results safely (GC.stress under GC_STRESS=1)", gc_stress: true do
      recorder = DdprofRecorder::StackRecorder.new
      recorder.record_sample([["leaf", "a.rb", 2], ["root", "a.rb", 1]], [5, 1, 7], [["thread name", "t"], ["thread id", 3]])
      data = recorder.serialize!
      # Plain comparisons: RSpec's matchers are slow under GC.stress.
      folded = DdprofRecorder.folded(data, group_by: "thread name")
      names = DdprofRecorder.top(data)[:rows].map { |r| r[:name] }
      summary = DdprofRecorder.summary(data)
      svg = DdprofRecorder.flamegraph(data)
      expect(folded == "thread name=t;root;leaf 5\n").to be(true)
      expect(names == %w[leaf root]).to be(true)
      expect([summary[:thread_names], summary[:thread_ids], summary[:samples]] == [["t"], [3], 1]).to be(true)
      expect(svg.include?("leaf")).to be(true)
    end

    it "raises DdprofRecorder::Error when there is nothing to draw" do
      empty = DdprofRecorder::StackRecorder.new.serialize!
      expect(DdprofRecorder.folded(empty)).to eq("")
      expect { DdprofRecorder.flamegraph(empty) }.to raise_error(DdprofRecorder::Error, /nothing to draw/)
    end
  end

  describe "lifecycle" do
    after { described_class.stop }

    it "starts and stops the process-wide profiler once" do
      expect(described_class.stop).to be_nil
      profiler = described_class.start(hz: 200)
      expect(described_class).to be_running
      expect(described_class.current).to equal(profiler)
      expect { described_class.start }.to raise_error(DdprofRecorder::Error, /already running/)
      sleep 0.05
      start, finish, pprof = described_class.stop
      expect(start).to be < finish
      expect(DdprofRecorder.summary(pprof)[:thread_names]).to include("main")
      expect(described_class).not_to be_running
      expect(profiler.stop).to be_nil
    end

    it "stops its threads, and a stopped profiler starts again in a new window" do
      profiler = described_class.new(hz: 500)
      profiler.start
      expect { profiler.start }.to raise_error(DdprofRecorder::Error)
      sleep 0.05
      first = profiler.stop
      expect(Thread.list.map(&:name)).not_to include("ddprof_recorder sampler")
      profiler.start
      sleep 0.05
      second = profiler.stop
      expect(second[0]).to be >= first[1]
    end

    it "stops the profiler and re-raises when the profiled block raises" do
      profiler = described_class.new
      expect { profiler.profile { raise "boom" } }.to raise_error(RuntimeError, "boom")
      expect(profiler).not_to be_running
    end
  end

  describe "exporting every interval" do
    it "hands contiguous windows to the block, the last one at stop" do
      windows = Queue.new
      profiler = described_class.new(hz: 200, interval: 0.15) { |start, finish, pprof| windows << [start, finish, pprof] }
      profiler.start
      sleep 0.5
      last = profiler.stop
      got = []
      got << windows.pop until windows.empty?
      expect(got.size).to be_between(3, 5)
      expect(got.last).to eq(last)
      got.each_cons(2) { |a, b| expect(b[0]).to eq(a[1]) }
      expect(got.sum { |_, _, pprof| DdprofRecorder.summary(pprof)[:totals]["wall-time"] }).to be > 0.3e9
    end

    it "calls #export on an exporter object, and survives an exporter that raises" do
      exporter = Class.new do
        attr_reader :calls

        def initialize
          @calls = 0
        end

        def export(_start, _finish, _pprof)
          @calls += 1
          raise IOError, "upload failed"
        end
      end.new
      log = StringIO.new
      DdprofRecorder.logger = Logger.new(log)
      profiler = described_class.new(hz: 200, interval: 0.1, exporter: exporter)
      profiler.start
      sleep 0.35
      expect(profiler).to be_running
      profiler.stop
      expect(exporter.calls).to be >= 3
      expect(log.string).to include("the exporter raised IOError: upload failed")
    end
  end

  describe "an exporter that calls the profiler" do
    it "may stop the process-wide profiler from a window, and the profiler itself from the last one" do
      log = StringIO.new
      DdprofRecorder.logger = Logger.new(log)
      calls = Queue.new
      profiler = described_class.start(hz: 200, interval: 0.1) do |*|
        calls << described_class.stop # from the exporter thread: stops, hands over the last window
        calls << described_class.current # and from within that last delivery: nothing left
      end
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
      # Three calls: the window's stop, then (within it) the last window's two.
      sleep 0.02 while calls.size < 3 && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      expect(profiler).not_to be_running
      expect(profiler.stop).to be_nil # stopped already
      expect(calls.size).to be >= 3
      expect(log.string).not_to include("exporter raised", "ThreadError")

      same = described_class.new(hz: 200) # its own last delivery calls stop on it
      same_exporter = ->(*) { same.stop }
      same.instance_variable_set(:@exporter, same_exporter)
      same.start
      sleep 0.05
      expect(same.stop&.last).to be_a(String)
      expect(log.string).not_to include("exporter raised")
    end

    it "lets another thread start the profiler while a slow exporter takes the last window" do
      delivered = Queue.new
      profiler = described_class.new(hz: 200) do |*|
        sleep 1
        delivered << true
      end
      profiler.start
      stopper = Thread.new { profiler.stop }
      sleep 0.2 # the stopper is in the exporter now
      started_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      profiler.start
      waited = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started_at
      expect(waited).to be < 0.5 # it did not wait for the 1 s export
      expect(profiler).to be_running
      expect(stopper.value&.last).to be_a(String)
      expect(profiler.stop&.last).to be_a(String)
      expect(delivered.size).to eq(2)
    end
  end

  describe "not crashing the host" do
    it "samples threads that come and go without errors" do
      log = StringIO.new
      DdprofRecorder.logger = Logger.new(log)
      profiler = described_class.new(hz: 1000)
      profiler.start
      200.times { Array.new(5) { Thread.new { Thread.pass } }.each(&:join) }
      profiler.stop
      expect(profiler.stats).to include(errors: 0), log.string
      expect(profiler.stats[:passes]).to be > 0
    end

    # Fails the next `failures` passes (or all of them with :always), whether a job or the
    # sampler thread runs them. A prepended module rather than a mock: a job runs where
    # rspec-mocks' Mutex cannot be locked (trap context).
    failing_passes = Module.new do
      class << self
        attr_accessor :failures
      end
    end
    failing_passes.define_method(:pass_locked) do |now_ns, except|
      failures = failing_passes.failures
      if failures == :always || failures.to_i.positive?
        failing_passes.failures -= 1 unless failures == :always
        raise "injected"
      end
      super(now_ns, except)
    end
    failing_passes.send(:private, :pass_locked)
    DdprofRecorder::Profiler::ThreadSampler.prepend(failing_passes)
    let(:failing_passes) { failing_passes }

    after { failing_passes.failures = nil }

    it "never swallows a Thread#raise or Thread#kill aimed at a sampled thread" do
      # The job runs Ruby code on the sampled thread; an exception raised at that thread while
      # it runs would end there (interrupt_mask.rs). 3 of 60 rounds were lost before.
      error = Class.new(StandardError)
      # A thread that missed its raise or kill is stopped by the flag instead: left spinning, it
      # would take the CPU from every later example (5 of them slowed a Ruby 3.3 run to a crawl).
      done = false
      spinners = []
      spin = lambda do |started|
        spinners << Thread.current
        started << true
        x = 0
        x = (x + [x, 3].max) % 1_000_003 until done
      end
      profiler = described_class.new(hz: 999).start
      undelivered = 0
      begin
        40.times do
          started = Queue.new
          raised = Thread.new do
            spin.call(started)
          rescue error
            :rescued
          end
          started.pop # inside the rescue, spinning
          sleep 0.005
          raised.raise(error)
          undelivered += 1 unless raised.join(5)
          killed = Thread.new { spin.call(started) }
          started.pop
          sleep 0.005
          killed.kill
          undelivered += 1 unless killed.join(5)
        ensure
          [raised, killed].compact.each(&:kill)
        end
      ensure
        done = true
        spinners.each { |thread| thread.join(5) }
        profiler.stop
      end
      expect(undelivered).to eq(0)
      expect(profiler.stats[:errors]).to eq(0)
      expect(profiler.stats[:on_cpu_samples]).to be > 100
    end

    it "logs a failing pass and carries on" do
      log = StringIO.new
      DdprofRecorder.logger = Logger.new(log)
      failing_passes.failures = 1
      profiler = described_class.new(hz: 200)
      profiler.start
      sleep 0.1
      profiler.stop
      expect(profiler.stats[:errors]).to eq(1)
      expect(profiler.stats[:passes]).to be > 2
      expect(log.string).to include("profiler: sampling failed: RuntimeError: injected")
    end

    it "stops sampling, without raising anywhere, after #{described_class::MAX_CONSECUTIVE_ERRORS} failed passes in a row" do
      log = StringIO.new
      DdprofRecorder.logger = Logger.new(log)
      failing_passes.failures = :always
      profiler = described_class.new(hz: 500)
      profiler.start
      sleep 0.01 while profiler.running? && profiler.stats[:errors] < described_class::MAX_CONSECUTIVE_ERRORS
      sleep 0.05
      expect(profiler).not_to be_running
      expect(profiler.stats[:errors]).to eq(described_class::MAX_CONSECUTIVE_ERRORS)
      expect(log.string).to include("sampling stops")
    end
  end
end
