# frozen_string_literal: true

require "net/http"
require "rbconfig"
require "socket"

require_relative "../../bench/support/server_bench"

# Recording real servers (spec/integration/servers_spec.rb, rails_spec.rb): `ddprof-recorder
# record -- <server>` in a process group of its own, loaded by wrk, stopped by a signal to its
# master, and the files it wrote. The including spec gives @dir, a temporary directory.
module ServerHelpers
  EXE = File.expand_path("../../exe/ddprof-recorder", __dir__)
  # How long a server may take to boot, and to stop and write its profiles.
  BOOT_TIMEOUT = 20
  STOP_TIMEOUT = 20

  def free_port = BenchServer.free_port

  def now = BenchServer.now

  # The server's output (record's too), so far.
  def server_log
    @log && File.exist?(@log) ? File.read(@log) : ""
  end

  # GET http://127.0.0.1:port/path: the Net::HTTPResponse, nil while the server does not answer.
  def get(port, path)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 1, read_timeout: 5) { |http| http.get(path) }
  rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
    nil
  end

  # Runs `record -o <name>.pb.gz -- *command` in a process group of its own (the recorder, the
  # server's master and its workers) with @dir as its directory, waits until `ready` answers
  # 200, yields (the block loads the server), stops the server with `signal` sent to the master
  # (its pid from `pidfile`), and returns [record's output, its exit status, {pid or nil =>
  # file}]: nil is the master's file (-o), each forked worker's is <name>.pid<PID>.pb.gz.
  # Whatever happens, the whole group is killed before returning.
  def record_server(name, command, port:, pidfile:, signal:, env: {}, ready: "/pid", boot_timeout: BOOT_TIMEOUT)
    @log = File.join(@dir, "#{name}.log")
    out = File.join(@dir, "#{name}.pb.gz")
    group = Process.spawn(env, RbConfig.ruby, EXE, "record", "-o", out, "--", *command,
                          chdir: @dir, out: @log, err: @log, pgroup: true)
    deadline = now + boot_timeout
    sleep 0.1 until get(port, ready)&.code == "200" || now > deadline
    expect(get(port, ready)&.code).to eq("200"), "the server did not answer #{ready} in #{boot_timeout} s:\n#{server_log}"

    yield

    master = Integer(File.read(pidfile))
    Process.kill(signal, master)
    deadline = now + STOP_TIMEOUT
    status = nil
    sleep 0.05 until (status = Process.wait2(group, Process::WNOHANG)&.last) || now > deadline
    expect(status).not_to be_nil, "record did not end #{STOP_TIMEOUT} s after SIG#{signal}:\n#{server_log}"
    group = nil
    children = Dir.children(@dir).filter_map { |f| f[/\A#{name}\.pid(\d+)\.pb\.gz\z/, 1]&.to_i }.sort
    files = { nil => out }.merge(children.to_h { |pid| [pid, File.join(@dir, "#{name}.pid#{pid}.pb.gz")] })
    [server_log, status.exitstatus, files.select { |_, f| File.file?(f) }]
  ensure
    BenchServer.kill_group(group) if group
  end

  # Loads the server with one wrk per path, all at once, for `seconds` (`wrk_args`: more of
  # wrk's options, such as `-s script.lua`); returns {path => wrk's report}. A wrk that has not
  # ended 30 s after its time is killed (its report is then what it printed).
  def wrk_reports(port, paths, seconds:, threads: 1, connections: 2, wrk_args: [])
    loads = paths.to_h do |path|
      report = File.join(@dir, "wrk#{path.tr('/', '_')}.txt")
      pid = Process.spawn("wrk", "-t#{threads}", "-c#{connections}", "-d#{seconds}s", "--timeout", "5s", *wrk_args,
                          "http://127.0.0.1:#{port}#{path}", out: report, err: [:child, :out])
      [path, [pid, report]]
    end
    loads.each_value { |pid, _| wait_child(pid, seconds + 30) }
    loads.transform_values { |_, report| File.read(report) }
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

  # Requests wrk completed, from its report.
  def requests(report)
    report[/(\d+) requests in/, 1].to_i
  end
end
