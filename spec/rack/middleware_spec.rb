# frozen_string_literal: true

require "json"
require "logger"
require "stringio"

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

  # What another thread does meanwhile: not the request's work.
  def self.rack_spec_other_thread_work
    loop { 10_000.times { |i| i * i } }
  end

  # Their frame names: owner and method (docs/profiler.md, "Frame names").
  render_page = "#{self}.rack_spec_render_page"
  other_thread_work = "#{self}.rack_spec_other_thread_work"

  # Runs the block while a thread named rack_spec_busy works.
  def with_busy_thread
    busy = Thread.new { self.class.rack_spec_other_thread_work }
    busy.name = "rack_spec_busy"
    Thread.pass until busy.status == "run" || busy.status == "runnable" || !busy.alive?
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
    expect(described_class.lock).not_to be_locked
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

    it "serves an authorized request normally while another request is being profiled" do
      described_class.lock.lock
      begin
        expect(middleware.call(env("ddprof=flamegraph", token: token))).to equal(page)
      ensure
        described_class.lock.unlock
      end
      expect(log.string).to include("rack: not profiling GET /users: another request is being profiled")
    end

    it "serves an authorized request normally while the process-wide profiler runs" do
      DdprofRecorder::Profiler.start(hz: 19)
      begin
        expect(middleware.call(env("ddprof=flamegraph", token: token))).to equal(page)
      ensure
        DdprofRecorder::Profiler.stop
      end
      expect(log.string).to include("rack: not profiling GET /users: a profiler is already running in this process")
    end

    it "serves an authorized request normally while a profiler of someone's own runs" do
      own = DdprofRecorder::Profiler.new(hz: 19).start
      begin
        expect(DdprofRecorder::Profiler.running?).to be(false) # not the process-wide one
        expect(middleware.call(env("ddprof=speedscope", token: token))).to equal(page)
      ensure
        own.stop
      end
      expect(log.string).to include("a profiler is already running in this process")
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
  end
end
