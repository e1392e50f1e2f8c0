# frozen_string_literal: true

require "tempfile"

require_relative "command"
require_relative "record_summary"
require_relative "../recording"

module DdprofRecorder
  class CLI
    # `ddprof-recorder record -- COMMAND ...`: runs a Ruby program with the profiler started
    # by lib/ddprof_recorder/autostart.rb (see Recording), then prints a RecordSummary of the
    # files it wrote. Exits with the program's exit status, or 1 if that was 0 but a profile
    # was lost or none came (#run).
    class Record < Command
      NAME = "record"
      DESCRIPTION = "profile a Ruby program and write its pprof"
      DEFAULT_OUT = "profile.pb.gz"

      # @!attribute command [Array<String>] the program and its arguments.
      # @!attribute out [String] the pprof's path as given (-o).
      # @!attribute hz [Integer] samples per second and thread.
      # @!attribute interval [Float, nil] seconds per window, or nil for one file per process.
      # @!attribute allocations [Boolean] sample allocations (--allocations).
      # @!attribute allocation_interval [Integer] one allocation sampled in about this many.
      # @!attribute allocation_overhead [Float] the share of time the allocation hook may cost.
      # @!attribute heap [Boolean] report the live heap (--heap).
      # @!attribute gc [Boolean] GC time on its own frame (--gc).
      # @!attribute timeline [Boolean] each thread sample with its time (--timeline).
      # @!attribute signals [Boolean] read stacks in a signal handler (--no-signals: false).
      # @!attribute ticks [Symbol, nil] what sends the signals (--ticks; nil: the default).
      Options = Struct.new(:command, :out, :hz, :interval, :allocations, :allocation_interval, :allocation_overhead,
                           :heap, :gc, :timeline, :signals, :ticks, keyword_init: true)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new(out: DEFAULT_OUT, hz: Profiler::DEFAULT_HZ, allocations: false, heap: false, gc: false,
                              timeline: false, signals: true,
                              allocation_interval: Profiler::DEFAULT_ALLOCATION_INTERVAL,
                              allocation_overhead: Profiler::DEFAULT_ALLOCATION_OVERHEAD)
        parser = OptionParser.new do |o|
          o.banner = "Usage: ddprof-recorder record [-o FILE] [--hz N] [--interval S] -- COMMAND ..."
          o.separator ""
          o.separator "Runs COMMAND, a Ruby program (ruby, bundle exec, rake, ...), profiling its threads;"
          o.separator "writes the pprof (gzip if FILE ends in .gz) and prints a summary."
          o.separator "Exits with COMMAND's exit status; with 1 if it exited 0 but no profile came (it exec'd a"
          o.separator "program that is not Ruby, ...: one line says why) or a profile file or window could not be"
          o.separator "written (a full disk: the summary's `lost` line says how many, and why)."
          o.separator ""
          output_option(o, options, "where to write the pprof (default #{DEFAULT_OUT})")
          o.on("--hz N", Integer, "samples per second and thread (#{Profiler::HZ_RANGE}, default #{Profiler::DEFAULT_HZ})") do |v|
            options.hz = v
          end
          o.on("--interval S", Float, "also cut the profile every S seconds (#{Profiler::INTERVAL_RANGE}): one file",
               "per window, FILE with a number (profile.0001.pb.gz, ...)") { |v| options.interval = v }
          o.on("--allocations", "also sample allocations (alloc-samples, alloc-count)") { options.allocations = true }
          o.on("--allocation-interval N", Integer,
               "sample one allocation in about N (default #{Profiler::DEFAULT_ALLOCATION_INTERVAL})") do |v|
            options.allocation_interval = v
          end
          o.on("--allocation-overhead F", Float,
               "the share of time the allocation hook may cost, 0 < F <= 1 (default " \
               "#{Profiler::DEFAULT_ALLOCATION_OVERHEAD}: always on; 0.02 is cheap but its counts wander)") do |v|
            options.allocation_overhead = v
          end
          o.on("--heap", "also report the live heap (heap-live-samples, heap-live-size; implies --allocations)") do
            options.heap = options.allocations = true
          end
          o.on("--gc", "charge GC time to a (garbage collection) frame") { options.gc = true }
          o.on("--timeline", "give each thread sample its time (label end_timestamp_ns) and state (implies --gc):",
               "kept apart, not aggregated; see `ddprof-recorder timeline`") do
            options.timeline = true
            options.gc = true
          end
          o.on("--no-signals", "read stacks at the VM's interrupt checks, with no signal (for C extensions",
               "that cannot take one; cheap C methods then get the CPU of the Ruby code around them)") do
            options.signals = false
          end
          o.on("--ticks KIND", Profiler::TICKS, "what signals the threads: auto (the default: a perf event on each",
               "thread's CPU clock, every 1/hz of its user-mode CPU, where the kernel allows it, else cpu), or",
               "cpu (a timer on each thread's CPU clock: at most the kernel's tick rate, ~250/s); either way",
               "only on a thread's way back to user mode, never inside a system call") do |kind|
            options.ticks = kind
          end
          o.separator ""
          o.separator "Forked children (a server's workers) are profiled too, each into a file of its own:"
          o.separator "FILE with its pid (profile.pid4242.pb.gz; windows: profile.pid4242.0001.pb.gz)."
        end
        command = parse_options(parser, argv)
        return nil if command.nil?
        raise usage_error("record: no COMMAND given (usage: #{parser.banner.sub('Usage: ', '')})") if command.empty?
        unless Profiler::HZ_RANGE.cover?(options.hz)
          raise usage_error("record: --hz must be in #{Profiler::HZ_RANGE}, got #{options.hz}")
        end
        if options.interval && !Profiler.interval?(options.interval)
          raise usage_error("record: --interval must be in #{Profiler::INTERVAL_RANGE} (seconds), got #{options.interval}")
        end
        unless Profiler::ALLOCATION_INTERVAL_RANGE.cover?(options.allocation_interval)
          raise usage_error("record: --allocation-interval must be in #{Profiler::ALLOCATION_INTERVAL_RANGE}, " \
                            "got #{options.allocation_interval}")
        end
        unless Profiler.allocation_overhead?(options.allocation_overhead)
          raise usage_error("record: --allocation-overhead must be in #{Profiler::ALLOCATION_OVERHEAD_RANGE}, " \
                            "got #{options.allocation_overhead}")
        end

        options.command = command
        options
      end

      # Removes nothing: the files listed, and read, are the ones that the program's processes
      # said they wrote (Recording::WRITTEN). A file of the directory that merely has the form
      # of a profile file's name stays as it was: an earlier run's, or the user's
      # (`-o backup.tar.gz` and `backup.2024.tar.gz`); the summary names those, and the files
      # of this run that replaced one from before.
      #
      # A profile file or window that the program's processes could not write (a full disk)
      # is in the summary and makes the exit status 1 if the program's was 0; so does no
      # profile at all (the line that says why is then all `record` prints).
      #
      # @return [Integer] the program's exit status (128 + signal if a signal ended it), or
      #   FAILURE for a lost file of a program that exited 0.
      # @raise [Failure] when no profile came, with the program's exit status, or FAILURE if
      #   that was 0.
      def run(options)
        check_output(options.out)
        out = File.expand_path(options.out)
        before = Recording.profile_files(out).values.flatten

        # What the processes report (see Recording): the files' paths, by variable.
        reports = {}
        [Recording::STARTED, Recording::WRITTEN, Recording::LOST].each do |variable|
          file = Tempfile.create("ddprof-recorder-report")
          file.close
          reports[variable] = file.path
        end
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        status = run_profiled(options.command, env(out, options).merge(reports))
        elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
        said = reports.transform_values { |path| File.binread(path) }
        files = Recording.profile_files(out, written: said[Recording::WRITTEN].split("\0"))
        lost = Recording.lost_files(said[Recording::LOST])
        if files.empty?
          raise Failure.new(no_profile(options.command, status, said[Recording::STARTED], lost),
                            exit_status(status).zero? ? FAILURE : exit_status(status))
        end

        ours = files.values.flatten
        earlier = { replaced: ours & before, left: Recording.profile_files(out).values.flatten - ours }
        print_summary(RecordSummary.new(options, status, elapsed, files, lost: lost, **earlier))
        lost.empty? || !exit_status(status).zero? ? exit_status(status) : FAILURE
      ensure
        reports&.each_value { |path| File.delete(path) if File.exist?(path) }
      end

      private

      # Why no profile came: the writes that failed, and why (Recording::LOST); else from what
      # the command's Ruby said at start (Recording::STARTED: nothing if no Ruby loaded the
      # profiler) and how the command ended.
      def no_profile(command, status, report, lost)
        unless lost.empty?
          texts = lost.group_by(&:last).map do |why, entries|
            paths = entries.filter_map(&:first)
            "#{paths.empty? ? "#{entries.size} window#{'s' unless entries.size == 1}" : name_list(paths)}: #{why}"
          end
          return "record: no profile: could not write #{texts.join('; ')}"
        end
        shown = "`#{display_command(command)}`"
        what, pid = report.split
        case what
        when nil
          "record: no profile: #{shown} ran no Ruby that loaded the profiler (record profiles Ruby programs " \
            "through RUBYOPT: ruby, bundle exec, rake, ...)"
        when "failed"
          "record: no profile: the profiler could not start in #{shown} (process #{pid}; its message is above)"
        else
          if status.termsig
            "record: no profile: #{shown} was #{status_text(status)} before its Ruby (process #{pid}) " \
              "could write one (a signal that Ruby does not handle, such as SIGKILL, or a crash)"
          else
            "record: no profile: #{shown} started the profiler (process #{pid}) but wrote nothing at its " \
              "end (did it exec a program that is not Ruby?)"
          end
        end
      end

      # The summary is the last thing `record` says: if its reader went away (`record ... |
      # head`, once the summary outgrows the pipe's buffer or @out is sync), there is no one
      # to tell, and `record` still exits with the program's status.
      def print_summary(summary)
        summary.print(@out)
      rescue Errno::EPIPE
        nil
      end

      def env(out, options)
        autostart = File.expand_path("../autostart", __dir__)
        require_flag =
          if autostart.match?(/\s/)
            # RUBYOPT is split on spaces: load it by feature name through RUBYLIB instead.
            lib = File.expand_path("../..", __dir__)
            env_lib = { "RUBYLIB" => [lib, ENV["RUBYLIB"]].compact.reject(&:empty?).join(File::PATH_SEPARATOR) }
            "-rddprof_recorder/autostart"
          else
            "-r#{autostart}"
          end
        (env_lib || {}).merge(
          "RUBYOPT" => [ENV["RUBYOPT"], require_flag].compact.reject(&:empty?).join(" "),
          Recording::OUT => out,
          Recording::HZ => options.hz.to_s,
          Recording::INTERVAL => options.interval&.to_s,
          Recording::ALLOCATIONS => options.allocations ? options.allocation_interval.to_s : nil,
          Recording::ALLOCATION_OVERHEAD => options.allocations ? options.allocation_overhead.to_s : nil,
          Recording::HEAP => options.heap ? "1" : nil,
          Recording::GC => options.gc ? "1" : nil,
          Recording::TIMELINE => options.timeline ? "1" : nil,
          Recording::OWNER => nil,
        ).merge(options.signals ? {} : { Profiler::SIGNALS_ENV => "0" })
         .merge(options.ticks ? { Profiler::TICKS_ENV => options.ticks.to_s } : {})
      end

      # Runs the command and waits, leaving Ctrl-C to it: the program gets the SIGINT (same
      # process group), writes its profile at exit, and we still print the summary.
      # Process.spawn reports a failed exec as its errno (ENOENT, EACCES, ...): the exit status
      # a shell gives for a command it cannot run, 127.
      def run_profiled(command, env)
        previous = trap("INT") {}
        begin
          pid = Process.spawn(env, *command)
        rescue SystemCallError => e
          raise Failure.new("record: cannot run #{command.first}: #{e.message}", 127)
        end
        Process.wait2(pid).last
      ensure
        trap("INT", previous || "DEFAULT")
      end

      def exit_status(status)
        status.exitstatus || (128 + (status.termsig || 0))
      end
    end
  end
end
