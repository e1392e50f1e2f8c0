# frozen_string_literal: true

# The Rails app the benchmarks serve (spec/fixtures/rails_app, Debian's Rails 6.1) and how:
# Puma in cluster mode, 2 workers of 4 threads, as bench/rails_endpoints.rb and the `rails`
# program of bench/accuracy.rb run it.
module BenchRailsApp
  APP = File.expand_path("../../spec/fixtures/rails_app", __dir__)
  # Its five endpoints, which wrk sends in turn: PagesController#index, #heavy (a CPU loop),
  # ItemsController#index (a collection render), #show, ApiController#stats (JSON, queries).
  PATHS = ["/", "/heavy", "/items", "/items/7", "/api/stats"].freeze
  # The app's own Puma settings (preload_app!, before_fork).
  PUMA_CONFIG = File.join(APP, "config", "puma.rb")

  module_function

  # @param config [String] Puma's config file (PUMA_CONFIG, or one that loads it and adds hooks).
  def puma(port:, pidfile:, config: PUMA_CONFIG)
    ["puma", "-C", config, "-w", "2", "-t", "4:4", "-b", "tcp://127.0.0.1:#{port}", "--pidfile", pidfile,
     File.join(APP, "config.ru")]
  end

  # The app's environment: its database and log in `dir`/tmp; with `truth`, the RequestCpu
  # truth hook on, writing `truth`.<pid>.
  def env(dir, truth: nil)
    { "RAILS_APP_TMP" => File.join(dir, "tmp") }.merge(truth ? { "RAILS_APP_TRUTH" => truth } : {})
  end

  # Aborts unless Debian's Rails can run here (it is for Debian's Ruby, 3.1).
  def check(bench)
    abort "#{bench}: Debian's Rails is for Ruby 3.1" unless RUBY_VERSION.start_with?("3.1")
  end
end
