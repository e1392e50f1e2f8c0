# frozen_string_literal: true

# Endpoints on a Rails app: spec/fixtures/rails_app (Debian's Rails 6.1) on Puma in cluster mode
# (2 workers, 4 threads), loaded by wrk over its five endpoints, started plainly or under
# `ddprof-recorder record --hz HZ`, alternating, a fresh server each round. Every run has the
# app's own truth hook on (RAILS_APP_TRUTH: each request's thread CPU by Controller#action,
# measured inside the app, outside the profiler), so both kinds of run pay for it alike.
#
# For each profiled run: each endpoint's share of the profile's cpu-time (the workers' files
# merged, by the "trace endpoint" label) against its share of the truth's CPU, the largest gap
# in points, and the labelled cpu-time over the truth's CPU. For each pair: profiled over plain
# requests per second.
#
#   ruby bench/rails_endpoints.rb [--rounds 8] [--seconds 6] [--hz 99]
#
# Ruby 3.1 only (Debian's Rails is for Debian's Ruby). Prints a line per run and the medians.
require "json"
require "net/http"
require "optparse"
require "rbconfig"
require "socket"
require "tmpdir"
require_relative "../lib/ddprof_recorder"
require_relative "support/pprof_threads"

ROOT = File.expand_path("..", __dir__)
APP = File.join(ROOT, "spec", "fixtures", "rails_app")
PATHS = ["/", "/heavy", "/items", "/items/7", "/api/stats"].freeze

options = { rounds: 8, seconds: 6, hz: 99 }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--seconds N", Integer) { |v| options[:seconds] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
end.parse!

def free_port
  TCPServer.new("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
end

def up?(port)
  Net::HTTP.start("127.0.0.1", port, open_timeout: 1, read_timeout: 5) { |h| h.get("/").code == "200" }
rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
  false
end

def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

def wrk(port, seconds, script)
  out = IO.popen(["wrk", "-t2", "-c8", "-d#{seconds}s", "--timeout", "5s", "-s", script, "http://127.0.0.1:#{port}/"],
                 err: %i[child out], &:read)
  out[%r{Requests/sec:\s+([\d.]+)}, 1].to_f
end

# Profile cpu-time by endpoint, from the workers' files merged.
def endpoint_cpu(files)
  pprof = DdprofRecorder.merge(files.map { |f| File.binread(f) })
  BenchPprofThreads.by_label(pprof, "trace endpoint")
end

def run(kind, options)
  Dir.mktmpdir("ddprof_recorder_rails_bench") do |dir|
    port = free_port
    script = File.join(dir, "paths.lua")
    File.write(script, "local paths = { #{PATHS.map(&:dump).join(', ')} }\nlocal i = 0\n" \
                       "request = function() i = i % #paths + 1; return wrk.format(\"GET\", paths[i]) end\n")
    pidfile = File.join(dir, "puma.pid")
    command = ["puma", "-C", File.join(APP, "config", "puma.rb"), "-w", "2", "-t", "4:4",
               "-b", "tcp://127.0.0.1:#{port}", "--pidfile", pidfile, File.join(APP, "config.ru")]
    if kind == :profiled
      command = [RbConfig.ruby, File.join(ROOT, "exe", "ddprof-recorder"), "record", "--hz", options[:hz].to_s,
                 "-o", File.join(dir, "rails.pb.gz"), "--", *command]
    end
    env = { "RAILS_APP_TMP" => File.join(dir, "tmp"), "RAILS_APP_TRUTH" => File.join(dir, "truth.json") }
    group = Process.spawn(env, *command, chdir: dir, out: File::NULL, err: File::NULL, pgroup: true)
    begin
      deadline = now + 60
      sleep 0.2 until up?(port) || now > deadline
      raise "the app did not answer in 60 s" unless up?(port)

      wrk(port, 1, script) # warm-up; its requests are in the truth and the profile alike
      rps = wrk(port, options[:seconds], script)
      Process.kill("TERM", Integer(File.read(pidfile)))
      deadline = now + 30
      sleep 0.05 until Process.wait2(group, Process::WNOHANG) || now > deadline
      group = nil
      truth = Hash.new(0)
      Dir[File.join(dir, "truth.json.*")].each do |f|
        JSON.parse(File.read(f)).each { |action, total| truth[action] += total["cpu_ns"] }
      end
      ours = (endpoint_cpu(Dir[File.join(dir, "rails.pid*.pb.gz")]) if kind == :profiled)
      [rps, truth, ours]
    ensure
      if group
        Process.kill("KILL", -group) rescue nil # rubocop:disable Style/RescueModifier
        Process.wait(group)
      end
    end
  end
end

def shares(cpu)
  total = cpu.values.sum.to_f
  cpu.transform_values { |v| 100.0 * v / total }
end

def median(values) = values.sort[values.size / 2]

abort "bench/rails_endpoints.rb: Debian's Rails is for Ruby 3.1" unless RUBY_VERSION.start_with?("3.1")
puts "rails endpoints: puma -w 2 -t 4:4, #{options[:rounds]} rounds of #{options[:seconds]} s, " \
     "profiled at #{options[:hz]} Hz, load average #{File.read('/proc/loadavg').split.first}"
ratios = []
gaps = []
covered = []
options[:rounds].times do |round|
  order = round.even? ? %i[plain profiled] : %i[profiled plain]
  results = order.to_h { |kind| [kind, run(kind, options)] }
  plain_rps = results[:plain][0]
  rps, truth, ours = results[:profiled]
  labelled = ours.reject { |endpoint, _| endpoint.nil? }
  truth_shares = shares(truth)
  our_shares = shares(labelled)
  gap = truth_shares.map { |action, share| (share - our_shares.fetch(action, 0.0)).abs }.max
  coverage = labelled.values.sum.to_f / truth.values.sum
  ratios << rps / plain_rps
  gaps << gap
  covered << coverage
  detail = truth_shares.keys.sort.map { |a| format("%s %.1f/%.1f", a, our_shares.fetch(a, 0.0), truth_shares[a]) }
  printf("round %d: plain %.1f req/s, profiled %.1f (%.3f); largest gap %.1f points; labelled %.1f%% " \
         "of the truth's CPU; ours/truth %s\n", round + 1, plain_rps, rps, rps / plain_rps, gap, 100 * coverage,
         detail.join(", "))
end
printf("median: requests/s ratio %.3f (%.3f-%.3f), largest gap %.1f points (%.1f-%.1f), labelled %.1f%% (%.1f-%.1f)\n",
       median(ratios), ratios.min, ratios.max, median(gaps), gaps.min, gaps.max, 100 * median(covered),
       100 * covered.min, 100 * covered.max)
