# frozen_string_literal: true

# Rack and Sinatra come from Debian, for its Ruby (3.1): on another Ruby the examples that serve
# them skip, and in CI on Debian's Ruby they must run.
begin
  require "rack/mock"
  require "sinatra/base"
rescue LoadError => e
  raise if ENV["CI"] && RUBY_VERSION.start_with?("3.1")

  SINATRA_MISSING = e.message
end

# Application labels (DdprofRecorder.with_labels, push_labels/pop_labels) and the endpoints that
# Endpoints puts on a request's samples; profiles decoded with google-protobuf.
RSpec.describe "Application labels" do
  def burn(n) = n.times { |i| i.to_s }

  def cpu_by(samples, key)
    samples.each_with_object(Hash.new(0)) do |sample, by|
      by[sample[:labels][key]] += sample[:values]["cpu-time"]
    end
  end

  def thread_cpu_ns = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)

  it "puts the labels on the samples taken inside, nested, and takes them off after" do
    truth = Hash.new(0)
    pprof = DdprofRecorder::Profiler.profile(hz: 999) do
      3.times do
        t = thread_cpu_ns
        DdprofRecorder.with_labels("tenant" => "a") { burn(400_000) }
        truth["a"] += thread_cpu_ns - t
        t = thread_cpu_ns
        DdprofRecorder.with_labels("tenant" => "b") do
          DdprofRecorder.with_labels("job" => "x") { burn(200_000) }
        end
        truth["b"] += thread_cpu_ns - t
        t = thread_cpu_ns
        burn(200_000)
        truth[nil] += thread_cpu_ns - t
      end
    end
    samples = samples_from(decode_pprof(pprof))
    ours = cpu_by(samples, "tenant")
    total = ours.values.sum.to_f
    truth_total = truth.values.sum.to_f
    # Wide margins: a few hundred samples.
    truth.each do |tenant, cpu|
      expect(ours[tenant] / total).to be_within(0.15).of(cpu / truth_total), "#{tenant.inspect}: #{ours} vs #{truth}"
    end
    # The inner set has the outer's key too; no sample has "job" without "tenant" b.
    jobs = samples.select { |s| s[:labels]["job"] }
    expect(jobs).not_to be_empty
    expect(jobs.map { |s| s[:labels]["tenant"] }.uniq).to eq(["b"])
    expect(DdprofRecorder.current_labels).to eq({})
  end

  it "labels a blocked thread's wall time too" do
    pprof = DdprofRecorder::Profiler.profile(hz: 99) do
      Thread.new { DdprofRecorder.with_labels("phase" => "waiting") { sleep 0.4 } }.join
    end
    samples = samples_from(decode_pprof(pprof))
    wall = samples.select { |s| s[:labels]["phase"] == "waiting" }.sum { |s| s[:values]["wall-time"] }
    expect(wall).to be > 200_000_000
  end

  it "restores the labels when the block raises" do
    expect do
      DdprofRecorder.with_labels("a" => "1") { DdprofRecorder.with_labels("b" => "2") { raise "boom" } }
    end.to raise_error(RuntimeError, "boom")
    expect(DdprofRecorder.current_labels).to eq({})
    DdprofRecorder.with_labels("a" => "1") do
      depth = DdprofRecorder.push_labels("a" => "2", "c" => "3")
      expect(DdprofRecorder.current_labels).to eq("a" => "2", "c" => "3")
      DdprofRecorder.pop_labels(depth)
      expect(DdprofRecorder.current_labels).to eq("a" => "1")
    end
  end

  it "refuses bad labels with ArgumentError, and they reach no sample" do
    bad = [{ 1 => "x" }, { "k" => :sym }, { "" => "x" }, { "k" => "v" * 1025 }, { ("k" * 1025) => "v" },
           { "thread id" => "1" }, { "trace endpoint" => "x" }, { "local root span id" => "1" }, "k=v",
           (1..17).to_h { |i| ["k#{i}", "v"] }]
    pprof = DdprofRecorder::Profiler.profile(hz: 999) do
      bad.each do |labels|
        expect { DdprofRecorder.with_labels(labels) { burn(1) } }.to raise_error(ArgumentError)
        expect(DdprofRecorder.current_labels).to eq({})
      end
      burn(200_000)
    end
    expect { DdprofRecorder.pop_labels(7) }.to raise_error(ArgumentError)
    keys = samples_from(decode_pprof(pprof)).flat_map { |s| s[:labels].keys }.uniq
    expect(keys - ["thread id", "thread name", "process id"]).to eq([])
  end

  it "gives a Sinatra app's requests their route as the endpoint, with nothing configured" do
    skip "sinatra and rack are Debian's, for its Ruby: #{SINATRA_MISSING}" if defined?(SINATRA_MISSING)
    expect(DdprofRecorder::Integrations.sinatra?).to be(true)
    app = Class.new(Sinatra::Base) do
      get("/items/:id") { 20_000.times { |i| i.to_s }; "item" }
      get("/heavy") { 100_000.times { |i| i.to_s }; "heavy" }
    end
    pprof = DdprofRecorder::Profiler.profile(hz: 999) do
      request = Rack::MockRequest.new(app)
      60.times do |i|
        request.get("/items/#{i}")
        request.get("/heavy") if i.even?
        request.post("/nowhere")
      end
    end
    by = cpu_by(samples_from(decode_pprof(pprof)), "trace endpoint")
    expect(by.keys).to include("GET /heavy", "GET /items/:id")
    expect(by.keys.grep(%r{/items/\d})).to be_empty # never the path
    expect(by["GET /heavy"]).to be > by["GET /items/:id"]
    expect(by[nil]).to be < 0.2 * by.values.sum
  end

  it "puts Sinatra's own middleware (Rack::Protection and the others) inside the request's endpoint" do
    skip "sinatra and rack are Debian's, for its Ruby: #{SINATRA_MISSING}" if defined?(SINATRA_MISSING)
    # A route of about 0.3 ms, of which Sinatra's routing and middleware are a tenth or so. (Not
    # less: a thread's label slot remembers its last 64 changes, two a request, to give a sample
    # the labels on at its tick, and at 999 Hz a batch of samples waits up to 4 ms for its job.)
    app = Class.new(Sinatra::Base) { get("/ping") { 5_000.times { |i| i.to_s }; "pong" } }
    pprof = DdprofRecorder::Profiler.profile(hz: 999) do
      request = Rack::MockRequest.new(app)
      1_500.times { request.get("/ping") }
    end
    protection = samples_from(decode_pprof(pprof)).select do |s|
      s[:frames].any? { |_, file, _| file.include?("rack/protection/") }
    end
    by = cpu_by(protection, "trace endpoint")
    # Sinatra's middleware after ours, as Sinatra::Base.use puts it, had none of it labelled.
    expect(by.values.sum).to be > 0
    expect(by.fetch("GET /ping", 0)).to be > 0.9 * by.values.sum, by.inspect
  end

  it "gives a request its endpoint when the thread already has as many labels as an app may set" do
    skip "rack is Debian's, for its Ruby: #{SINATRA_MISSING}" if defined?(SINATRA_MISSING)
    app = DdprofRecorder::Endpoints.new(->(_env) { 200_000.times { |i| i.to_s }; [200, {}, ["ok"]] })
    full = (1..DdprofRecorder::Labels::MAX_LABELS).to_h { |i| ["k#{i}", "v"] }
    pprof = DdprofRecorder::Profiler.profile(hz: 999) do
      DdprofRecorder.with_labels(full) { 3.times { Rack::MockRequest.new(app).get("/") } }
    end
    expect(cpu_by(samples_from(decode_pprof(pprof)), "trace endpoint").keys).to include("GET")
  end

  it "names a plain Rack app's endpoint by what it put in the env, else by the request method" do
    skip "rack is Debian's, for its Ruby: #{SINATRA_MISSING}" if defined?(SINATRA_MISSING)
    app = DdprofRecorder::Endpoints.new(lambda do |env|
      env["ddprof_recorder.endpoint"] = "report" if env["PATH_INFO"] == "/report"
      200_000.times { |i| i.to_s }
      [200, {}, ["ok"]]
    end)
    pprof = DdprofRecorder::Profiler.profile(hz: 999) do
      request = Rack::MockRequest.new(app)
      3.times { request.get("/report"); request.get("/other/1") }
    end
    by = cpu_by(samples_from(decode_pprof(pprof)), "trace endpoint")
    expect(by.keys.compact.sort).to eq(%w[GET report])
  end
  # The slot keeps its sets natively (ext/ddprof_recorder/src/labels.rs): under GC.stress
  # (rake spec:gc_stress) every allocation in push_hash starts a GC, and GC.compact moves what
  # it may; the sets must come back whole.
  it "keeps its sets whole across GCs and compactions", gc_stress: true do
    slot = DdprofRecorder::Labels.slot
    base = slot.depth
    depths = Array.new(20) { |i| DdprofRecorder.push_labels("k#{i % 5}" => +"v#{i}", "n#{i % 11}" => "x" * i) }
    GC.compact if GC.respond_to?(:compact)
    expect(DdprofRecorder.current_labels).to include("k4" => "v19", "k0" => "v15", "n8" => "x" * 19, "n10" => "x" * 10)
    expect(DdprofRecorder.current_labels.size).to eq(DdprofRecorder::Labels::MAX_LABELS)
    expect(slot.at(Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond))).to equal(slot.pairs)
    DdprofRecorder.pop_labels(depths[10])
    GC.start
    expect(DdprofRecorder.current_labels).to eq((5..9).to_h { |i| ["k#{i % 5}", "v#{i}"] }.merge((0..9).to_h { |i| ["n#{i}", "x" * i] }))
    DdprofRecorder.pop_labels(depths[0])
    expect(slot.depth).to eq(base)
    expect(DdprofRecorder.current_labels).to eq({})
  end

  # The server writes the body and closes it after `call` returned: Rails does its request's
  # completion there, a streaming body its work. That CPU is the request's too.
  it "keeps a request's endpoint on while the server iterates and closes its body, and not after" do
    skip "rack is Debian's, for its Ruby: #{SINATRA_MISSING}" if defined?(SINATRA_MISSING)
    streaming = Class.new do
      define_method(:each) { |&block| 3.times { 100_000.times { |i| i.to_s }; block.call("part") } }
      define_method(:close) { 100_000.times { |i| i.to_s } }
    end
    app = DdprofRecorder::Endpoints.new(lambda do |env|
      env["ddprof_recorder.endpoint"] = "stream"
      [200, {}, streaming.new]
    end)
    after = nil
    pprof = DdprofRecorder::Profiler.profile(hz: 999) do
      request = Rack::MockRequest.new(app)
      4.times { request.get("/") }
      after = DdprofRecorder.current_labels
      burn(400_000) # no request's
    end
    by = cpu_by(samples_from(decode_pprof(pprof)), "trace endpoint")
    expect(after).to eq({})
    # 1.6M iterations inside the requests' bodies, 0.4M outside them.
    expect(by["stream"]).to be > 0.6 * by.values.sum
    expect(by[nil]).to be > 0.1 * by.values.sum
  end

  it "ends the span of a request whose body was never closed at the thread's next request" do
    skip "rack is Debian's, for its Ruby: #{SINATRA_MISSING}" if defined?(SINATRA_MISSING)
    app = DdprofRecorder::Endpoints.new(->(_env) { [200, {}, ["ok"]] })
    env = -> { Rack::MockRequest.env_for("/") }
    slot = DdprofRecorder::Labels.slot
    base = slot.depth
    depths = []
    DdprofRecorder::Profiler.profile(hz: 99) do
      3.times do
        app.call(env.call) # the body left open
        depths << slot.depth
      end
      _, _, body = app.call(env.call)
      body.close
      depths << slot.depth
      body.close # a second close changes nothing
      depths << slot.depth
    end
    expect(depths).to eq([base + 1, base + 1, base + 1, base, base])
  end
end
