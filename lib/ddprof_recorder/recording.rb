# frozen_string_literal: true

module DdprofRecorder
  # Profiles the whole life of a Ruby process that did not ask for it: `ddprof-recorder
  # record` loads lib/ddprof_recorder/autostart.rb, which calls {.start}, into the program it
  # runs through `RUBYOPT=-r.../autostart`, and
  # says through the environment where to write the pprof (`DDPROF_RECORDER_OUT`), at which
  # rate (`DDPROF_RECORDER_HZ`) and, optionally, every how many seconds to write a window of
  # its own (`DDPROF_RECORDER_INTERVAL`, into numbered files, see {.window_path}).
  #
  # Without `DDPROF_RECORDER_OUT` it does nothing. Only one process writes: the first Ruby
  # process to load it claims the profile (`DDPROF_RECORDER_OWNER`, inherited by its
  # children), so that Ruby subprocesses of the program neither profile themselves nor
  # overwrite its file; `exec` keeps the pid, so `bundle exec ruby app.rb` profiles app.rb.
  # A forked child does not write either. The profile is written at exit (`at_exit`; a
  # process ending through `exit!` or a signal it does not handle writes nothing).
  #
  # Nothing here may break the program: a failure is one line on $stderr.
  module Recording
    OUT = "DDPROF_RECORDER_OUT"
    HZ = "DDPROF_RECORDER_HZ"
    INTERVAL = "DDPROF_RECORDER_INTERVAL"
    OWNER = "DDPROF_RECORDER_OWNER"

    module_function

    # Starts profiling if the environment asks for it.
    #
    # @return [Profiler, nil] the running profiler, or nil.
    def start(env = ENV)
      out = env[OUT]
      return nil if out.nil? || out.empty?

      owner = env[OWNER]
      return nil if owner && owner != Process.pid.to_s

      env[OWNER] = Process.pid.to_s
      require_relative "../ddprof_recorder"
      profiler = new_profiler(out, env)
      pid = Process.pid
      at_exit { finish(profiler, pid, out) }
      profiler.start
    rescue StandardError, LoadError, ScriptError => e
      warn "ddprof-recorder: not profiling this process: #{e.class}: #{e.message}"
      nil
    end

    # The file of the `n`th window with `--interval`: `profile.pb.gz` → `profile.0001.pb.gz`.
    #
    # @param out [String] the output path given to `record`.
    # @param n [Integer] the window's number, from 1.
    # @return [String]
    def window_path(out, n)
      stem, dot, ext = File.basename(out).partition(".")
      File.join(File.dirname(out), "#{stem}.#{format('%04d', n)}#{dot}#{ext}")
    end

    # The window files of `out` that exist, in order.
    #
    # @return [Array<String>]
    def window_files(out)
      dir = File.dirname(out)
      stem, dot, ext = File.basename(out).partition(".")
      pattern = /\A#{Regexp.escape(stem)}\.\d{4,}#{Regexp.escape(dot + ext)}\z/
      return [] unless File.directory?(dir)

      Dir.children(dir).select { |f| pattern.match?(f) }.sort.map { |f| File.join(dir, f) }
    end

    # Writes through a temporary file and a rename, so a reader never sees half a profile.
    def write(path, pprof)
      tmp = "#{path}.tmp#{Process.pid}"
      File.binwrite(tmp, pprof)
      File.rename(tmp, path)
    end

    def new_profiler(out, env)
      hz = Integer(env.fetch(HZ, Profiler::DEFAULT_HZ.to_s), 10)
      interval = env[INTERVAL] && !env[INTERVAL].empty? ? Float(env[INTERVAL]) : nil
      compression = out.end_with?(".gz") ? :gzip : :none
      return Profiler.new(hz: hz, compression: compression) unless interval

      windows = 0
      Profiler.new(hz: hz, interval: interval, compression: compression) do |_start, _finish, pprof|
        windows += 1
        write(window_path(out, windows), pprof)
      end
    end

    # at_exit: the last window (and the only one without an interval) goes to its file.
    def finish(profiler, pid, out)
      return unless Process.pid == pid # a forked child: its parent writes

      result = profiler.stop
      write(out, result[2]) if result && !profiler.interval
    rescue StandardError => e
      warn "ddprof-recorder: could not write the profile: #{e.class}: #{e.message}"
    end
  end
end

