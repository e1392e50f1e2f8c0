# frozen_string_literal: true

require "fileutils"
require "rbconfig"
require "rubygems"

# How the native extension is built with cargo, shared by extconf.rb (`gem install`, and
# Bundler's `git:` sources), the Rakefile's `compile` (a checkout) and lib/ddprof_recorder.rb
# (the first require from a source tree without the library, as with Bundler's `path:`): the
# same cargo, the same Ruby to build against, the same library taken out of cargo's target
# directory.
module DdprofRecorderBuild
  # The oldest Rust that builds the extension: the core uses `slice::as_chunks` (Rust 1.88);
  # the locked dependencies ask for 1.85 at most (magnus 0.9, prost 0.14). The workspace
  # declares it as `rust-version` (Cargo.toml), so clippy flags std APIs newer than that.
  MIN_RUST = "1.88"
  # The cdylib crate (ext/ddprof_recorder/Cargo.toml) and the top of the workspace.
  PACKAGE = "ddprof_recorder"
  WORKSPACE = File.expand_path("../..", __dir__)
  HOW_TO_GET_RUST = "install Rust #{MIN_RUST} or newer with rustup (https://rustup.rs), " \
                    "or set CARGO=/path/to/cargo, then try again"
  # What a failed build most often lacks, after cargo's own messages.
  BUILD_FAILED = "ddprof_recorder: `cargo build` failed (its messages are above). It needs libclang " \
                 "for bindgen (Debian/Ubuntu: apt-get install libclang-dev; or set LIBCLANG_PATH) " \
                 "and Ruby's headers (ruby-dev)."

  # The cargo features of the checkout's build (`rake compile`), which the specs, the GC.stress
  # run and `rake rubies` run on: `test-panics`, the deliberate panics of
  # StackRecorder::Testing (ext/ddprof_recorder/Cargo.toml). The gem's build (extconf.rb) and
  # the build at the first require (lib/ddprof_recorder/source_build.rb) turn none on.
  TEST_FEATURES = %w[test-panics].freeze

  # Raised with a one-line message for the person installing the gem.
  class Error < StandardError; end

  module_function

  # @return [String] the path of cargo: `$CARGO`, else the first `cargo` on PATH, else
  #   rustup's `~/.cargo/bin/cargo` (a shell that never loaded `~/.cargo/env`, or `sudo gem
  #   install`, has no rustup on its PATH).
  # @raise [Error] if none is found, or it is older than {MIN_RUST}.
  def cargo
    found = cargo_candidates.find { |path| File.file?(path) && File.executable?(path) }
    raise Error, "cargo (Rust's build tool) was not found on PATH nor in ~/.cargo/bin: #{HOW_TO_GET_RUST}" unless found

    version = cargo_version(found)
    if version && version < Gem::Version.new(MIN_RUST)
      raise Error, "#{found} is cargo #{version}, too old to build ddprof_recorder: #{HOW_TO_GET_RUST}"
    end

    found
  end

  def cargo_candidates
    exe = RbConfig::CONFIG["EXEEXT"]
    path = ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).reject(&:empty?).map { |dir| File.join(dir, "cargo#{exe}") }
    home = begin
      File.join(Dir.home, ".cargo", "bin", "cargo#{exe}")
    rescue ArgumentError # no HOME
      nil
    end
    [ENV["CARGO"], *path, home].compact.reject(&:empty?)
  end

  # @return [Gem::Version, nil] from `cargo --version` ("cargo 1.95.0 (f2d3ce0bd 2026-03-21)"),
  #   nil if it does not say (then cargo itself will complain, if it must).
  def cargo_version(cargo)
    out = IO.popen([cargo, "--version"], err: File::NULL, &:read)
    version = out[/\Acargo (\d+\.\d+\.\d+)/, 1]
    version && Gem::Version.new(version)
  rescue SystemCallError
    nil
  end

  # The environment of `cargo build`: rb-sys's build script reads RbConfig from the `ruby`
  # named by RUBY (else the first on PATH), so this names the Ruby running us. Both builds
  # set it alike, which also keeps cargo from rebuilding rb-sys when they share a target
  # directory.
  def env
    { "RUBY" => RbConfig.ruby }
  end

  # @param target_dir [String] cargo's target directory.
  # @param locked [Boolean] refuse to change Cargo.lock (an installed gem builds exactly the
  #   versions it was tested with).
  # @param features [Array<String>] the package's cargo features to turn on: none for the gem,
  #   {TEST_FEATURES} for the specs.
  # @return [Array<String>] the `cargo build` command line (cargo's path first).
  def command(cargo, target_dir:, locked:, features: [])
    [cargo, "build", "--release", *("--locked" if locked), "--package", PACKAGE,
     *(["--features", features.join(",")] unless features.empty?),
     "--manifest-path", File.join(WORKSPACE, "Cargo.toml"), "--target-dir", target_dir]
  end

  # Builds the extension with cargo (its output goes to this process's stdout and stderr) and
  # puts it at `dest`. Copy then rename: a process that has the old library loaded keeps its
  # (unlinked) file, where `cp` would rewrite the mapped pages under it and crash it (seen in
  # RSpec runs that overlapped a `rake compile`); and concurrent builds (cargo waits for its
  # lock on the target directory) each put a whole file there.
  #
  # @param target_dir [String] cargo's target directory.
  # @param locked [Boolean] see {.command}.
  # @param dest [String] where the library goes, e.g. `lib/ddprof_recorder/ddprof_recorder.so`.
  # @param features [Array<String>] see {.command}.
  # @raise [Error] if cargo is missing or the build fails.
  def build(target_dir:, locked:, dest:, features: [])
    command = command(cargo, target_dir: target_dir, locked: locked, features: features)
    yield command if block_given?
    raise Error, BUILD_FAILED unless system(env, *command)

    tmp = "#{dest}.#{Process.pid}.tmp"
    FileUtils.cp(File.join(target_dir, "release", cdylib_name), tmp)
    File.rename(tmp, dest)
  ensure
    FileUtils.rm_f(tmp) if tmp
  end

  # @return [String] the file cargo makes for the cdylib, under `<target>/release/`.
  def cdylib_name
    case RbConfig::CONFIG["host_os"]
    when /darwin/ then "lib#{PACKAGE}.dylib"
    when /mswin|mingw|cygwin/ then "#{PACKAGE}.dll"
    else "lib#{PACKAGE}.so"
    end
  end

  # @return [String] the library's name where Ruby loads it: `ddprof_recorder.<DLEXT>`
  #   (`.so` on Linux and Windows, `.bundle` on macOS).
  def dlib_name
    "#{PACKAGE}.#{RbConfig::CONFIG['DLEXT']}"
  end
end
