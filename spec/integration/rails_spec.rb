# frozen_string_literal: true

require "json"
require "open3"
require "tmpdir"

# `ddprof-recorder record` on a real Rails app: spec/fixtures/rails_app (Debian's Rails 6.1 on
# sqlite, production settings) served by Puma in cluster mode (2 workers of 4 threads, the app
# preloaded in the master) under load from wrk over its five endpoints for a few seconds. Every
# worker writes a profile in which the app's controller actions and templates are seen, and
# which go tool pprof reads; the app's RAILS_APP_TRUTH hook writes each worker's CPU by action.
# One recording for the whole file, about 10 s.
RSpec.describe "record on a Rails app served by Puma (cluster mode)" do
  include ServerHelpers

  app_dir = File.expand_path("../fixtures/rails_app", __dir__)
  # Each endpoint and the controller action that serves it.
  endpoints = {
    "/" => "PagesController#index", "/heavy" => "PagesController#heavy", "/items" => "ItemsController#index",
    "/items/7" => "ItemsController#show", "/api/stats" => "ApiController#stats"
  }.freeze
  load_seconds = 4

  # Debian's Rails, sqlite3 and puma are for Debian's Ruby (3.1): skipped on another Ruby; on
  # Debian's, a missing one fails in CI, which installs them (script/setup).
  def skip_unless_served
    other_ruby = Programs.other_ruby("puma")
    skip "Debian's Rails 6.1 is for Debian's Ruby 3.1 only; #{other_ruby}" if other_ruby

    rails = system(RbConfig.ruby, "-e", 'require "rails"; require "sqlite3"; exit(Rails::VERSION::MAJOR == 6)',
                   out: File::NULL, err: File::NULL)
    missing = { "Debian's ruby-rails 6.1 and ruby-sqlite3" => rails, "puma" => Programs.available?("puma"),
                "wrk" => Programs.available?("wrk") }.reject { |_, there| there }.keys
    return if missing.empty?
    raise "missing: #{missing.join(', ')} (CI must run this; script/setup installs them)" if ENV["CI"]

    skip "missing: #{missing.join(', ')} (script/setup installs them)"
  end

  def rails_log
    file = File.join(@dir, "rails_tmp", "production.log")
    File.exist?(file) ? "production.log:\n#{File.read(file)}" : "no production.log"
  end

  # The decoded samples of a file.
  def samples_of(file)
    samples_from(decode_pprof(File.binread(file)))
  end

  # cpu-time of the samples with the method `name` in their stack.
  def cpu_under(samples, name)
    value_totals(samples.select { |s| s[:frames].any? { |frame| frame.first == name } })["cpu-time"]
  end

  # The app's files in the stacks of the samples that have cpu-time, relative to the app: a
  # template's compiled method has the template as its file.
  define_method(:templates_of) do |samples|
    samples.reject { |s| s[:values]["cpu-time"].zero? }.flat_map { |s| s[:frames].map { |frame| frame[1] } }.uniq
           .filter_map { |path| path.delete_prefix("#{app_dir}/") if path.start_with?("#{app_dir}/app/views/") }
  end

  before(:context) do
    skip_unless_served
    @dir = Dir.mktmpdir("ddprof_recorder_rails")
    port = free_port
    pidfile = File.join(@dir, "puma.pid")
    env = { "RAILS_APP_TMP" => File.join(@dir, "rails_tmp"), "RAILS_APP_TRUTH" => File.join(@dir, "truth.json") }
    script = File.join(@dir, "endpoints.lua")
    File.write(script, <<~LUA)
      -- Each wrk thread sends the endpoints in turn.
      local paths = { #{endpoints.keys.map(&:dump).join(', ')} }
      local i = 0
      request = function()
        i = i % #paths + 1
        return wrk.format("GET", paths[i])
      end
    LUA
    command = ["puma", "-C", File.join(app_dir, "config", "puma.rb"), "-w", "2", "-t", "4:4",
               "-b", "tcp://127.0.0.1:#{port}", "--pidfile", pidfile, File.join(app_dir, "config.ru")]
    @output, @status, @files = record_server("rails", command, port: port, pidfile: pidfile, signal: "TERM",
                                                                 env: env, ready: "/", boot_timeout: 60) do
      @answers = endpoints.keys.to_h { |path| [path, get(port, path)] }
      # 8 connections for the 8 threads of the 2 workers.
      @wrk = wrk_reports(port, ["/"], seconds: load_seconds, threads: 2, connections: 8,
                                      wrk_args: ["-s", script]).fetch("/")
    end
    @workers = @files.reject { |pid, _| pid.nil? }
  end

  after(:context) { FileUtils.remove_entry(@dir, true) if @dir }

  it "serves every endpoint with 200 before the load, and only 2xx under it" do
    endpoints.each_key do |path|
      expect(@answers[path]&.code).to eq("200"), "GET #{path}: #{@answers[path]&.code.inspect}\n#{rails_log}"
    end
    expect(@answers["/items"].body.scan("<tr id=\"item_").size).to eq(120) # the collection render, all seeded rows
    expect(@answers["/items/7"].body).to include("<h1>Item 007</h1>", "<nav>")
    expect(JSON.parse(@answers["/api/stats"].body)).to include("items" => 120)
    expect(requests(@wrk)).to be > 0, @wrk
    expect(@wrk).not_to match(/Non-2xx|Socket errors/), "#{@wrk}\n#{rails_log}"
    # Puma's master re-raises SIGTERM once its workers are stopped: record passes it on.
    expect(@status).to eq(128 + Signal.list.fetch("TERM")), @output
  end

  it "writes the master's profile and one per worker, each of its own process" do
    expect_one_profile_per_process(@output, @files, workers: 2)
  end

  # Each worker spends seconds in PagesController#heavy's loop and in the items' partial (the
  # collection render of /items), and tenths of a second in ApiController#stats and the layout:
  # dozens of samples each at least, on a loaded machine too. The other actions' own frames
  # hold a few milliseconds a request (their views render after they return): not asked for.
  it "shows the app's controller actions and templates in the workers' stacks" do
    expect(@workers.size).to eq(2), @output
    @workers.each_value do |file|
      samples = samples_of(file)
      expect(cpu_under(samples, "PagesController#heavy")).to be > 0, "no PagesController#heavy in #{File.basename(file)}"
      templates = templates_of(samples)
      expect(templates).to include("app/views/items/_item.html.erb"), "#{File.basename(file)}: #{templates}"
    end
    merged = samples_from(decode_pprof(DdprofRecorder.merge(@workers.values.map { |f| File.binread(f) })))
    expect(cpu_under(merged, "ApiController#stats")).to be > 0
    templates = templates_of(merged)
    expect(templates).to include("app/views/items/index.html.erb", "app/views/layouts/application.html.erb"), templates.to_s
    # The master served nothing: it booted the app and forked.
    expect(cpu_under(samples_of(@files[nil]), "PagesController#heavy")).to eq(0)
  end

  it "writes the truth hook's CPU by action in each worker, for every endpoint" do
    workers = @output.scan(/Worker \d+ \(PID: (\d+)\) booted/).flatten.map(&:to_i)
    expect(workers.size).to eq(2), @output
    truths = Dir[File.join(@dir, "truth.json.*")].to_h { |f| [Integer(f[/\d+\z/]), JSON.parse(File.read(f))] }
    expect(truths.keys).to match_array(workers), "truth files: #{truths.keys}, Puma's workers: #{workers}"
    served = truths.values.flat_map(&:to_a).group_by(&:first).transform_values do |totals|
      totals.sum { |_, total| total["requests"] }
    end
    expect(served.keys).to match_array(endpoints.values)
    # wrk's, the checks before it, and the waits for the boot; wrk does not count the requests
    # it left unanswered when its time was up.
    expect(served.values.sum).to be >= requests(@wrk) + endpoints.size
    truths.each_value do |totals|
      expect(totals.values).to all(include("cpu_ns" => be > 0))
    end
  end

  # Endpoints, with nothing configured (the Railtie): each request's samples carry its
  # Controller#action, the shares near those the app's own hook measured per request (wide
  # margins here; bench/rails_endpoints.rb measures them closely).
  it "labels each request's samples with its Controller#action, as the app measured its CPU" do
    truth = Hash.new(0)
    Dir[File.join(@dir, "truth.json.*")].each do |f|
      JSON.parse(File.read(f)).each { |action, total| truth[action] += total["cpu_ns"] }
    end
    merged = samples_from(decode_pprof(DdprofRecorder.merge(@workers.values.map { |f| File.binread(f) })))
    ours = merged.each_with_object(Hash.new(0)) do |sample, by|
      by[sample[:labels]["trace endpoint"]] += sample[:values]["cpu-time"]
    end
    labelled = ours.reject { |endpoint, _| endpoint.nil? }
    expect(labelled.keys).to match_array(endpoints.values), ours.to_s
    truth_total = truth.values.sum.to_f
    ours_total = labelled.values.sum.to_f
    message = "ours #{labelled.transform_values { |v| (100 * v / ours_total).round(1) }}, " \
              "truth #{truth.transform_values { |v| (100 * v / truth_total).round(1) }}"
    truth.each do |action, cpu|
      expect(labelled[action] / ours_total).to be_within(0.1).of(cpu / truth_total), message
    end
    expect(ours_total / truth_total).to be > 0.7, "labelled #{ours_total / 1e9} s of #{truth_total / 1e9} s; #{message}"
  end

  it "writes profiles that go tool pprof -top reads" do
    skip "go is not on PATH (apt-get install golang-go)" unless Programs.available?("go")
    expect(@files.size).to eq(3), @output

    @files.each do |pid, file|
      out, err, status = Open3.capture3({ "HOME" => @dir, "GOTOOLCHAIN" => "local", "GOPROXY" => "off" }, "go",
                                        "tool", "pprof", "-top", "-sample_index=cpu-time", "-symbolize=none", file)
      expect(status).to be_success, "go tool pprof -top #{File.basename(file)}: #{err}"
      expect(out).to include("PagesController#heavy") if pid
    end
  end
end
