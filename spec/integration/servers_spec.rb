# frozen_string_literal: true

require "tmpdir"

# `ddprof-recorder record` on real forking servers (Debian's puma and unicorn) serving
# spec/fixtures/server_app/config.ru under load from wrk: every worker writes a profile of its
# own, and the CPU-heavy route's method dominates cpu-time once they are merged. Each server runs
# for a few seconds (wrk -d 3s); the whole file takes about 20 s.
RSpec.describe "record on forking servers" do
  include ServerHelpers

  app_dir = File.expand_path("../fixtures/server_app", __dir__)
  let(:load_seconds) { 3 }

  around do |example|
    Dir.mktmpdir("ddprof_recorder_servers") do |dir|
      @dir = dir
      example.run
    end
  end

  # record_server (spec/support/server_helpers.rb) under load from wrk on the CPU-heavy and the
  # sleeping route at once; wrk's reports in @wrk ({"/cpu" => report, "/sleep" => report}).
  def record_loaded_server(name, command, **options)
    record_server(name, command, **options) do
      @wrk = wrk_reports(options.fetch(:port), %w[/cpu /sleep], seconds: load_seconds)
    end
  end

  # The merged profile's cpu-time share of the samples with `method` anywhere in their stack,
  # out of the CPU spent serving (the rest is the servers' own work per request, which the
  # sleeping route makes plenty of: on Puma, 16% in `setsockopt` uncorking each response, the
  # kernel's TCP send on loopback, 40–90% in the CPU-heavy route, 80–90% on Unicorn): samples under `require` (booting the server and loading the
  # app, in the master and in each worker) are left out. Under load from other jobs wrk gets
  # fewer requests done, and the boot (a fixed cost) was half of the CPU once.
  def cpu_share(files, method)
    merged = DdprofRecorder.merge(files.values.map { |f| File.binread(f) })
    samples = samples_from(decode_pprof(merged))
    total = samples.sum { |s| s[:values]["cpu-time"] }
    boot = %w[Kernel#require Kernel#require_relative Kernel#load]
    serving = samples.reject { |s| s[:frames].any? { |frame| boot.include?(frame.first) } }
    serving_total = serving.sum { |s| s[:values]["cpu-time"] }
    with_method = serving.select { |s| s[:frames].any? { |frame| frame.first == method } }
    @top = DdprofRecorder.top(merged, value: "cpu-time", limit: 12)[:rows].map do |r|
      format("%5.1f%% self %5.1f%% total  %s", 100.0 * r[:self] / total, 100.0 * r[:total] / total, r[:name])
    end
    [with_method.sum { |s| s[:values]["cpu-time"] }.fdiv(serving_total), total]
  end

  it "profiles Puma's master and both workers of `puma -w 2` (cluster mode, stopped with TERM)" do
    skip "Debian's puma and wrk are needed" unless Programs.available?("puma") && Programs.available?("wrk")
    skip Programs.other_ruby("puma") if Programs.other_ruby("puma")

    port = free_port
    pidfile = File.join(@dir, "puma.pid")
    output, status, files = record_loaded_server(
      "puma", ["puma", "-w", "2", "-t", "4", "-b", "tcp://127.0.0.1:#{port}", "--pidfile", pidfile,
               File.join(app_dir, "config.ru")],
      port: port, pidfile: pidfile, signal: "TERM",
    )
    expect(requests(@wrk["/cpu"])).to be > 0
    expect(requests(@wrk["/sleep"])).to be > 0
    # Puma's master re-raises SIGTERM once its workers are stopped: record passes it on.
    expect(status).to eq(128 + Signal.list.fetch("TERM")), output
    expect_one_profile_per_process(output, files, workers: 2)
    share, total = cpu_share(files, "ServerApp.crunch_numbers")
    expect(total).to be > 0.5e9 # wrk kept at least one core half busy for 3 s

    expect(@top.first).to end_with(" ServerApp.crunch_numbers"), "top:\n#{@top.join("\n")}"
    expect(share).to be > 0.3, "crunch_numbers #{(100 * share).round(1)}% of cpu-time; top:\n#{@top.join("\n")}"
  end

  it "profiles Unicorn's master and both workers (worker_processes 2, stopped with TERM: workers exit!)" do
    skip "Debian's unicorn and wrk are needed" unless Programs.available?("unicorn") && Programs.available?("wrk")
    skip Programs.other_ruby("unicorn") if Programs.other_ruby("unicorn")

    port = free_port
    pidfile = File.join(@dir, "unicorn.pid")
    output, status, files = record_loaded_server(
      "unicorn", ["unicorn", "-N", "-c", File.join(app_dir, "unicorn.conf.rb"), "-l", "127.0.0.1:#{port}",
                  File.join(app_dir, "config.ru")],
      port: port, pidfile: pidfile, signal: "TERM", env: { "UNICORN_PIDFILE" => pidfile },
    )
    expect(requests(@wrk["/cpu"])).to be > 0
    expect(requests(@wrk["/sleep"])).to be > 0
    expect(status).to eq(0), output
    expect_one_profile_per_process(output, files, workers: 2)
    share, total = cpu_share(files, "ServerApp.crunch_numbers")
    expect(total).to be > 0.5e9

    expect(@top.first).to end_with(" ServerApp.crunch_numbers"), "top:\n#{@top.join("\n")}"
    expect(share).to be > 0.3, "crunch_numbers #{(100 * share).round(1)}% of cpu-time; top:\n#{@top.join("\n")}"
  end
end
