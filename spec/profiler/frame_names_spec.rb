# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

# How the profiler names frames (docs/profiler.md, "Frame names"): qualified names, the same
# for a frame whichever thread and path read it, spelled so that go tool pprof shows them as
# written. Profiles come from `ddprof-recorder record` (or Profiler.profile in a separate
# process) and are decoded with google-protobuf.
RSpec.describe "Profiler frame names" do
  root = File.expand_path("../..", __dir__)
  exe = File.join(root, "exe", "ddprof-recorder")

  # Its block calls Integer#to_s so that nearly all of its 75-100 ms is inside the block: a block
  # of bare additions took 45 ms, half of it in the loop of Integer#times, and once had no sample
  # (3.4.5 with YJIT, in CI). The loop stays on line 3, which the frame contract example names.
  required = <<~RUBY
    # The top level of a required file, busy for 75-100 ms (samples in its block each time).
    t = 0
    1_000_000.times { |i| t += i.to_s.size }
  RUBY
  program = <<~RUBY
    require_relative "shapes_required"
    module Shapes
      class Node
        define_method(:meth) { |n| x = 0; n.times { |i| x += i }; x }
        define_method(:park) { |queue| queue.pop }
        def work(n) = [1].each { n.times { |i| format("%08d", i) } }
        def self.build(n) = n.times { Integer("1" * 40) }
        t = 0
        400_000.times { |i| t += i }
      end
    end
    node = Shapes::Node.new
    queue = Thread::Queue.new
    parked = Thread.new { Thread.current.name = "parked"; node.park(queue) }
    busy = Thread.new { Thread.current.name = "busy"; 30.times { node.meth(40_000); node.work(20_000) } }
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.5
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      node.meth(40_000)
      node.work(20_000)
      Shapes::Node.build(20_000)
    end
    busy.join
    queue << 1
    parked.join
  RUBY

  # What the weaker names (base labels) and Ruby's own `<...>` labels look like: none of them
  # may appear when frames are named natively.
  # A define_method method (a bmethod): the native reader (vm/frames.rs) gives its method
  # entry, where rb_profile_frames gives the block it runs.
  meth = "Shapes::Node#meth"
  park = "Shapes::Node#park"

  weak_names = ["meth", "work", "build", "park", "format", "pop", "times", "<main>", "<class:Node>",
                "<module:Shapes>", "<top (required)>"].freeze

  def names_by_thread(samples)
    samples.each_with_object(Hash.new { |h, k| h[k] = [] }) do |sample, by_thread|
      by_thread[sample[:labels]["thread name"]].concat(sample[:frames].map(&:first))
    end
  end

  def go_pprof_names(file)
    # -nodefraction=0: every node, however small. The class body's loop is a few ms under
    # YJIT, below the default 0.5% of the parked threads' wall time, and -top dropped it.
    out, err, status = Open3.capture3({ "HOME" => @dir }, "go", "tool", "pprof", "-top", "-nodefraction=0",
                                      "-sample_index=wall-time", file)
    raise "go tool pprof failed: #{err}" unless status.success?

    rows = out.lines.drop_while { |l| !l.include?("flat%") }.drop(1)
    # flat flat% sum% cum cum% name: the name is the rest of the line, spaces and all.
    rows.map { |l| l.strip.split(/\s+/, 6).last }
  end

  before(:context) do
    @dir = Dir.mktmpdir("ddprof_recorder_names")
    File.write(File.join(@dir, "shapes_required.rb"), required)
    File.write(File.join(@dir, "shapes.rb"), program)
    @required = File.join(@dir, "shapes_required.rb")
    @out, @err, @status = Open3.capture3(RbConfig.ruby, exe, "record", "-o", "shapes.pb.gz", "--hz", "499",
                                         "--", RbConfig.ruby, "shapes.rb", chdir: @dir)
    @file = File.join(@dir, "shapes.pb.gz")
    @samples = @status.success? ? samples_from(decode_pprof(File.binread(@file))) : []
  end

  after(:context) { FileUtils.remove_entry(@dir, true) }

  it "checks its native frame reader and names frames qualified on this Ruby" do
    expect(@status).to be_success, @err
    expect(DdprofRecorder::Profiler::FrameNames.check).to be(true)
  end

  it "names methods by owner, C methods too, and a define_method method by its name" do
    names = @samples.flat_map { |s| s[:frames].map(&:first) }.uniq
    expect(names).to include(meth, "Shapes::Node#work", "Shapes::Node.build", "Kernel#format",
                             "Kernel#Integer", "Integer#times", "Array#each", park,
                             "Thread::Queue#pop")
    expect(names & weak_names).to eq([])
  end

  it "spells main, class bodies and required files without Ruby's angle brackets" do
    names = @samples.flat_map { |s| s[:frames].map(&:first) }.uniq
    expect(names).to include("main", "block in main", "class Node", "module Shapes",
                             "top level of #{@required}", "block in top level of #{@required}")
    expect(names.grep(/[<>]/)).to eq([])
  end

  it "keeps the recorder's frame contract: the path is the file's, a C method takes its caller's" do
    frames = @samples.flat_map { |s| s[:frames] }.uniq
    program_path = "shapes.rb" # as the program was started
    # Integer#times is a C method on Ruby 3.1; 3.3 writes it in Ruby (numeric.rb), so its
    # frame has a path and line of its own there.
    times = lambda do |path, line|
      RUBY_VERSION < "3.3" ? ["Integer#times", path, line] : ["Integer#times", "<internal:numeric>", kind_of(Integer)]
    end
    expect(frames).to include([meth, program_path, 4], times.call(program_path, 4),
                              ["Kernel#format", program_path, 6], times.call(@required, 3))
  end

  it "names another thread's frames as its own: a parked thread read by passes, a busy one by both" do
    by_thread = names_by_thread(@samples)
    # The parked thread never holds the GVL once parked: only passes read it.
    parked = @samples.select { |s| s[:labels]["thread name"] == "parked" }.map { |s| s[:frames].map(&:first) }
    expect(parked).to include(["Thread::Queue#pop", park, "block in main"])
    # With YJIT on Ruby 3.1, stacks are read at interrupt checks (:safepoint), which a C
    # method such as format has mostly returned from (one of the two busy threads missed it
    # in 2 of 6 runs on 3.3.8 when it was so there too). Both threads' names are still
    # checked to be the same ones.
    at_job = defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? && !DdprofRecorder::Profiler::HANDLER_READS_UNDER_YJIT
    c_method = at_job ? [] : ["Kernel#format"]
    expect(by_thread.fetch("busy")).to include(meth, "Shapes::Node#work", *c_method)
    expect(by_thread.fetch("main")).to include(meth, "Shapes::Node#work", *c_method)
    by_thread.each_value { |names| expect(names & weak_names).to eq([]) }
  end

  it "reads the same in go tool pprof -top: no <unknown>, every name as written" do
    skip "go is not on PATH" unless system("go", "version", out: File::NULL, err: File::NULL)
    names = go_pprof_names(@file)
    ours = @samples.flat_map { |s| s[:frames].map(&:first) }.uniq
    expect(names).not_to include("<unknown>")
    expect(names).to include("main", "class Node", "top level of #{@required}", meth,
                             "Kernel#format")
    expect(names - ours).to eq([])
  end

  it "spells Ruby's labels the same for a Location's base_label" do
    spell = ->(label, path = "lib/x.rb") { DdprofRecorder::Profiler._native_frame_name(label, path) }
    expect(spell.call("<main>")).to eq("main")
    expect(spell.call("<top (required)>")).to eq("top level of lib/x.rb")
    expect(spell.call("block (2 levels) in <top (required)>")).to eq("block (2 levels) in top level of lib/x.rb")
    expect(spell.call("<class:Node>")).to eq("class Node")
    expect(spell.call("<module:Shapes>")).to eq("module Shapes")
    expect(spell.call("rescue in block in <main>")).to eq("rescue in block in main")
    expect(spell.call("<compiled>")).to eq("compiled")
    expect(spell.call("work")).to eq("work")
    expect(spell.call("Integer#<=>")).to eq("Integer#<=>")
    expect(spell.call("<=>")).to eq("<=>") # a C method's base label
    expect(spell.call("block in <=>")).to eq("block in <=>")
  end

  it "names frames the weaker way on both paths when the native reader is not used" do
    skip "Ruby #{RUBY_VERSION}: without the native reader, names come from the public API, qualified" unless RUBY_VERSION < "3.3"
    script = <<~RUBY
      require "ddprof_recorder"
      # Ends the self-check as failed before it runs, as a failed check would.
      DdprofRecorder::Profiler._native_frame_names_checked(false)
      queue = Thread::Queue.new
      parked = Thread.new { Thread.current.name = "parked"; queue.pop }
      pprof = DdprofRecorder::Profiler.profile(hz: 499) do
        Thread.pass until parked.status == "sleep"
        k = Class.new { define_method(:meth) { 200_000.times { |i| format("%08d", i) } } }
        3.times { k.new.meth }
      end
      queue << 1
      parked.join
      print DdprofRecorder::Profiler::FrameNames.qualified?, "\\n", [pprof].pack("m0")
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(root, "lib"), "-e", script)
    expect(status).to be_success, err
    qualified, pprof = out.split("\n", 2)
    expect(qualified).to eq("false")
    samples = samples_from(decode_pprof(pprof.unpack1("m0")))
    names = samples.flat_map { |s| s[:frames].map(&:first) }.uniq
    expect(names).to include("format", "times", "main", "pop")
    expect(names.grep(/[<>#]/)).to eq([])
    parked = samples.select { |s| s[:labels]["thread name"] == "parked" }.map { |s| s[:frames].map(&:first) }
    expect(parked).to include(%w[pop main])
  end
end
