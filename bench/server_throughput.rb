# frozen_string_literal: true

# A forking server's throughput with and without the profiler: Debian's `puma` in cluster mode
# (2 workers, 4 threads) or `unicorn` (2 workers) serving spec/fixtures/server_app/config.ru,
# loaded by `wrk` on 127.0.0.1 (the CPU-heavy route `/cpu` and the sleeping one `/sleep` at
# once), started plainly or under `ddprof-recorder record --hz 99`. Each round starts a fresh
# server of each kind, alternating, warms it up, then measures; the ratio of each round is
# paired (profiled / plain requests per second). For profiled runs it also gives each worker's
# on-CPU samples per second of its CPU (from its profile: the `cpu-samples` of the samples with
# cpu-time, over its cpu-time; an upper bound, see bench/profiler_rate.rb) against `hz`.
#
#   ruby bench/server_throughput.rb [--server puma|unicorn] [--rounds 5] [--seconds 5] [--connections 8]
#
# Prints one line per run, the median ratio, and one JSON line.
require "json"
require "net/http"
require "optparse"
require "rbconfig"
require "socket"
require "tmpdir"
require_relative "support/pprof_threads"

ROOT = File.expand_path("..", __dir__)
APP = File.join(ROOT, "spec", "fixtures", "server_app")

options = { server: "puma", rounds: 5, seconds: 5, hz: 99, connections: 8 }
OptionParser.new do |o|
  o.on("--server NAME", %w[puma unicorn]) { |v| options[:server] = v }
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--seconds N", Integer) { |v| options[:seconds] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
  o.on("--connections N", Integer, "wrk connections per route (default 8)") { |v| options[:connections] = v }
end.parse!

%w[wrk].push(options[:server]).each do |program|
  next if ENV.fetch("PATH", "").split(":").any? { |d| File.executable?(File.join(d, program)) }

  abort "bench/server_throughput.rb: #{program} not found (apt-get install #{program})"
end

def free_port
  server = TCPServer.new("127.0.0.1", 0)
  server.addr[1]
ensure
  server&.close
end

def up?(port)
  Net::HTTP.start("127.0.0.1", port, open_timeout: 1, read_timeout: 2) { |h| h.get("/pid").code == "200" }
rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
  false
end

def server_command(server, port, dir)
  case server
  when "puma"
    ["puma", "-w", "2", "-t", "4:4", "-b", "tcp://127.0.0.1:#{port}", "--pidfile", File.join(dir, "server.pid"),
     File.join(APP, "config.ru")]
  else
    ["unicorn", "-c", File.join(APP, "unicorn.conf.rb"), "-l", "127.0.0.1:#{port}", File.join(APP, "config.ru")]
  end
end

# Requests per second of the two routes together over `seconds`. Enough connections that both
# workers get CPU-heavy requests: with 4 a route, the kernel often gave all the `/cpu` ones to
# one worker, and the server's throughput came out at either ~280 or ~470 requests/s.
def load(port, seconds, connections)
  outs = %w[/cpu /sleep].map do |path|
    r, w = IO.pipe
    pid = Process.spawn("wrk", "-t1", "-c#{connections}", "-d#{seconds}s", "--timeout", "5s",
                        "http://127.0.0.1:#{port}#{path}",
                        out: w, err: w)
    w.close
    [pid, r]
  end
  outs.sum do |pid, r|
    report = r.read
    Process.wait(pid)
    report[/Requests\/sec:\s+([\d.]+)/, 1].to_f
  end
end

# Per worker's profile (`server.pid<N>.pb.gz`): on-CPU samples per second of its CPU.
def worker_rates(dir, profiles)
  profiles.grep(/\.pid\d+\.pb\.gz\z/).sort.map do |name|
    threads = BenchPprofThreads.per_thread(File.join(dir, name)).values
    cpu_ns = threads.sum { |t| t[:cpu_ns] }
    cpu_ns.positive? ? (threads.sum { |t| t[:cpu_samples] } * 1e9 / cpu_ns).round(1) : 0.0
  end
end

def run(kind, options)
  Dir.mktmpdir("ddprof_recorder_throughput") do |dir|
    port = free_port
    command = server_command(options[:server], port, dir)
    if kind == "profiled"
      command = [RbConfig.ruby, File.join(ROOT, "exe", "ddprof-recorder"), "record", "--hz", options[:hz].to_s,
                 "-o", File.join(dir, "server.pb.gz"), "--", *command]
    end
    env = { "UNICORN_PIDFILE" => File.join(dir, "server.pid") }
    group = Process.spawn(env, *command, chdir: dir, out: File::NULL, err: File::NULL, pgroup: true)
    begin
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
      sleep 0.1 until up?(port) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      raise "the server did not answer in 20 s" unless up?(port)

      load(port, 1, options[:connections]) # warm-up: both workers booted, caches filled
      rps = load(port, options[:seconds], options[:connections])
      Process.kill("TERM", Integer(File.read(File.join(dir, "server.pid"))))
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 20
      sleep 0.05 until Process.wait2(group, Process::WNOHANG) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      profiles = Dir.children(dir).grep(/\.pb\.gz\z/)
      group = nil
      [rps, profiles.size, worker_rates(dir, profiles)]
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
  end
end

load_average = File.read("/proc/loadavg").split.first
puts "server throughput: #{options[:server]}, #{options[:rounds]} rounds of #{options[:seconds]} s, " \
     "profiled at #{options[:hz]} Hz, load average #{load_average}"
ratios = []
results = { "plain" => [], "profiled" => [] }
rates = []
options[:rounds].times do |round|
  kinds = round.even? ? %w[plain profiled] : %w[profiled plain]
  rps = kinds.to_h do |kind|
    value, profiles, worker_rates = run(kind, options)
    results[kind] << value
    rates.concat(worker_rates) if kind == "profiled"
    puts format("  round %d %-8s %8.1f requests/s%s", round + 1, kind, value,
                kind == "profiled" ? " (#{profiles} profiles written; workers' on-CPU samples per CPU-second: " \
                                     "#{worker_rates.join(', ')})" : "")
    [kind, value]
  end
  ratios << rps["profiled"] / rps["plain"]
end
median = ->(xs) { xs.sort[xs.size / 2] }
puts format("median profiled/plain: %.3f (rounds: %s); plain %.1f, profiled %.1f requests/s (medians)",
            median.call(ratios), ratios.map { |r| format("%.3f", r) }.join(" "),
            median.call(results["plain"]), median.call(results["profiled"]))
puts format("workers' on-CPU samples per CPU-second at %d Hz (an upper bound; with threads that share a stack, as " \
            "Puma's, far above): %s (median %.1f)", options[:hz], rates.sort.join(", "),
            median.call(rates) || 0)
puts JSON.generate(bench: "server_throughput", server: options[:server], hz: options[:hz], rounds: options[:rounds],
                   connections: options[:connections],
                   seconds: options[:seconds], load_average: load_average, median_ratio: median.call(ratios).round(4),
                   ratios: ratios.map { |r| r.round(4) }, plain_rps: results["plain"], profiled_rps: results["profiled"],
                   worker_on_cpu_per_cpu_second: rates)
