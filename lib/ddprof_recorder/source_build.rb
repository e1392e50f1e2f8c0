# frozen_string_literal: true

require "rbconfig"

module DdprofRecorder
  # Builds the native extension at the first `require "ddprof_recorder"` from a source tree
  # that lacks it.
  #
  # `gem install` builds it (ext/ddprof_recorder/extconf.rb), and so does Bundler for a `git:`
  # source, but Bundler never builds the extensions of a `path:` gem (Bundler 2.3's
  # Source::Path#install installs its executables with `disable_extensions: true`): an
  # application whose Gemfile says `gem "ddprof_recorder", path: "..."` would otherwise fail
  # at its first require until someone runs `rake compile` in that directory. So, when the
  # library is missing and the gem's directory has the Cargo workspace, this runs the same
  # cargo build as `rake compile` (into that directory's target/, or CARGO_TARGET_DIR) and
  # puts the library into lib/, saying so on stderr first. Concurrent first requires (a
  # server's workers) are safe: cargo lets one build at a time per target directory, and the
  # library is renamed into place whole.
  #
  # DDPROF_RECORDER_BUILD=0 turns this off (the require then raises LoadError at once).
  module SourceBuild
    ROOT = File.expand_path("../..", __dir__)
    HELPER = File.join(ROOT, "ext", "ddprof_recorder", "cargo_build.rb")

    module_function

    # The library's path in this tree's lib/, if it is there.
    #
    # @return [String, nil]
    def existing_library
      path = File.join(ROOT, "lib", "ddprof_recorder", "ddprof_recorder.#{RbConfig::CONFIG['DLEXT']}")
      File.file?(path) ? path : nil
    end

    # Builds the library, or raises LoadError saying how to get it. Only a missing library is
    # built: one that is there but does not load (built for another Ruby, or damaged) gets its
    # error and how to rebuild it, rather than a two-minute build inside the application.
    #
    # @param error [LoadError] why it could not be loaded.
    # @param existing [String, nil] the library that failed to load, if there is one.
    # @raise [LoadError]
    def build_or_raise(error, existing: existing_library)
      if existing
        raise LoadError, "ddprof_recorder's native extension #{existing} does not load (#{error.message}); built for " \
                         "another Ruby? Rebuild it: `rake compile` in #{ROOT}, or reinstall the gem"
      end
      unless File.file?(HELPER) && File.file?(File.join(ROOT, "Cargo.toml"))
        raise LoadError, "ddprof_recorder's native extension is missing (reinstall the gem: `gem install` builds it): #{error.message}"
      end
      if ENV["DDPROF_RECORDER_BUILD"] == "0"
        raise LoadError, "ddprof_recorder's native extension is not built (run `rake compile` in #{ROOT}; " \
                         "DDPROF_RECORDER_BUILD=0 keeps `require` from building it): #{error.message}"
      end

      require HELPER
      build
    end

    # The cargo build, once HELPER is loaded. A method of its own because its rescue names
    # DdprofRecorderBuild: in {.build_or_raise}, the LoadErrors raised before the require
    # turned into a NameError for that constant.
    #
    # @raise [LoadError] if the build fails.
    def build
      dest = File.join(ROOT, "lib", "ddprof_recorder", DdprofRecorderBuild.dlib_name)
      target = File.expand_path(ENV.fetch("CARGO_TARGET_DIR", "target"), ROOT)
      warn "ddprof_recorder: the native extension is not built in #{ROOT}; building it now with cargo " \
           "(once; about 2 minutes from scratch; DDPROF_RECORDER_BUILD=0 to not)"
      # cargo's progress goes to stderr; stdout is the program's.
      DdprofRecorderBuild.build(target_dir: target, locked: true, dest: dest) { |_command| $stdout.flush }
    rescue DdprofRecorderBuild::Error => e
      raise LoadError, "ddprof_recorder's native extension could not be built: #{e.message}"
    end
  end
end
