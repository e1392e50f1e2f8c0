# frozen_string_literal: true

require "fileutils"
require_relative "../support/rails_app"
require_relative "../support/server_bench"

# Accuracy program `rails` (bench/accuracy.rb): the Rails app of the test suite
# (spec/fixtures/rails_app, Debian's Rails 6.1) on Puma in cluster mode (2 workers of 4
# threads, the app preloaded in the master), loaded by wrk (2 threads, 8 connections) over its
# five endpoints for 1 s of warm-up and then SECONDS. No truth measured. Ruby 3.1 only.
#
# - ours: `ddprof-recorder record --hz N -- puma ...`; each worker writes its file
#   (`rails.pid<N>.pb`), the master's (it only boots the app and forks) is left out, as the
#   reference has none;
# - stackprof: Puma's config is the app's with two hooks added (a file written into the run's
#   directory, #stackprof_config): each worker starts `StackProf.start(mode: :cpu, interval:,
#   raw: true)` when it boots (on_worker_boot: a profiler does not survive fork) and writes
#   StackProf.results with Marshal when it shuts down (on_worker_shutdown, in the worker, once
#   it has served its last request); the workers' dumps are added up.
#
# Both see the workers from their boot to their exit. The app is not told of either.
module AccuracyRails
  module_function

  # Serves the app once under `kind` (:ours or :stackprof) in `dir` (emptied first) and
  # loads it.
  #
  # @return [Array<String>] the workers' files: pprofs for :ours, Marshal dumps for :stackprof.
  # @raise [RuntimeError] if a worker wrote nothing.
  def run(kind, dir, options)
    FileUtils.rm_rf(dir)
    FileUtils.mkdir_p(dir)
    port = BenchServer.free_port
    pidfile = File.join(dir, "puma.pid")
    config = kind == :stackprof ? stackprof_config(dir, options.stackprof_interval) : BenchRailsApp::PUMA_CONFIG
    command = BenchRailsApp.puma(port: port, pidfile: pidfile, config: config)
    command = BenchServer.record(command, hz: options.hz, output: File.join(dir, "rails.pb")) if kind == :ours
    BenchServer.serve(command, port: port, pidfile: pidfile, chdir: dir, env: BenchRailsApp.env(dir),
                               log: File.join(dir, "server.log"), boot_timeout: options.timeout) do
      BenchServer.wrk(port, 1, paths: BenchRailsApp::PATHS, dir: dir)
      BenchServer.wrk(port, options.seconds.ceil, paths: BenchRailsApp::PATHS, dir: dir)
    end
    files = Dir[File.join(dir, kind == :ours ? "rails.pid*.pb" : "stackprof.*")].sort
    raise "rails: #{files.size} worker files of 2 in #{dir} (see server.log)" unless files.size == 2

    files
  end

  # A Puma config: the app's, then the hooks that run stackprof in each worker.
  def stackprof_config(dir, interval)
    out = File.join(dir, "stackprof")
    File.join(dir, "puma_stackprof.rb").tap do |path|
      File.write(path, <<~RUBY)
        # Written by bench/accuracy/rails.rb: #{BenchRailsApp::PUMA_CONFIG}, then stackprof in each worker.
        #{File.read(BenchRailsApp::PUMA_CONFIG)}
        on_worker_boot do
          require "stackprof"
          StackProf.start(mode: :cpu, interval: #{Integer(interval)}, raw: true)
        end
        on_worker_shutdown do
          StackProf.stop
          File.binwrite(#{out.dump} + ".\#{Process.pid}", Marshal.dump(StackProf.results))
        end
      RUBY
    end
  end
end
