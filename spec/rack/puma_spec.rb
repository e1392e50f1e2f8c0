# frozen_string_literal: true

require "json"
require "net/http"
require "open3"
require "rbconfig"
require "socket"
require "tmpdir"

# DdprofRecorder::Rack in a real server: Debian's puma (one process, 4 threads) serving
# spec/fixtures/rack_app/config.ru on 127.0.0.1, asked by Net::HTTP. Who gets a profile, who
# gets the page, and the flamegraph rendered once in headless Chromium. About 10 s.
RSpec.describe "DdprofRecorder::Rack under puma" do
  root = File.expand_path("../..", __dir__)
  config_ru = File.join(root, "spec", "fixtures", "rack_app", "config.ru")
  token = "test-token-#{Process.pid}"

  before(:context) do
    unless Programs.available?("puma")
      raise "puma is not on PATH (CI installs Debian's puma)" if ENV["CI"]

      skip "puma is not on PATH (apt-get install puma)"
    end
    other_ruby = Programs.other_ruby("puma")
    skip other_ruby if other_ruby
    @dir = Dir.mktmpdir("ddprof_recorder_rack_puma")
    @log = File.join(@dir, "puma.log")
    @started = File.join(@dir, "hold_started")
    @release = File.join(@dir, "hold_release")
    server = TCPServer.new("127.0.0.1", 0)
    @port = server.addr[1]
    server.close
    env = { "DDPROF_TEST_TOKEN" => token, "DDPROF_TEST_HOLD_STARTED" => @started,
            "DDPROF_TEST_HOLD_RELEASE" => @release, "RUBYOPT" => nil }
    @puma = Process.spawn(env, "puma", "-b", "tcp://127.0.0.1:#{@port}", "-t", "4:4", config_ru,
                          out: @log, err: @log, pgroup: true)
    deadline = now + 20
    sleep 0.1 until answering? || now > deadline
    raise "puma did not answer in 20 s:\n#{File.read(@log)}" unless answering?
  end

  after(:context) do
    if @puma
      Process.kill("TERM", -@puma)
      Process.wait(@puma)
    end
    FileUtils.remove_entry(@dir, true) if @dir
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def answering?
    get("/hello").body == "hello\n"
  rescue SystemCallError, IOError, Net::OpenTimeout
    false
  end

  # GET path on the server; with `token`, as an authorized user.
  def get(path, token: nil)
    Net::HTTP.start("127.0.0.1", @port, open_timeout: 2, read_timeout: 20) do |http|
      request = Net::HTTP::Get.new(path)
      request["X-Profile-Token"] = token if token
      http.request(request)
    end
  end

  def server_log
    File.read(@log)
  end

  # The header names of a response.
  def header_names(response)
    response.to_hash.keys.sort
  end

  describe "requests served normally" do
    it "serves requests without the token, or with a wrong one, the page itself, with no hint" do
      profiled_before = server_log.scan("rack: profiled").size
      plain = get("/checkout")
      expect(plain.code).to eq("200")
      ["/checkout?ddprof=flamegraph", "/checkout?ddprof=pprof", "/checkout?ddprof=speedscope", "/checkout?ddprof=nonsense"].each do |path|
        [nil, "wrong-#{token}"].each do |given|
          response = get(path, token: given)
          expect(response.code).to eq("200"), "#{path} with #{given.inspect}"
          expect(response.body).to start_with("checkout total ")
          expect(response["content-type"]).to eq("text/plain")
          expect(header_names(response)).to eq(header_names(plain))
        end
      end
      expect(server_log.scan("rack: profiled").size).to eq(profiled_before)
    end

    it "answers a second authorized request 503 busy while a first one is being profiled" do
      first = Thread.new { get("/hold?ddprof=pprof", token: token) }
      deadline = now + 10
      sleep 0.01 until File.exist?(@started) || now > deadline
      expect(File.exist?(@started)).to be(true), "the first request did not reach the app:\n#{server_log}"

      begin
        second = get("/hello?ddprof=flamegraph", token: token)
      ensure
        File.write(@release, "")
      end
      expect([second.code, second["x-ddprof-busy"]]).to eq(["503", "another request is being profiled"])
      expect(Integer(second["retry-after"])).to be_between(1, 10)
      held = first.value
      expect([held.code, held["content-type"]]).to eq(["200", "application/octet-stream"])
      frames = samples_from(decode_pprof(held.body)).flat_map { |s| s[:frames].map(&:first) }
      expect(frames).to include("CheckoutPage.compute_checkout_totals")
      expect(server_log).to include("rack: not profiling GET /hello: another request is being profiled")
    ensure
      File.delete(@started) if File.exist?(@started)
      File.delete(@release) if File.exist?(@release)
    end

    it "answers authorized requests 503 busy while the process-wide profiler runs" do
      expect(get("/profiler/start").body).to eq("started\n")
      begin
        response = get("/checkout?ddprof=flamegraph", token: token)
        expect([response.code, response["x-ddprof-busy"]]).to eq(["503", "a profiler is already running in this process"])
      ensure
        expect(get("/profiler/stop").body).to eq("stopped\n")
      end
      expect(server_log).to include("rack: not profiling GET /checkout: a profiler is already running in this process")
      # Once it stopped, requests are profiled again.
      expect(get("/checkout?ddprof=flamegraph", token: token)["content-type"]).to eq("image/svg+xml; charset=utf-8")
    end
  end

  describe "authorized requests" do
    it "get a flamegraph of their own thread, which Chromium renders" do
      response = get("/checkout?ddprof=flamegraph", token: token)
      expect(response.code).to eq("200")
      expect(response["content-type"]).to eq("image/svg+xml; charset=utf-8")
      expect(response["cache-control"]).to eq("no-store")
      svg = response.body
      expect(svg).to include("CheckoutPage.compute_checkout_totals", "GET /checkout: wall-time")
      expect(svg).not_to include("background_churn") # the fixture's other busy thread
      expect(server_log).to match(%r{rack: profiled GET /checkout as flamegraph \(\d+\.\d ms\)})

      viewers_ready!(browser: true)
      file = File.join(@dir, "checkout.svg")
      File.write(file, svg)
      report = Viewers.check("svg", file, File.join(@dir, "checkout.png"))
      expect(report["errors"]).to eq([])
      expect(report["refused"]).to eq([])
      expect(report["texts"].map(&:strip)).to include("CheckoutPage.compute_checkout_totals")
      expect(report["coloured_share"]).to be > 0.02
    end

    it "get the pprof file, which go tool pprof reads" do
      response = get("/checkout?ddprof=pprof", token: token)
      expect(response["content-type"]).to eq("application/octet-stream")
      expect(response["content-disposition"]).to match(/\Aattachment; filename="ddprof-\w+\.pb\.gz"\z/)
      samples = samples_from(decode_pprof(response.body))
      expect(samples.map { |s| s[:labels]["thread id"] }.uniq.size).to eq(1)
      # 200 ms of CPU at 999 Hz: about 200 (fewer on a loaded machine).
      expect(samples.sum { |s| s[:values]["cpu-samples"] }).to be >= 50

      skip "go is not on PATH" unless Programs.available?("go")
      file = File.join(@dir, "checkout.pb.gz")
      File.binwrite(file, response.body)
      out, err, status = Open3.capture3({ "HOME" => @dir, "GOTOOLCHAIN" => "local", "GOPROXY" => "off" },
                                        "go", "tool", "pprof", "-top", "-sample_index=wall-time", "-symbolize=none", file)
      expect(status).to be_success, err
      expect(out).to include("CheckoutPage.compute_checkout_totals")
    end

    it "get a speedscope file that speedscope's schema accepts" do
      response = get("/checkout?ddprof=speedscope", token: token)
      expect(response["content-type"]).to eq("application/json")
      doc = JSON.parse(response.body)
      expect(doc["profiles"].map { |p| p["name"] }).to eq(%w[cpu-time cpu-samples wall-time])
      frames = doc.dig("shared", "frames").map { |f| f["name"] }
      expect(frames).to include("CheckoutPage.compute_checkout_totals")
      expect(frames).not_to include("background_churn")

      viewers_ready!
      file = File.join(@dir, "checkout.speedscope.json")
      File.write(file, response.body)
      expect(Viewers.check("schema", file)["results"].first).to include("valid" => true)
    end
  end
end
