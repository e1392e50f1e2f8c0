# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"

require_relative "allocation_shape"

# Allocation samples (Profiler.start(allocations: true)): the NEWOBJ hook of
# ext/ddprof_recorder/src/memory/allocations.rs and Profiler::AllocationRecorder, checked on
# programs whose allocation shape is known, through the public API and google-protobuf.
RSpec.describe "DdprofRecorder::Profiler allocation samples" do
  let(:profiler_class) { DdprofRecorder::Profiler }

  class AllocatedThing; end # rubocop:disable Lint/EmptyClass

  # Per leaf method name (`AllocationShape.ten` is `ten`), the sum of `type` over the samples.
  # With YJIT on, `"a" + "b"` calls the C method String#+, a frame of its own over the method
  # that allocates (the interpreter's opt_plus calls no method): that frame is passed over.
  def by_leaf(samples, type)
    samples.each_with_object(Hash.new(0)) do |s, acc|
      names = s[:frames].map { |frame| frame.first.sub(/\A.*[#.]/, "") }
      names.shift if names.first == "+" && names.size > 1
      acc[names.first] += s[:values].fetch(type, 0)
    end
  end

  def share(hash, key)
    100.0 * hash[key] / hash.values.sum
  end

  def profile(**options, &block)
    samples_from(decode_pprof(profiler_class.profile(compression: :none, **options, &block)))
  end

  # Runs `script` (after `require "ddprof_recorder"` and AllocationShape) in a fresh Ruby and
  # returns what it writes to stdout. The GC.stress examples run there: a full GC at each
  # allocation marks the whole heap, and the spec process's (RSpec, google-protobuf, every
  # example loaded) made each take minutes (164 s and 75 s in a CI run), a fresh Ruby's seconds.
  def in_fresh_ruby(script)
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-rddprof_recorder",
                                      "-r", File.join(__dir__, "allocation_shape.rb"), "-e", script, binmode: true)
    expect(status.success?).to be(true), err
    out
  end

  it "adds alloc-samples and alloc-count only when asked" do
    plain = decode_pprof(profiler_class.profile(compression: :none) { AllocationShape.run(1, 10) })
    types = ->(p) { p.sample_type.map { |t| [p.string_table[t.type], p.string_table[t.unit]] } }
    expect(types.call(plain)).to eq(profiler_class::VALUE_TYPES)
    with = decode_pprof(profiler_class.profile(compression: :none, allocations: true) { AllocationShape.run(1, 10) })
    expect(types.call(with)).to eq(profiler_class::VALUE_TYPES + [%w[alloc-samples count], %w[alloc-count count]])
  end

  it "charges every allocation to its stack at interval 1 (10x more in #ten than in #one)" do
    profiler = profiler_class.new(allocations: true, allocation_interval: 1, compression: :none).start
    AllocationShape.run(20, 500)
    samples = samples_from(decode_pprof(profiler.stop[2]))
    counts = by_leaf(samples, "alloc-samples")
    expect(counts["ten"]).to eq(20 * 5000)
    expect(counts["one"]).to eq(20 * 500)
    expect(by_leaf(samples, "alloc-count")).to include("ten" => 100_000, "one" => 10_000)
    ten_share = share(counts.slice("ten", "one"), "ten")
    expect(ten_share).to be_within(5).of(100.0 * 10 / 11)
  end

  # At interval 1 every allocation the hook sees is a sample: one in Profiler#start after the
  # hook is on, or in #stop before it is off, would be in the profile (record_spec's 999 Hz
  # example found them now and then at the default interval: `caller_locations` in #stop).
  # Except in a first stop: the VM's caches of its first call sites (hidden objects) are made
  # before the native call that says what follows is the profiler's.
  it "samples none of the profiler's own allocations in start and stop, at interval 1" do
    profiler = profiler_class.new(allocations: true, allocation_interval: 1, compression: :none)
    runs = Array.new(2) do
      profiler.start
      AllocationShape.run(2, 50)
      samples_from(decode_pprof(profiler.stop[2])).select { |s| s[:values]["alloc-samples"].positive? }
    end
    runs.each { |samples| expect(samples.sum { |s| s[:values]["alloc-samples"] }).to be >= 2 * 550 }
    own = runs.map do |samples|
      samples.select { |s| s[:frames].any? { |frame| frame[1].include?("lib/ddprof_recorder/") } }
             .map { |s| [s[:labels]["allocation class"], s[:frames].first.first] }
    end
    expect(own.first.reject { |klass, _| klass == "(hidden)" }).to eq([])
    expect(own.last).to eq([])
  end

  it "keeps the shares within 5 points at the default interval, and alloc-count near the true count" do
    truth = (300 * 10_000) + (300 * 1_000)
    # The hook always on: every allocation seen, one in about DEFAULT_ALLOCATION_INTERVAL sampled
    # (about 800). A sample weighs its step, so the share spreads more than a binomial's: 1.8
    # points (sd) over 12 runs with a third of this (87.8 to 93.6), so about 1.0 here, and the
    # 5-point margin is 5 of them.
    profiler = profiler_class.new(allocations: true, allocation_overhead: 1.0, compression: :none).start
    AllocationShape.run(300, 1_000)
    samples = samples_from(decode_pprof(profiler.stop[2]))
    counts = by_leaf(samples, "alloc-count").slice("ten", "one")
    expect(share(counts, "ten")).to be_within(5).of(100.0 * 10 / 11)
    expect(counts.values.sum).to be_within(truth / 10).of(truth)
    taken = by_leaf(samples, "alloc-samples").slice("ten", "one").values.sum
    expected = truth / profiler_class::DEFAULT_ALLOCATION_INTERVAL
    expect(taken).to be_within(expected / 3).of(expected)
  end

  # The duty cycle (allocation_overhead: 0.02; the default was this until the estimate was
  # found to wander, it is now 1.0): the hook on for random slots of time only (ext/ddprof_recorder/src/memory/duty_cycle.rs),
  # each sample weighted by the slots it did not see. This loop gets one slot seen in about 50:
  # sampling 1 in 256 of what is seen (not the default 4096) gives enough samples for a
  # 5-point check in a second (about 2,500; at 4096 the share's spread is about 2.6 points).
  # The true count is not checked here: on a loaded machine the estimate came out 3.6x the
  # truth in a CI run, where this share check passed (issue 21, "the default allocation
  # estimate wanders"); the count is `bench/run allocations`'s to measure until the duty
  # cycle's weights hold under load.
  it "keeps the shares with the hook on part of the time (the duty cycle)" do
    profiler = profiler_class.new(allocations: true, allocation_interval: 256, allocation_overhead: 0.02,
                                  compression: :none).start
    AllocationShape.run(1_500, 1_000)
    pprof = profiler.stop[2]
    stats = profiler.stats[:allocations]
    expect(stats[:seen_every]).to be > 3, stats.inspect
    expect(stats[:hook_on_share]).to be < 0.5, stats.inspect
    expect(stats[:hook_cost_ns]).to be_between(5, 500)
    counts = by_leaf(samples_from(decode_pprof(pprof)), "alloc-count").slice("ten", "one")
    expect(share(counts, "ten")).to be_within(5).of(100.0 * 10 / 11)
    expect(counts.values.sum).to be_positive
  end

  # Two threads allocating at interval 1: each one's job is switched out in its Ruby handler
  # now and then, for a time slice in which the other allocates tens of thousands of samples.
  # The buffer must start over while a job is away: it used to wait for it and drop the rest
  # (128,180 to 186,166 of about 440,000 in 3 runs here; 73,688 of 110,026 in a loaded run of
  # the interval-1 example, where the profiler's own sampler thread was the other one).
  it "drops no sample at interval 1 while two threads allocate, their jobs switched out in turn" do
    profiler = profiler_class.new(allocations: true, allocation_interval: 1, compression: :none).start
    threads = Array.new(2) { Thread.new { AllocationShape.run(20, 1_000) } }
    threads.each(&:join)
    samples = samples_from(decode_pprof(profiler.stop[2]))
    stats = profiler.stats[:allocations]
    expect(stats[:dropped]).to eq(0)
    expect(by_leaf(samples, "alloc-count")).to include("ten" => 2 * 200_000, "one" => 2 * 20_000)
  end

  # String#split makes its parts in C, without an interrupt check: every sample waits for the
  # one job that runs after the call.
  it "keeps every sample of a C method that allocates thousands of objects at once" do
    text = (["part"] * 5_000).join(",")
    profiler = profiler_class.new(allocations: true, allocation_interval: 1, compression: :none).start
    text.split(",")
    pprof = profiler.stop[2]
    samples = samples_from(decode_pprof(pprof))
    parts = samples.select { |s| s[:frames].first&.first == "String#split" && s[:labels]["allocation class"] == "String" }
    expect(parts.sum { |s| s[:values]["alloc-count"] }).to eq(5_000)
    expect(profiler.stats[:allocations][:dropped]).to eq(0)
  end

  it "labels each sample with the allocated object's class" do
    samples = profile(allocations: true, allocation_interval: 1) do
      200.times { AllocatedThing.new }
      100.times { [1, 2] + [3] }
    end
    by_class = samples.each_with_object(Hash.new(0)) do |s, acc|
      acc[s[:labels][profiler_class::ALLOCATION_CLASS_LABEL]] += s[:values]["alloc-samples"]
    end
    expect(by_class["AllocatedThing"]).to eq(200)
    expect(by_class["Array"]).to be >= 300
    thread_labels = samples.select { |s| s[:values]["alloc-samples"].positive? }.map { |s| s[:labels]["thread name"] }
    expect(thread_labels.uniq).to eq(["main"])
  end

  it "records the allocating thread's labels" do
    samples = profile(allocations: true, allocation_interval: 1) do
      t = Thread.new { 300.times { AllocatedThing.new } }
      t.name = "allocator"
      t.join
    end
    things = samples.select { |s| s[:labels][profiler_class::ALLOCATION_CLASS_LABEL] == "AllocatedThing" }
    expect(things.sum { |s| s[:values]["alloc-samples"] }).to eq(300)
    expect(things.map { |s| s[:labels]["thread name"] }.uniq).to eq(["allocator"])
  end

  it "names the stacks right across GC.compact" do
    samples = profile(allocations: true, allocation_interval: 7, allocation_overhead: 1.0) do
      3.times do
        AllocationShape.run(5, 200)
        GC.compact
      end
    end
    counts = by_leaf(samples, "alloc-count").slice("ten", "one")
    expect(share(counts, "ten")).to be_within(5).of(100.0 * 10 / 11)
  end

  it "refuses bad options with an ArgumentError, and starts nothing" do
    [{ allocations: "yes" }, { allocation_interval: 0 }, { allocation_interval: 1.5 },
     { allocation_interval: profiler_class::MAX_ALLOCATION_INTERVAL + 1 }, { heap: 1 }, { gc: nil },
     { allocation_overhead: 0 }, { allocation_overhead: 1.5 }, { allocation_overhead: "0.1" },
     { allocation_overhead: Float::NAN }].each do |bad|
      expect { profiler_class.new(allocations: true, **bad) }.to raise_error(ArgumentError, /#{bad.keys.first}/)
    end
    expect { profiler_class._native_allocations_start(0, Object.new, false, 0.02, -> {}) }.to raise_error(ArgumentError, /interval/)
    expect { profiler_class._native_allocations_start(64, Object.new, false, 0.0, -> {}) }.to raise_error(ArgumentError, /overhead/)
    expect(profiler_class.running?).to be(false)
  end

  # Every allocation a full GC: a frame, class or object the hook read and did not keep
  # alive until its job would be collected (or moved) and the example would crash or fail.
  it "records right under GC.stress" do
    pprof = in_fresh_ruby(<<~RUBY)
      pprof = DdprofRecorder::Profiler.profile(allocations: true, allocation_interval: 1, heap: true, gc: true, hz: 1,
                                               compression: :none) do
        GC.stress = true
        AllocationShape.run(1, 10)
      ensure
        GC.stress = false
      end
      $stdout.binmode.write(pprof)
    RUBY
    samples = samples_from(decode_pprof(pprof))
    expect(by_leaf(samples, "alloc-count").slice("ten", "one")).to eq("ten" => 100, "one" => 10)
    expect(samples.map { |s| s[:frames].last&.first }).to include("(garbage collection)")
  end

  # The duty cycle's switches run in a job (enabling a TracePoint allocates its hook, so under
  # GC.stress each switch runs a GC there); what it records is still right, and what its hook
  # saw is accounted for.
  it "runs the duty cycle under GC.stress" do
    pprof, stats = Marshal.load(in_fresh_ruby(<<~RUBY)) # rubocop:disable Security/MarshalLoad: our child's data
      profiler = DdprofRecorder::Profiler.new(allocations: true, allocation_interval: 4, allocation_overhead: 0.02,
                                              compression: :none).start
      begin
        GC.stress = true
        AllocationShape.run(2, 10)
      ensure
        GC.stress = false
      end
      $stdout.binmode.write(Marshal.dump([profiler.stop[2], profiler.stats[:allocations]]))
    RUBY
    samples = samples_from(decode_pprof(pprof))
    expect(stats[:seen]).to be_positive
    expect(stats[:dropped]).to eq(0)
    # Each sample stands for at most its step (< 2 * 4) times the largest `every` (64).
    sampled = samples.select { |s| s[:values]["alloc-samples"].positive? }
    expect(sampled).to all(satisfy { |s| s[:values]["alloc-count"] <= s[:values]["alloc-samples"] * 7 * 64 })
  end

  it "starts afresh in a forked child, and the parent's running hook does nothing there" do
    parent = profiler_class.new(allocations: true, allocation_interval: 1, heap: true, gc: true,
                                compression: :none).start
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      AllocationShape.run(1, 100) # the parent's hook is still enabled here
      pprof = profiler_class.profile(allocations: true, allocation_interval: 1, heap: true, compression: :none) do
        AllocationShape.run(2, 100)
      end
      writer.write(pprof)
      writer.close
      exit!(0)
    end
    writer.close
    child = reader.read
    Process.wait(pid)
    expect($?.success?).to be(true)
    parent_samples = samples_from(decode_pprof(parent.stop[2]))
    expect(by_leaf(parent_samples, "alloc-samples")["ten"]).to eq(0)
    counts = by_leaf(samples_from(decode_pprof(child)), "alloc-samples")
    expect(counts.slice("ten", "one")).to eq("ten" => 2000, "one" => 200)
    expect(counts.keys - %w[ten one]).to all(satisfy { |leaf| counts[leaf] < 50 })
  end

  # With a duty cycle, its thread runs too: the end proc stops it before the VM is torn down
  # (it registers postponed jobs).
  [{ allocation_interval: 1 }, { allocation_overhead: 0.02 }].each do |options|
    it "exits cleanly with the hooks on (the end proc disables them), #{options.key?(:allocation_overhead) ? "duty cycle" : "interval 1"}" do
      script = <<~RUBY
        require "ddprof_recorder"
        DdprofRecorder::Profiler.start(allocations: true, heap: true, gc: true, **#{options.inspect})
        200_000.times { "x" * 10 }
        puts "done"
      RUBY
      out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script)
      expect([out, err, status.success?]).to eq(["done\n", "", true])
    end
  end

  # The parent's duty-cycle thread does not exist in the child; the child's own starts there.
  it "runs the duty cycle afresh in a forked child" do
    parent = profiler_class.new(allocations: true, allocation_overhead: 0.02, compression: :none).start
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      profiler = profiler_class.new(allocations: true, allocation_overhead: 0.02, compression: :none).start
      AllocationShape.run(300, 1_000)
      profiler.stop
      writer.write(JSON.generate(profiler.stats[:allocations]))
      writer.close
      exit!(0)
    end
    writer.close
    stats = JSON.parse(reader.read, symbolize_names: true)
    Process.wait(pid)
    expect($?.success?).to be(true)
    expect(stats[:seen_every]).to be > 1
    expect(stats[:recorded]).to be_positive
    parent.stop
  end
end
