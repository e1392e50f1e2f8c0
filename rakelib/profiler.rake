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

namespace :bench do
  desc "The profiler's overhead on examples/hot_spot.rb's work at 99 Hz (RUNS=7)"
  task profiler_overhead: :compile do
    sh(RbConfig.ruby, "bench/profiler_overhead.rb", "--runs", ENV.fetch("RUNS", "7"))
  end
end
