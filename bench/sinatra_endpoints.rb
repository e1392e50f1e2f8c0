# frozen_string_literal: true

# Endpoints on a Sinatra app, as bench/rails_endpoints.rb on a Rails one: spec/fixtures/sinatra_app
# (Debian's Sinatra 3; three routes of clearly different CPU cost, one rendering ERB) on Debian's
# Puma in cluster mode (2 workers of 4 threads, the app preloaded), loaded by wrk over the three
# routes, started plainly or under `ddprof-recorder record --hz HZ`, alternating, a fresh
# server each round. Every run has the app's truth hook on (SINATRA_APP_TRUTH: each request's
# thread CPU by route pattern, a Rack middleware in config.ru outside the app, and so outside
# the profiler's: spec/fixtures/request_cpu.rb), and a second one inside the app's middleware
# stack, after the profiler's and Sinatra's own middleware, from the app's call to its return
# (SINATRA_APP_INNER_TRUTH): the profiler's span less Sinatra's middleware (Rack::Protection
# and the others) and the response's writing, which the profiler's span holds (it starts
# before that middleware and ends at the body's close). The target is against the first.
#
# For each profiled run: each route's share of the profile's cpu-time (the workers' files
# merged, by "trace endpoint", which Sinatra's routes get with nothing configured: `GET
# /items/:id`) against its share of the truth's CPU, the largest gap in points, and the
# labelled cpu-time over the truth's CPU; for each pair, profiled over plain requests per second.
#
#   ruby bench/sinatra_endpoints.rb [--rounds 8] [--seconds 6] [--hz 99] [--record-args "--gc"] [--threads 4]
#
# Prints a line per run and the medians.
require "optparse"
require_relative "support/measure"
require_relative "support/server_bench"

APP = File.expand_path("../spec/fixtures/sinatra_app", __dir__)
# The cheap one first: the bench waits for it to answer.
PATHS = ["/api/status", "/items/7", "/report"].freeze

options = { rounds: 8, seconds: 6, hz: 99, threads: 4 }
OptionParser.new do |o|
  o.on("--rounds N", Integer) { |v| options[:rounds] = v }
  o.on("--seconds N", Integer) { |v| options[:seconds] = v }
  o.on("--hz N", Integer) { |v| options[:hz] = v }
  o.on("--threads N", Integer, "Puma's threads per worker (default 4)") { |v| options[:threads] = v }
  o.on("--record-args ARGS", "more options for record, e.g. \"--ticks cpu --gc\"") { |v| options[:record_args] = v.split }
end.parse!

BenchServer.need_programs("bench/sinatra_endpoints.rb", %w[puma wrk])
puts "sinatra endpoints: puma -w 2 -t #{options[:threads]}:#{options[:threads]}, #{options[:rounds]} rounds of #{options[:seconds]} s, " \
     "profiled at #{options[:hz]} Hz #{options[:record_args]&.join(' ')}, load average #{BenchMeasure.load_average}"
pairs = BenchServer.alternate(options[:rounds]) do |kind, _|
  BenchServer.endpoints_run(kind, options, name: "sinatra", paths: PATHS) do |port, pidfile, _dir, truth, inner|
    [["puma", "-w", "2", "-t", "#{options[:threads]}:#{options[:threads]}", "--preload", "-b", "tcp://127.0.0.1:#{port}", "--pidfile", pidfile,
      File.join(APP, "config.ru")], { "SINATRA_APP_TRUTH" => truth, "SINATRA_APP_INNER_TRUTH" => inner }]
  end
end
BenchServer.endpoints_report(pairs)
