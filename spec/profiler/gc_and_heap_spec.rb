# frozen_string_literal: true

require "objspace"

# GC time (Profiler.new(gc: true), ext/ddprof_recorder/src/memory/gc_events.rs) and the live heap
# (heap: true, ext/ddprof_recorder/src/memory/heap.rs), on programs whose truth is known,
# decoded with google-protobuf.
RSpec.describe "DdprofRecorder::Profiler GC time and live heap" do
  let(:profiler_class) { DdprofRecorder::Profiler }

  module MemoryShape
    KEPT = []

    module_function

    # Allocates and drops Strings of 100 bytes (off the object slot, so the GC has work).
    def churn(rounds)
      rounds.times { "x" * 100 }
    end

    def kept
      "k" * 10
    end

    def dropped
      "d" * 10
    end

    # Keeps 1 in 10 of the Strings it makes.
    def keep_a_tenth(count)
      count.times { |i| (i % 10).zero? ? KEPT << kept : dropped }
    end
  end

  after { MemoryShape::KEPT.clear }

  def gc_samples(samples)
    samples.select { |s| s[:frames].last&.first == "(garbage collection)" }
  end

  def cpu_ns
    Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)
  end

  describe "gc: true" do
    it "charges the GC's CPU to (garbage collection), within 5 points of GC.stat(:time)" do
      GC.start
      gc_ms = GC.stat(:time)
      cpu = cpu_ns
      pprof = profiler_class.profile(gc: true, compression: :none) { 10.times { MemoryShape.churn(200_000) } }
      gc_ms = GC.stat(:time) - gc_ms
      cpu = cpu_ns - cpu
      samples = samples_from(decode_pprof(pprof))
      main = samples.select { |s| s[:labels]["thread name"] == "main" }
      total = main.sum { |s| s[:values]["cpu-time"] }
      in_gc = gc_samples(main).sum { |s| s[:values]["cpu-time"] }
      expect(in_gc).to be_positive
      # GC.stat(:time) counts the GCs of the profiler's own threads too: a little more.
      expect(100.0 * in_gc / total).to be_within(5).of(100.0 * gc_ms * 1e6 / cpu)
      # The GC's CPU is taken out of the thread's, not added to it.
      expect(total).to be_within(cpu / 10).of(cpu)
      # Not also as the leaf over the allocating code (signal_sampler/gc_ticks.rs): that would
      # count it twice.
      expect(main.count { |s| s[:frames].first.first == "(garbage collection)" }).to eq(0)
    end

    it "tells marking from sweeping and minor from major" do
      pprof = profiler_class.profile(gc: true, compression: :none) do
        MemoryShape.churn(100_000)
        3.times { GC.start(full_mark: true) }
        3.times { GC.start(full_mark: false) }
      end
      stacks = gc_samples(samples_from(decode_pprof(pprof))).map do |s|
        [s[:frames].map(&:first), s[:labels][profiler_class::GC_KIND_LABEL]]
      end
      expect(stacks.uniq).to include([["(marking)", "(garbage collection)"], "major"],
                                     [["(sweeping)", "(garbage collection)"], "major"],
                                     [["(marking)", "(garbage collection)"], "minor"])
      expect(stacks.map(&:last).uniq - %w[major minor]).to be_empty
    end

    it "leaves the GC in the code that triggered it without the option" do
      pprof = profiler_class.profile(compression: :none) { MemoryShape.churn(100_000) && GC.start }
      expect(gc_samples(samples_from(decode_pprof(pprof)))).to be_empty
    end

    # TracePoint.stat counts the VM's event hooks ([active, deleted]), ours among them. With
    # gc: true the handler drops a tick inside the GC (its time is on the GC's own frames), so
    # the GC_EXIT hook that would read it (signal_sampler/gc_ticks.rs, 3.3+ in handler mode) must
    # not be on:
    # it stayed on, called for nothing at every GC step. And a stopped profiler leaves no hook.
    it "adds no hook whose ticks it drops, and leaves none after stop" do
      active = -> { TracePoint.stat.values.sum(&:first) }
      before = active.call
      runs = [false, true].to_h do |gc|
        profiler = profiler_class.new(gc: gc)
        profiler.start
        during = active.call - before
        profiler.stop
        [gc, { during: during, mode: profiler.sampling_mode, after: active.call - before }]
      end
      ticks_hook = runs[false][:mode] == :handler && profiler_class::GC_TICKS_READ ? 1 : 0
      # gc: true adds the GC events' hook, and the tick-reading one is off.
      expect(runs[true][:during]).to eq(runs[false][:during] + 1 - ticks_hook), runs.inspect
      expect(runs.values.map { |run| run[:after] }).to eq([0, 0])
    end
  end

  # ext/ddprof_recorder/src/sampling/signal_sampler/gc_ticks.rs: a CPU tick inside the GC, read at
  # the GC step's end.
  describe "without gc: true, a tick inside the GC" do
    def churn_profile
      GC.start
      gc_ms = GC.stat(:time)
      cpu = cpu_ns
      profiler = profiler_class.new(hz: 199, compression: :none).start
      deadline = cpu + 1_000_000_000
      MemoryShape.churn(20_000) while cpu_ns < deadline
      pprof = profiler.stop[2]
      main = samples_from(decode_pprof(pprof)).select { |s| s[:labels]["thread name"] == "main" }
      [main, (GC.stat(:time) - gc_ms) * 1e6 / (cpu_ns - cpu), profiler.stats[:signals]]
    end

    def leaf_gc(samples)
      samples.select { |s| s[:frames].first.first == "(garbage collection)" }
    end

    if RUBY_VERSION >= "3.3"
      it "is a sample of the allocating code under a (garbage collection) leaf, about GC.stat(:time)'s share" do
        main, gc_share, signals = churn_profile
        in_gc = leaf_gc(main)
        total = main.sum { |s| s[:values]["cpu-time"] }
        share = in_gc.sum { |s| s[:values]["cpu-time"] }.fdiv(total)
        expect(signals[:signals_read_at_gc_exit]).to be_positive
        # About 200 samples, a third or so in the GC: a wide margin.
        expect(100 * share).to be_within(15).of(100 * gc_share)
        # Under the leaf, the code that allocated: `"x" * 100` (String#*) in MemoryShape.churn.
        callers = in_gc.map { |s| s[:frames][1..2].map(&:first) }.tally
        expect(callers.fetch(["String#*", "MemoryShape.churn"], 0)).to be >= in_gc.size * 0.8, callers.inspect
        expect(in_gc.map { |s| s[:frames].first }.uniq).to eq([["(garbage collection)", "", 0]])
      end

      # The stack is read at the end of the step that compacted (signal_sampler/gc_ticks.rs): in a
      # child, so
      # that a crash is a failure and not the end of the suite.
      it "reads stacks right through GC.compact and GC.auto_compact (999 Hz, 2 s, a child process)" do
        program = <<~RUBY
          require "ddprof_recorder"
          GC.auto_compact = true
          profiler = DdprofRecorder::Profiler.new(hz: 999, compression: :none).start
          started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          kept = []
          i = 0
          while Process.clock_gettime(Process::CLOCK_MONOTONIC) - started < 2
            kept << Array.new(50) { |j| "s\#{j}" }
            kept.shift if kept.size > 200
            GC.compact if ((i += 1) % 300).zero?
          end
          File.binwrite(ARGV[0], profiler.stop[2])
          print profiler.stats[:signals][:signals_read_at_gc_exit]
        RUBY
        Dir.mktmpdir("ddprof_recorder_gc_ticks") do |dir|
          path = File.join(dir, "compact.pb")
          lib = File.expand_path("../../lib", __dir__)
          out, err, status = Open3.capture3("timeout", "60", RbConfig.ruby, "-I", lib, "-e", program, path)
          expect([status.exitstatus, err]).to eq([0, ""])
          expect(Integer(out)).to be_positive
          in_gc = leaf_gc(samples_from(decode_pprof(File.binread(path))))
          expect(in_gc).not_to be_empty
          # Named frames of the program under each leaf: none lost to a moved object.
          expect(in_gc.map { |s| s[:frames].drop(1).any? { |f| f[1] == "-e" } }.uniq).to eq([true])
        end
      end
    else
      # No GC-event hook on 3.1 (it would slow every allocation down there): the job after the
      # GC reads the stack, at the thread's first interrupt check, near the allocating code.
      it "is a sample read right after the GC under a (garbage collection) leaf, about GC.stat(:time)'s share" do
        main, gc_share, signals = churn_profile
        in_gc = leaf_gc(main)
        share = in_gc.sum { |s| s[:values]["cpu-time"] }.fdiv(main.sum { |s| s[:values]["cpu-time"] })
        expect(signals).to include(signals_read_at_gc_exit: 0, signals_in_gc: 0)
        expect(signals[:signals_read_after_gc]).to be_positive
        expect(100 * share).to be_within(15).of(100 * gc_share)
        under = in_gc.count { |s| s[:frames].any? { |name, _, _| name == "MemoryShape.churn" } }
        expect(under).to be >= in_gc.size * 0.8, in_gc.map { |s| s[:frames].first(3) }.tally.inspect
      end
    end
  end

  describe "heap: true" do
    def heap_profile(interval, compact: false, count: 40_000)
      # The hook always on: these check the heap tracker, not the duty cycle (allocations_spec).
      profiler = profiler_class.new(heap: true, allocation_interval: interval, allocation_overhead: 1.0,
                                    compression: :none).start
      MemoryShape.keep_a_tenth(count)
      GC.start
      GC.compact if compact
      pprof = profiler.stop[2]
      [samples_from(decode_pprof(pprof)), profiler.stats[:allocations]]
    end

    # 40,000 objects (heap_profile's default): at interval 1 every one is tracked, and the freed ones may all still be
    # alive when the last is made, with a few objects of the spec's own on top; 50,000 reached
    # MAX_HEAP_TRACKED (heap_skipped 2 in a CI run).
    it "reports the kept tenth as live, and the freed objects' stacks not at all (interval 1)" do
      samples, stats = heap_profile(1)
      # `"k" * 10` is String#*, a C method: its frame is the leaf, its caller's is next. Only
      # these callers' samples are counted: a thread an earlier example left may allocate too.
      kept = samples.select { |s| s[:frames][1]&.first == "MemoryShape.kept" }
      dropped = samples.select { |s| s[:frames][1]&.first == "MemoryShape.dropped" }
      expect((kept + dropped).map { |s| s[:frames].first.first }.uniq).to eq(["String#*"])
      expect(kept.sum { |s| s[:values]["alloc-samples"] }).to eq(4_000)
      expect(dropped.sum { |s| s[:values]["alloc-samples"] }).to eq(36_000)
      expect(kept.sum { |s| s[:values]["heap-live-samples"] }).to eq(4_000)
      # The GC is conservative about the machine stack and registers: the last String or two
      # that `dropped` made can still be referenced from there, so alive (2 seen on Ruby 3.4;
      # a deeper stack, as in the whole suite, may hold a few more).
      still_referenced = dropped.sum { |s| s[:values]["heap-live-samples"] }
      expect(still_referenced).to be <= 8
      expect(stats).to include(heap_skipped: 0)
      expect(stats[:heap_freed]).to be >= 36_000 - still_referenced
      sizes = kept.sum { |s| s[:values]["heap-live-size"] }
      expect(sizes).to eq(4_000 * ObjectSpace.memsize_of(MemoryShape::KEPT.first))
    end

    # About 2,000 samples: the share's standard deviation is 0.7 points.
    it "finds the same tenth when sampling 1 in 256 (within 3 points)" do
      samples, = heap_profile(256, count: 500_000)
      strings = samples.select { |s| %w[MemoryShape.kept MemoryShape.dropped].include?(s[:frames][1]&.first) }
      live = strings.sum { |s| s[:values]["heap-live-samples"] }
      allocated = strings.sum { |s| s[:values]["alloc-samples"] }
      expect(100.0 * live / allocated).to be_within(3).of(10)
    end

    it "follows the objects GC.compact moves" do
      samples, stats = heap_profile(1, compact: true)
      kept = samples.select { |s| s[:frames][1]&.first == "MemoryShape.kept" }
      expect(kept.sum { |s| s[:values]["heap-live-samples"] }).to eq(4_000)
      expect(stats[:heap_live_tracked]).to be < 4_100
    end

    it "tracks at most MAX_HEAP_TRACKED objects, and counts the others" do
      # 30,000 more objects than the cap: samples past the pending buffer are dropped while the
      # job waits, and in a loaded CI run only 39,736 of MAX + 1,000 got tracked.
      profiler = profiler_class.new(heap: true, allocation_interval: 1, compression: :none).start
      keep = Array.new(profiler_class::MAX_HEAP_TRACKED + 30_000) { Object.new }
      stats = profiler.stats[:allocations]
      profiler.stop
      expect(keep.size).to eq(profiler_class::MAX_HEAP_TRACKED + 30_000)
      expect(stats[:heap_live_tracked]).to eq(profiler_class::MAX_HEAP_TRACKED)
      expect(stats[:heap_skipped]).to be >= 1000
    end
  end
end
