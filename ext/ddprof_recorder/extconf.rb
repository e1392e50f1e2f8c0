# frozen_string_literal: true

# Configures the native extension for `gem install` and `bundle install`: writes a Makefile
# whose `make` runs `cargo build --release` on the Cargo workspace packaged with the gem and
# whose `make install` puts `ddprof_recorder.<DLEXT>` into RubyGems' extension directory
# (`require "ddprof_recorder/ddprof_recorder"`; RubyGems also copies it into lib/).
#
# rb-sys's `create_rust_makefile` is the usual way, but its gem (rb_sys) is not installable
# everywhere (no RubyGems on our machines); this is the part of it that we need. mkmf still
# writes the system section (install directories, DESTDIR, RM, INSTALL_PROG), which RubyGems
# points at its own directories through RbConfig.
#
# Environment:
#   CARGO             the cargo to use (default: PATH, then ~/.cargo/bin/cargo)
#   DDPROF_RECORDER_UNTESTED_RUBY=1   builds on a Ruby other than TESTED_RUBIES (below)
#   CARGO_TARGET_DIR  cargo's target directory, kept after the install: give an absolute path,
#                     and builds that share it reuse each other's work (a relative one is taken
#                     from this directory). Without it cargo builds in ./target here, which
#                     `make install` removes: RubyGems 3.3 runs no `make clean` after
#                     installing, and that tree (300 MB) would stay in the installed gem.
require "shellwords"
require_relative "cargo_build"

# Before mkmf, whose exit handler would add its own banner to our one line.
# Where it is built and tested (README, "Supported Rubies"): the profiler needs Linux (thread
# CPU clocks by thread id, per-thread timers, /proc), and its VM facts are checked for these
# Rubies only (ext/ddprof_recorder/src/vm/mod.rs).
TESTED_RUBIES = %w[3.1 3.3 3.4].freeze
unless RUBY_PLATFORM.include?("linux")
  abort "ddprof_recorder: it builds on Linux only, not on #{RUBY_PLATFORM} (its profiler uses Linux's thread clocks and timers)"
end
minor = RUBY_VERSION[/\A\d+\.\d+/]
unless TESTED_RUBIES.include?(minor) || ENV["DDPROF_RECORDER_UNTESTED_RUBY"] == "1"
  abort "ddprof_recorder: Ruby #{RUBY_VERSION} is untested (tested: #{TESTED_RUBIES.join(', ')}); " \
        "DDPROF_RECORDER_UNTESTED_RUBY=1 builds it anyway"
end

begin
  cargo = DdprofRecorderBuild.cargo
rescue DdprofRecorderBuild::Error => e
  abort "ddprof_recorder: #{e.message}"
end

require "mkmf"
puts "ddprof_recorder: building with #{cargo} against #{RbConfig.ruby}"

own_target_dir = ENV["CARGO_TARGET_DIR"].to_s.empty?
target_dir = own_target_dir ? File.join(Dir.pwd, "target") : File.expand_path(ENV["CARGO_TARGET_DIR"])
# No cargo features: TEST_FEATURES are the specs' (`rake compile`), not the gem's.
build = DdprofRecorderBuild.command(cargo, target_dir: target_dir, locked: true)
cargo_env = DdprofRecorderBuild.env.map { |k, v| "#{k}=#{v.shellescape}" }.join(" ")
# Removes the target directory, only when it is ours.
remove_target = own_target_dir ? "-$(RM_RF) #{target_dir.shellescape}" : "@:"

File.open("Makefile", "w") do |mk|
  mk.puts(configuration($srcdir))
  mk.puts(<<~MAKE.gsub(/^ {2}(?=\S)/, "\t"))
    #### ddprof_recorder: the library is built by cargo. ####
    target_prefix = /ddprof_recorder
    RUBYARCHDIR = $(sitearchdir)$(target_prefix)
    DLLIB = #{DdprofRecorderBuild.dlib_name}
    CARGO_CDYLIB = #{File.join(target_dir, 'release', DdprofRecorderBuild.cdylib_name).shellescape}

    all: $(DLLIB)

    # Always asks cargo, which knows what is up to date.
    $(DLLIB): FORCE
      $(ECHO) cargo build --release --package #{DdprofRecorderBuild::PACKAGE}
      $(Q) #{cargo_env} #{build.shelljoin} || { echo #{DdprofRecorderBuild::BUILD_FAILED.shellescape} >&2; exit 1; }
      $(Q) $(COPY) $(CARGO_CDYLIB) $@

    # The build's own copy goes once installed: RubyGems 3.3 runs no `make clean`, and it
    # would stay in the installed gem's ext/ beside the two RubyGems keeps (its extension
    # directory, and lib/).
    install: $(DLLIB)
      $(Q) $(MAKEDIRS) $(RUBYARCHDIR)
      $(Q) $(INSTALL_PROG) $(DLLIB) $(RUBYARCHDIR)
      -$(Q) $(RM) $(DLLIB)
      #{remove_target}

    clean:
      -$(Q) $(RM) $(DLLIB)
      #{remove_target}

    distclean: clean
      -$(Q) $(RM) Makefile mkmf.log

    FORCE:
    .PHONY: all install clean distclean FORCE
  MAKE
end
