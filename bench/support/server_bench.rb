# frozen_string_literal: true

require "json"
require "net/http"
require "rbconfig"
require "socket"
require "tmpdir"
require_relative "measure"

# What the benchmarks that serve an app on 127.0.0.1 share (bench/rails_endpoints.rb,
# bench/sinatra_endpoints.rb, bench/server_throughput.rb, the `rails` program of
# bench/accuracy.rb): a free port, a server started in a process group of its own and stopped
# by its pidfile, wrk's requests per second, the alternating rounds, and the comparison of a
# profile's cpu-time by "trace endpoint" with the CPU an app measured inside its requests.
module BenchServer
  ROOT = File.expand_path("../..", __dir__)

  module_function

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  # Whether the server on `port` answers `path` with a 200.
  def up?(port, path = "/", read_timeout: 5)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 1, read_timeout: read_timeout) { |h| h.get(path).code == "200" }
  rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
    false
  end

  # `command` under `ddprof-recorder record --hz HZ [ARGS] -o OUTPUT` (each forked worker
  # writes OUTPUT with its pid: `x.pid4242.pb.gz`).
  def record(command, hz:, output:, args: [])
    [RbConfig.ruby, File.join(ROOT, "exe", "ddprof-recorder"), "record", "--hz", hz.to_s, *args, "-o", output,
     "--", *command]
  end

  # Starts `command` in a process group of its own (output to `log`, default none), waits
  # until it answers `path`, yields, then stops the server with TERM to the pid in `pidfile`
  # and waits for it to exit (its workers write their files on the way out). If the block
  # raises, or the server does not answer or exit in time, the group is killed.
  #
  # @return the block's value.
  # @raise [RuntimeError] if the server does not answer in `boot_timeout` s.
  def serve(command, port:, pidfile:, chdir:, env: {}, path: "/", log: File::NULL, boot_timeout: 60, stop_timeout: 30)
    group = Process.spawn(env, *command, chdir: chdir, out: log, err: %i[child out], pgroup: true)
    begin
      deadline = now + boot_timeout
      sleep 0.2 until up?(port, path, read_timeout: 2) || now > deadline
      raise "#{command.join(' ')} did not answer #{path} in #{boot_timeout} s" unless up?(port, path)

      result = yield
      Process.kill("TERM", Integer(File.read(pidfile)))
      deadline = now + stop_timeout
      sleep 0.05 until (exited = Process.wait2(group, Process::WNOHANG)) || now > deadline
      group = nil if exited
      result
    ensure
      kill_group(group) if group
    end
  end

  # Kills process group `group` (a child spawned with `pgroup: true`) and reaps its leader.
  def kill_group(group)
    begin
      Process.kill("KILL", -group)
    rescue Errno::ESRCH
      nil
    end
    Process.wait(group) rescue nil # rubocop:disable Style/RescueModifier
  end

  # Requests per second of a wrk report ("Requests/sec: 123.4"), 0.0 if it has none.
  def wrk_rps(report)
    report[%r{Requests/sec:\s+([\d.]+)}, 1].to_f
  end

  # Loads the server on `port` for `seconds` with wrk (2 threads, `connections` connections),
  # each thread sending `paths` in turn (a Lua script written into `dir`).
  #
  # @return [Float] requests per second.
  def wrk(port, seconds, paths:, dir:, connections: 8)
    script = File.join(dir, "paths.lua")
    File.write(script, "local paths = { #{paths.map(&:dump).join(', ')} }\nlocal i = 0\n" \
                       "request = function() i = i % #paths + 1; return wrk.format(\"GET\", paths[i]) end\n")
    wrk_rps(IO.popen(["wrk", "-t2", "-c#{connections}", "-d#{seconds}s", "--timeout", "5s", "-s", script,
                      "http://127.0.0.1:#{port}/"], err: %i[child out], &:read))
  end

  # Aborts, with the Debian package to install, unless each program is on PATH.
  def need_programs(bench, programs)
    programs.each do |program|
      next if ENV.fetch("PATH", "").split(":").any? { |d| File.executable?(File.join(d, program)) }

      abort "#{bench}: #{program} not found (apt-get install #{program})"
    end
  end

  # Runs `rounds` pairs, each pair's two kinds in turn, the order alternating from one round
  # to the next (plain first in even rounds), so that a drift of the machine's load falls on
  # both alike. Yields (kind, round) and collects the block's values.
  #
  # @return [Array<Hash{Symbol => Object}>] per round, {plain: value, profiled: value}.
  def alternate(rounds)
    Array.new(rounds) do |round|
      order = round.even? ? %i[plain profiled] : %i[profiled plain]
      order.to_h { |kind| [kind, yield(kind, round)] }.slice(:plain, :profiled)
    end
  end

  # The truth files an app's RequestCpu wrote (spec/fixtures/request_cpu.rb: FILE.<pid>, one
  # JSON object {endpoint => {"requests", "cpu_ns"}} per process), added up.
  #
  # @return [Hash{String => Integer}] endpoint => CPU ns.
  def read_truth(prefix)
    Dir["#{prefix}.*"].each_with_object(Hash.new(0)) do |file, truth|
      JSON.parse(File.read(file)).each { |endpoint, total| truth[endpoint] += total.fetch("cpu_ns") }
    end
  end

  # A profile's cpu-time by "trace endpoint" (nil: samples without it), of files merged by
  # the profiler's own merge (DdprofRecorder.merge), decoded with google-protobuf.
  def endpoint_cpu(files)
    require_relative "../../lib/ddprof_recorder"
    require_relative "pprof_threads"
    pprof = DdprofRecorder.merge(files.map { |f| File.binread(f) })
    BenchPprofThreads.by_label(pprof, "trace endpoint")
  end

  # Each value's share of their sum, in percent.
  def shares(weights)
    total = weights.values.sum.to_f
    weights.transform_values { |v| total.positive? ? 100.0 * v / total : 0.0 }
  end

  # How a profile's cpu-time by endpoint (`ours`, nil for unlabelled samples) agrees with the
  # CPU the app measured inside its requests (`truth`): the shares of the labelled cpu-time
  # against the truth's; the largest gap, in points, over the truth's endpoints and any
  # endpoint only ours has; and the labelled cpu-time over the truth's CPU (`coverage`).
  #
  # @return [Hash] gap:, coverage:, ours: {endpoint => %}, truth: {endpoint => %}.
  def compare_endpoints(truth, ours)
    labelled = ours.reject { |endpoint, _| endpoint.nil? }
    truth_shares = shares(truth)
    our_shares = shares(labelled)
    endpoints = truth_shares.keys | our_shares.keys
    gap = endpoints.map { |e| (truth_shares.fetch(e, 0.0) - our_shares.fetch(e, 0.0)).abs }.max || 0.0
    total = truth.values.sum
    { gap: gap, coverage: total.positive? ? labelled.values.sum.fdiv(total) : 0.0, ours: our_shares,
      truth: truth_shares }
  end

  # "A ours/truth, ..." of compare_endpoints' result, by endpoint name.
  def endpoint_detail(compared)
    compared[:truth].keys.union(compared[:ours].keys).sort.map do |e|
      format("%s %.1f/%.1f", e, compared[:ours].fetch(e, 0.0), compared[:truth].fetch(e, 0.0))
    end.join(", ")
  end

  # One server of an endpoints bench (bench/rails_endpoints.rb, bench/sinatra_endpoints.rb),
  # in a fresh directory: the block gives the server's command and environment for (port,
  # pidfile, dir, truth, inner), the app writing its RequestCpu truth to `truth`.<pid> and, if
  # it measures one, a second truth further in to `inner`.<pid>; the command runs as it is
  # (:plain) or under `record --hz [options[:record_args]]` (:profiled), is up once it answers `up_path` (default: the
  # first of `paths`), is loaded by wrk over `paths` for 1 s of warm-up (its requests are in
  # the truths and the profile alike) and then options[:seconds], and stopped.
  #
  # @return [Hash] rps: requests/s, truth: and inner: {endpoint => CPU ns} (inner empty if not
  #   measured), ours: for :profiled the workers' cpu-time by "trace endpoint" (nil for :plain).
  def endpoints_run(kind, options, name:, paths:, up_path: paths.first)
    Dir.mktmpdir("ddprof_recorder_#{name}_bench") do |dir|
      port = free_port
      pidfile = File.join(dir, "server.pid")
      truth = File.join(dir, "truth.json")
      inner = File.join(dir, "inner_truth.json")
      command, env = yield(port, pidfile, dir, truth, inner)
      if kind == :profiled
        command = record(command, hz: options[:hz], args: options.fetch(:record_args, []),
                                  output: File.join(dir, "#{name}.pb.gz"))
      end
      rps = serve(command, port: port, pidfile: pidfile, chdir: dir, env: env, path: up_path) do
        wrk(port, 1, paths: paths, dir: dir)
        wrk(port, options[:seconds], paths: paths, dir: dir)
      end
      ours = (endpoint_cpu(Dir[File.join(dir, "#{name}.pid*.pb.gz")]) if kind == :profiled)
      { rps: rps, truth: read_truth(truth), inner: read_truth(inner), ours: ours }
    end
  end

  # Prints, for the pairs of endpoints_run results that alternate gave, a line per round
  # (requests/s of each, the largest gap, the labelled share of the truth's CPU, each
  # endpoint's share ours/truth; the same against the inner truth if there is one) and the
  # medians with the load average.
  #
  # @return [Hash] the medians: ratio:, gap:, coverage:, and inner_gap:, inner_coverage: (nil
  #   without an inner truth).
  def endpoints_report(pairs, io: $stdout)
    rows = pairs.map.with_index(1) do |pair, round|
      plain, profiled = pair.values_at(:plain, :profiled)
      compared = compare_endpoints(profiled[:truth], profiled[:ours])
      ratio = profiled[:rps] / plain[:rps]
      io.printf("round %d: plain %.1f req/s, profiled %.1f (%.3f); largest gap %.1f points; labelled %.1f%% " \
                "of the truth's CPU; ours/truth %s\n", round, plain[:rps], profiled[:rps], ratio, compared[:gap],
                100 * compared[:coverage], endpoint_detail(compared))
      row = { ratio: ratio, gap: compared[:gap], coverage: compared[:coverage] }
      next row if profiled[:inner].empty?

      inner = compare_endpoints(profiled[:inner], profiled[:ours])
      io.printf("  against the inner truth: largest gap %.1f points; labelled %.1f%% of its CPU; ours/inner %s\n",
                inner[:gap], 100 * inner[:coverage], endpoint_detail(inner))
      row.merge(inner_gap: inner[:gap], inner_coverage: inner[:coverage])
    end
    medians = rows.first.keys.to_h { |key| [key, BenchMeasure.median(rows.map { |row| row[key] })] }
    range = ->(key, scale = 1) { format("%.1f (%.1f-%.1f)", *[medians[key], *rows.map { |r| r[key] }.minmax].map { |v| v * scale }) }
    io.printf("median: requests/s ratio %.3f (%.3f-%.3f), largest gap %s points, labelled %s%%%s; load average %s at the end\n",
              medians[:ratio], *rows.map { |row| row[:ratio] }.minmax, range.call(:gap), range.call(:coverage, 100),
              medians.key?(:inner_gap) ? "; against the inner truth: gap #{range.call(:inner_gap)} points, labelled " \
                                         "#{range.call(:inner_coverage, 100)}%" : "",
              BenchMeasure.load_average)
    medians
  end
end
