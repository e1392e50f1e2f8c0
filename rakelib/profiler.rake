# frozen_string_literal: true

# The profiler's tasks: profile the example, regenerate the README's flamegraph, measure the
# profiler's overhead. How the profiler works: docs/profiler.md.
require "rbconfig"

PROFILER_CLI = ["exe/ddprof-recorder"].freeze

desc "Profile examples/hot_spot.rb: tmp/hot_spot.pb.gz, its top table and tmp/hot_spot.svg"
task example: :compile do
  mkdir_p "tmp"
  sh(*PROFILER_CLI, "record", "-o", "tmp/hot_spot.pb.gz", "--", RbConfig.ruby, "examples/hot_spot.rb")
  sh(*PROFILER_CLI, "top", "tmp/hot_spot.pb.gz", "-n", "10")
  sh(*PROFILER_CLI, "flamegraph", "tmp/hot_spot.pb.gz", "-o", "tmp/hot_spot.svg")
end

namespace :docs do
  desc "Regenerate docs/flamegraph.svg from a fresh profile of examples/hot_spot.rb"
  task flamegraph: :compile do
    mkdir_p "tmp"
    sh({ "SECONDS" => "3" }, *PROFILER_CLI, "record", "-o", "tmp/docs_hot_spot.pb.gz", "--", RbConfig.ruby, "examples/hot_spot.rb")
    sh(*PROFILER_CLI, "flamegraph", "tmp/docs_hot_spot.pb.gz", "-o", "docs/flamegraph.svg",
       "--title", "examples/hot_spot.rb, cpu-time (ddprof-recorder flamegraph)")
  end
end

namespace :viewers do
  desc "The example's profile in speedscope and as a flamegraph, in headless Chromium: tmp/viewers/*.png"
  task screenshots: :example do
    require_relative "../spec/support/viewers"
    Viewers.ensure_ready!(browser: true)
    mkdir_p "tmp/viewers"
    sh(*PROFILER_CLI, "speedscope", "tmp/hot_spot.pb.gz", "-o", "tmp/viewers/hot_spot.speedscope.json")
    sh(*PROFILER_CLI, "flamegraph", "tmp/hot_spot.pb.gz", "-o", "tmp/viewers/hot_spot.svg")
    { "speedscope" => "tmp/viewers/hot_spot.speedscope.json", "svg" => "tmp/viewers/hot_spot.svg" }.each do |kind, file|
      png = "tmp/viewers/#{kind}.png"
      report = Viewers.check(kind, File.expand_path(file), File.expand_path(png))
      names = report["drawn"] || report["texts"].map(&:strip)
      puts "#{png}: #{report['errors'].empty? ? 'no page errors' : report['errors']}; names shown: #{names.grep(/\A[a-z_]+\z/).uniq.join(', ')}"
    end
  rescue Viewers::Unavailable => e
    abort "viewers:screenshots: #{e.message}"
  end
end

namespace :bench do
  desc "The profiler's overhead on examples/hot_spot.rb's work at 99 Hz (RUNS=7)"
  task profiler_overhead: :compile do
    sh(RbConfig.ruby, "bench/profiler_overhead.rb", "--runs", ENV.fetch("RUNS", "7"))
  end
end
