# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

# The gem as a user gets it: `gem build`, then `gem install --local` into a clean GEM_HOME
# (which compiles the extension with cargo, through ext/ddprof_recorder/extconf.rb), then
# require, profile and serialize from outside the checkout, `ddprof-recorder record` from the
# installed executable, and an application whose Gemfile names the gem by `path:`, after
# `bundle install --local`. go tool pprof reads what they write.
#
# cargo builds in the checkout's target directory (CARGO_TARGET_DIR if set, as for a Ruby other
# than Debian's (rakelib/rubies.rake), else target/; the extconf honors it), so the
# dependencies compiled by `rake compile` for this Ruby are reused: only the workspace's own
# crates, now at the installed gem's path, are compiled again (about 20 s each, against 2 min
# from nothing). The cdylib in <target>/release is then the installed gem's build, of the same
# sources.
RSpec.describe "the gem, built and installed as a user would" do
  root = File.expand_path("../..", __dir__)
  gemspec = Dir.chdir(root) { Gem::Specification.load(File.join(root, "ddprof_recorder.gemspec")) }
  version = DdprofRecorder::VERSION

  # A program with a hot method, profiled by `record`.
  app_rb = <<~RUBY
    def checkout_app_hot_method
      x = 0
      i = 0
      while i < 3_000_000 # bytecode only: all of its CPU is its own
        x += i
        i += 1
      end
      x
    end
    3.times { checkout_app_hot_method }
    puts "app done"
  RUBY

  # In-process use: profile a block, serialize, write the pprof; print where the library came from.
  profile_rb = <<~RUBY
    require "ddprof_recorder"
    def gem_spec_block_work = 2_000_000.times.sum
    pprof = DdprofRecorder::Profiler.new(hz: 199).profile { 3.times { gem_spec_block_work } }
    File.binwrite(ARGV.fetch(0), pprof)
    puts $LOADED_FEATURES.grep(/ddprof_recorder\\.#{RbConfig::CONFIG['DLEXT']}\\z/)
  RUBY

  def self.go?
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).any? { |dir| File.executable?(File.join(dir, "go")) }
  end

  def timed
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    result = yield
    [result, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started]
  end

  # Runs a command; returns [combined output, success?].
  def run(env, *command, chdir:)
    out, status = Open3.capture2e(env, *command, chdir: chdir)
    [out, status.success?]
  end

  # go tool pprof -top's function names for a file, most wall-time first.
  def pprof_top(file)
    out, status = Open3.capture2e({ "HOME" => @dir, "GOTOOLCHAIN" => "local", "GOPROXY" => "off" },
                                  "go", "tool", "pprof", "-top", "-sample_index=cpu-time", "-symbolize=none", file)
    raise "go tool pprof failed on #{file}:\n#{out}" unless status.success?

    out
  end

  # Environment for every command below: nothing of this process's own Ruby or Bundler setup.
  define_method(:clean_env) do
    { "RUBYOPT" => nil, "RUBYLIB" => nil, "BUNDLE_GEMFILE" => nil, "BUNDLE_BIN_PATH" => nil,
      "DDPROF_RECORDER_BUILD" => nil, "CARGO_TARGET_DIR" => File.expand_path(ENV.fetch("CARGO_TARGET_DIR", "target"), root) }
  end

  describe "the packaged file list" do
    tracked = Dir.chdir(root) { `git ls-files -z 2>/dev/null`.split("\0") }

    it "holds every workspace member's manifest and sources, Cargo.lock and the build script" do
      skip "not a git checkout" if tracked.empty?
      members = File.read(File.join(root, "Cargo.toml"))[/^members\s*=\s*\[([^\]]*)\]/, 1].scan(/"([^"]+)"/).flatten
      expect(members).to include("crates/core", "ext/ddprof_recorder", "bench")
      needed = members.flat_map do |member|
        tracked.select { |f| f == "#{member}/Cargo.toml" || f == "#{member}/build.rs" || f.start_with?("#{member}/src/") }
      end
      needed += %w[Cargo.toml Cargo.lock ext/ddprof_recorder/extconf.rb ext/ddprof_recorder/cargo_build.rb
                   ddprof_recorder.gemspec exe/ddprof-recorder]
      needed += tracked.grep(%r{\Alib/.*\.rb\z})
      expect(needed - gemspec.files).to eq([])
      expect(gemspec.extensions).to eq(["ext/ddprof_recorder/extconf.rb"])
    end
  end

  # The README quoted 290,304 bytes while `gem build` made 372,736: a size it quotes is checked
  # here, within 5% (it changes with the code; the README says "about").
  describe "the README's .gem sizes" do
    readme = File.read(File.join(root, "README.md"))

    it "are within 5% of what gem build makes" do
      kib = readme[/^gem build ddprof_recorder\.gemspec\s+# ddprof_recorder-[\d.]+\.gem, about (\d+) KiB$/, 1]
      bytes = readme[/the \.gem is about ([\d,]+) bytes/, 1]
      expect([kib, bytes]).to all(be_a(String)), "the README's two .gem sizes were not found"
      size = Dir.mktmpdir("ddprof_recorder_gem_size") do |dir|
        gem = File.join(dir, "ddprof_recorder.gem")
        out, status = Open3.capture2e(clean_env, "gem", "build", "ddprof_recorder.gemspec", "--output", gem, chdir: root)
        expect(status).to be_success, out
        File.size(gem)
      end
      expect(Integer(kib) * 1024).to be_within(size * 0.05).of(size)
      expect(Integer(bytes.delete(","))).to be_within(size * 0.05).of(size)
    end
  end

  describe "ext/ddprof_recorder/extconf.rb without a usable cargo" do
    extconf = File.join(root, "ext", "ddprof_recorder", "extconf.rb")

    around do |example|
      Dir.mktmpdir("ddprof_recorder_extconf") do |dir|
        @dir = dir
        example.run
      end
    end

    # Runs the extconf as RubyGems does (in the build directory); returns [stderr, stdout, status].
    def extconf_run(extconf, env)
      out, err, status = Open3.capture3(env, RbConfig.ruby, extconf, chdir: @dir)
      [err, out, status]
    end

    it "fails with one line that says how to get Rust when there is no cargo" do
      path = File.dirname(RbConfig.ruby) # ruby, but no cargo (nor ~/.cargo/bin: HOME is empty)
      err, _, status = extconf_run(extconf, "PATH" => path, "HOME" => @dir, "CARGO" => nil)
      expect(status.success?).to be(false)
      expect(err).to eq("ddprof_recorder: cargo (Rust's build tool) was not found on PATH nor in ~/.cargo/bin: " \
                        "install Rust 1.88 or newer with rustup (https://rustup.rs), or set CARGO=/path/to/cargo, then try again\n")
      expect(File.exist?(File.join(@dir, "Makefile"))).to be(false)
    end

    it "fails with one line when cargo is too old" do
      old = File.join(@dir, "old-cargo")
      File.write(old, "#!/bin/sh\necho 'cargo 1.63.0'\n")
      File.chmod(0o755, old)
      err, _, status = extconf_run(extconf, "CARGO" => old)
      expect(status.success?).to be(false)
      expect(err).to eq("ddprof_recorder: #{old} is cargo 1.63.0, too old to build ddprof_recorder: install Rust 1.88 " \
                        "or newer with rustup (https://rustup.rs), or set CARGO=/path/to/cargo, then try again\n")
    end

    it "writes a Makefile that builds with cargo, into CARGO_TARGET_DIR when given, and keeps it" do
      _, out, status = extconf_run(extconf, "CARGO_TARGET_DIR" => File.join(@dir, "shared"))
      expect(status.success?).to be(true)
      expect(out).to match(%r{\Addprof_recorder: building with \S*cargo against #{Regexp.escape(RbConfig.ruby)}\n\z})
      makefile = File.read(File.join(@dir, "Makefile"))
      expect(makefile).to include("RUBY=#{RbConfig.ruby}", "build --release --locked --package ddprof_recorder",
                                  "--target-dir #{File.join(@dir, 'shared')}", "DLLIB = ddprof_recorder.#{RbConfig::CONFIG['DLEXT']}",
                                  "RUBYARCHDIR = $(sitearchdir)$(target_prefix)")
      expect(makefile).not_to include("$(RM_RF) #{File.join(@dir, 'shared')}")
      _, _, status = extconf_run(extconf, "CARGO_TARGET_DIR" => nil)
      expect(status.success?).to be(true)
      expect(File.read(File.join(@dir, "Makefile"))).to include("$(RM_RF) #{File.join(@dir, 'target')}")
    end
  end

  describe "the first require from a source tree without the library, with DDPROF_RECORDER_BUILD=0" do
    it "raises LoadError saying how to build it, and builds nothing" do
      # This checkout has its library: `existing: nil` stands for a tree without one.
      script = "require #{File.join(root, 'lib', 'ddprof_recorder', 'source_build').dump}; " \
               'DdprofRecorder::SourceBuild.build_or_raise(LoadError.new("no library"), existing: nil)'
      _, err, status = Open3.capture3(clean_env.merge("DDPROF_RECORDER_BUILD" => "0"), RbConfig.ruby, "-e", script)
      expect(status.success?).to be(false)
      expect(err).to include("ddprof_recorder's native extension is not built (run `rake compile` in #{root}; " \
                             "DDPROF_RECORDER_BUILD=0 keeps `require` from building it): no library (LoadError)")
    end
  end

  describe "a require whose library is there but does not load (built for another Ruby)" do
    it "raises its LoadError with how to rebuild it, and builds nothing" do
      script = "require #{File.join(root, 'lib', 'ddprof_recorder', 'source_build').dump}; " \
               'DdprofRecorder::SourceBuild.build_or_raise(LoadError.new("undefined symbol: rb_foo"))'
      _, err, status = Open3.capture3(clean_env, RbConfig.ruby, "-e", script)
      expect(status.success?).to be(false)
      library = File.join(root, "lib", "ddprof_recorder", "ddprof_recorder.#{RbConfig::CONFIG['DLEXT']}")
      expect(err).to include("ddprof_recorder's native extension #{library} does not load (undefined symbol: rb_foo); " \
                             "built for another Ruby? Rebuild it: `rake compile` in #{root}, or reinstall the gem")
      expect(err).not_to include("building it now with cargo")
    end
  end

  describe "gem build, gem install --local into a clean GEM_HOME" do
    before(:context) do
      @dir = Dir.mktmpdir("ddprof_recorder_gem")
      @gem = File.join(@dir, "ddprof_recorder-#{version}.gem")
      @gem_home = File.join(@dir, "gem_home")
      @app = File.join(@dir, "app")
      FileUtils.mkdir_p(@app)
      File.write(File.join(@app, "app.rb"), app_rb)
      File.write(File.join(@app, "profile.rb"), profile_rb)
      env = clean_env
      (@build_out, @build_ok), @build_seconds = timed { run(env, "gem", "build", "ddprof_recorder.gemspec", "--output", @gem, chdir: root) }
      @gem_env = env.merge("GEM_HOME" => @gem_home, "GEM_PATH" => @gem_home)
      if @build_ok
        (@install_out, @install_ok), @install_seconds =
          timed { run(@gem_env, "gem", "install", "--local", "--no-document", @gem, chdir: @dir) }
      end
      @installed_files = Dir.glob(File.join(@gem_home, "{gems,extensions}", "**", "*")).select { |f| File.file?(f) }
      # The README's figures come from this line.
      RSpec.configuration.reporter.message(
        format("gem build: %.1f s, %d bytes; gem install --local: %.1f s (cargo target: %s), installed: %d bytes " \
               "in %d files, the library %d times",
               @build_seconds, File.size?(@gem) || 0, @install_seconds || 0, env["CARGO_TARGET_DIR"],
               @installed_files.sum { |f| File.size(f) }, @installed_files.size, installed_libraries.size)
      )
    end

    after(:context) { FileUtils.remove_entry(@dir, true) if @dir }

    def installed_libraries
      @installed_files.select { |f| File.basename(f) == "ddprof_recorder.#{RbConfig::CONFIG['DLEXT']}" }
    end

    it "builds the .gem without warnings" do
      expect(@build_ok).to be(true), @build_out
      expect(@build_out).to include("Successfully built RubyGem")
      expect(@build_out).not_to match(/WARN/i)
      expect(File.size(@gem)).to be < 1_000_000
    end

    it "installs it, compiling the extension into the gem" do
      expect(@install_ok).to be(true), @install_out
      expect(@install_out).to include("Building native extensions", "Successfully installed ddprof_recorder-#{version}")
      installed = File.join(@gem_home, "gems", "ddprof_recorder-#{version}")
      ext = Dir[File.join(@gem_home, "extensions", "*", "*", "ddprof_recorder-#{version}", "ddprof_recorder",
                          "ddprof_recorder.#{RbConfig::CONFIG['DLEXT']}")]
      expect(ext.size).to eq(1)
      # RubyGems keeps two copies (its extension directory, and lib/); the build's own is gone.
      expect(installed_libraries.map { |f| f.delete_prefix(@gem_home) })
        .to contain_exactly(ext.first.delete_prefix(@gem_home),
                            "/gems/ddprof_recorder-#{version}/lib/ddprof_recorder/ddprof_recorder.#{RbConfig::CONFIG['DLEXT']}")
      # cargo's build tree was outside the gem (CARGO_TARGET_DIR); none is left in it.
      expect(Dir.exist?(File.join(installed, "ext", "ddprof_recorder", "target"))).to be(false)
    end

    it "requires from outside the checkout, profiles a block and serializes a pprof that go tool pprof reads" do
      out, ok = run(@gem_env, RbConfig.ruby, "profile.rb", "block.pb.gz", chdir: @app)
      expect(ok).to be(true), out
      expect(out.lines.map(&:chomp)).to all(start_with(File.join(@gem_home, "gems", "ddprof_recorder-#{version}")))
      skip "go is not on PATH" unless self.class.go?
      expect(pprof_top(File.join(@app, "block.pb.gz"))).to include("gem_spec_block_work")
    end

    it "records a program with the installed ddprof-recorder" do
      out, ok = run(@gem_env, File.join(@gem_home, "bin", "ddprof-recorder"), "record", "-o", "app.pb.gz", "--",
                    RbConfig.ruby, "app.rb", chdir: @app)
      expect(ok).to be(true), out
      expect(out).to include("app done", "hottest   Object#checkout_app_hot_method (app.rb)")
      skip "go is not on PATH" unless self.class.go?
      expect(pprof_top(File.join(@app, "app.pb.gz"))).to include("Object#checkout_app_hot_method")
    end

    describe "in an application's Gemfile, by path" do
      before(:context) do
        # The gem's files, as a checkout of it would have them.
        src = File.join(@dir, "src")
        @src = File.join(src, "ddprof_recorder-#{version}")
        _, ok = run(clean_env, "gem", "unpack", @gem, "--target", src, chdir: @dir)
        raise "gem unpack failed" unless ok

        @bundle_app = File.join(@dir, "bundled_app")
        FileUtils.mkdir_p(@bundle_app)
        File.write(File.join(@bundle_app, "app.rb"), app_rb)
        File.write(File.join(@bundle_app, "Gemfile"), <<~RUBY)
          source "https://rubygems.org"
          gem "ddprof_recorder", path: #{@src.inspect}
        RUBY
        # GEM_PATH stays the system's: Bundler itself is Debian's gem.
        @bundle_env = clean_env.merge("GEM_HOME" => File.join(@dir, "bundle_home"), "GEM_PATH" => nil,
                                      "BUNDLE_USER_HOME" => File.join(@dir, "bundle_user"),
                                      "BUNDLE_APP_CONFIG" => File.join(@bundle_app, ".bundle"))
        (@bundle_out, @bundle_ok), @bundle_seconds =
          timed { run(@bundle_env, "bundle", "install", "--local", chdir: @bundle_app) }
        @library = File.join(@src, "lib", "ddprof_recorder", "ddprof_recorder.#{RbConfig::CONFIG['DLEXT']}")
        @built_by_bundler = File.exist?(@library)
        (@first_out, @first_ok), @first_seconds =
          timed { run(@bundle_env, "bundle", "exec", RbConfig.ruby, "-e", 'require "ddprof_recorder"; puts :loaded', chdir: @bundle_app) }
        RSpec.configuration.reporter.message(format("bundle install --local: %.1f s; first require (builds the extension): %.1f s",
                                                    @bundle_seconds, @first_seconds))
      end

      it "installs with bundle install --local; the first require builds the extension, which Bundler does not" do
        expect(@bundle_ok).to be(true), @bundle_out
        expect(@bundle_out).to include("Bundle complete!")
        # Bundler 2.3 (Debian's) also prints "Using ddprof_recorder 0.1.0 from source at ...";
        # Ruby 3.3's and 3.4's Bundler do not: the lock file says it for both.
        expect(File.read(File.join(@bundle_app, "Gemfile.lock")))
          .to include("PATH\n  remote: #{@src}\n  specs:\n    ddprof_recorder (#{version})\n")
        # Bundler builds no extension for a path: gem (see lib/ddprof_recorder/source_build.rb).
        expect(@built_by_bundler).to be(false)
        expect(@first_ok).to be(true), @first_out
        expect(@first_out).to include("ddprof_recorder: the native extension is not built in", "building it now with cargo")
        expect(@first_out).to end_with("loaded\n")
        expect(File.exist?(@library)).to be(true)
      end

      it "profiles a block with bundle exec ruby -e" do
        script = 'require "ddprof_recorder"; pprof = DdprofRecorder::Profiler.profile(hz: 199) { 3_000_000.times.sum }; ' \
                 'File.binwrite("e.pb.gz", pprof); puts DdprofRecorder.top(pprof, limit: 1)[:rows].first[:name]'
        out, ok = run(@bundle_env, "bundle", "exec", RbConfig.ruby, "-e", script, chdir: @bundle_app)
        expect(ok).to be(true), out
        expect(out).to match(/^(Enumerable#sum|Enumerator#each|Integer#times|main)$/)
        skip "go is not on PATH" unless self.class.go?
        expect(pprof_top(File.join(@bundle_app, "e.pb.gz"))).to match(/sum|times/)
      end

      it "records with bundle exec ddprof-recorder record -- ruby app.rb" do
        out, ok = run(@bundle_env, "bundle", "exec", "ddprof-recorder", "record", "-o", "app.pb.gz", "--",
                      "ruby", "app.rb", chdir: @bundle_app)
        expect(ok).to be(true), out
        expect(out).to include("app done", "hottest   Object#checkout_app_hot_method (app.rb)")
        skip "go is not on PATH" unless self.class.go?
        expect(pprof_top(File.join(@bundle_app, "app.pb.gz"))).to include("Object#checkout_app_hot_method")
      end
    end
  end
end
