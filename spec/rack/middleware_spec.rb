# frozen_string_literal: true

require "json"
require "logger"
require "rexml/document"
require "stringio"
require "tmpdir"

require_relative "../../lib/ddprof_recorder/rack"

# DdprofRecorder::Rack called directly with Rack env Hashes (the real server:
# spec/rack/puma_spec.rb): who is profiled, who is refused, and what comes back.
RSpec.describe DdprofRecorder::Rack do
  # The app's hot method: busy until its thread used `seconds` of CPU.
  def self.rack_spec_render_page(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
    x
  end

  # What another thread does meanwhile: not the request's work. Says when it runs, from
  # inside (so that its stack has this method from then on).
  def self.rack_spec_other_thread_work(started = nil)
    started&.push(true)
    loop { 10_000.times { |i| i * i } }
  end

  # A long request's work before its cap: busy until the slot is free again (the cap stopped
  # its profile), 60 s at most.
  def self.rack_spec_before_cap
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 60
    x = 0
    x += 1 while DdprofRecorder::Rack.slot.held? && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    x
  end

  # And after it: busy until its thread used `seconds` of CPU.
  def self.rack_spec_after_cap(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
    x = 0
    x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
    x
  end

  # Their frame names: owner and method (docs/profiler.md, "Frame names").
  render_page = "#{self}.rack_spec_render_page"
  other_thread_work = "#{self}.rack_spec_other_thread_work"
  before_cap = "#{self}.rack_spec_before_cap"
  after_cap = "#{self}.rack_spec_after_cap"

  # Runs the block while a thread named rack_spec_busy works.
  # Waits until the thread runs its work: a thread that has not run yet has no stack to sample
  # (under load the request's 50 ms could pass before it first got the GVL).
  def with_busy_thread
    started = Thread::Queue.new
    busy = Thread.new { self.class.rack_spec_other_thread_work(started) }
    busy.name = "rack_spec_busy"
    started.pop
    yield
  ensure
    busy.kill.join
  end

  # A Rack body that says whether it was iterated and closed.
  class SpyBody
    attr_reader :iterated, :closed

    def initialize(chunks)
      @chunks = chunks
    end

    def each(&block)
      @iterated = true
      @chunks.each(&block)
    end

    def close
      @closed = true
    end
  end

  let(:page) { [200, { "content-type" => "text/html", "x-app" => "1" }, ["<p>the page</p>"]] }
  let(:calls) { [] }
  let(:app) do
    lambda do |env|
      calls << env
      self.class.rack_spec_render_page(0.05)
      page
    end
  end
  let(:log) { StringIO.new }
  let(:token) { "s3cret" }
  let(:authorize) { ->(env) { env["HTTP_X_PROFILE_TOKEN"] == token } }
  let(:middleware) { described_class.new(app, authorize: authorize) }

  before { DdprofRecorder.logger = Logger.new(log) }

  after do
    expect(described_class.slot).not_to be_held
    expect(DdprofRecorder::Profiler._native_sampling_stats[:trigger_running]).to be(false)
  end

  def env(query = "", token: nil, path: "/users")
    e = { "REQUEST_METHOD" => "GET", "SCRIPT_NAME" => "", "PATH_INFO" => path, "QUERY_STRING" => query,
          "rack.input" => StringIO.new }
    e["HTTP_X_PROFILE_TOKEN"] = token if token
    e
  end

  describe "configuration" do
    it "has no default authorization: authorize is required and must be callable" do
      expect { described_class.new(app) }.to raise_error(ArgumentError, /missing keyword: :authorize/)
      expect { described_class.new(app, authorize: nil) }.to raise_error(ArgumentError, /authorize must respond to #call/)
      expect { described_class.new(app, authorize: true) }.to raise_error(ArgumentError, /authorize must respond to #call/)
      expect { described_class.new(app, authorize: authorize, hz: 5000) }.to raise_error(ArgumentError, /hz must be/)
      expect { described_class.new(app, authorize: authorize, param: "") }.to raise_error(ArgumentError, /param/)
      [0, -1, Float::INFINITY, "10", nil].each do |bad|
        expect { described_class.new(app, authorize: authorize, max_seconds: bad) }
          .to raise_error(ArgumentError, "max_seconds must be a positive number of seconds, got #{bad.inspect}")
      end
      expect(described_class::DEFAULT_MAX_SECONDS).to eq(10)
    end
  end

  describe "requests that are served normally, with no hint" do
    it "does not call authorize for a request that asks for no profile" do
      authorize = ->(_env) { raise "must not be called" }
      mw = described_class.new(app, authorize: authorize)
      expect(mw.call(env)).to equal(page)
      expect(mw.call(env("page=2&ddprofx=1"))).to equal(page)
      expect(mw.call(env("xddprof=flamegraph&ddprofile=pprof"))).to equal(page) # other parameters
    end

    it "serves unauthorized requests the app's own response, untouched" do
      expect(middleware.call(env("ddprof=flamegraph"))).to equal(page)
      expect(middleware.call(env("ddprof=pprof", token: "wrong"))).to equal(page)
      expect(middleware.call(env("ddprof=bogus"))).to equal(page) # no 400 either: that would be a hint
      expect(calls.size).to eq(3)
      expect(calls.map { |e| e["QUERY_STRING"] }).to eq(%w[ddprof=flamegraph ddprof=pprof ddprof=bogus])
      expect(log.string).to eq("")
    end

    it "authorizes only on true itself: truthy values, nil and exceptions do not" do
      ["yes", 1, :true, nil, false].each do |answer| # rubocop:disable Lint/BooleanSymbol
        mw = described_class.new(app, authorize: ->(_env) { answer })
        expect(mw.call(env("ddprof=flamegraph"))).to equal(page), "authorize returned #{answer.inspect}"
      end
      raising = described_class.new(app, authorize: ->(_env) { raise KeyError, "no session" })
      expect(raising.call(env("ddprof=flamegraph"))).to equal(page)
      expect(log.string).to include("rack: authorize raised KeyError: no session; serving GET /users unprofiled")
      expect(log.string).not_to include("ddprof=") # the query may hold secrets
    end

  end

  describe "an authorized request while profiling is busy: 503, and a header that says why" do
    def expect_busy(response, why, retry_after:)
      status, headers, body = response
      expect(status).to eq(503)
      expect(headers).to include("x-ddprof-busy" => why, "content-type" => "text/plain; charset=utf-8",
                                 "cache-control" => "no-store")
      expect(headers["retry-after"]).to(retry_after ? match(/\A([1-9]|10)\z/) : be_nil) # the cap: 10 s by default
      expect(body.join).to eq("ddprof_recorder: profiling is busy: #{why}" \
                              "#{retry_after ? "; retry in #{headers['retry-after']} s" : ''}\n")
    end

    it "while another request is being profiled, with the seconds until that one's cap" do
      inside = Queue.new
      go_on = Queue.new
      holding = described_class.new(lambda do |_env|
        inside << true
        go_on.pop
        self.class.rack_spec_render_page(0.02) # its own samples: the wait alone can last under a tick
        page
      end, authorize: authorize)
      first = Thread.new { holding.call(env("ddprof=pprof", token: token, path: "/hold")) }
      inside.pop
      begin
        expect_busy(middleware.call(env("ddprof=flamegraph", token: token)), "another request is being profiled",
                    retry_after: true)
        expect(calls).to be_empty # the app is not called for it
      ensure
        go_on << true
      end
      status, _, body = first.value
      expect(status).to eq(200)
      expect(decode_pprof(body.join).sample).not_to be_empty
      expect(log.string).to include("rack: not profiling GET /users: another request is being profiled")
    end

    it "while the process-wide profiler runs" do
      DdprofRecorder::Profiler.start(hz: 19)
      begin
        expect_busy(middleware.call(env("ddprof=flamegraph", token: token)),
                    "a profiler is already running in this process", retry_after: false)
      ensure
        DdprofRecorder::Profiler.stop
      end
      expect(calls).to be_empty
      expect(log.string).to include("rack: not profiling GET /users: a profiler is already running in this process")
      expect(middleware.call(env("ddprof=flamegraph", token: token)).first).to eq(200) # once it stopped
    end

    # The docs said the process-wide profiler would take the trigger over; the start raises.
    it "the other way round: a profiler the app starts during a profiled request raises, and the request's profile goes on" do
      raised = nil
      starting_app = lambda do |_env|
        DdprofRecorder::Profiler.start(hz: 19)
      rescue DdprofRecorder::Error => e
        raised = e.message
        self.class.rack_spec_render_page(0.05)
        page
      end
      status, _, body = described_class.new(starting_app, authorize: authorize).call(env("ddprof=pprof", token: token))
      expect(raised).to eq("another DdprofRecorder::Profiler is already sampling in this process (one profiler per " \
                           "process: stop it first)")
      expect(DdprofRecorder::Profiler.running?).to be(false)
      expect(status).to eq(200)
      expect(decode_pprof(body.join).sample).not_to be_empty
    end

    it "while a profiler of someone's own runs" do
      own = DdprofRecorder::Profiler.new(hz: 19).start
      begin
        expect(DdprofRecorder::Profiler.running?).to be(false) # not the process-wide one
        expect_busy(middleware.call(env("ddprof=speedscope", token: token)),
                    "a profiler is already running in this process", retry_after: false)
      ensure
        own.stop
      end
    end
  end

  describe "an authorized request" do
    it "gets a flamegraph SVG of its own thread instead of the page" do
      status, headers, body = with_busy_thread { middleware.call(env("ddprof=flamegraph", token: token)) }
      svg = body.join
      expect(status).to eq(200)
      expect(headers).to include("content-type" => "image/svg+xml; charset=utf-8", "cache-control" => "no-store",
                                 "content-length" => svg.bytesize.to_s)
      expect(svg).to start_with("<?xml").and include(".rack_spec_render_page", "GET /users: wall-time")
      expect(svg).not_to include("the page")
      expect(svg).not_to include("rack_spec_other_thread_work") # the other thread's
      expect(log.string).to match(%r{rack: profiled GET /users as flamegraph \(\d+\.\d ms\)})
    end

    it "gets the pprof of its thread alone, at about the asked rate" do
      status, headers, body = with_busy_thread { middleware.call(env("ddprof=pprof", token: token)) }
      expect(status).to eq(200)
      expect(headers["content-type"]).to eq("application/octet-stream")
      expect(headers["content-disposition"]).to match(/\Aattachment; filename="ddprof-\d{8}T\d{6}Z\.pb\.gz"\z/)
      samples = samples_from(decode_pprof(body.join))
      thread_ids = samples.map { |s| s[:labels]["thread id"] }.uniq
      expect(thread_ids).to eq([DdprofRecorder::Profiler::ThreadSampler.thread_id(Thread.current)])
      frames = samples.flat_map { |s| s[:frames].map(&:first) }
      expect(frames).to include(render_page)
      # 50 ms at 999 Hz: tens of samples (each thread's rate: docs/profiler.md).
      expect(samples.sum { |s| s[:values]["cpu-samples"] }).to be >= 10
    end

    it "gets every thread with all_threads: true" do
      mw = described_class.new(app, authorize: authorize, all_threads: true)
      _, _, body = with_busy_thread { mw.call(env("ddprof=pprof", token: token)) }
      samples = samples_from(decode_pprof(body.join))
      expect(samples.map { |s| s[:labels]["thread name"] }.uniq).to include("rack_spec_busy", "main")
      expect(samples.flat_map { |s| s[:frames].map(&:first) }).to include(other_thread_work)
    end

    it "gets a speedscope file with every value type" do
      status, headers, body = middleware.call(env("ddprof=speedscope", token: token))
      expect(status).to eq(200)
      expect(headers["content-type"]).to eq("application/json")
      expect(headers["content-disposition"]).to match(/filename="ddprof-\d{8}T\d{6}Z\.speedscope\.json"/)
      doc = JSON.parse(body.join)
      expect(doc["profiles"].map { |p| p["name"] }).to eq(%w[cpu-time cpu-samples wall-time])
      expect(doc["name"]).to match(%r{\AGET /users: all values, \d+\.\d ms \(ddprof_recorder, 999 Hz\)\z})
    end

    it "picks the flamegraph's value with ddprof_value=, and says what is wrong in a request" do
      _, _, body = middleware.call(env("ddprof=flamegraph&ddprof_value=cpu-time", token: token))
      expect(body.join).to include("GET /users: cpu-time")

      status, headers, body = middleware.call(env("ddprof=gif", token: token))
      expect([status, headers["content-type"], body.join])
        .to eq([400, "text/plain; charset=utf-8", "ddprof_recorder: ddprof= takes flamegraph, pprof, speedscope; got \"gif\"\n"])
      status, _, body = middleware.call(env("ddprof=flamegraph&ddprof_value=alloc", token: token))
      expect([status, body.join])
        .to eq([400, "ddprof_recorder: ddprof_value= takes cpu-time, cpu-samples, wall-time; got \"alloc\"\n"])
      expect(calls.size).to eq(1)
    end

    it "iterates and closes the app's body inside the profile" do
      spy = SpyBody.new(["a", "b"])
      mw = described_class.new(->(_env) { [200, {}, spy] }, authorize: authorize)
      status, = mw.call(env("ddprof=pprof", token: token))
      expect(status).to eq(200)
      expect([spy.iterated, spy.closed]).to eq([true, true])
    end

    it "lets the app's exception through, the profiler stopped and the lock released" do
      mw = described_class.new(->(_env) { raise IOError, "database gone" }, authorize: authorize)
      expect { mw.call(env("ddprof=flamegraph", token: token)) }.to raise_error(IOError, "database gone")
      # The after hook checks the lock and the trigger; the next request is profiled again.
      expect(middleware.call(env("ddprof=pprof", token: token)).first).to eq(200)
    end

    it "with a custom param name, answers to it alone" do
      mw = described_class.new(app, authorize: authorize, param: "_prof")
      expect(mw.call(env("ddprof=flamegraph", token: token))).to equal(page)
      expect(mw.call(env("_prof=flamegraph", token: token)).first).to eq(200)
    end

    it "longer than max_seconds: served to its end, its profile covers the cap, a header says so, the slot is free" do
      second = nil
      long = lambda do |_env|
        self.class.rack_spec_before_cap
        # The cap gave the slot back: another request is profiled while this one goes on.
        second = Thread.new { middleware.call(env("ddprof=pprof", token: token, path: "/second")) }.value
        self.class.rack_spec_after_cap(0.05)
        page
      end
      mw = described_class.new(long, authorize: authorize, max_seconds: 0.2)
      status, headers, body = mw.call(env("ddprof=pprof", token: token))
      expect(status).to eq(200)
      capped = headers["x-ddprof-capped"]
      expect(capped).to match(/\Aprofiled the first \d+\.\d\d s of \d+\.\d\d s \(max_seconds: 0\.2\)\z/)
      first, total = capped.scan(/\d+\.\d\d/).map { |n| Float(n) }
      expect(first).to be <= total
      profile = decode_pprof(body.join)
      expect(profile.duration_nanos / 1e9).to be_within(0.006).of(first)
      frames = samples_from(profile).flat_map { |s| s[:frames].map(&:first) }
      expect(frames).to include(before_cap)
      expect(frames).not_to include(after_cap)
      expect(second.first).to eq(200)
      expect(samples_from(decode_pprof(second[2].join)).flat_map { |s| s[:frames].map(&:first) }).to include(render_page)
      expect(log.string).to match(%r{rack: profiled GET /users as pprof \(the first \d+\.\d ms of \d+\.\d ms\)})
    end

    it "longer than max_seconds, as a flamegraph: its title says what it covers" do
      mw = described_class.new(->(_env) { self.class.rack_spec_before_cap && page }, authorize: authorize, max_seconds: 0.2)
      status, headers, body = mw.call(env("ddprof=flamegraph", token: token))
      expect([status, headers.key?("x-ddprof-capped")]).to eq([200, true])
      expect(body.join).to match(%r{GET /users: wall-time, the first \d+\.\d ms of \d+\.\d ms \(ddprof_recorder, 999 Hz, max_seconds: 0\.2\)})
        .and include(before_cap)
    end
  end

  describe "a request too short to get a sample: 200, a valid file of its kind that says so, and a header" do
    # At 1 Hz a request that does nothing almost never gets a sample (a CPU tick is drawn as
    # one with the odds of its share of a period, 4 ms in 1 s here): asked again until one
    # has none.
    def empty_response(kind)
      mw = described_class.new(->(_env) { page }, authorize: authorize, hz: 1)
      50.times do
        response = mw.call(env("ddprof=#{kind}", token: token))
        return response if response[1].key?("x-ddprof-empty")
      end
      raise "50 requests at 1 Hz, and each got a sample"
    end

    let(:note) do
      /\Anothing to draw: the profiler took no sample in the request's \d+\.\d ms \(at 1 Hz, about one every 1000\.0 ms; a request this short can get none\)\z/
    end

    it "a flamegraph: an SVG that shows the title and the note" do
      status, headers, body = empty_response("flamegraph")
      svg = body.join
      expect(status).to eq(200)
      expect(headers).to include("content-type" => "image/svg+xml; charset=utf-8", "content-length" => svg.bytesize.to_s)
      expect(headers["x-ddprof-empty"]).to match(note)
      texts = REXML::XPath.match(REXML::Document.new(svg), "//text").map(&:text)
      expect(texts).to match([%r{\AGET /users: wall-time, \d+\.\d ms \(ddprof_recorder, 1 Hz\)\z}, headers["x-ddprof-empty"]])
      expect(log.string).to match(%r{rack: profiled GET /users as flamegraph \(\d+\.\d ms; nothing to draw\)})
    end

    it "a speedscope file: one empty profile named with the note" do
      status, headers, body = empty_response("speedscope")
      expect(status).to eq(200)
      expect(headers["x-ddprof-empty"]).to match(note)
      expect(headers["content-disposition"]).to eq('attachment; filename="ddprof-empty.speedscope.json"')
      doc = JSON.parse(body.join)
      expect(doc).to include("$schema" => "https://www.speedscope.app/file-format-schema.json", "activeProfileIndex" => 0)
      expect(doc["profiles"]).to eq([{ "type" => "sampled", "name" => headers["x-ddprof-empty"], "unit" => "none",
                                       "startValue" => 0, "endValue" => 0, "samples" => [], "weights" => [] }])
    end

    it "files that speedscope's schema and Chromium read: the speedscope file valid, the SVG drawn with its note" do
      viewers_ready!(browser: true)
      Dir.mktmpdir("ddprof_recorder_rack_empty") do |dir|
        json = File.join(dir, "empty.speedscope.json")
        File.write(json, empty_response("speedscope")[2].join)
        expect(Viewers.check("schema", json)["results"]).to match([include("valid" => true, "errors" => [])])
        svg = File.join(dir, "empty.svg")
        _, headers, body = empty_response("flamegraph")
        File.write(svg, body.join)
        report = Viewers.check("svg", svg, File.join(dir, "empty.png"))
        expect(report).to include("errors" => [], "refused" => [])
        expect(report["texts"]).to include(headers["x-ddprof-empty"])
      end
    end

    it "a pprof: the profile as it is, without a sample" do
      status, headers, body = empty_response("pprof")
      expect([status, headers["content-type"]]).to eq([200, "application/octet-stream"])
      expect(headers["x-ddprof-empty"]).to match(note)
      expect(value_totals(samples_from(decode_pprof(body.join)))["cpu-samples"]).to eq(0)
    end
  end

  describe "the log" do
    # The default logger, made again on a $stderr of the example's (after the `before` above).
    around do |example|
      stderr = $stderr
      $stderr = StringIO.new
      example.run
    ensure
      $stderr = stderr
      DdprofRecorder.logger = nil
    end

    before { DdprofRecorder.logger = nil }

    it "is at INFO for profiled and busy requests, which the default logger (WARN) shows once its level says so" do
      expect(middleware.call(env("ddprof=pprof", token: token)).first).to eq(200)
      raising = described_class.new(app, authorize: ->(_env) { raise KeyError, "no session" })
      expect(raising.call(env("ddprof=flamegraph"))).to equal(page)
      expect($stderr.string.lines).to match([/\AW, .* WARN -- ddprof_recorder: rack: authorize raised KeyError: no session; /])

      DdprofRecorder.logger.level = Logger::INFO
      expect(middleware.call(env("ddprof=pprof", token: token)).first).to eq(200)
      expect($stderr.string).to match(%r{INFO -- ddprof_recorder: rack: profiled GET /users as pprof \(\d+\.\d ms\)})
    end
  end
end
