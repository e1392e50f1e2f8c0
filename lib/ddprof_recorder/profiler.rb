# frozen_string_literal: true

module DdprofRecorder
  # A small sampling profiler built on {StackRecorder}: a background thread wakes up `hz`
  # times a second and records, for every other live Ruby thread, its stack with
  #
  # - `cpu-time`: nanoseconds of CPU the thread itself used since its previous sample, read
  #   from the thread's own kernel CPU clock (natively, by its `native_thread_id`), so a thread
  #   that sleeps or waits for I/O or the GVL gets none;
  # - `cpu-samples`: 1 per sample;
  # - `wall-time`: nanoseconds since the thread's previous sample;
  #
  # and the labels `"thread id"` (`"<native id> (<object_id>)"`), `"thread name"`
  # (`Thread#name`, `"main"` for the main thread, else where the thread was created) and
  # `"process id"` (the pid, a number: tells apart the processes of a forking server once
  # their profiles are merged).
  #
  # Values are differences of clocks, so totals are exact whatever the sampling rate: the
  # rate decides only how finely time is split between stacks. A thread that has not run
  # since it was last looked at (its CPU clock has not moved) still has the same stack: its
  # samples are added up and recorded as one (`cpu-samples` = their number) when it runs
  # again, ends, or the window closes, which saves reading and recording the same stack of
  # every idle thread on every pass. The sampler is a Ruby thread
  # and needs the GVL to look at stacks; while another thread runs Ruby code without
  # pause, Ruby hands the GVL over every 100 ms only (its thread time slice), so a CPU-bound
  # program is sampled about 10 times a second whatever `hz` says. {#stats} reports the rate
  # really reached.
  #
  # @example
  #   pprof = DdprofRecorder::Profiler.profile(hz: 99) { work }
  #   File.binwrite("profile.pb.gz", pprof)
  #
  #   DdprofRecorder::Profiler.start(interval: 60) { |start, finish, pprof| upload(pprof) }
  #   ...
  #   DdprofRecorder::Profiler.stop
  #
  # The native half (`_native_thread_cpu_time_ns`) is ext/ddprof_recorder/src/thread_cpu.rs.
  class Profiler
    DEFAULT_HZ = 99
    HZ_RANGE = (1..1000).freeze
    # Value types of the profiles made, in value order (StackRecorder's defaults).
    VALUE_TYPES = StackRecorder::DEFAULT_VALUE_TYPES
    THREAD_ID_LABEL = "thread id"
    THREAD_NAME_LABEL = "thread name"
    PROCESS_ID_LABEL = "process id"
    # A sampling pass that raises is logged and skipped; this many in a row stop the sampler
    # rather than flood the log of a program that would keep failing the same way.
    MAX_CONSECUTIVE_ERRORS = 10
    # How long {#stop} waits for the sampler to notice (it wakes up at once).
    STOP_TIMEOUT = 5
    # How long {#stop} lets the exporter finish handing over the windows before the last one.
    EXPORT_TIMEOUT = 30

    # Per Ruby thread, between samples: the wall clock when it was last looked at, its labels,
    # the stack last recorded, and the idle samples not recorded yet (see #sample_thread).
    # CPU clocks are kept per native thread instead (see #baseline_threads).
    ThreadState = Struct.new(:wall_ns, :native_id, :name, :labels, :locations, :idle_wall_ns, :idle_samples)
    private_constant :ThreadState

    @current = nil
    @current_lock = Mutex.new

    class << self
      # Starts the process-wide profiler (see {#initialize} for the options).
      #
      # @return [Profiler] the running profiler.
      # @raise [DdprofRecorder::Error] if one is already running.
      def start(**options, &exporter)
        @current_lock.synchronize do
          raise Error, "the profiler is already running (call DdprofRecorder::Profiler.stop first)" if @current&.running?

          @current&.stop # one that stopped sampling on its own: let its threads go
          @current = new(**options, &exporter).start
        end
      end

      # Stops the process-wide profiler.
      #
      # @return [Array(Time, Time, String), nil] the last window `[start, finish, pprof]`
      #   (also handed to the exporter if there is one), or nil if it was not running.
      def stop
        profiler = @current_lock.synchronize { @current.tap { @current = nil } }
        profiler&.stop
      end

      # @return [Profiler, nil] the process-wide profiler, if started.
      attr_reader :current

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
    end

    # @return [Integer] samples per second asked for.
    attr_reader :hz
    # @return [Numeric, nil] seconds between two windows handed to the exporter.
    attr_reader :interval

    # @param hz [Integer] sampling passes per second, 1..1000.
    # @param interval [Numeric, nil] with an exporter, hand it a window every `interval`
    #   seconds (default 60); the last window goes to it at {#stop}. The sampler thread cuts
    #   the windows (a few ms: encoding runs without the GVL).
    # @param exporter [#call, #export, nil] receives `(start, finish, pprof)` for each window:
    #   `export` if it has one, else `call`. Or pass a block. It runs in a thread of its own
    #   (the last window: in the thread calling {#stop}) and may take its time; an exception
    #   it raises is logged and forgotten.
    # @param max_frames [Integer] deepest stack kept (see {StackRecorder.new}).
    # @param compression [Symbol] `:gzip` (default, the usual `.pb.gz`) or `:none`.
    # @raise [ArgumentError] on a bad option.
    def initialize(hz: DEFAULT_HZ, interval: nil, exporter: nil, max_frames: StackRecorder::DEFAULT_MAX_FRAMES,
                   compression: :gzip, &block)
      raise ArgumentError, "hz must be an Integer in #{HZ_RANGE}, got #{hz.inspect}" unless hz.is_a?(Integer) && HZ_RANGE.cover?(hz)
      raise ArgumentError, "give an exporter or a block, not both" if exporter && block
      unless interval.nil? || (interval.is_a?(Numeric) && interval.positive?)
        raise ArgumentError, "interval must be a positive number of seconds, got #{interval.inspect}"
      end

      @exporter = exporter || block
      if @exporter && !(@exporter.respond_to?(:export) || @exporter.respond_to?(:call))
        raise ArgumentError, "exporter must respond to #export or #call"
      end
      raise ArgumentError, "interval needs an exporter (or a block) to hand the windows to" if interval && !@exporter

      @hz = hz
      @interval = interval || (@exporter ? 60 : nil)
      @max_frames = max_frames
      @compression = compression
      # Fails now, not in start, on a bad max_frames / compression.
      @recorder = new_recorder
      @lifecycle = Mutex.new
      # @started: between start and stop; @running: the sampler should keep sampling (it
      # clears it itself after too many failures).
      @started = false
      @running = false
      @stats = nil
    end

    # Starts sampling (in a new window: anything recorded before is dropped).
    #
    # @return [self]
    # @raise [DdprofRecorder::Error] if already running.
    def start
      @lifecycle.synchronize do
        raise Error, "this profiler is already running" if @started && Process.pid == @pid

        @recorder = new_recorder
        @pid = Process.pid
        @threads = {}.compare_by_identity
        @cpu_by_tid = {}
        @stats = { passes: 0, samples: 0, errors: 0, consecutive_errors: 0 }
        @started_ns = @last_pass_ns = now_ns
        @next_window_ns = @interval && (@started_ns + (@interval * 1e9).to_i)
        baseline_threads(@started_ns)
        @started = @running = true
        @sampler = Thread.new { run_sampler }
        @sampler.name = "ddprof_recorder sampler"
        @sampler.report_on_exception = false
        if @exporter
          @windows = Queue.new
          @exporter_thread = Thread.new { run_exporter(@windows) }
          @exporter_thread.name = "ddprof_recorder exporter"
          @exporter_thread.report_on_exception = false
        end
      end
      self
    end

    # Stops sampling and returns the last window.
    #
    # @return [Array(Time, Time, String), nil] `[start, finish, pprof]` (also handed to the
    #   exporter, if any), or nil if not started (or in a forked child, where the profiler's
    #   threads do not exist: start a new profiler there).
    def stop
      @lifecycle.synchronize do
        return nil unless @started

        @started = @running = false
        @stopped_ns = now_ns
        return nil unless Process.pid == @pid

        stop_thread(@sampler, STOP_TIMEOUT)
        if @exporter_thread
          @windows.close # the exporter hands over what is queued, then ends
          stop_thread(@exporter_thread, EXPORT_TIMEOUT)
          @exporter_thread = nil
        end
        begin
          flush_idle_samples
        rescue StandardError => e # never expected; the window is still worth having
          DdprofRecorder.logger.error("profiler: could not record the idle samples: #{e.class}: #{e.message}")
        end
        result = @recorder.serialize
        deliver(result) if result && @exporter
        result
      end
    end

    # In a forked child, profiles the child from now on: the profiler was running in the
    # parent, but its threads did not survive the fork. Forgets the parent's threads and state
    # and starts again, through {#start}, with the same options and exporter, in a window of
    # its own (the parent's samples stay the parent's). {ForkHook} calls it for the
    # process-wide profiler.
    #
    # @return [self, nil] self, or nil if there is nothing to restart (not started, or not in
    #   a child of the process that started it).
    def restart_after_fork
      return nil unless @started && @pid != Process.pid

      # A thread of the parent may have held it at fork; that thread is gone.
      @lifecycle = Mutex.new
      @started = @running = false
      @sampler = @exporter_thread = @windows = nil
      # The child's one thread (see #native_id).
      @forked_thread = Thread.current
      start
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
    # @return [Hash{Symbol => Numeric}] `:passes` (sampling passes), `:samples` (thread
    #   samples recorded), `:errors` (passes that raised), `:seconds`, `:effective_hz`
    #   (passes per second really reached), `:sampler_cpu_ns` (CPU the sampler thread used,
    #   nil once it has exited), `:recorder` ({StackRecorder#stats}).
    def stats
      return {} unless @stats

      seconds = ((@started ? now_ns : (@stopped_ns || now_ns)) - @started_ns) / 1e9
      sampler_id = @sampler && native_id(@sampler)
      {
        passes: @stats[:passes],
        samples: @stats[:samples],
        errors: @stats[:errors],
        seconds: seconds,
        effective_hz: seconds.positive? ? @stats[:passes] / seconds : 0.0,
        sampler_cpu_ns: sampler_id && Profiler._native_thread_cpu_time_ns(sampler_id),
        recorder: @recorder.stats,
      }
    end

    private

    def new_recorder
      StackRecorder.new(value_types: VALUE_TYPES, max_frames: @max_frames, compression: @compression)
    end

    def now_ns
      Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
    end

    def internal_thread?(thread)
      thread.equal?(@sampler) || thread.equal?(@exporter_thread)
    end

    # The threads alive at start count from start: their time before it is not ours.
    #
    # CPU clocks are per native thread, and Ruby keeps the native thread of a finished Ruby
    # thread for the next one (its thread cache), clock and all. So the CPU baseline is taken
    # for every native thread of the process (/proc/self/task), idle cached ones included: a
    # Ruby thread started later on a reused native thread then starts from that thread's
    # reading, not from 0, and is not charged the CPU of the threads that ran there before.
    def baseline_threads(now)
      native_thread_ids.each do |tid|
        cpu = Profiler._native_thread_cpu_time_ns(tid)
        @cpu_by_tid[tid] = cpu if cpu
      end
      Thread.list.each do |thread|
        @threads[thread] = new_state(thread, now) unless internal_thread?(thread)
      end
    end

    def native_thread_ids
      ids = Dir.children("/proc/self/task").map(&:to_i)
      ids.empty? ? Thread.list.filter_map { |t| native_id(t) } : ids
    rescue SystemCallError
      Thread.list.filter_map { |t| native_id(t) }
    end

    # `Thread#native_thread_id` came with Ruby 3.1; before it, no thread's CPU clock can be
    # read and cpu-time stays 0.
    if Thread.method_defined?(:native_thread_id)
      # The thread that forked keeps its id from the parent in the child (Ruby bug #19873,
      # fixed in 3.3), where it is not a thread: a forked child's one thread is its main
      # thread, whose id is the pid (Linux).
      def native_id(thread)
        thread.equal?(@forked_thread) ? Process.pid : thread.native_thread_id
      end
    else
      def native_id(_thread)
        nil
      end
    end

    def new_state(thread, wall_ns)
      ThreadState.new(wall_ns, nil, nil, nil, nil, 0, 0).tap { |s| refresh_labels(s, thread) }
    end

    # Forgets the finished threads (after recording their idle samples) and native threads
    # (their tids may come back for new threads, which then count from 0 as they should).
    def prune_finished_threads
      @threads.delete_if do |thread, state|
        next false if thread.alive?

        flush_idle(state)
        true
      end
      @cpu_by_tid.delete_if { |tid, _| Profiler._native_thread_cpu_time_ns(tid).nil? }
    end

    # Records the idle samples of every thread: before a window closes.
    def flush_idle_samples
      @threads.each_value { |state| flush_idle(state) }
    end

    def flush_idle(state)
      return if state.idle_samples.zero?

      @recorder.record_sample(state.locations, [0, state.idle_samples, state.idle_wall_ns], state.labels)
      state.idle_samples = state.idle_wall_ns = 0
    end

    def run_sampler
      period_ns = 1_000_000_000 / @hz
      next_tick = now_ns + period_ns
      while @running
        delay = next_tick - now_ns
        sleep(delay / 1e9) if delay.positive?
        break unless @running

        sample_pass
        cut_window if @next_window_ns && now_ns >= @next_window_ns
        next_tick += period_ns
        now = now_ns
        # Behind (the GVL came late): start again from now rather than catch up in a burst.
        next_tick = now + period_ns if next_tick < now
      end
    end

    def sample_pass
      now = now_ns
      Thread.list.each do |thread|
        sample_thread(thread, now) unless internal_thread?(thread)
      end
      prune_finished_threads if (@stats[:passes] % 64).zero?
      @last_pass_ns = now
      @stats[:passes] += 1
      @stats[:consecutive_errors] = 0
    rescue StandardError => e
      @stats[:errors] += 1
      @stats[:consecutive_errors] += 1
      DdprofRecorder.logger.warn("profiler: sampling failed: #{e.class}: #{e.message}")
      return if @stats[:consecutive_errors] < MAX_CONSECUTIVE_ERRORS

      DdprofRecorder.logger.error("profiler: #{MAX_CONSECUTIVE_ERRORS} sampling passes failed in a row; sampling stops")
      @running = false
    end

    def sample_thread(thread, now)
      tid = native_id(thread)
      cpu = tid && Profiler._native_thread_cpu_time_ns(tid)
      # New since the previous pass: its wall time counts from that pass.
      state = (@threads[thread] ||= new_state(thread, @last_pass_ns))
      same_labels = thread.name.equal?(state.name) && tid == state.native_id
      wall = now - state.wall_ns
      wall = 0 if wall.negative?

      if cpu && cpu == @cpu_by_tid[tid] && state.locations && same_labels
        # It has not run since it was last looked at: same stack. Add up, record later.
        state.wall_ns = now
        state.idle_wall_ns += wall
        state.idle_samples += 1
        @stats[:samples] += 1
        return
      end

      locations = thread.backtrace_locations
      # nil: the thread is dead; empty: not started yet or ending. Nothing to attribute the
      # time to: its next sample gets it (its clocks are left as they are).
      return if locations.nil? || locations.empty?

      flush_idle(state)
      refresh_labels(state, thread) unless same_labels
      cpu_used = 0
      if cpu
        previous = @cpu_by_tid[tid] || 0
        cpu_used = cpu - previous if cpu > previous
        @cpu_by_tid[tid] = cpu
      end
      state.wall_ns = now
      state.locations = locations
      @recorder.record_sample(locations, [cpu_used, 1, wall], state.labels)
      @stats[:samples] += 1
    end

    def refresh_labels(state, thread)
      state.name = thread.name
      state.native_id = native_id(thread)
      id = state.native_id ? "#{state.native_id} (#{thread.object_id})" : thread.object_id.to_s
      state.labels = [[THREAD_ID_LABEL, id].freeze, [THREAD_NAME_LABEL, display_name(thread)].freeze,
                      [PROCESS_ID_LABEL, Process.pid].freeze].freeze
    end

    # `Thread#name`, or "main", or where the thread was created (from `Thread#inspect`,
    # `#<Thread:0x... file.rb:12 run>`).
    def display_name(thread)
      return thread.name if thread.name
      return "main" if thread.equal?(Thread.main)

      thread.inspect[/\A#<Thread:0x\h+ (.+) \w+>\z/, 1] || "thread #{thread.object_id}"
    end

    # In the sampler thread, every `interval`: closes the window (with the idle samples it
    # holds) and queues it for the exporter thread.
    def cut_window
      @next_window_ns += (@interval * 1e9).to_i
      flush_idle_samples
      result = @recorder.serialize
      @windows << result if result
    rescue ClosedQueueError
      nil # stopping: the window is in the last one
    end

    def run_exporter(windows)
      while (result = windows.pop)
        deliver(result)
      end
    end

    def deliver(result)
      if @exporter.respond_to?(:export)
        @exporter.export(*result)
      else
        @exporter.call(*result)
      end
    rescue StandardError => e
      DdprofRecorder.logger.error("profiler: the exporter raised #{e.class}: #{e.message}")
    end

    def stop_thread(thread, timeout)
      return if thread.equal?(Thread.current)

      thread.wakeup if thread.alive? && thread.equal?(@sampler)
      return if thread.join(timeout)

      DdprofRecorder.logger.warn("profiler: #{thread.name} did not stop in #{timeout} s; killing it")
      thread.kill
    rescue ThreadError
      nil # it ended between alive? and wakeup
    end
  end
end
