# frozen_string_literal: true

require "digest"
require "fileutils"
require "json"
require "open3"

# What the viewers make of our files: speedscope's JSON schema (ajv) and headless Chromium
# (speedscope's own page, and flamegraph SVGs), through spec/viewers/check.mjs.
#
# The npm packages (spec/viewers/package.json, versions pinned by its package-lock.json) are
# installed with `npm ci` into spec/viewers/node_modules (gitignored) the first time a spec
# needs them, and again when the lock file changes; npm's own cache (~/.npm) keeps the
# downloads. Without node, npm or Chromium the examples are skipped, except in CI (CI=true),
# where script/setup installs them and a missing one is a failure. `rake viewers:screenshots`
# uses it too, outside RSpec.
module Viewers
  DIR = File.expand_path("../viewers", __dir__)
  LOCK = File.join(DIR, "package-lock.json")
  STAMP = File.join(DIR, "node_modules", ".ddprof-lock-sha256")

  # Raised when a viewer check cannot run (skipped outside CI).
  class Unavailable < StandardError; end

  class << self
    def chromium
      ENV.fetch("CHROMIUM", "/usr/bin/chromium")
    end

    # Makes sure node, the npm packages and (if `browser`) Chromium are there.
    # @raise [Unavailable]
    def ensure_ready!(browser: false)
      @ready ||= install
      raise Unavailable, @ready unless @ready == true
      raise Unavailable, "no Chromium at #{chromium} (apt-get install chromium, or set CHROMIUM)" if browser && !File.executable?(chromium)
    end

    # Runs `node check.mjs *args` and returns its JSON report.
    def check(*args, timeout: 60)
      out, err, status = Open3.capture3({ "CHROMIUM" => chromium }, "timeout", timeout.to_s, "node",
                                        File.join(DIR, "check.mjs"), *args)
      report = begin
        JSON.parse(out.lines.last.to_s)
      rescue JSON::ParserError
        nil
      end
      raise "check.mjs #{args.first} failed (#{status}):\n#{out}\n#{err}" unless status.success? && report

      report
    end

    private

    # true, or why the packages cannot be had.
    def install
      return "node is not on PATH (apt-get install nodejs npm)" unless command?("node")

      wanted = Digest::SHA256.file(LOCK).hexdigest
      return true if File.exist?(STAMP) && File.read(STAMP) == wanted
      return "npm is not on PATH (apt-get install npm)" unless command?("npm")

      out, status = Open3.capture2e("npm", "ci", "--no-audit", "--no-fund", "--loglevel=error", chdir: DIR)
      return "npm ci in spec/viewers failed:\n#{out}" unless status.success?

      File.write(STAMP, wanted)
      true
    end

    def command?(name)
      ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).any? { |dir| File.executable?(File.join(dir, name)) }
    end
  end

  # For example groups: `before(:context) { viewers_ready!(browser: true) }`.
  def viewers_ready!(browser: false)
    Viewers.ensure_ready!(browser: browser)
  rescue Viewers::Unavailable => e
    raise "#{e.message} (CI must run this)" if ENV["CI"]

    skip e.message
  end
end

RSpec.configure { |config| config.include Viewers } if defined?(RSpec)
