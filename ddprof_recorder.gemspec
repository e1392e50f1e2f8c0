# frozen_string_literal: true

require_relative "lib/ddprof_recorder/version"

Gem::Specification.new do |spec|
  spec.name = "ddprof_recorder"
  spec.version = DdprofRecorder::VERSION
  spec.summary = "A profiler's sample recorder: aggregates stacks and hands back pprof, never blocking the sampler"
  spec.description = <<~TEXT
    The part of a Ruby profiler that keeps the samples (stacks, values, labels), aggregates
    them and returns a pprof profile per time window, with a Rust core (magnus + rb-sys);
    a reimplementation of dd-trace-rb's StackRecorder. Comes with a sampling profiler, the
    ddprof-recorder command (record, top, flamegraph, speedscope) and a Rack middleware
    that profiles one request. Installing it builds the extension with cargo (Rust 1.88+).
  TEXT
  spec.license = "Apache-2.0"
  spec.authors = ["ddprof_recorder developers"]
  spec.homepage = "https://example.invalid/ddprof_recorder"
  spec.required_ruby_version = [">= 3.1", "< 3.5"] # CI tests 3.1, 3.3 and 3.4 (README, "Supported Rubies")
  spec.requirements = ["Rust 1.88 or newer (cargo), from rustup", "libclang (Debian: libclang-dev), for bindgen"]

  # What cargo needs to build the extension from the installed gem: every member of the
  # workspace (Cargo.toml's `members`, bench included: cargo reads every member's manifest)
  # and the lock file, which `--locked` holds the build to; the gemspec itself, for Bundler's
  # `path:` and `git:` sources. spec/integration/gem_install_spec.rb checks this list against the
  # repository, and builds and installs the gem.
  spec.files = Dir.chdir(__dir__) do
    Dir[
      "ddprof_recorder.gemspec", "lib/**/*.rb", "exe/*",
      "ext/ddprof_recorder/{extconf.rb,cargo_build.rb,Cargo.toml,build.rs}", "ext/ddprof_recorder/src/**/*.rs",
      "crates/core/Cargo.toml", "crates/core/src/**/*.rs",
      "bench/Cargo.toml", "bench/src/**/*.rs",
      "Cargo.toml", "Cargo.lock", "rustfmt.toml",
      "README.md", "docs/*.md", "examples/*.rb"
    ]
  end
  spec.extensions = ["ext/ddprof_recorder/extconf.rb"]
  spec.bindir = "exe"
  spec.executables = ["ddprof-recorder"]
  spec.require_paths = ["lib"]
  spec.metadata["rubygems_mfa_required"] = "true"

  # Logger is a default gem of every supported Ruby (1.5.0 in 3.1, 1.6.4 in 3.4), which Ruby
  # 3.4 warns about when a bundle that does not list it requires it (it leaves the default gems
  # in 3.5): named here, it is part of every bundle that has this gem.
  spec.add_dependency "logger", "~> 1.5"

  # Development only: the versions Debian 12 ships (ruby-google-protobuf, rake, ruby-rspec).
  spec.add_development_dependency "google-protobuf", "~> 3.21"
  spec.add_development_dependency "rake", "~> 13.0"
  spec.add_development_dependency "rspec", "~> 3.12"
end
