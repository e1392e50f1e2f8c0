# frozen_string_literal: true

require "net/http"
require "rbconfig"
require "socket"
require "tmpdir"

# `ddprof-recorder record` on real forking servers (Debian's puma and unicorn) serving
# spec/fixtures/server_app/config.ru under load from wrk: every worker writes a profile of its
# own, and the CPU-heavy route's method dominates cpu-time once they are merged. Each server runs
# for a few seconds (wrk -d 3s); the whole file takes about 20 s.
RSpec.describe "record on forking servers" do
  root = File.expand_path("../..", __dir__)
  app_dir = File.join(root, "spec", "fixtures", "server_app")
  let(:exe) { File.join(root, "exe", "ddprof-recorder") }
  let(:load_seconds) { 3 }
  # How long a server may take to boot, and to stop and write its profiles.
  let(:boot_timeout) { 20 }
  let(:stop_timeout) { 20 }

  around do |example|
    Dir.mktmpdir("ddprof_recorder_servers") do |dir|
      @dir = dir
      example.run
    end
  end

  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  def log
    File.exist?(@log) ? File.read(@log) : ""
  end

  # GET http://127.0.0.1:port/path, nil while the server does not answer.
  def get(port, path)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 1, read_timeout: 5) { |http| http.get(path).body }
  rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
    nil
  end

  # Runs `record -o <name>.pb.gz -- *command` in a process group of its own (the recorder, the
  # server's master and its workers), loads the server with wrk on the CPU-heavy and the
  # sleeping route at once, stops it with `signal` sent to the master (its pid from `pidfile`),
  # and returns [record's output, its exit status, {pid or nil => file}]. Whatever happens,
  # the whole group is killed before returning.
  def record_server(name, command, port:, pidfile:, signal:, env: {})
    @log = File.join(@dir, "#{name}.log")
    out = File.join(@dir, "#{name}.pb.gz")
    group = Process.spawn(env, RbConfig.ruby, exe, "record", "-o", out, "--", *command,
                          chdir: @dir, out: @log, err: @log, pgroup: true)
    deadline = now + boot_timeout
    sleep 0.1 until get(port, "/pid") || now > deadline
    expect(get(port, "/pid")).to match(/\A\d+\n\z/), "the server did not answer in #{boot_timeout} s:\n#{log}"

    loads = %w[/cpu /sleep].map do |path|
      Process.spawn("wrk", "-t1", "-c2", "-d#{load_seconds}s", "--timeout", "5s", "http://127.0.0.1:#{port}#{path}",
                    out: File.join(@dir, "wrk#{path.tr('/', '_')}.txt"), err: [:child, :out])
    end
    loads.each { |pid| Process.wait(pid) }
    @wrk = %w[_cpu _sleep].to_h { |path| [path, File.read(File.join(@dir, "wrk#{path}.txt"))] }

    master = Integer(File.read(pidfile))
    Process.kill(signal, master)
    deadline = now + stop_timeout
    status = nil
    sleep 0.05 until (status = Process.wait2(group, Process::WNOHANG)&.last) || now > deadline
    expect(status).not_to be_nil, "record did not end #{stop_timeout} s after SIG#{signal}:\n#{log}"
    group = nil
    children = Dir.children(@dir).filter_map { |f| f[/\A#{name}\.pid(\d+)\.pb\.gz\z/, 1]&.to_i }.sort
    files = { nil => out }.merge(children.to_h { |pid| [pid, File.join(@dir, "#{name}.pid#{pid}.pb.gz")] })
    [log, status.exitstatus, files.select { |_, f| File.file?(f) }]
  ensure
    if group
      begin
        Process.kill("KILL", -group)
      rescue Errno::ESRCH
        nil
      end
      Process.wait(group)
    end
  end

  # Requests wrk completed, from its report.
  def requests(report)
    report[/(\d+) requests in/, 1].to_i
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

  # What every server must show: the master's profile and one per worker, each with its pid
  # in its name and on its samples, the summary listing them, the app's methods in the workers.
  def expect_one_profile_per_process(output, files, workers:)
    expect(files.keys.first).to be_nil # the master: the file given to -o
    children = files.keys.compact
    expect(children.size).to eq(workers), "files: #{files.values.map { |f| File.basename(f) }}\n#{output}"
    files.each do |pid, file|
      samples = samples_from(decode_pprof(File.binread(file)))
      expect(samples).not_to be_empty
      pids = samples.map { |s| s[:labels]["process id"] }.uniq
      expect(pids.size).to eq(1)
      expect(pids.first).to eq(pid) if pid
    end
    master = samples_from(decode_pprof(File.binread(files[nil]))).first[:labels]["process id"]
    expect(children).not_to include(master)
    expect(output).to match(/processes #{workers + 1}: the command's and #{workers} forked/)
    children.each { |pid| expect(output).to match(/^\s+#{pid}\s+samples \d+\s+cpu-time\s+\d+\.\d+ s  \S+\.pid#{pid}\.pb\.gz/) }
    served = files.values_at(*children).map { |f| DdprofRecorder.summary(File.binread(f))[:functions] }
    expect(served).to all(be > 0)
  end

  it "profiles Puma's master and both workers of `puma -w 2` (cluster mode, stopped with TERM)" do
    skip "Debian's puma and wrk are needed" unless Programs.available?("puma") && Programs.available?("wrk")
    skip Programs.other_ruby("puma") if Programs.other_ruby("puma")

    port = free_port
    pidfile = File.join(@dir, "puma.pid")
    output, status, files = record_server(
      "puma", ["puma", "-w", "2", "-t", "4", "-b", "tcp://127.0.0.1:#{port}", "--pidfile", pidfile,
               File.join(app_dir, "config.ru")],
      port: port, pidfile: pidfile, signal: "TERM",
    )
    expect(requests(@wrk["_cpu"])).to be > 0
    expect(requests(@wrk["_sleep"])).to be > 0
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
    output, status, files = record_server(
      "unicorn", ["unicorn", "-N", "-c", File.join(app_dir, "unicorn.conf.rb"), "-l", "127.0.0.1:#{port}",
                  File.join(app_dir, "config.ru")],
      port: port, pidfile: pidfile, signal: "TERM", env: { "UNICORN_PIDFILE" => pidfile },
    )
    expect(requests(@wrk["_cpu"])).to be > 0
    expect(requests(@wrk["_sleep"])).to be > 0
    expect(status).to eq(0), output
    expect_one_profile_per_process(output, files, workers: 2)
    share, total = cpu_share(files, "ServerApp.crunch_numbers")
    expect(total).to be > 0.5e9

    expect(@top.first).to end_with(" ServerApp.crunch_numbers"), "top:\n#{@top.join("\n")}"
    expect(share).to be > 0.3, "crunch_numbers #{(100 * share).round(1)}% of cpu-time; top:\n#{@top.join("\n")}"
  end
end
