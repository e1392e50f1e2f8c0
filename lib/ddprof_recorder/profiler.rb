# frozen_string_literal: true

require_relative "profiler/own_thread"
require_relative "profiler/thread_sampler"
require_relative "profiler/exporter"
require_relative "profiler/allocation_recorder"
require_relative "profiler/ractor_guard"
require_relative "profiler/trap_context"
require_relative "profiler/auto_compact_guard"
require_relative "directory_exporter"

module DdprofRecorder
  # A sampling profiler built on {StackRecorder}. It records, for every live Ruby thread,
  # its stack with
  #
  # - `cpu-time`: nanoseconds of CPU the thread itself used, read from its own kernel CPU
  #   clock, charged at *on-CPU samples*. By default (`signals: true`) each thread has a timer
  #   on its own CPU clock that sends it a signal every `1/hz` of its CPU time, and the stack
  #   is read in the signal handler, where the CPU is being spent (see {#sampling_mode});
  #   with `signals: false`, the thread that holds the GVL is sampled `hz` times a second by
  #   a postponed job that a native trigger thread asks Ruby to run, at the VM's next
  #   interrupt check (no signal; cheap C methods then take the CPU of the Ruby code around
  #   them);
  # - `cpu-samples`: how many samples;
  # - `wall-time`: nanoseconds since the thread's previous sample (every live thread is
  #   sampled at the asked rate, running or not);
  #
  # and the labels `"thread id"` (`"<native id> (<object_id>)"`) and `"thread name"`
  # (`Thread#name`, `"main"` for the main thread, else where the thread was created).
  #
  # Values are differences of clocks, so totals are exact whatever the sampling rate: the
  # rate decides only how finely time is split between stacks. How CPU is charged, how a
  # late job is handled and why, and how idle threads are added up: {ThreadSampler}. The
  # native half: ext/ddprof_recorder/src/sampling/trigger.rs (the trigger thread),
  # job.rs (the job) and clocks/thread_cpu.rs (per-thread CPU clocks), in the same folder.
  #
  # Memory, on request (docs/profiler.md, "Memory"):
  #
  # - `allocations: true`: one allocation in about every `allocation_interval` the native
  #   NEWOBJ hook sees is sampled, with its stack: `alloc-samples` (samples) and
  #   `alloc-count` (the allocations they stand for), labelled `"allocation class"`. By
  #   default the hook is always on and sees every allocation. With `allocation_overhead`
  #   below 1 (0.02, say) it is on only for random 2 ms slices of time, as many as keep its
  #   cost near that share of the program's time, and each sample stands for the allocations
  #   the hook did not see too: far cheaper, but the estimate wanders (bench/RESULTS.md);
  # - `heap: true` (implies allocations): the sampled objects the GC has not freed, reported
  #   per allocating stack and class at each window: `heap-live-samples` and `heap-live-size`
  #   (bytes, estimated: each object's `ObjectSpace.memsize_of` times its sample's weight);
  # - `gc: true`: the CPU and wall time threads spend in the GC, on a `(garbage collection)`
  #   frame under `(marking)` or `(sweeping)`, labelled `"gc kind"` (minor or major), taken
  #   out of the CPU of the code that triggered it.
  #
  # The value types are the three above, then `alloc-samples`, `alloc-count` (with
  # allocations or heap), then `heap-live-samples`, `heap-live-size` (with heap): a profile
  # without these options is the same as before them.
  #
  # Known bias of `signals: false` (and of the `:safepoint` mode): the job runs at the GVL
  # holder's next interrupt check, which in practice finds a C method on top of the stack
  # far more often than the CPU is in one, and CPU spent inside a C method that does not
  # call back into Ruby or check interrupts (a big `Array#sort`) is seen when that method
  # returns. bench/RESULTS.md measures both modes against stackprof (`bench/run accuracy`).
  #
  # @example
  #   pprof = DdprofRecorder::Profiler.profile(hz: 99) { work }
  #   File.binwrite("profile.pb.gz", pprof)
  #
  #   DdprofRecorder::Profiler.start(interval: 60) { |start, finish, pprof| upload(pprof) }
  #   DdprofRecorder::Profiler.start(interval: 60, directory: "tmp/profiles") # DirectoryExporter
  #   ...
  #   DdprofRecorder::Profiler.stop
  class Profiler
    DEFAULT_HZ = 99
    # The rates a profiler takes; the bound, MAX_HZ, comes from the native side (the sampling
    # job), which refuses any other.
    HZ_RANGE = (1..MAX_HZ).freeze
    # The shortest `interval:`, in seconds. The sampler thread looks at the windows every
    # {HOUSEKEEPING_SECONDS} while jobs run, so shorter windows would not come on time; and at
    # 1e-12 s the next window was always due: the thread cut windows in a busy loop (1,598
    # files in 2 s from `record --interval 1e-12`).
    MIN_INTERVAL = 0.1
    # The longest `interval:`, in seconds: a year. The windows' deadlines are nanoseconds, and
    # past about 1.8e299 s a Float interval times 1e9 is Infinity: `DDPROF_RECORDER_INTERVAL=1e308`
    # was taken here, then `start` died with `FloatDomainError: Infinity`.
    MAX_INTERVAL = 365 * 86_400
    # The intervals a profiler takes.
    INTERVAL_RANGE = (MIN_INTERVAL..MAX_INTERVAL).freeze
    # Value types of the profiles made, in value order (StackRecorder's defaults), without
    # the memory options; see {#value_types}.
    VALUE_TYPES = StackRecorder::DEFAULT_VALUE_TYPES
    ALLOCATION_VALUE_TYPES = [%w[alloc-samples count], %w[alloc-count count]].map { |t| t.map(&:freeze).freeze }.freeze
    HEAP_VALUE_TYPES = [%w[heap-live-samples count], %w[heap-live-size bytes]].map { |t| t.map(&:freeze).freeze }.freeze
    # With `timeline: true` on a Ruby with GVL events ({GVL_EVENTS}, 3.3+): the time each
    # thread waited for the GVL, on the stack it ran once it had it.
    GVL_VALUE_TYPES = [%w[gvl-wait-time nanoseconds]].map { |t| t.map(&:freeze).freeze }.freeze
    # One allocation sampled in about this many. Measured on bench/allocations.rb (see
    # bench/RESULTS.md): the cost of a sample is a few microseconds, so this keeps the
    # slowdown of an allocation-heavy program small.
    DEFAULT_ALLOCATION_INTERVAL = 4096
    # The share of the program's time the allocation hook may cost (see the class doc): 1.0,
    # the hook always on. The duty cycle (0.02 keeps an allocation-bound loop's slowdown under
    # 3%) missed its accuracy target on a loaded machine: at load 5-6, 10 runs of
    # bench/allocations.rb counted 0.61-1.74 of the true allocations at 0.02, 0.81-1.04 at
    # 0.1, and 0.999-1.000 always on, which costs that loop 1.50x and JSON 1.27x
    # (bench/RESULTS.md).
    DEFAULT_ALLOCATION_OVERHEAD = 1.0
    # Ruby code that makes 10,000 objects of the usual kinds: what the allocation hook's cost
    # is measured on, with the hook off and on, when allocation sampling starts with a duty
    # cycle (ext/ddprof_recorder/src/memory/hook_cost.rs, `calibrate`).
    # Each object is garbage at once: keeping them would grow the heap, and change how often
    # the program's GC runs (measured: 115 heap pages against 76, and half the GCs).
    ALLOCATION_CALIBRATION = lambda do
      i = 0
      while i < 2_000
        _made = ["#{i}x", { i => i }, Object.new]
        i += 1
      end
    end
    ALLOCATION_INTERVAL_RANGE = (1..MAX_ALLOCATION_INTERVAL).freeze
    # What `allocation_overhead:` may be, a share of the program's time: more than 0, at most 1
    # (the hook always on). {.allocation_overhead?} is the check; the CLI and the environment
    # variables use it too.
    ALLOCATION_OVERHEAD_RANGE = "(0, 1]"
    ALLOCATION_CLASS_LABEL = AllocationRecorder::CLASS_LABEL
    GC_KIND_LABEL = ThreadSampler::GC_KIND_LABEL
    THREAD_ID_LABEL = ThreadSampler::THREAD_ID_LABEL
    THREAD_NAME_LABEL = ThreadSampler::THREAD_NAME_LABEL
    # The pid, a number: tells apart the processes of a forking server once their profiles
    # are merged.
    PROCESS_ID_LABEL = "process id"
    MAX_CONSECUTIVE_ERRORS = ThreadSampler::MAX_CONSECUTIVE_ERRORS
    # How long {#stop} waits for the sampler thread to notice (it wakes up at once).
    STOP_TIMEOUT = 5
    # How long {#stop} lets the exporter finish handing over the windows before the last one
    # (the default of `export_timeout:`); the windows it has not finished with then are
    # dropped, counted in {#stats} and logged.
    EXPORT_TIMEOUT = 30
    # Windows that may wait for a slow exporter (the default of `max_queued_windows:`): each
    # holds a whole pprof, so an exporter slower than the interval would otherwise grow the
    # process without end. Four minutes of backlog at the default 60 s interval: an upload
    # that stalls that long loses nothing. Past it, the oldest waiting window is dropped
    # (see {Exporter} for why the oldest).
    DEFAULT_MAX_QUEUED_WINDOWS = 4
    # A profile comment that starts with this says what became of the sampling signal when the
    # program took it ({#keep_signal}).
    SIGNAL_COMMENT = "signal: "
    # Those that say how many threads blocked it, and how many had no slot
    # ({#note_unarmed_threads}).
    BLOCKED_COMMENT = "signal blocked: "
    NO_SLOT_COMMENT = "signal slots: "
    # How often the sampler thread looks at the log and the windows while jobs run.
    HOUSEKEEPING_SECONDS = 0.1

    # Environment variable that, set to `0`, `false` or `off`, makes the default `signals:`
    # false (see {#initialize}).
    SIGNALS_ENV = "DDPROF_RECORDER_SIGNALS"
    # Environment variable that, set to `auto` or `cpu`, chooses the default `ticks:`.
    TICKS_ENV = "DDPROF_RECORDER_TICKS"
    # What sends each thread its sampling signal (see {#initialize}).
    TICKS = %i[auto cpu].freeze
    # Whether M:N threads are on (Ruby 3.3+ with `RUBY_MN_THREADS=1`), which {#start} refuses:
    # Ruby's version string then says "+MN" (`ruby_mn_threads_enabled`, 3.3.8 and 3.4.5
    # `version.c`), as no other API tells.
    MN_THREADS = RUBY_DESCRIPTION.include?(" +MN")

    @current = nil
    @current_lock = Mutex.new

    # Hooks that exist only for tests.
    module Testing
      # Makes the next starts find perf events refused, as a kernel with
      # `perf_event_paranoid` 3 refuses them to a user without `CAP_PERFMON`: their threads
      # get CPU timers (see {Profiler#initialize}'s `ticks:`).
      #
      # @param refuse [Boolean]
      # @return [void]
      def self.refuse_perf_events(refuse)
        Profiler._native_refuse_perf_events(refuse)
      end

      # @param thread [Thread]
      # @return [Boolean, nil] whether `thread`'s Ractor names it as the GVL's owner, as the
      #   signal handler checks for its own thread (nil where that is not known).
      def self.holds_gvl?(thread)
        Profiler._native_thread_holds_gvl(thread)
      end
    end

    class << self
      # Starts the process-wide profiler (see {#initialize} for the options). A `trap`
      # handler may call it (see {TrapContext}).
      #
      # @return [Profiler, nil] the running profiler (nil only from a trap handler whose
      #   signal came while this thread was inside start or stop: {TrapContext}).
      # @raise [DdprofRecorder::Error] if one is already running.
      def start(**options, &exporter)
        if TrapContext.trap_context?
          return TrapContext.outside_trap("Profiler.start", trap_locks) { start(**options, &exporter) }
        end

        @current_lock.synchronize do
          raise Error, "the profiler is already running (call DdprofRecorder::Profiler.stop first)" if @current&.running?

          @current&.stop # one that stopped sampling on its own: let its threads go
          @current = new(**options, &exporter).start
        end
      end

      # Stops the process-wide profiler. A `trap` handler may call it, as a server's
      # `trap("TERM")` does (see {TrapContext}).
      #
      # @return [Array(Time, Time, String), nil] the last window `[start, finish, pprof]`
      #   (also handed to the exporter if there is one), or nil if it was not running (or
      #   from a trap handler whose signal came while this thread was inside start or stop:
      #   it stops once they return, {TrapContext}).
      def stop
        return TrapContext.outside_trap("Profiler.stop", trap_locks) { stop } if TrapContext.trap_context?

        profiler = @current_lock.synchronize { @current.tap { @current = nil } }
        profiler&.stop
      end

      # @return [Profiler, nil] the process-wide profiler, if started.
      attr_reader :current

      # @return [Boolean] whether a profiler samples this process now, the process-wide one
      #   or any other (one at a time: the native trigger drives one).
      def sampling?
        @sampling_profiler&.running? || false
      end

      # Links a request's span id to its endpoint in the sampling profiler's window (see
      # Endpoints); nothing when none samples.
      #
      # @return [Boolean] whether a profiler took it.
      def record_endpoint(span_id, endpoint)
        profiler = @sampling_profiler
        profiler ? profiler.record_endpoint(span_id, endpoint) : false
      end

      # @api private
      # The profiler that samples now ({#start} sets it; Endpoints records to it).
      attr_writer :sampling_profiler

      # @api private
      # The program turns `GC.auto_compact` on (AutoCompactGuard): the sampling profiler, if
      # its handler reads stacks, reads them at the jobs from now on.
      def auto_compact_turned_on
        @sampling_profiler&.read_stacks_at_jobs(AutoCompactGuard::REASON)
      end

      # @return [Boolean] whether the process-wide profiler is running.
      def running?
        @current&.running? || false
      end

      # Profiles the block with a profiler of its own.
      #
      # @return [String] the pprof of the block's run.
      def profile(**options, &block)
        raise ArgumentError, "Profiler.profile needs a block" unless block

        new(**options).profile(&block)
      end

      private

      # The locks that Profiler.start and stop take, and that a trap handler's thread may hold.
      def trap_locks
        [@current_lock, @current&.__send__(:lifecycle_lock)]
      end
    end

    # @return [Integer] samples per second asked for.
    attr_reader :hz
    # @return [Numeric, nil] seconds between two windows handed to the exporter.
    attr_reader :interval

    # @param hz [Integer] sampling passes per second, in {HZ_RANGE}.
    # @param interval [Numeric, nil] with an exporter, hand it a window every `interval`
    #   seconds (default 60; in {INTERVAL_RANGE}); the last window goes to it at {#stop}.
    #   The sampler thread cuts the windows (a few ms: encoding runs without the GVL).
    # @param exporter [#call, #export, nil] receives `(start, finish, pprof)` for each window:
    #   `export` if it has one, else `call`. Or pass a block. It runs in a thread of its own
    #   (the last window: in the thread calling {#stop}) and may take its time; an exception
    #   it raises is logged and forgotten.
    # @param directory [String, Pathname, nil] instead of an exporter: write each window to a
    #   file of its own there, `DirectoryExporter.new(directory)` with its defaults (keep the 60
    #   newest, stop writing under 100 MiB free; see {DirectoryExporter} for those options).
    # @param max_queued_windows [Integer] windows that may wait for the exporter, at least 1
    #   (default {DEFAULT_MAX_QUEUED_WINDOWS}); when one more is cut, the oldest waiting one
    #   is dropped, counted (`stats[:exporter][:dropped]`) and logged.
    # @param export_timeout [Numeric] seconds {#stop} waits for the exporter to finish with
    #   the waiting windows before it kills the exporter's thread (default {EXPORT_TIMEOUT});
    #   the windows it did not finish with are dropped, counted and logged.
    # @param max_frames [Integer] deepest stack kept (see {StackRecorder.new}).
    # @param compression [Symbol] `:gzip` (default, the usual `.pb.gz`) or `:none`.
    # @param allocations [Boolean] sample allocations (see the class doc).
    # @param allocation_interval [Integer] sample one allocation in about this many the hook
    #   sees (1: every one, the hook always on), in {ALLOCATION_INTERVAL_RANGE}.
    # @param allocation_overhead [Float] the share of the program's time the allocation hook
    #   may cost, in (0, 1]; 1.0 (the default) keeps it always on, below 1 a duty cycle.
    # @param heap [Boolean] report the live heap at each window (samples allocations too).
    # @param gc [Boolean] charge GC time to a `(garbage collection)` frame.
    # @param timeline [Boolean] give each thread sample its time: a numeric label
    #   `"end_timestamp_ns"` (Unix nanoseconds: when its on-CPU tick or its pass was), which
    #   keeps it apart in the pprof rather than aggregated (see {StackRecorder#record_sample}),
    #   so that a timeline can place it, and its thread's state then, label `"thread state"`
    #   (running, waiting for GVL, blocked, gc: docs/profiler.md, "Timeline"; what
    #   DdprofRecorder.timeline draws). A thread's idle passes in a row are still one sample
    #   (its wall time is how long they lasted, its time the last one's), and CPU carried to a
    #   thread's end or a window's close has no time of its own: those stay aggregated, as do
    #   allocation and heap samples. On Ruby 3.3+ ({GVL_EVENTS}) it also measures, with a
    #   thread event hook, how long each thread waited for the GVL: value `gvl-wait-time`,
    #   charged to the thread's next sample (the stack it runs once it has the lock). Ruby
    #   3.1 has no such events: no `gvl-wait-time` there.
    # @param signals [Boolean] read on-CPU stacks at each thread's CPU tick, from a signal
    #   (the default, unless the environment's {SIGNALS_ENV} says `0`); false: at the VM's
    #   interrupt checks, with no signal (for programs whose C extensions cannot take one).
    # @param ticks [Symbol] with signals, what sends them; either way a tick reaches a thread
    #   only on its way back to user mode, never inside a system call. `:auto` (the default,
    #   unless the environment's {TICKS_ENV} says otherwise): a perf event on each thread's CPU
    #   clock (`perf_event_open`, user mode only), every `1/hz` of its CPU, where the kernel
    #   allows it; else, as `:cpu`, a timer on each thread's CPU clock, which the kernel fires at
    #   its scheduler tick only (at most about 250 samples per second of a thread's CPU on
    #   Debian's kernels). `stats[:ticks]` says which a run has, `stats[:signals][:perf_refused]`
    #   why not perf events, and so does the profile's `sampling` comment.
    # @raise [ArgumentError] on a bad option.
    def initialize(hz: DEFAULT_HZ, interval: nil, exporter: nil, max_frames: StackRecorder::DEFAULT_MAX_FRAMES,
                   compression: :gzip, allocations: false, allocation_interval: DEFAULT_ALLOCATION_INTERVAL,
                   allocation_overhead: DEFAULT_ALLOCATION_OVERHEAD, heap: false, gc: false, timeline: false,
                   signals: Profiler.signals_default, ticks: Profiler.ticks_default, max_queued_windows: DEFAULT_MAX_QUEUED_WINDOWS,
                   export_timeout: EXPORT_TIMEOUT, directory: nil, &block)
      Profiler.check_hz(hz)

      { allocations: allocations, heap: heap, gc: gc, signals: signals, timeline: timeline }.each do |name, value|
        raise ArgumentError, "#{name} must be true or false, got #{shown(value)}" unless [true, false].include?(value)
      end
      raise ArgumentError, "ticks must be one of #{TICKS.map(&:inspect).join(', ')}, got #{shown(ticks)}" unless TICKS.include?(ticks)
      unless Integer === allocation_interval && ALLOCATION_INTERVAL_RANGE.cover?(allocation_interval)
        raise ArgumentError,
              "allocation_interval must be an Integer in #{ALLOCATION_INTERVAL_RANGE}, got #{shown(allocation_interval)}"
      end
      unless Profiler.allocation_overhead?(allocation_overhead)
        raise ArgumentError,
              "allocation_overhead must be a number in #{ALLOCATION_OVERHEAD_RANGE}, got #{shown(allocation_overhead)}"
      end
      raise ArgumentError, "give an exporter or a block, not both" if exporter && block
      raise ArgumentError, "give directory or an exporter (or a block), not both" if directory && (exporter || block)
      unless Integer === max_queued_windows && max_queued_windows.positive?
        raise ArgumentError, "max_queued_windows must be a positive Integer, got #{shown(max_queued_windows)}"
      end
      unless Numeric === export_timeout && export_timeout.real? && export_timeout.finite? && !export_timeout.negative?
        raise ArgumentError, "export_timeout must be a finite number of seconds >= 0, got #{shown(export_timeout)}"
      end
      unless interval.nil? || Profiler.interval?(interval)
        raise ArgumentError, "interval must be a number of seconds in #{INTERVAL_RANGE}, got #{shown(interval)}"
      end

      @exporter = exporter || block
      if @exporter && !(@exporter.respond_to?(:export) || @exporter.respond_to?(:call))
        raise ArgumentError, "exporter must respond to #export or #call"
      end
      raise ArgumentError, "interval needs an exporter (or a block) to hand the windows to" if interval && !@exporter && !directory

      @hz = hz
      @interval = interval || (@exporter || directory ? 60 : nil)
      @max_frames = max_frames
      @compression = compression
      @allocations = allocations || heap
      @allocation_interval = allocation_interval
      @allocation_overhead = allocation_overhead.to_f
      @heap = heap
      @gc = gc
      @timeline = timeline
      @gvl = timeline && GVL_EVENTS
      @signals = signals
      @ticks = ticks
      @max_queued_windows = max_queued_windows
      @export_timeout = export_timeout
      # Fails now, not in start, on a bad max_frames / compression.
      @recorder = new_recorder
      # Last: it creates the directory, once every other option is known good.
      @exporter = DirectoryExporter.new(directory) if directory
      @lifecycle = Mutex.new
      # @started: between start and stop; @running: the sampler should keep sampling (it
      # clears it itself after too many failures).
      @started = false
      @running = false
      @stats = nil
    end

    # Starts sampling (in a new window: anything recorded before is dropped). A `trap` handler
    # may call it (see {TrapContext}).
    #
    # @return [self, nil] self (nil only from a trap handler whose signal came while this
    #   thread was inside this profiler's start or stop: {TrapContext}).
    # @raise [DdprofRecorder::Error] if already running.
    def start
      # Its allocations on this thread are not the program's (the hook is on before its end).
      own = Profiler._native_own_allocations(true)
      return TrapContext.outside_trap("Profiler#start", [@lifecycle]) { start } if TrapContext.trap_context?

      @lifecycle.synchronize do
        raise Error, "this profiler is already running" if @started && Process.pid == @pid
        if @allocations && RactorGuard.ractors?
          raise Error, "allocation sampling cannot start while a Ractor other than the main one runs: " \
                       "Ruby's allocation hooks are not safe with Ractors; start without allocations: and heap:"
        end
        if @gc && RactorGuard.ractors?
          raise Error, "GC time cannot be measured while a Ractor other than the main one runs: " \
                       "Ruby's GC-event hooks are not safe with Ractors; start without gc:"
        end
        if MN_THREADS
          raise Error, "M:N threads are on (RUBY_MN_THREADS): a Ruby thread moves between native threads, " \
                       "whose CPU clocks and ticks the profiler uses; run the program without RUBY_MN_THREADS"
        end

        @recorder = new_recorder
        @pid = Process.pid
        @endpoints = @endpoints_lost = 0
        @started_ns = now_ns
        @sampler_thread_cpu_base = @sampler_thread_cpu_ns = nil
        @sampler_thread = @exporting = nil # made at the end
        @next_window_ns = @interval && (@started_ns + (@interval * 1e9).to_i)
        @sampler = ThreadSampler.new(@recorder, internal: method(:internal_thread?),
                                                extra_labels: [[PROCESS_ID_LABEL, @pid]],
                                                forked_thread: @forked_thread,
                                                extra_values: value_types.size - VALUE_TYPES.size, gc: @gc,
                                                timeline: @timeline,
                                                gvl_index: (value_types.size - 1 if @gvl))
        @started = @running = true
        wake, @wake_writer = IO.pipe
        run = @run = Object.new # this run's token: a thread of an earlier run stops on seeing another
        @sampler.baseline(Profiler._native_task_ids, Thread.list, starting: true)
        start_sampling(run, wake)
        Profiler._native_gvl_start if @gvl
        start_memory
        # Last, once every thread is armed: a new thread asks for the GVL at once, which on Ruby
        # 3.1 can end this thread's time slice at its next interrupt check, and with N busy
        # threads it then waits N slices of 100 ms for the lock. Made first, it cost those
        # 200-300 ms before the threads were armed: samples lost (bench/RESULTS.md, "Sampling
        # rate"). An OwnThread is the profiler's (#internal_thread?) from its first moment.
        @exporting = @exporter && Exporter.new(@exporter, max_queued: @max_queued_windows).start
        @sampler_thread = OwnThread.new { run_sampler_thread(wake, run) }
        @sampler_thread.name = "ddprof_recorder sampler"
        @sampler_thread.report_on_exception = false
        # After the threads are made: making them is starting work too (a tick in `Thread#name=`,
        # 110-125 µs of CPU past the cut, was in record's profile on 3.4.5 under load, 2 runs
        # of 200).
        @sampler.started
        Profiler.sampling_profiler = self
      end
      self
    ensure
      Profiler._native_own_allocations(own)
    end

    # How on-CPU stacks are read in the current or last run:
    #
    # - `:handler`: in the signal handler, at the thread's CPU tick (the default);
    # - `:safepoint`: at the tick's signal, but the stack is read at the thread's next
    #   interrupt check: on Ruby 3.1 with YJIT on (its machine code may leave a frame's pc
    #   unwritten, which a handler cannot tell there; from 3.3 on it can, and the handler
    #   reads stacks under YJIT too: `vm::HANDLER_READS_UNDER_YJIT`), or with
    #   `GC.auto_compact` on before Ruby 3.2 (its read barrier; turned on during the run, from
    #   then on: AutoCompactGuard);
    # - `:off`: with `signals: false`, at the trigger's job (interrupt checks, no signal).
    #
    # @return [Symbol, nil] nil before the first start.
    attr_reader :sampling_mode

    # @return [String, nil] why the mode is not `:handler`, when signals were asked for.
    attr_reader :sampling_mode_reason

    # @api private
    # @return [Boolean] whether `value` is a real number of seconds in {INTERVAL_RANGE}.
    def self.interval?(value)
      Numeric === value && value.real? && value.finite? && INTERVAL_RANGE.cover?(value)
    end

    # @api private
    # @return [Boolean] whether `value` is a number in {ALLOCATION_OVERHEAD_RANGE}.
    def self.allocation_overhead?(value)
      [Integer, Float].any? { |c| c === value } && value.positive? && value <= 1
    end

    # The check of `hz:`, here and in {DdprofRecorder::Rack} (which checks it when it is built,
    # before any request asks for a profile).
    #
    # @api private
    # @raise [ArgumentError] unless `hz` is an Integer in {HZ_RANGE}.
    def self.check_hz(hz)
      return if hz.is_a?(Integer) && HZ_RANGE.cover?(hz)

      raise ArgumentError, "hz must be an Integer in #{HZ_RANGE}, got #{hz.inspect}"
    end

    # The default of `ticks:`: what {TICKS_ENV} says (`cpu`), else `:auto`.
    def self.ticks_default(env = ENV)
      TICKS.find { |t| t.to_s == env[TICKS_ENV].to_s.strip.downcase } || :auto
    end

    # @return [Symbol] what `ticks:` asked for (`:auto` or `:cpu`).
    attr_reader :ticks

    # The default of `signals:`: true unless {SIGNALS_ENV} says `0`, `false` or `off`.
    def self.signals_default(env = ENV)
      !%w[0 false off no].include?(env[SIGNALS_ENV].to_s.strip.downcase)
    end

    # @return [Array<Array(String, String)>] the value types of this profiler's profiles.
    def value_types
      types = VALUE_TYPES
      types += ALLOCATION_VALUE_TYPES if @allocations
      types += HEAP_VALUE_TYPES if @heap
      types += GVL_VALUE_TYPES if @gvl
      types
    end

    # Stops sampling and returns the last window. A `trap` handler may call it (see
    # {TrapContext}).
    #
    # @return [Array(Time, Time, String), nil] `[start, finish, pprof]` (also handed to the
    #   exporter, if any), or nil if not started (or in a forked child, where the profiler's
    #   threads do not exist: start a new profiler there; or from a trap handler whose signal
    #   came while this thread was inside this profiler's start or stop: {TrapContext}).
    def stop
      # Where this thread runs now, and its CPU: if the profiler samples it, what it carries
      # goes there, and the stopping work below is not charged to it (a tick in it records
      # nothing: ThreadSampler#stopping, first of all). Nor are its allocations the program's
      # (an allocation sample in `caller_locations` was in record_spec's profile).
      cut = @sampler&.stopping
      own = Profiler._native_own_allocations(true)
      caller_cpu_ns = Profiler._native_current_thread_cpu_time_ns
      if TrapContext.trap_context?
        @sampler&.not_stopping(cut) # this thread waits; the stop runs in a thread of its own
        return TrapContext.outside_trap("Profiler#stop", [@lifecycle]) { stop }
      end

      running_here = @started && Process.pid == @pid
      Profiler._native_allocations_stop if @allocations && running_here
      caller_stack = FrameNames.program_locations(caller_locations(1))
      # Only the state change is under the lock: joining the threads (up to 35 s) and calling
      # the exporter are not, so that an exporter that calls stop or start does not deadlock
      # on it, nor wait for it. (A trap handler's call runs in a thread of its own, above.)
      run = @lifecycle.synchronize do
        return nil unless @started

        @started = @running = false
        @stopped_ns = now_ns
        return nil unless Process.pid == @pid

        keep_signal # a trap of our signal since the sampler thread's last look goes into the profile
        note_unarmed_threads
        Profiler._native_sampling_stop(self)
        Profiler._native_gvl_stop if @gvl
        stop_memory
        { thread: @sampler_thread, wake: @wake_writer, exporting: @exporting, sampler: @sampler,
          recorder: @recorder }
      end
      finish_run(run, caller_cpu_ns, caller_stack)
    ensure
      Profiler._native_own_allocations(own)
    end

    # In a forked child, profiles the child from now on: the profiler was running in the
    # parent, but its threads (the Ruby sampler thread, the exporter thread, the native
    # trigger) did not survive the fork. Forgets the parent's threads and state and starts
    # again, through {#start}, with the same options and exporter, in a window of its own
    # (the parent's samples stay the parent's). {ForkHook} calls it for the process-wide
    # profiler.
    #
    # @return [self, nil] self, or nil if there is nothing to restart (not started, or not in
    #   a child of the process that started it).
    def restart_after_fork
      return nil unless @started && @pid != Process.pid

      # A thread of the parent may have held it at fork; that thread is gone.
      @lifecycle = Mutex.new
      @started = @running = false
      @sampler = @sampler_thread = @exporting = nil
      # The parent's pipe: this process has its own copy of both ends, and makes a new pair.
      @wake_writer&.close
      # The child's one thread (see ThreadSampler#native_id).
      @forked_thread = Thread.current
      start
    end

    # Links `span_id` to `endpoint` in the current window (StackRecorder#record_endpoint):
    # the samples labelled `"local root span id" => span_id` get `"trace endpoint" =>
    # endpoint`. Counted in `stats[:endpoints]`.
    #
    # @return [Boolean] whether the recorder took it (false when not running; an endpoint
    #   past the window's limits is taken and folded, counted in the recorder's stats).
    def record_endpoint(span_id, endpoint)
      return false unless running?

      @recorder.record_endpoint(span_id, endpoint)
      @endpoints += 1
      true
    rescue RuntimeError => e # both slots busy: never expected (see DESIGN.md), but never raised into the app
      @endpoints_lost += 1
      DdprofRecorder.logger.warn("profiler: an endpoint was not recorded: #{e.message}")
      false
    end

    # @return [Boolean] whether it samples: started, not stopped, and not given up after
    #   {MAX_CONSECUTIVE_ERRORS} failed passes.
    def running?
      @started && @running && Process.pid == @pid
    end

    # Profiles the block: start, yield, stop.
    #
    # @return [String] the pprof of the block's run (also handed to the exporter, if any).
    # @raise whatever the block raises (the profiler is stopped first).
    def profile
      start
      begin
        yield
      ensure
        result = stop
      end
      result&.last || raise(Error, "could not serialize the profile (see the log)")
    end

    # Counters of the current or last run.
    #
    # @return [Hash{Symbol => Numeric}] `:passes` (the sampling periods that wall passes over
    #   the threads stood for: a pass that waited, see ThreadSampler#pass_periods, counts the
    #   periods since the last), `:samples`
    #   (thread samples recorded), `:on_cpu_samples` (samples of the thread holding the GVL,
    #   which carry its CPU), `:late_jobs` (jobs that ran after their thread had been blocked,
    #   whose CPU was carried), `:errors` (passes that raised), `:seconds`, `:effective_hz`
    #   (those periods per second), `:on_cpu_hz` (on-CPU samples per second),
    #   `:sampler_cpu_ns` (CPU of the profiler's Ruby thread since the run started, of the
    #   jobs' own work, which the program's threads pay, and of {#start}'s work on the thread
    #   that called it, which the profile leaves out too), `:trigger_cpu_ns` (CPU of the
    #   native trigger thread), `:thread_ends` (threads whose CPU up to their end was
    #   accounted at their end, ext/ddprof_recorder/src/sampling/thread_end.rs), `:thread_end_accounting`
    #   (`:hook`: `"on"` when the run added the hook, else why not; `:exits`: native threads accounted at
    #   their exit; `:cpu_ns`: CPU charged at ends and exits; `:unsampled_cpu_ns`: of which to
    #   `(unsampled thread)`; `:dropped`: ends and exits not queued, their CPU left to the next
    #   charge of their native thread, if any),
    #   `:endpoints` (`:recorded`: requests linked to their endpoint, {#record_endpoint};
    #   `:lost`: those that could not be), `:recorder` ({StackRecorder#stats}), `:interrupt_deferral` (whether the jobs defer
    #   the program's `Thread#raise`/`Timeout` to after them on this Ruby: its thread layout
    #   passed the start's check, ext/ddprof_recorder/src/vm/mod.rs; false means they may be
    #   lost, and the profile's `sampling` comment says so); with allocations or heap, `:allocations`
    #   (`:sampled`, `:recorded`, `:dropped` when too many waited for their job, and
    #   `:heap_tracked`, `:heap_freed`, `:heap_skipped` past {MAX_HEAP_TRACKED},
    #   `:heap_live_tracked`; `:stopped`, why sampling stopped early: RactorGuard); with gc,
    #   `:gc_lost_ns` (GC CPU of threads past the native table's 64) and `:gc_stopped`, why
    #   GC time stopped early (RactorGuard), if it did; with an exporter,
    #   `:exporter` (`:exported`: windows it returned from, the last one too; `:failed`: it
    #   raised; `:queued`: waiting now; `:dropped`: the oldest waiting when
    #   `max_queued_windows` were, and those it had not finished when {#stop} killed its
    #   thread after `export_timeout`; with a {DirectoryExporter}, `:directory`, its
    #   {DirectoryExporter#stats}).
    def stats
      return {} unless @sampler

      seconds = ((@started ? now_ns : (@stopped_ns || now_ns)) - @started_ns) / 1e9
      counts = @sampler.counts
      thread_cpu = @started ? sampler_thread_cpu_ns : @sampler_thread_cpu_ns
      per_second = ->(n) { seconds.positive? ? n / seconds : 0.0 }
      {
        passes: counts[:passes],
        samples: counts[:samples],
        on_cpu_samples: counts[:on_cpu_samples],
        late_jobs: counts[:carried_cpu_samples],
        errors: counts[:errors],
        seconds: seconds,
        effective_hz: per_second.call(counts[:passes]),
        on_cpu_hz: per_second.call(counts[:on_cpu_samples]),
        signal_samples: counts[:signal_samples],
        sampling_mode: @sampling_mode,
        sampling_mode_reason: @sampling_mode_reason,
        ticks: @sampling_mode && @sampling_mode != :off ? @ticks_used : nil,
        interrupt_deferral: @interrupt_deferral,
        signals: @started ? signal_stats(Profiler._native_sampling_stats) : @signal_stats,
        sampler_cpu_ns: (thread_cpu || 0) + counts[:job_cpu_ns] + counts[:start_cpu_ns],
        trigger_cpu_ns: @started ? Profiler._native_sampling_stats[:trigger_cpu_ns] : @trigger_cpu_ns,
        thread_ends: counts[:thread_ends],
        thread_end_accounting: thread_end_stats(counts),
        endpoints: { recorded: @endpoints, lost: @endpoints_lost },
        recorder: @recorder.stats,
      }.merge(memory_stats).merge(exporter_stats)
    end

    # @api private
    # The handler reads no more stacks in this run: they are read at the jobs (`:safepoint`),
    # for `reason` (AutoCompactGuard). Said once in the log and in the profile's comment.
    #
    # @return [void]
    def read_stacks_at_jobs(reason)
      return unless @running && @sampling_mode == :handler

      Profiler._native_signal_read_at_jobs
      @sampling_mode = :safepoint
      @sampling_mode_reason = reason
      DdprofRecorder.logger.warn("profiler: #{reason}: stacks are read at the next interrupt check from now on")
      @comments = [sampling_comment(Profiler._native_sampling_stats[:signals]), *@comments.drop(1)]
      @recorder.comments = @comments
    end

    private

    def lifecycle_lock
      @lifecycle
    end

    # The classes whose own `inspect` {#shown} uses: their values as Ruby writes them (`0`).
    SHOWN_AS_WRITTEN = [Integer, Float, Rational, String, Symbol, TrueClass, FalseClass, NilClass]
                       .to_h { |c| [c, c.instance_method(:inspect)] }.freeze

    # `inspect` of a bad option for its message, even for a BasicObject or one whose inspect
    # raises or was redefined: a number, String, Symbol, true, false or nil by its class's
    # own inspect, anything else by Kernel#inspect (which alone shows an Integer as
    # `#<Integer:0x0000000000000001>`).
    def shown(value)
      klass = SHOWN_AS_WRITTEN.keys.find { |c| c === value }
      (klass ? SHOWN_AS_WRITTEN.fetch(klass) : Kernel.instance_method(:inspect)).bind_call(value)
    rescue StandardError
      "an object"
    end

    def new_recorder
      StackRecorder.new(value_types: value_types, max_frames: @max_frames, compression: @compression)
    end

    # With the lifecycle lock, after the sampling started.
    def start_memory
      @allocations_stopped = @gc_stopped = nil
      Profiler._native_gc_start if @gc
      RactorGuard.owner = self if @gc || @allocations
      return unless @allocations

      recorder = AllocationRecorder.new(@recorder, labels_for: @sampler.method(:labels_for),
                                                   value_count: value_types.size,
                                                   samples_index: VALUE_TYPES.size)
      Profiler._native_allocations_start(@allocation_interval, recorder, @heap, @allocation_overhead,
                                         ALLOCATION_CALIBRATION)
    end

    # A Ractor is about to start (RactorGuard): stops the allocation, heap and GC hooks for the
    # rest of this run, the live heap recorded first, and says so in the profile, the log and
    # stats, once each.
    def stop_memory_for_ractor
      stopped = @lifecycle.synchronize do
        next [] unless @started && Process.pid == @pid

        [stop_allocations_for_ractor, stop_gc_for_ractor].compact
      end
      stopped.each { |what| DdprofRecorder.logger.warn("profiler: #{what}") }
    end

    # With the lifecycle lock: what the log says, or nil if there was nothing to stop.
    def stop_allocations_for_ractor
      return unless @allocations && !@allocations_stopped

      Profiler._native_allocations_stop
      @allocation_stats = Profiler._native_allocations_stats
      record_heap
      Profiler._native_heap_stop
      @allocations_stopped = RactorGuard::REASON
      add_comment("allocations: stopped at #{Time.now.utc.strftime('%H:%M:%S')} UTC: #{RactorGuard::REASON}")
      "allocation sampling stopped: #{RactorGuard::REASON}"
    end

    # With the lifecycle lock: what the log says, or nil if there was nothing to stop. The GC
    # time measured so far stays in the threads' next samples.
    def stop_gc_for_ractor
      return unless @gc && !@gc_stopped

      Profiler._native_gc_stop
      @gc_stopped = RactorGuard::GC_REASON
      add_comment("gc: stopped at #{Time.now.utc.strftime('%H:%M:%S')} UTC: #{RactorGuard::GC_REASON}")
      "GC time stopped: #{RactorGuard::GC_REASON}"
    end

    def add_comment(comment)
      @comments += [comment]
      @recorder.comments = @comments
    end

    # With the lifecycle lock: no allocation is sampled after this; the live heap goes into
    # the last window first (it can only be read while the free hook runs).
    def stop_memory
      RactorGuard.owner = nil
      Profiler._native_gc_stop if @gc
      return unless @allocations

      Profiler._native_allocations_stop
      return if @allocations_stopped # by a Ractor: its stats and live heap are in already

      @allocation_stats = Profiler._native_allocations_stats
      record_heap
      Profiler._native_heap_stop
    end

    def thread_end_stats(counts)
      native = @started ? Profiler._native_sampling_stats : @thread_end_native
      { hook: @thread_end_hook, exits: counts[:thread_exits],
        cpu_ns: counts[:thread_end_cpu_ns], unsampled_cpu_ns: counts[:unsampled_thread_cpu_ns],
        dropped: native ? native[:thread_ends_dropped] - @thread_ends_dropped_base : 0 }
    end

    def exporter_stats
      return {} unless @exporting

      stats = @exporting.stats
      stats = stats.merge(directory: @exporter.stats) if @exporter.is_a?(DirectoryExporter)
      { exporter: stats }
    end

    def memory_stats
      stats = {}
      if @allocations
        stats[:allocations] = @started && !@allocations_stopped ? Profiler._native_allocations_stats : @allocation_stats
        stats[:allocations] = stats[:allocations].merge(stopped: @allocations_stopped) if @allocations_stopped
      end
      stats[:gc_lost_ns] = Profiler._native_gc_lost_ns if @gc
      stats[:gc_stopped] = @gc_stopped if @gc_stopped
      stats
    end

    # The live objects of the sampled allocations, per allocating stack and class, into the
    # current window.
    def record_heap
      return unless @heap

      values = Array.new(value_types.size, 0)
      samples_index = VALUE_TYPES.size + ALLOCATION_VALUE_TYPES.size
      Profiler._native_heap_live.each do |frames, class_name, samples, size|
        values[samples_index] = samples
        values[samples_index + 1] = size
        @recorder.record_sample(frames, values, [[ALLOCATION_CLASS_LABEL, class_name], [PROCESS_ID_LABEL, @pid]])
      end
    rescue StandardError => e
      DdprofRecorder.logger.error("profiler: could not record the live heap: #{e.class}: #{e.message}")
    end

    def now_ns
      Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    end

    def signal_stats(native)
      return nil if @sampling_mode == :off

      native[:signals]
    end

    def internal_thread?(thread)
      thread.is_a?(OwnThread)
    end

    # The running sampler thread's CPU since it started: its native thread's clock, less the
    # baseline the thread read first thing (Ruby may give a new thread the native thread of one
    # that ended, clock and all). Nil until it read its baseline.
    def sampler_thread_cpu_ns
      base = @sampler_thread_cpu_base
      id = base && @sampler_thread&.alive? && @sampler_thread.native_thread_id
      now = id && Profiler._native_thread_cpu_time_ns(id)
      now && [now - base, 0].max
    rescue NoMethodError # no Thread#native_thread_id before Ruby 3.1
      nil
    end

    # The Ruby sampler thread: passes when no job runs (every thread blocked: the trigger then
    # writes to `wake`; the rule, with {JOBLESS_TICKS}, is stated in the module doc of
    # ext/ddprof_recorder/src/sampling/trigger.rs, "Waking the Ruby sampler thread"), windows,
    # and the log of failed jobs. While jobs run, it wakes only every {HOUSEKEEPING_SECONDS}:
    # a Ruby thread woken `hz` times a second would cost the process about 50 µs each time on
    # this VM (1% of a core at 99 Hz, measured).
    def run_sampler_thread(wake, run)
      cpu_base = Profiler._native_current_thread_cpu_time_ns
      @sampler_thread_cpu_base = cpu_base if @run.equal?(run)
      period_ns = 1_000_000_000 / @hz
      while @running && @run.equal?(run)
        timeout = HOUSEKEEPING_SECONDS
        timeout = ((@next_window_ns - now_ns) / 1e9).clamp(0, timeout) if @next_window_ns
        woken = IO.select([wake], nil, nil, timeout)
        break unless @running && @run.equal?(run)

        drain(wake) if woken
        now = now_ns
        last_job = @sampler.last_job_ns
        @sampler.pass(now) if woken && (last_job.nil? || now - last_job > JOBLESS_TICKS * period_ns)
        keep_signal
        note_unarmed_threads
        read_stacks_at_jobs(AutoCompactGuard::REASON) if AutoCompactGuard::NEEDED && @sampling_mode == :handler && GC.auto_compact
        cut_window if @next_window_ns && now >= @next_window_ns
        @sampler.write_log
        give_up if @sampler.gave_up?
      end
    ensure
      # Its own CPU in all, for #stats once it has ended (none if it ended before its baseline).
      if @run.equal?(run)
        @sampler_thread_cpu_ns = cpu_base ? Profiler._native_current_thread_cpu_time_ns - cpu_base : 0
      end
    end

    def drain(wake)
      wake.read_nonblock(4096, exception: false)
    end

    # In the sampler thread, at each of its wake-ups (and so before each window's end): that our
    # handler is still the one on our signal, which a C extension's `sigaction` may have
    # replaced (a Ruby `trap` of it is seen before it takes it: {SignalGuard}), and what became
    # of the signal if the program took it: said once in the log, the profile's comments and
    # `stats[:signals][:signal_taken]`; with no other signal free, the threads are sampled at
    # the passes from then on.
    def keep_signal(taken = 0)
      return if @sampling_mode.nil? || @sampling_mode == :off

      text, sampling = Profiler._native_keep_signal(taken)
      return if text.nil? || text == @signal_taken

      @signal_taken = text
      @sampler.stop_signals unless sampling
      DdprofRecorder.logger.warn("profiler: #{text.split('; then ').last}")
      @comments = @comments.reject { |c| c.start_with?(SIGNAL_COMMENT) } + ["#{SIGNAL_COMMENT}#{text}"]
      @recorder.comments = @comments
    end

    # The threads that block our signal (ThreadSampler#blocks_signal) and those that got no
    # slot (ThreadSampler#no_slot), sampled at the passes instead: in the profile's comments
    # once their counts change. `record`'s summary shows them under its `sampling` line.
    def note_unarmed_threads
      counts = @sampler.counts
      noted = [counts[:signal_blocked_threads], counts[:signal_unarmed_threads]]
      return if noted == [0, 0] || noted == @unarmed_noted

      @unarmed_noted = noted
      blocked, no_slot = noted
      texts = []
      if blocked.positive?
        texts << "#{BLOCKED_COMMENT}#{threads_text(blocked)} blocked the profiler's signal: " \
                 "sampled at the wall passes and their own jobs instead"
      end
      if no_slot.positive?
        texts << "#{NO_SLOT_COMMENT}#{threads_text(no_slot)} had none (#{SIGNAL_SLOTS} threads at most are " \
                 "sampled at their CPU ticks): sampled at the wall passes and their own jobs instead"
      end
      @comments = @comments.reject { |c| c.start_with?(BLOCKED_COMMENT, NO_SLOT_COMMENT) } + texts
      @recorder.comments = @comments
    end

    def threads_text(count)
      "#{count} thread#{'s' if count > 1}"
    end

    def give_up
      Profiler._native_sampling_stop(self)
      @running = false
    end

    # With the lifecycle lock, at the end of {#start}: the native trigger (and the signal
    # handler, in signal mode), then every thread's timer. Another profiler sampling in this
    # process makes it raise, and this run's wake-up pipe is closed (its threads are not made
    # yet: #start makes them last).
    def start_sampling(run, wake)
      @sampling_mode, @sampling_mode_reason = choose_sampling_mode
      @interrupt_deferral = Profiler._native_interrupt_deferral_checked?
      begin
        @thread_ends_dropped_base = Profiler._native_sampling_stats[:thread_ends_dropped]
        Profiler._native_sampling_start(@hz, @sampler, @wake_writer.fileno, @sampling_mode, @ticks, self,
                                        defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? ? true : false)
      rescue StandardError
        @started = @running = false
        @run = nil if @run.equal?(run)
        @wake_writer.close
        wake.close
        raise
      end
      @thread_end_hook = Profiler._native_sampling_stats[:thread_end_hook]
      @sampler.start_signals(1_000_000_000 / @hz) unless @sampling_mode == :off
      signals = Profiler._native_sampling_stats[:signals]
      @ticks_used = signals[:ticks]
      @signal_taken = @unarmed_noted = nil
      @comments = [sampling_comment(signals)]
      @recorder.comments = @comments
    end

    # The profile says how it was sampled (pprof's comments: `go tool pprof -comments`, and
    # `record`'s summary).
    def sampling_comment(signals)
      signal = signals[:signal]
      tick = if signals[:ticks] == :perf_events
               "at each 1/#{@hz} s of its CPU (perf events)"
             elsif signals[:perf_refused]
               "at each CPU tick, at most the kernel's tick rate (CPU timers: #{signals[:perf_refused]})"
             else
               "at each CPU tick, at most the kernel's tick rate (CPU timers: ticks: :cpu)"
             end
      how = case @sampling_mode
            when :handler then "each thread #{tick} (#{signal}), stacks read in the signal handler#{gc_ticks_note}"
            when :safepoint
              "each thread #{tick} (#{signal}), stacks read at the next interrupt check (#{@sampling_mode_reason})"
            else "at the VM's interrupt checks, no signal (signals: false)"
            end
      deferral = @interrupt_deferral ? "" : "; the program's Thread#raise and Timeout may be lost in the profiler's " \
                                                  "jobs (Ruby #{RUBY_VERSION}'s thread layout is not checked)"
      "sampling: #{how}, #{@hz} Hz#{deferral}"
    end

    # What becomes of a tick that comes inside the GC
    # (ext/ddprof_recorder/src/sampling/signal_sampler/gc_ticks.rs):
    # nothing to say with gc: true, whose GC frames measure the GC's time.
    def gc_ticks_note
      return "" if @gc

      GC_TICKS_READ ? " (in the GC: at its step's end)" : " (in the GC: at the next interrupt check, Ruby < 3.3)"
    end

    def choose_sampling_mode
      return [:off, nil] unless @signals
      if defined?(RubyVM::YJIT) && RubyVM::YJIT.enabled? && !HANDLER_READS_UNDER_YJIT
        return [:safepoint, "YJIT is on (Ruby < 3.3)"]
      end
      unless Profiler._native_handler_can_read_stacks?
        return [:safepoint, "Ruby #{RUBY_VERSION}'s thread layout is not checked (ext/ddprof_recorder/src/vm/mod.rs)"]
      end
      return [:safepoint, AutoCompactGuard::REASON] if AutoCompactGuard::NEEDED && GC.auto_compact

      AutoCompactGuard.install
      [:handler, nil]
    end

    # In the sampler thread, every `interval`: closes the window (with what the threads hold)
    # and queues it for the exporter thread.
    def cut_window
      @next_window_ns += (@interval * 1e9).to_i
      @sampler.flush
      record_heap
      result = @recorder.serialize
      @exporting << result if result
    end

    # The end of {#stop}, outside the lifecycle lock: with the objects of the run it stops
    # (a new run may have started meanwhile).
    def finish_run(run, caller_cpu_ns, caller_stack)
      stop_sampler_thread(run[:thread], run[:wake])
      run[:wake].close
      native = Profiler._native_sampling_stats
      @trigger_cpu_ns = native[:trigger_cpu_ns]
      @thread_end_native = native
      @signal_stats = signal_stats(native)
      sampler = run[:sampler]
      sampler.write_log
      run[:exporting]&.close(@export_timeout)
      begin
        sampler.flush(caller_cpu_ns: caller_cpu_ns, caller_stack: caller_stack)
      rescue StandardError => e # never expected; the window is still worth having
        DdprofRecorder.logger.error("profiler: could not record the idle samples: #{e.class}: #{e.message}")
      end
      result = run[:recorder].serialize
      run[:exporting].deliver(result) if result && run[:exporting]
      result
    end

    def stop_sampler_thread(thread, wake)
      return if thread.nil? || thread.equal?(Thread.current)

      wake.write_nonblock("!", exception: false)
      return if thread.join(STOP_TIMEOUT)

      DdprofRecorder.logger.warn("profiler: #{thread.name} did not stop in #{STOP_TIMEOUT} s; killing it")
      thread.kill
    end
  end
end
