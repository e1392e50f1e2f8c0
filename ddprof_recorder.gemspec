# frozen_string_literal: true

require_relative "lib/ddprof_recorder/version"

Gem::Specification.new do |spec|
  spec.name = "ddprof_recorder"
  spec.version = DdprofRecorder::VERSION
  spec.summary = "A profiler's sample recorder: aggregates stacks and hands back pprof, never blocking the sampler"
  spec.description = <<~TEXT
    The part of a Ruby profiler that keeps the samples (stacks, values, labels), aggregates
    them and returns a pprof profile per time window, with a Rust core (magnus + rb-sys).
    A reimplementation of dd-trace-rb's StackRecorder.
  TEXT
  spec.license = "Apache-2.0"
  spec.authors = ["ddprof_recorder developers"]
  spec.homepage = "https://example.invalid/ddprof_recorder"
  spec.required_ruby_version = ">= 3.0"

  spec.files = Dir[
    "lib/**/*.rb", "ext/**/*.{rs,toml}", "crates/**/*.{rs,toml}", "exe/*",
    "Cargo.toml", "Cargo.lock", "Rakefile", "README.md"
  ]
  spec.bindir = "exe"
  spec.executables = Dir["exe/*"].map { |f| File.basename(f) }
  spec.require_paths = ["lib"]

  spec.add_development_dependency "google-protobuf", ">= 3.21"
  spec.add_development_dependency "rake", ">= 13"
  spec.add_development_dependency "rspec", ">= 3.12"
end
