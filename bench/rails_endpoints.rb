# frozen_string_literal: true

# Endpoints on a Rails app: spec/fixtures/rails_app (Debian's Rails 6.1) on Puma in cluster mode
# (2 workers, 4 threads), loaded by wrk over its five endpoints, started plainly or under
# `ddprof-recorder record --hz HZ`, alternating, a fresh server each round. Every run has the
# app's own truth hook on (RAILS_APP_TRUTH: each request's thread CPU by Controller#action,
# measured inside the app, outside the profiler: spec/fixtures/request_cpu.rb), so both kinds
# of run pay for it alike.
#
# For each profiled run: each endpoint's share of the profile's cpu-time (the workers' files
# merged, by the "trace endpoint" label) against its share of the truth's CPU, the largest gap
# in points, and the labelled cpu-time over the truth's CPU (BenchServer.compare_endpoints).
# For each pair: profiled over plain requests per second. bench/sinatra_endpoints.rb does the
# same for a Sinatra app.
#
#   ruby bench/rails_endpoints.rb [--rounds 8] [--seconds 6] [--hz 99]
#
# Ruby 3.1 only (Debian's Rails is for Debian's Ruby). Prints a line per run and the medians.
require "optparse"
require "tmpdir"
require_relative "support/measure"
require_relative "support/rails_app"
require_relative "support/server_bench"

options = { rounds: 8, seconds: 6, hz: 99 }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--seconds N", Integer) { |v| options[:seconds] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
end.parse!

# One server's run: [requests/s, truth {action => CPU ns}, ours {endpoint => cpu-time} or nil].
def run(kind, options)
  Dir.mktmpdir("ddprof_recorder_rails_bench") do |dir|
    port = BenchServer.free_port
    pidfile = File.join(dir, "puma.pid")
    command = BenchRailsApp.puma(port: port, pidfile: pidfile)
    command = BenchServer.record(command, hz: options[:hz], output: File.join(dir, "rails.pb.gz")) if kind == :profiled
    env = BenchRailsApp.env(dir, truth: File.join(dir, "truth.json"))
    rps = BenchServer.serve(command, port: port, pidfile: pidfile, chdir: dir, env: env) do
      BenchServer.wrk(port, 1, paths: BenchRailsApp::PATHS, dir: dir) # warm-up; its requests are in the truth and the profile alike
      BenchServer.wrk(port, options[:seconds], paths: BenchRailsApp::PATHS, dir: dir)
    end
    ours = (BenchServer.endpoint_cpu(Dir[File.join(dir, "rails.pid*.pb.gz")]) if kind == :profiled)
    [rps, BenchServer.read_truth(File.join(dir, "truth.json")), ours]
  end
end

BenchRailsApp.check("bench/rails_endpoints.rb")
BenchServer.need_programs("bench/rails_endpoints.rb", %w[puma wrk])
puts "rails endpoints: puma -w 2 -t 4:4, #{options[:rounds]} rounds of #{options[:seconds]} s, " \
     "profiled at #{options[:hz]} Hz, load average #{BenchMeasure.load_average}"
rounds = BenchServer.alternate(options[:rounds]) { |kind, _| run(kind, options) }
ratios = []
gaps = []
covered = []
rounds.each.with_index(1) do |results, round|
  plain_rps = results[:plain][0]
  rps, truth, ours = results[:profiled]
  compared = BenchServer.compare_endpoints(truth, ours)
  ratios << rps / plain_rps
  gaps << compared[:gap]
  covered << compared[:coverage]
  printf("round %d: plain %.1f req/s, profiled %.1f (%.3f); largest gap %.1f points; labelled %.1f%% " \
         "of the truth's CPU; ours/truth %s\n", round, plain_rps, rps, rps / plain_rps, compared[:gap],
         100 * compared[:coverage], BenchServer.endpoint_detail(compared))
end
printf("median: requests/s ratio %.3f (%.3f-%.3f), largest gap %.1f points (%.1f-%.1f), labelled %.1f%% (%.1f-%.1f); " \
       "load average %s at the end\n",
       BenchMeasure.median(ratios), ratios.min, ratios.max, BenchMeasure.median(gaps), gaps.min, gaps.max,
       100 * BenchMeasure.median(covered), 100 * covered.min, 100 * covered.max, BenchMeasure.load_average)
