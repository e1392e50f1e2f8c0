# frozen_string_literal: true

# A forking server's throughput with and without the profiler: Debian's `puma` in cluster mode
# (2 workers, 4 threads) or `unicorn` (2 workers) serving spec/fixtures/server_app/config.ru,
# loaded by `wrk` on 127.0.0.1 (the CPU-heavy route `/cpu` and the sleeping one `/sleep` at
# once), started plainly or under `ddprof-recorder record --hz 99`. Each round starts a fresh
# server of each kind, alternating, warms it up, then measures; the ratio of each round is
# paired (profiled / plain requests per second). For profiled runs it also gives each worker's
# on-CPU samples per second of its CPU (from its profile: the `cpu-samples` of the samples with
# cpu-time, over its cpu-time; an upper bound, see bench/profiler_rate.rb) against `hz`. For
# every run it gives how the load fell on the workers: each one's share of wrk's connections
# (counted half way through, from /proc) and of the workers' CPU over the second half. wrk
# keeps its connections open, so a worker that accepted few of them idles for the whole run.
#
#   ruby bench/server_throughput.rb [--server puma|unicorn] [--rounds 5] [--seconds 5] [--connections 8]
#
# Prints one line per run, the median ratio, and one JSON line.
require "json"
require "optparse"
require "tmpdir"
require_relative "support/measure"
require_relative "support/pprof_threads"
require_relative "support/server_bench"

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

BenchServer.need_programs("bench/server_throughput.rb", ["wrk", options[:server]])

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
#
# With a block, it is called half way through with the processes that hold the load's
# connections, as {pid => [connections by route, CPU clock ticks then]}, and `load` returns the
# requests per second and what the block gave back.
def load(port, seconds, connections)
  outs = %w[/cpu /sleep].map do |path|
    r, w = IO.pipe
    pid = Process.spawn("wrk", "-t1", "-c#{connections}", "-d#{seconds}s", "--timeout", "5s",
                        "http://127.0.0.1:#{port}#{path}",
                        out: w, err: w)
    w.close
    [pid, r]
  end
  seen = nil
  if block_given?
    sleep(seconds / 2.0)
    routes = outs.zip(%w[cpu sleep]).to_h { |(pid, _), route| [pid, route] }
    seen = yield(connections_by_pid(port, routes).to_h { |pid, tally| [pid, [tally, cpu_ticks(pid)]] })
  end
  rps = outs.sum do |pid, r|
    report = r.read
    Process.wait(pid)
    BenchServer.wrk_rps(report)
  end
  block_given? ? [rps, seen] : rps
end

# wrk's connections to `port` that a server process accepted, by that process and by route:
# {pid => {"cpu" => 3, "sleep" => 4}}. From /proc/net/tcp (IPv4, state 01: established): the
# server's side of a connection is local 127.0.0.1:port, and the client's side, held by one of
# the wrk processes (`routes`: wrk pid => route), has the server's remote port as its local
# one; a socket belongs to the process whose /proc/PID/fd links to its inode.
def connections_by_pid(port, routes)
  server_end = format("0100007F:%04X", port)
  server = {} # inode => client port
  client = {} # client port => inode
  File.readlines("/proc/net/tcp").drop(1).each do |line|
    f = line.split
    next unless f[3] == "01"

    server[f[9]] = f[2] if f[1] == server_end
    client[f[1]] = f[9] if f[2] == server_end
  end
  owner = {} # inode => pid
  Dir.glob("/proc/[0-9]*/fd/*").each do |fd|
    inode = File.readlink(fd)[/\Asocket:\[(\d+)\]\z/, 1]
    owner[inode] = Integer(fd.split("/")[2]) if inode
  rescue SystemCallError
    next
  end
  tallies = Hash.new { |h, k| h[k] = Hash.new(0) }
  server.each do |inode, client_port|
    pid = owner[inode] or next # not accepted yet: in the listen queue
    tallies[pid][routes.fetch(owner[client[client_port]], "other")] += 1
  end
  tallies
end

# A process's user + system CPU clock ticks (/proc/PID/stat), 0 once it is gone.
def cpu_ticks(pid)
  File.read("/proc/#{pid}/stat").split(") ", 2).last.split[11, 2].sum(&:to_i)
rescue SystemCallError
  0
end

# Each worker's connections by route and share of the workers' CPU over the second half of
# the load, e.g. "cpu 2 sleep 2: 51% / cpu 2 sleep 2: 49%": a worker that holds most of the
# `/cpu` connections works while the other idles (keep-alive connections stay with the
# worker that accepted them, and a Puma worker accepts no more than it has threads). Unicorn
# closes each connection after its response: none is held, and no worker is named.
def split(at_half)
  return "no connection held half way (one per request, as Unicorn's)" if at_half.empty?

  used = at_half.to_h { |pid, (_, ticks)| [pid, cpu_ticks(pid) - ticks] }
  total = used.values.sum
  at_half.sort_by { |pid, _| -used[pid] }.map do |pid, (tally, _)|
    format("cpu %d sleep %d: %d%%", tally["cpu"], tally["sleep"], total.positive? ? (100.0 * used[pid] / total).round : 0)
  end.join(" / ")
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
    port = BenchServer.free_port
    command = server_command(options[:server], port, dir)
    command = BenchServer.record(command, hz: options[:hz], output: File.join(dir, "server.pb.gz")) if kind == "profiled"
    env = { "UNICORN_PIDFILE" => File.join(dir, "server.pid") }
    rps, workers = BenchServer.serve(command, port: port, pidfile: File.join(dir, "server.pid"), chdir: dir, env: env,
                                              path: "/pid", boot_timeout: 20, stop_timeout: 20) do
      load(port, 1, options[:connections]) # warm-up: both workers booted, caches filled
      load(port, options[:seconds], options[:connections]) do |at_half|
        sleep(options[:seconds] / 2.0 - 0.5) # the second half, less wrk's last moments
        split(at_half)
      end
    end
    profiles = Dir.children(dir).grep(/\.pb\.gz\z/)
    [rps, profiles.size, worker_rates(dir, profiles), workers]
  end
end

load_average = File.read("/proc/loadavg").split.first
puts "server throughput: #{options[:server]}, #{options[:rounds]} rounds of #{options[:seconds]} s, " \
     "profiled at #{options[:hz]} Hz, load average #{load_average}"
results = { "plain" => [], "profiled" => [] }
rates = []
splits = { "plain" => [], "profiled" => [] }
pairs = BenchServer.alternate(options[:rounds]) do |kind_symbol, round|
  kind = kind_symbol.to_s
  value, profiles, worker_rates, workers = run(kind, options)
  results[kind] << value
  rates.concat(worker_rates) if kind == "profiled"
  splits[kind] << workers
  puts format("  round %d %-8s %8.1f requests/s (workers: %s)%s", round + 1, kind, value, workers,
              kind == "profiled" ? " (#{profiles} profiles written; workers' on-CPU samples per CPU-second: " \
                                   "#{worker_rates.join(', ')})" : "")
  value
end
ratios = pairs.map { |pair| pair[:profiled] / pair[:plain] }
median = BenchMeasure.method(:median)
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
                   worker_on_cpu_per_cpu_second: rates, workers: splits)
