# frozen_string_literal: true

require "fileutils"
require_relative "recording"

module DdprofRecorder
  # An exporter for {Profiler.start}`(interval:)` that writes each window to a file of its own
  # in a directory, keeps the newest ones and stops writing when the disk is nearly full: what
  # a production server runs, and what `ddprof-recorder merge -o all.pb.gz DIR/*.pb.gz` (or
  # `top`, `flamegraph`...) reads afterwards. `Profiler.start(interval: 60, directory: "tmp/profiles")`
  # is the shortcut with the defaults.
  #
  # **File names.** `<prefix>-<UTC start>-pid<pid>-<seq>.pb.gz`, e.g.
  # `profile-20250314T093000Z-pid4242-000017.pb.gz` (`.pb` for a profiler with
  # `compression: :none`): the window's start time (to the second) first, so that `ls` and a
  # shell glob list the windows of every process of the directory in time order; then the pid
  # of the process that wrote it (the `"process id"` label of its samples); then the number of
  # the window in that process (from 1, six digits or more), which orders the windows of one
  # second and makes the name unique in the process. A forked child (a Puma worker) writes its
  # own pid and counts from 1 again.
  #
  # **Complete files only.** A window goes to a temporary file in the same directory (named
  # after the final one, `.tmp<pid>-<random>` appended, created exclusively: {Recording.create_temp}),
  # in binary mode whatever `Encoding.default_internal` says (Rails sets it), is `fsync`ed,
  # then renamed to its name, and the directory is `fsync`ed: rename(2) is atomic, so a reader
  # listing the directory sees either no file or a whole one, and after a crash the file is on
  # disk whole or not at all. A failed write removes its temporary file. A temporary file of
  # this naming left by a process killed while writing (SIGKILL, an OOM kill) is removed once
  # it is {STALE_TEMP_SECONDS} old (a write takes milliseconds).
  #
  # **keep: counts per directory.** After each window it writes, the exporter removes the
  # files of its naming (its prefix, the form above; never any other file) beyond the `keep`
  # newest, newest by name (start time, then pid, then number), whichever process wrote them:
  # so the directory holds about `keep` windows in all, and stays bounded when workers come and
  # go (counting per process would leave every dead worker's files behind for good: Puma
  # restarts its workers at each phased restart, or when a worker killer ends one). With W
  # processes writing, that is about `keep / W` windows of each: size `keep` to the processes.
  # No lock is needed across processes: a process removes a file only when its listing showed
  # `keep` files of newer names, which no other process removes (they are newer than that file
  # in its listings too), so a file is removed only once `keep` newer ones were written, and
  # the `keep` newest are never removed, however the processes interleave. Two processes
  # removing the same old file is harmless (the second finds it gone). Processes writing to one
  # directory must share one pid namespace (one host or container): pids of two containers may
  # be equal. `keep: nil` removes nothing.
  #
  # **The floor.** Before each window it reads the free space of the directory's filesystem
  # (statvfs(2): the blocks an unprivileged process may still write; natively,
  # ext/ddprof_recorder/src/directory_exporter.rs) and skips the window if writing it would
  # leave less than the floor: the larger of `min_free_bytes` and `min_free_fraction` of the
  # filesystem's size. The first skip logs one WARN line, and the first window written once
  # there is room again logs one more; the skipped windows are counted (`stats[:exporter][:directory][:skipped]`).
  #
  # **Failures.** A failed write (ENOSPC below the floor's check, EACCES, EROFS, the directory
  # removed and not re-creatable...) is counted (`:failed`) and logged at ERROR once per kind
  # (its `Errno` class); after a failure, the next window written logs one line saying so,
  # and each kind is logged again if it comes back. The exporter never raises out of {#export}
  # for a failed write (the profiler would log each one): it returns, and
  # `stats[:exporter][:exported]` counts it as handed over; `:directory` says what became of it.
  # The directory is created again if it was removed.
  #
  # It may be shared by the processes a server forks: the profiler restarts in each child
  # ({ForkHook}) with this same exporter, whose counts and log state then start afresh.
  class DirectoryExporter
    DEFAULT_PREFIX = "profile"
    # 60 one-minute windows: an hour of one process, or a quarter of an hour of a Puma master
    # and 3 workers (keep counts per directory).
    DEFAULT_KEEP = 60
    # A profile window is tens to hundreds of KB: 100 MiB leaves room for the logs and the
    # application's own files long before the disk is full.
    DEFAULT_MIN_FREE_BYTES = 100 << 20
    DEFAULT_MIN_FREE_FRACTION = 0.0
    # A temporary file of this exporter's naming older than this was left by a process that
    # died while writing it.
    STALE_TEMP_SECONDS = 3600
    # What a prefix may be: a file name's start, no separator, not hidden.
    PREFIX_FORMAT = /\A[A-Za-z0-9_][A-Za-z0-9_.-]*\z/.freeze
    TIME_FORMAT = "%Y%m%dT%H%M%SZ"
    GZIP_MAGIC = "\x1f\x8b".b.freeze
    # The counts of {#stats}, all zero.
    COUNTS = { written: 0, skipped: 0, failed: 0, removed: 0 }.freeze

    # @return [String] the directory, absolute.
    attr_reader :directory
    # @return [String]
    attr_reader :prefix
    # @return [Integer, nil]
    attr_reader :keep
    # @return [Integer]
    attr_reader :min_free_bytes
    # @return [Float]
    attr_reader :min_free_fraction

    # @param directory [String, Pathname] where the windows go; relative to the current
    #   directory now (a later chdir does not move it). Created (with its parents) if missing.
    # @param keep [Integer, nil] the newest files of this naming kept in the directory, at
    #   least 1 (per directory, whichever process wrote them: see the class doc); nil: all.
    # @param min_free_bytes [Integer] bytes of the filesystem that must stay free, >= 0.
    # @param min_free_fraction [Numeric] share of the filesystem's size that must stay free,
    #   in [0, 1); the floor is the larger of the two.
    # @param prefix [String] the files' names start with `<prefix>-` (letters, digits, `_`,
    #   `.`, `-`; not starting with `.` or `-`).
    # @raise [ArgumentError] on a bad argument (naming it), or if `directory` exists and is
    #   not a directory.
    # @raise [SystemCallError] if the directory cannot be created.
    def initialize(directory, keep: DEFAULT_KEEP, min_free_bytes: DEFAULT_MIN_FREE_BYTES,
                   min_free_fraction: DEFAULT_MIN_FREE_FRACTION, prefix: DEFAULT_PREFIX)
      path = directory.respond_to?(:to_path) ? directory.to_path : directory
      unless String === path && !path.empty? && !path.include?("\0")
        raise ArgumentError, "directory must be a non-empty String or Pathname without NUL, got #{shown(directory)}"
      end
      # `===`, not `is_a?`: a BasicObject has no is_a? (nor nil?).
      unless NilClass === keep || (Integer === keep && keep.positive?)
        raise ArgumentError, "keep must be a positive Integer or nil, got #{shown(keep)}"
      end
      unless Integer === min_free_bytes && !min_free_bytes.negative?
        raise ArgumentError, "min_free_bytes must be an Integer >= 0, got #{shown(min_free_bytes)}"
      end
      unless [Integer, Float, Rational].any? { |c| c === min_free_fraction } && min_free_fraction >= 0 &&
             min_free_fraction < 1
        raise ArgumentError, "min_free_fraction must be a number in [0, 1), got #{shown(min_free_fraction)}"
      end
      unless String === prefix && PREFIX_FORMAT.match?(prefix)
        raise ArgumentError, "prefix must be a String of letters, digits, _, . and - (not starting with . or -), " \
                             "got #{shown(prefix)}"
      end

      @directory = File.expand_path(path)
      if File.exist?(@directory) && !File.directory?(@directory)
        raise ArgumentError, "directory #{@directory} exists and is not a directory"
      end

      FileUtils.mkdir_p(@directory)
      @keep = keep
      @min_free_bytes = min_free_bytes
      @min_free_fraction = min_free_fraction.to_f
      @prefix = prefix.dup.freeze
      stem = "#{Regexp.escape(prefix)}-(?<time>\\d{8}T\\d{6}Z)-pid(?<pid>\\d+)-(?<seq>\\d{6,})\\.pb(?:\\.gz)?"
      @file_pattern = /\A#{stem}\z/
      @temp_pattern = /\A#{stem}\.tmp\d+-\h{12}\z/
      # Ruby's Mutex needs no re-creating after fork: in the child, Ruby releases the mutexes
      # that the threads which did not survive held (thread.c, terminate_atfork_i, through
      # rb_mutex_abandon_keeping_mutexes).
      @lock = Mutex.new
      reset_for_process
    end

    # Writes one window (see the class doc); never raises for a failed write or a full disk.
    #
    # @param start [Time] the window's start (its file's name).
    # @param _finish [Time]
    # @param pprof [String] the window's pprof.
    # @return [String, nil] the file written, or nil (skipped, or failed).
    # @raise [TypeError] unless start is a Time and pprof a String.
    def export(start, _finish, pprof)
      raise TypeError, "start must be a Time, got #{shown(start)}" unless Time === start
      raise TypeError, "pprof must be a String, got #{shown(pprof)}" unless String === pprof

      @lock.synchronize do
        reset_for_process unless @pid == Process.pid
        export_window(start, pprof)
      end
    end

    # Counts of this process (a forked child's start at zero), read without the lock so that a
    # trap handler may call {Profiler#stats}.
    #
    # @return [Hash{Symbol => Integer, Boolean}] `:written` (windows written), `:skipped` (not
    #   written: the floor), `:failed` (the write failed), `:removed` (files this process
    #   removed for `keep`, and stale temporary files), `:low_space` (whether it is skipping now).
    def stats
      return COUNTS.merge(low_space: false) unless @pid == Process.pid

      @counts.merge(low_space: @low_space)
    end

    # The free space of the filesystem that holds `path`, statvfs(2).
    #
    # @return [Array(Integer, Integer)] bytes available to an unprivileged process, and the
    #   filesystem's size.
    # @raise [SystemCallError] (its Errno class) if statvfs fails.
    def self.free_space(path)
      result = _native_statvfs(path.to_s)
      raise SystemCallError.new("statvfs #{path}", result) if result.is_a?(Integer)

      result
    end

    private

    def reset_for_process
      @pid = Process.pid
      @seq = 0
      @counts = COUNTS.dup
      @low_space = false
      @skipped_since = 0
      @failures_logged = {}
      @failed_since = 0
      @remove_failures_logged = {}
    end

    def export_window(start, pprof)
      FileUtils.mkdir_p(@directory) unless File.directory?(@directory)
      return skip unless room_for?(pprof)

      path = write(start, pprof)
      @counts[:written] += 1
      written_again
      prune
      path
    rescue SystemCallError, IOError => e
      failed(e)
      nil
    end

    # Whether writing `pprof` leaves the floor free; logs the return of space once.
    def room_for?(pprof)
      available, total = DirectoryExporter.free_space(@directory)
      floor = [@min_free_bytes, (@min_free_fraction * total).ceil].max
      @available, @floor = available, floor
      return false if available - pprof.bytesize < floor

      if @low_space
        @low_space = false
        log(:warn, "#{@directory} has room again (#{mib(available)} free, floor #{mib(floor)}): writing windows " \
                   "again; #{@skipped_since} skipped meanwhile")
        @skipped_since = 0
      end
      true
    end

    def skip
      @counts[:skipped] += 1
      @skipped_since += 1
      unless @low_space
        @low_space = true
        log(:warn, "#{@directory} has #{mib(@available)} free, under the floor of #{mib(@floor)} " \
                   "(min_free_bytes: #{@min_free_bytes}, min_free_fraction: #{@min_free_fraction}): not writing " \
                   "windows until there is room (counted in stats[:exporter][:directory][:skipped])")
      end
      nil
    end

    def failed(error)
      @counts[:failed] += 1
      @failed_since += 1
      return if @failures_logged[error.class]

      @failures_logged[error.class] = true
      log(:error, "could not write a window to #{@directory}: #{error.message} (#{error.class}); not logging " \
                  "#{error.class} again until a window is written (counted in stats[:exporter][:directory][:failed])")
    end

    def written_again
      return if @failed_since.zero?

      log(:warn, "wrote a window to #{@directory} again, after #{@failed_since} failed")
      @failed_since = 0
      @failures_logged = {}
    end

    # Through a temporary file, fsync and rename (see the class doc).
    def write(start, pprof)
      path = next_path(start, pprof)
      file, tmp = Recording.create_temp(path)
      begin
        file.write(pprof) # binary: create_temp opens it so
        file.fsync
        file.close
        File.rename(tmp, path)
        tmp = nil
      ensure
        # The close of a failed write may fail again (flushing what the write left: EFBIG,
        # ENOSPC); the temporary file goes all the same.
        begin
          file.close unless file.closed?
        rescue SystemCallError, IOError
          nil
        end
        remove_temp(tmp) if tmp
      end
      sync_directory
      path
    end

    # The next name of this process that no file has (one of a process of another pid
    # namespace, or of an earlier process with this pid in the same second, is not replaced).
    def next_path(start, pprof)
      time = start.getutc.strftime(TIME_FORMAT)
      ext = pprof.b.start_with?(GZIP_MAGIC) ? ".pb.gz" : ".pb"
      loop do
        @seq += 1
        path = File.join(@directory, format("%<prefix>s-%<time>s-pid%<pid>d-%<seq>06d%<ext>s",
                                            prefix: @prefix, time: time, pid: @pid, seq: @seq, ext: ext))
        return path unless File.exist?(path) || File.symlink?(path)
      end
    end

    def remove_temp(tmp)
      File.delete(tmp)
    rescue SystemCallError
      nil
    end

    # The rename is durable once the directory is synced. A filesystem that cannot sync a
    # directory (EINVAL) still has the whole file under its name: nothing to report.
    def sync_directory
      File.open(@directory, File::RDONLY) { |dir| dir.fsync }
    rescue SystemCallError
      nil
    end

    # Removes this naming's files beyond the `keep` newest, and stale temporary files.
    def prune
      names = Dir.children(@directory, encoding: Encoding::BINARY)
      if @keep
        ours = names.filter_map do |name|
          m = @file_pattern.match(name) or next
          [[m[:time], m[:pid].to_i, m[:seq].to_i], name]
        end
        ours.sort_by!(&:first)
        ours.first([ours.size - @keep, 0].max).each { |_, name| remove(name) }
      end
      stale = Time.now - STALE_TEMP_SECONDS
      names.each do |name|
        next unless @temp_pattern.match?(name)

        path = File.join(@directory, name)
        remove(name) if File.lstat(path).mtime < stale
      rescue Errno::ENOENT
        nil
      end
    rescue SystemCallError => e
      log_remove_failure(e)
    end

    def remove(name)
      File.unlink(File.join(@directory, name))
      @counts[:removed] += 1
    rescue Errno::ENOENT # another process removed it first
      nil
    rescue SystemCallError => e
      log_remove_failure(e)
    end

    # Once per kind in a process: the windows are still written.
    def log_remove_failure(error)
      return if @remove_failures_logged[error.class]

      @remove_failures_logged[error.class] = true
      log(:error, "could not remove old files in #{@directory}: #{error.message} (#{error.class}); not logging " \
                  "#{error.class} again")
    end

    def log(level, message)
      DdprofRecorder.logger.public_send(level, "profiler: directory exporter: #{message}")
    end

    def mib(bytes)
      format("%.1f MiB", bytes / 1_048_576.0)
    end

    def shown(value)
      value.inspect
    rescue StandardError # a BasicObject has no inspect
      Kernel.instance_method(:inspect).bind_call(value)
    end
  end
end
