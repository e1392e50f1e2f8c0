# frozen_string_literal: true

module DdprofRecorder
  # Profiles the whole life of a Ruby process that did not ask for it, and of the processes it
  # forks: `ddprof-recorder record` loads lib/ddprof_recorder/autostart.rb, which calls
  # {.start}, into the program it runs through `RUBYOPT=-r.../autostart`, and says through the
  # environment where to write the pprof (`DDPROF_RECORDER_OUT`), at which rate
  # (`DDPROF_RECORDER_HZ`) and, optionally, every how many seconds to write a window of its own
  # (`DDPROF_RECORDER_INTERVAL`); `DDPROF_RECORDER_ALLOCATIONS` (an allocation interval),
  # `DDPROF_RECORDER_HEAP` and `DDPROF_RECORDER_GC` (`1`) turn on the memory options,
  # `DDPROF_RECORDER_ALLOCATION_OVERHEAD` sets `allocation_overhead:`, and
  # `DDPROF_RECORDER_TIMELINE` (`1`) turns on `timeline:`. With an interval,
  # `DDPROF_RECORDER_MAX_QUEUED_WINDOWS` bounds the windows that may wait for the writing thread
  # (default: {WRITE_BACKLOG_SECONDS} of windows, at least 4).
  #
  # Without `DDPROF_RECORDER_OUT` it does nothing. The first Ruby process to load it claims the
  # profile (`DDPROF_RECORDER_OWNER`, inherited by its children), so that Ruby programs it
  # starts (`system`, `spawn`, backticks, `exec` from a forked child) neither profile themselves
  # nor overwrite its files; `exec` keeps the pid, so `bundle exec ruby app.rb` profiles app.rb.
  #
  # Forked children are profiled: the profiler is the process-wide one ({Profiler.start}),
  # which {ForkHook} restarts in each child, and every process writes its own file when it
  # exits ({.profile_path}): the owner writes `DDPROF_RECORDER_OUT` itself, say `profile.pb.gz`,
  # a forked child `profile.pid<PID>.pb.gz` (a grandchild too: one flat set of files); with an
  # interval, windows are numbered after that, `profile.0001.pb.gz` and
  # `profile.pid<PID>.0001.pb.gz`. The `pid` prefix keeps a child's file apart from a window
  # number. `ddprof-recorder record` lists those that this run wrote ({.profile_files}, with
  # what {WRITTEN} says); their samples carry the `"process id"` label.
  #
  # A process writes at exit: `at_exit` (a normal exit, an uncaught exception, a SIGTERM or
  # Ctrl-C that Ruby turns into one), and also `exit!`, which skips `at_exit` but is hooked to
  # write first (Unicorn's workers end with it). A process killed by a signal that Ruby does
  # not handle (SIGKILL) or crashing writes nothing.
  #
  # `DDPROF_RECORDER_STARTED`, if set, names a file where the owner writes `started PID` as it
  # starts the profiler (then `failed PID` if that failed): when no profile comes, `record`
  # can tell a command that ran no Ruby with the profiler from one whose Ruby did not write.
  # `DDPROF_RECORDER_WRITTEN`, if set, names a file to which every process appends the path
  # of each profile file it wrote, NUL-terminated: `record` lists those, and only those (a
  # file of the directory whose name looks like one, `profile.2024.pb.gz`, may be the
  # user's, or an earlier run's). `DDPROF_RECORDER_LOST`, if set, names a file to which every
  # process appends each profile file it could not write, as its path and why (the errno's
  # text, "No space left on device"), each NUL-terminated, and an empty path for each window
  # that the writing thread dropped unwritten (it fell behind: Profiler::Exporter): `record`
  # counts them in its summary and its exit status ({.lost_files}). A process that cannot
  # append there either (the same full disk) says so on $stderr.
  #
  # Nothing here may break the program: a failure is one line on $stderr (a bad value in one
  # of these variables: the variable, its text as written and what it must be; the process
  # then runs unprofiled).
  module Recording
    OUT = "DDPROF_RECORDER_OUT"
    HZ = "DDPROF_RECORDER_HZ"
    INTERVAL = "DDPROF_RECORDER_INTERVAL"
    OWNER = "DDPROF_RECORDER_OWNER"
    ALLOCATIONS = "DDPROF_RECORDER_ALLOCATIONS"
    HEAP = "DDPROF_RECORDER_HEAP"
    GC = "DDPROF_RECORDER_GC"
    TIMELINE = "DDPROF_RECORDER_TIMELINE"
    ALLOCATION_OVERHEAD = "DDPROF_RECORDER_ALLOCATION_OVERHEAD"
    STARTED = "DDPROF_RECORDER_STARTED"
    WRITTEN = "DDPROF_RECORDER_WRITTEN"
    LOST = "DDPROF_RECORDER_LOST"
    MAX_QUEUED_WINDOWS = "DDPROF_RECORDER_MAX_QUEUED_WINDOWS"
    # Why a window has no file when the writing thread dropped it unwritten.
    DROPPED = "dropped: the writes fell behind the interval"
    # How far, in seconds of windows, the writing thread may fall behind before a window is
    # dropped (at least Profiler::DEFAULT_MAX_QUEUED_WINDOWS windows): with a short interval,
    # four windows were less than a second, and a loaded machine's stall of the writer lost
    # some (3 windows of 0.2 s, with load 11).
    WRITE_BACKLOG_SECONDS = 60

    # A bad value in one of the variables above: the message names it, with its text as
    # written, and says what it must be.
    class EnvironmentError < ArgumentError; end

    # An output path that {.write} does not replace (see {.not_regular}).
    class OutputError < StandardError; end

    # A profile file that {.write_profile} could not write: the message names it and says
    # why, without the name of the temporary file.
    class WriteError < StandardError; end

    # `exit!` on an object (Kernel's private instance method), prepended to Kernel.
    module KernelExitBang
      private

      def exit!(*)
        Recording.before_exit!
        super
      end
    end

    # `Kernel.exit!` and `Process.exit!`, prepended to their singleton classes.
    module ExitBang
      def exit!(*)
        Recording.before_exit!
        super
      end
    end

    # The exporter with an interval: writes each window to the next numbered file of the
    # process it runs in, counting again from 1 in a forked child.
    class WindowWriter
      def initialize(out)
        @out = out
        @pid = nil
      end

      def call(_start, _finish, pprof)
        unless @pid == Process.pid
          @pid = Process.pid
          @windows = 0
        end
        @windows += 1
        Recording.write_profile(Recording.profile_path(@out, pid: Recording.child_pid, window: @windows), pprof)
      end
    end

    @out = @owner = @profiler = @written = @lost = nil

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
      options = profiler_options(out, env)
      @out = out
      @owner = Process.pid
      @written = env[WRITTEN] && !env[WRITTEN].empty? ? env[WRITTEN] : nil
      @lost = env[LOST] && !env[LOST].empty? ? env[LOST] : nil
      at_exit { finish }
      Kernel.prepend(KernelExitBang)
      [Kernel, Process].each { |mod| mod.singleton_class.prepend(ExitBang) }
      # Before the profiler starts, so that its cost is not in the profile ("failed" below
      # replaces it).
      report_start(env, "started")
      @profiler = Profiler.start(**options)
    rescue StandardError, LoadError, ScriptError => e
      warn "ddprof-recorder: not profiling this process: #{e.is_a?(EnvironmentError) ? '' : "#{e.class}: "}#{e.message}"
      report_start(env, "failed") if env[OWNER] == Process.pid.to_s
      nil
    end

    # Says in the file that {STARTED} names, if any, how this process's start went.
    #
    # @param what [String] "started" or "failed".
    def report_start(env, what)
      path = env[STARTED]
      File.binwrite(path, "#{what} #{Process.pid}\n") if path && !path.empty?
    rescue SystemCallError => e
      warn "ddprof-recorder: could not tell record that this process #{what}: #{e.message}"
    end

    # The file of one process's profile, or of one of its windows:
    # `profile.pb.gz` → `profile.pid4242.pb.gz`, `profile.0001.pb.gz`, `profile.pid4242.0001.pb.gz`.
    #
    # @param out [String] the output path given to `record`.
    # @param pid [Integer, nil] a forked child's pid; nil for the process that owns `out`.
    # @param window [Integer, nil] the window's number, from 1, with `--interval`.
    # @return [String]
    def profile_path(out, pid: nil, window: nil)
      stem, dot, ext = File.basename(out).partition(".")
      parts = [stem]
      parts << "pid#{pid}" if pid
      parts << format("%04d", window) if window
      File.join(File.dirname(out), "#{parts.join('.')}#{dot}#{ext}")
    end

    # The profile files of `out` that exist, by process: the owner's (key nil) and each forked
    # child's (key: its pid), each process's files in window order.
    #
    # Any file of `out`'s directory whose name has the form of one is listed, a user's
    # `profile.2024.pb.gz` as well; with `written`, only those of its paths (what a recording
    # said it wrote, {WRITTEN}).
    #
    # @param written [Array<String>, nil] paths in `out`'s directory.
    # @return [Hash{Integer, nil => Array<String>}] the owner first, then the children by pid.
    def profile_files(out, written: nil)
      dir = File.dirname(out)
      return {} unless File.directory?(dir)

      stem, dot, ext = File.basename(out).partition(".")
      pattern = /\A#{Regexp.escape(stem)}(?:\.pid(\d+))?(?:\.(\d{4,}))?#{Regexp.escape(dot + ext)}\z/
      # Compared as bytes: the report's paths are binary, the directory's names in the
      # filesystem's encoding.
      only = written&.filter_map { |path| [File.basename(path).b, true] if File.dirname(path).b == dir.b }&.to_h
      found = Dir.children(dir).filter_map do |name|
        next if only && !only.key?(name.b)
        # A name that is not valid in the filesystem's encoding is not one of ours (ours are
        # `out`'s, which `record` checks, plus ASCII), and matching it would raise ArgumentError.
        next unless name.valid_encoding?

        m = pattern.match(name) or next
        [m[1]&.to_i, m[2].to_i, File.join(dir, name)]
      end
      found.sort_by { |pid, window, _| [pid || -1, window] }
           .group_by(&:first).transform_values { |files| files.map(&:last) }
    end

    # Writes through a temporary file and a rename, so a reader never sees half a profile;
    # a failed write leaves no temporary file behind. The temporary file is created in the
    # target's directory, exclusively, under a random name (#create_temp): not through a
    # symlink that someone who can write the directory planted for a name to come (it was
    # `<path>.tmp<PID>`, written by File.binwrite, which follows symlinks). `path` must be a
    # regular file or not exist (#not_regular): the rename would replace a device node, a
    # FIFO or a symlink itself (a copy of /dev/null became a regular file).
    #
    # @raise [OutputError] if `path` exists and is not a regular file.
    # @raise [SystemCallError] if the write fails.
    def write(path, data)
      refuse_unless_regular(path)
      file, tmp = create_temp(path)
      begin
        file.write(data)
        file.close
        refuse_unless_regular(path) # again: the write may have taken a while
        File.rename(tmp, path)
        tmp = nil
      ensure
        begin
          file.close unless file.closed?
        rescue SystemCallError, IOError
          nil # a failed flush: the temporary file goes all the same
        end
        begin
          File.delete(tmp) if tmp
        rescue SystemCallError
          nil
        end
      end
    end

    # Why `path` may not be written: what it is when it exists and is not a regular file
    # ("a symbolic link", "a FIFO", "a character device"...), or nil. A symlink is refused
    # rather than followed: the rename of #write would replace the link itself, and writing
    # through it would write where someone else's link points.
    #
    # @return [String, nil]
    def not_regular(path)
      stat = File.lstat(path)
      return nil if stat.file?

      NOT_REGULAR.fetch(stat.ftype, "not a regular file")
    rescue Errno::ENOENT
      nil
    end

    # File::Stat#ftype of what #not_regular refuses, as it names them.
    NOT_REGULAR = { "directory" => "a directory", "link" => "a symbolic link", "characterSpecial" => "a character device",
                    "blockSpecial" => "a block device", "fifo" => "a FIFO", "socket" => "a socket" }.freeze

    def refuse_unless_regular(path)
      kind = not_regular(path)
      raise OutputError, "#{path}: is #{kind}, not a regular file: not replacing it" if kind
    end

    # A new file next to `path`, `<path>.tmp<PID>-<12 random hex digits>`, opened for
    # writing with O_CREAT | O_EXCL | O_NOFOLLOW (mode 0666 less the umask, as File.write
    # makes it); a name that exists (planted, or a clash) is passed over for another.
    # `binmode: true`, because integer flags do not make a file binary (File::BINARY is 0
    # off Windows): under a program's `Encoding.default_internal` (Rails sets it) the write
    # transcoded the pprof, and the first byte of its gzip header, 0x8b, raised
    # Encoding::UndefinedConversionError from ASCII-8BIT to UTF-8. A text view (SVG, JSON)
    # is written as its bytes too, whatever `default_external` says.
    #
    # @return [Array(File, String)] the open file and its name.
    def create_temp(path)
      flags = File::WRONLY | File::CREAT | File::EXCL | File::BINARY | (defined?(File::NOFOLLOW) ? File::NOFOLLOW : 0)
      attempts = 0
      begin
        tmp = "#{path}.tmp#{Process.pid}-#{Random.urandom(6).unpack1('H*')}"
        [File.new(tmp, flags, 0o666, binmode: true), tmp]
      rescue Errno::EEXIST, Errno::ELOOP
        attempts += 1
        retry if attempts < 10
        raise
      end
    end

    # Writes one of this recording's profile files ({.write}), then says so in the file that
    # {WRITTEN} named, if any; or, if the write failed, says why in the one {LOST} named.
    #
    # @raise [WriteError] if the write failed: "could not write PATH: No space left on device".
    def write_profile(path, pprof)
      begin
        write(path, pprof)
      rescue SystemCallError, OutputError => e
        why = e.is_a?(SystemCallError) ? reason(e) : e.message.delete_prefix("#{path}: ")
        report(@lost, "#{path}\0#{why}\0", "could not write #{path}")
        raise WriteError, "could not write #{path}: #{why}"
      end
      report(@written, "#{path}\0", "wrote #{path}")
    end

    # What went wrong in a failed system call, as strerror says it ("No space left on
    # device"): Ruby's message adds the call and the path (`@ fptr_finalize_flush - x.tmp...`).
    #
    # @param error [SystemCallError]
    # @return [String]
    def reason(error)
      SystemCallError.new(nil, error.errno).message
    end

    # Appends `record` to the report file `path` (nil: no report asked). One write(2) of a few
    # bytes with O_APPEND: the records of processes writing at once do not mix.
    #
    # @param what [String] what the record says, for the message if it cannot be written.
    def report(path, record, what)
      File.write(path, record, mode: "ab") if path
    rescue SystemCallError => e
      warn "ddprof-recorder: could not tell record that this process #{what}: #{reason(e)}"
    end

    # The lost files that processes reported in the {LOST} file's text `report`.
    #
    # @param report [String] the file's bytes.
    # @return [Array<Array(String, String)>] `[path, why]` each, in the order reported; the
    #   path is nil for a window dropped unwritten.
    def lost_files(report)
      report.split("\0").each_slice(2).map { |path, why| [path.empty? ? nil : path, why.to_s] }
    end

    # This process's pid if it is a forked child, nil in the owner.
    #
    # @return [Integer, nil]
    def child_pid
      Process.pid == @owner ? nil : Process.pid
    end

    # `exit!`: writes the profile first. exit! may run in a signal handler (Unicorn's workers
    # `trap(:TERM) { exit!(0) }`), where Mutex#lock raises ThreadError; a thread of its own may
    # lock, so the profiler stops there.
    def before_exit!
      return unless @profiler

      writer = Thread.new { finish }
      writer.report_on_exception = false
      writer.join
    rescue StandardError => e
      warn "ddprof-recorder: could not write the profile: #{e.class}: #{e.message}"
    end

    # Options of the process-wide profiler (with an interval, its exporter).
    #
    # @raise [EnvironmentError] on a bad value in `env`.
    def profiler_options(out, env)
      hz = env_value(env, HZ, "an integer in #{Profiler::HZ_RANGE}") do |text|
        v = Integer(text, 10)
        v if Profiler::HZ_RANGE.cover?(v)
      end
      interval = env_value(env, INTERVAL, "a number of seconds in #{Profiler::INTERVAL_RANGE}") do |text|
        v = Float(text)
        v if Profiler.interval?(v)
      end
      options = { hz: hz || Profiler::DEFAULT_HZ, compression: out.end_with?(".gz") ? :gzip : :none,
                  timeline: env[TIMELINE] == "1" }
      options.merge!(memory_options(env))
      return options unless interval

      backlog = env_value(env, MAX_QUEUED_WINDOWS, "a positive integer") do |text|
        v = Integer(text, 10)
        v if v.positive?
      end
      backlog ||= [Profiler::DEFAULT_MAX_QUEUED_WINDOWS, (WRITE_BACKLOG_SECONDS / interval).ceil].max
      options.merge(interval: interval, exporter: WindowWriter.new(out), max_queued_windows: backlog)
    end

    # The memory options the environment asks for (see the module doc).
    #
    # @raise [EnvironmentError] on a bad value in `env`.
    def memory_options(env)
      options = { heap: env[HEAP] == "1", gc: env[GC] == "1" }
      allocation_interval = env_value(env, ALLOCATIONS, "an integer in #{Profiler::ALLOCATION_INTERVAL_RANGE}") do |text|
        v = Integer(text, 10)
        v if Profiler::ALLOCATION_INTERVAL_RANGE.cover?(v)
      end
      options.merge!(allocations: true, allocation_interval: allocation_interval) if allocation_interval
      overhead = env_value(env, ALLOCATION_OVERHEAD, "a number in #{Profiler::ALLOCATION_OVERHEAD_RANGE}") do |text|
        v = Float(text)
        v if Profiler.allocation_overhead?(v)
      end
      options[:allocation_overhead] = overhead if overhead
      options
    end

    # The value of the variable `name`, from the block (nil when the text is not valid), or
    # nil when it is unset or empty.
    #
    # @param what [String] what the variable must be, for the message.
    # @raise [EnvironmentError] naming the variable and its text as written, when the block
    #   returns nil or raises ArgumentError (`Integer("fast")`).
    def env_value(env, name, what)
      text = env[name]
      return nil if text.nil? || text.empty?

      value = begin
        yield text
      rescue ArgumentError
        nil
      end
      raise EnvironmentError, "#{name} must be #{what}, got #{text.inspect}" if value.nil?

      value
    end

    # At exit: the last window (and the only one without an interval) goes to the file of
    # this process; with an interval, the windows the writing thread dropped unwritten are
    # reported lost. Nothing in a process that does not profile (a forked child whose
    # profiler did not restart, or one that already wrote).
    def finish
      return unless @profiler

      result = @profiler.stop
      return unless result

      if @profiler.interval
        dropped = @profiler.stats.dig(:exporter, :dropped).to_i
        report(@lost, "\0#{DROPPED}\0" * dropped, "dropped #{dropped} windows") if dropped.positive?
      else
        write_profile(profile_path(@out, pid: child_pid), result[2])
      end
    rescue WriteError => e
      warn "ddprof-recorder: #{e.message}"
    rescue StandardError => e
      warn "ddprof-recorder: could not write the profile: #{e.class}: #{e.message}"
    end
  end
end
