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
#   ruby bench/rails_endpoints.rb [--rounds 8] [--seconds 6] [--hz 99] [--record-args "--gc"]
#
# Ruby 3.1 only (Debian's Rails is for Debian's Ruby). Prints a line per run and the medians.
require "optparse"
require_relative "support/measure"
require_relative "support/rails_app"
require_relative "support/server_bench"

options = { rounds: 8, seconds: 6, hz: 99 }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--seconds N", Integer) { |v| options[:seconds] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
  o.on("--record-args ARGS", "more options for record, e.g. \"--ticks cpu --gc\"") { |v| options[:record_args] = v.split }
end.parse!

BenchRailsApp.check("bench/rails_endpoints.rb")
BenchServer.need_programs("bench/rails_endpoints.rb", %w[puma wrk])
puts "rails endpoints: puma -w 2 -t 4:4, #{options[:rounds]} rounds of #{options[:seconds]} s, " \
     "profiled at #{options[:hz]} Hz #{options[:record_args]&.join(' ')}, load average #{BenchMeasure.load_average}"
pairs = BenchServer.alternate(options[:rounds]) do |kind, _|
  BenchServer.endpoints_run(kind, options, name: "rails", paths: BenchRailsApp::PATHS) do |port, pidfile, dir, truth, _inner|
    [BenchRailsApp.puma(port: port, pidfile: pidfile), BenchRailsApp.env(dir, truth: truth)]
  end
end
BenchServer.endpoints_report(pairs)
