# frozen_string_literal: true

require_relative "frame_names"

module DdprofRecorder
  class Profiler
    # What the profiler records, thread by thread: the per-thread accounts of CPU and wall
    # time, and the samples made from them. It is driven from two places:
    #
    # - {#call}: the sampling job (ext/ddprof_recorder/src/sampling/job.rs), about `hz` times a
    #   second on the thread that holds the GVL, with that thread's CPU clock. The thread is
    #   on the CPU, so this is an *on-CPU sample*: its stack gets the CPU the thread used since
    #   its previous on-CPU sample. Then it makes a {#pass} over the other threads.
    # - {#pass}: every other live thread gets a *wall sample* at the rate asked for. The
    #   profiler's Ruby thread also makes passes when no job came for a while (no thread
    #   runs Ruby, so the trigger's jobs do not run).
    #
    # Where CPU goes. A thread's CPU is charged only at an on-CPU moment: an on-time job on
    # that thread, or a pass that finds it runnable (it was preempted while running Ruby, so
    # its stack is where it ran). A pass that finds a thread blocked (`sleep`, I/O, a lock)
    # does not charge it the CPU it used since its last on-CPU sample: that CPU was spent
    # before it blocked, not in the blocking call its stack shows now. Nor does a job that ran
    # late because its thread was blocked when the tick came (the job then runs when the
    # thread wakes, inside `Kernel#sleep`). That CPU is *carried* to the thread's next on-CPU
    # sample, which is a random on-CPU moment of the same thread; what is still carried when
    # the window closes or the thread ends goes to the thread's last on-CPU stack (or, for a
    # thread never seen on the CPU, e.g. one running C code without the GVL, its stack then).
    # So no CPU is lost or counted twice; the rate only decides how finely it is split.
    #
    # Thread ends: a thread that ends between two passes would take the CPU it used since its
    # last charge with it (a dead thread's clock cannot be read), and a thread no pass saw all
    # of it. ext/ddprof_recorder/src/sampling/thread_end.rs queues each thread's CPU clock at its end
    # (and each native thread's at its exit), which every pass and flush takes first
    # (#take_thread_ends): see #thread_ended and #thread_exited.
    #
    # The job's own CPU is not charged to the program: the thread's account skips it.
    #
    # Integers are compared with `equal?` wherever the other side may be nil, true or another
    # object. The jobs run at the interrupted thread's interrupt checks, and `Integer#==` with
    # an argument that is not a number calls it back through numeric.c's `num_funcall1`,
    # under a recursion guard on the pair (seen on 3.1.2 and 3.4.5): if the interrupted code was in
    # the same guard (its own `0 == nil`, or 3.4's `Queue#pop`, whose C code does
    # `rb_equal(INT2FIX(0), timeout)`), our `0 == nil` raised `NameError: ==0`, and a program
    # looping on `x == nil` stopped sampling (10 failed passes in a row) within a second at
    # 999 Hz. Fixnums are immediates, so `equal?` is their `==` and calls nothing.
    #
    # Idle threads: a thread whose CPU clock has not moved since it was last looked at has not
    # run, so its stack has not changed; its wall samples are added up and recorded as one
    # (`cpu-samples` = how many) when it runs again, ends, or the window closes.
    #
    # Clocks come from a clock object (`now_ns`, `thread_cpu_ns(tid)`, `current_cpu_ns`) so
    # that the accounting can be tested with fake clocks.
    class ThreadSampler
      THREAD_ID_LABEL = "thread id"
      THREAD_NAME_LABEL = "thread name"
      # A sampling pass or job that raises is logged and skipped; this many in a row stop
      # sampling rather than flood the log of a program that would keep failing the same way.
      MAX_CONSECUTIVE_ERRORS = 10
      GC_FRAME = ["(garbage collection)", "", 0].freeze
      # Signal samples kept while a pass holds the lock (switched out), for the next job.
      MAX_PENDING_SIGNAL_SAMPLES = 256
      # Passes between two looks for new threads even when no thread began (see #list_threads).
      LIST_EVERY = 64
      # The threads that could not be armed (#arm) are tried again every this many passes.
      REARM_EVERY = 128
      # The keys of the stacks that passes read of other threads (#pass_stack), one per
      # ThreadState, counting down from here: apart from the signal samples' and the jobs'
      # (ext/ddprof_recorder/src/sampling/signal_sampler/samples.rs, `key`; #call).
      PASS_STACK_KEYS = -(1 << 40)
      # How a signal sample's cpu-time is made (see #signal_charge): the thread's average CPU
      # per sample is taken over about this many of its samples...
      SIGNAL_AVERAGE_SAMPLES = 32
      # ... and the CPU not charged yet is brought back to this many averages of reserve over
      # about SIGNAL_SPREAD samples.
      SIGNAL_RESERVE = 3
      SIGNAL_SPREAD = 8
      GC_KIND_LABEL = "gc kind"
      # The CPU, past the start's clock (#started), that is still the profiler's: the rest of
      # #started and the way out of Profiler#start and its caller (Recording.start) to the
      # program. Measured: 2 to 9 µs from the clock to the caller of Profiler#start; ticks in
      # there had the clock's C method or Recording.start on top (2 of 200 `record` runs of a
      # short program at 999 Hz, two busy processes beside). A sample in it records nothing;
      # its CPU goes to the next one.
      START_SLACK_NS = 100_000
      # Where the CPU of a thread's last moments goes when no on-CPU stack of it is known: at
      # its end hook no Ruby frame is left (its block has returned).
      THREAD_EXIT_STACK = [["(thread exit)", "", 0].freeze].freeze
      # The label that dates a sample (see #timed).
      END_TIMESTAMP_LABEL = StackRecorder::END_TIMESTAMP_LABEL
      # With the timeline, what a dated sample's thread was doing at its time (see #timed):
      # running on the CPU, ready to run but without the GVL, blocked (sleep, I/O, a lock, a
      # queue), or in the GC.
      THREAD_STATE_LABEL = "thread state"
      RUNNING, WAITING, BLOCKED, IN_GC = ["running", "waiting for GVL", "blocked", "gc"].map do |state|
        [THREAD_STATE_LABEL, state].freeze
      end
      # A native thread that exited with CPU no thread account holds: on Ruby 3.1, a thread
      # that ended with an exception or was killed (its end hook did not fire) before any pass
      # saw it.
      UNSAMPLED_STACK = [["(unsampled thread)", "", 0].freeze].freeze
      # Where the CPU of a thread that had no on-CPU sample goes: not to the stack a pass found
      # it waiting on, where it spent none (a thread that waited on a Queue, then burned 10 ms
      # and ended, at 99 Hz: its CPU was on Thread::Queue#pop). A thread that uses less than
      # a period of CPU in all is sampled with a chance in proportion to it.
      CPU_NOT_SAMPLED_STACK = [["(CPU not sampled)", "", 0].freeze].freeze
      # The GC's phases and kinds, in the order Profiler._native_take_gc gives their times.
      GC_BUCKETS = [["(marking)", "minor"], ["(marking)", "major"], ["(sweeping)", "minor"],
                    ["(sweeping)", "major"]].map do |phase, kind|
        [[[phase, "", 0].freeze, GC_FRAME].freeze, [GC_KIND_LABEL, kind].freeze].freeze
      end.freeze

      # The real clocks, native functions (ext/ddprof_recorder/src/sampling/clocks/, registered in
      # ext/ddprof_recorder/src/ruby_api/profiler.rs), called with no Ruby method in between (the
      # jobs read them with cold caches):
      # - `now_ns`: the monotonic clock;
      # - `thread_cpu_ns(tid)`: thread `tid`'s CPU clock, nil if it cannot be read;
      # - `current_cpu_ns`: the calling thread's CPU clock;
      # - `moved(tids, seen)`: the indices `i` where thread `tids[i]`'s CPU clock does not
      #   read `seen[i]`;
      # - `thread_ends`: nil, or `[ends, exits]` queued by the thread-end hook and exit
      #   watches (flat: `[thread, tid, cpu_ns, at_ns]` per end, `[tid, cpu_ns]` per exit);
      # - `threads_begun`: how many threads the thread-event hook saw begin, nil while it is
      #   not on.
      Clock = Profiler::NativeClock

      # Per Ruby thread: `wall_ns`, when its wall time was last accounted; `seen_cpu_ns`, its
      # CPU clock when it was last looked at (idle detection); `labels` and what they were
      # made from; `locations`, the stack last recorded; `on_cpu_locations`, the stack of its
      # last on-CPU sample; `index`, its place in the scan arrays; `sample_mark`, the pass
      # count after which its passes are idle ones not recorded yet (see #flush_idle);
      # `armed`, the native id its CPU-time timer was armed for (see #start_signals);
      # `signal_pass`, the pass count at its latest signal sample; `signal_cpu_ns`, its CPU
      # clock then; `signal_average`, its CPU per signal sample (see #signal_charge); with the
      # timeline, `last_state`, the thread state of its last sample (see #flush_idle);
      # `stack_key`, the key its passes keep its stack under natively (see #pass_stack); `slot`,
      # its application labels' Labels::Slot once it has one, `slots_seen` the count of slots
      # made when it was last looked for, and `app` the application labels its `labels` hold
      # (see #app_labels); `unarmed_why`, :blocked or :no_slot once it could not be armed
      # (counted once, see #blocks_signal and #no_slot).
      ThreadState = Struct.new(:thread, :wall_ns, :seen_cpu_ns, :native_id, :name, :labels, :locations,
                               :on_cpu_locations, :index, :sample_mark, :armed, :signal_pass, :signal_cpu_ns,
                               :signal_average, :last_state, :stack_key, :slot, :slots_seen, :app, :unarmed_why)
      private_constant :ThreadState

      # @return [Hash{Symbol => Integer}] counters: `:passes` (the sampling periods the wall
      #   passes stood for, see #pass_periods), `:samples` (thread samples
      #   recorded or added up), `:on_cpu_samples`, `:signal_samples` (on-CPU samples taken
      #   at a thread's CPU tick, see #signal_samples), `:carried_cpu_samples` (samples whose
      #   CPU was carried), `:job_cpu_ns` (CPU the jobs' own work used), `:start_cpu_ns` (CPU
      #   of the profiler's starting work on the thread that started it, see #started),
      #   `:errors`, `:thread_ends` (threads accounted at their end hook), `:thread_exits` (native threads
      #   accounted at their exit), `:thread_end_cpu_ns` (CPU charged there),
      #   `:unsampled_thread_cpu_ns` (of which on `(unsampled thread)`), `:signal_blocked_threads`
      #   (threads found blocking our signal, see #blocks_signal), `:signal_unarmed_threads`
      #   (threads that got no slot, see #no_slot).
      attr_reader :counts
      # @return [Integer, nil] monotonic ns of the latest job, nil before the first.
      attr_reader :last_job_ns

      # @param recorder [StackRecorder]
      # @param internal [#call] `internal.call(thread)` is true for the profiler's own threads.
      # @param extra_labels [Array<Array>] labels added to every sample (e.g. the process id).
      # @param forked_thread [Thread, nil] in a forked child, the thread that forked (see
      #   #native_id); found by {.forked_thread} if not given.
      # @param extra_values [Integer] value types the recorder has after the three it records
      #   (they get 0).
      # @param gc [Boolean] charge the GC time that ext/ddprof_recorder/src/memory/gc_events.rs
      #   measures to a `(garbage collection)` frame, out of the thread's CPU.
      # @param timeline [Boolean] samples of a time (on-CPU, wall, idle, GC) carry it as an
      #   {END_TIMESTAMP_LABEL} (see #timed).
      # @param gvl_index [Integer, nil] where `gvl-wait-time` is in the values: each thread's
      #   GVL waits (Profiler._native_gvl_take) go there on its next sample.
      def initialize(recorder, internal:, clock: Clock, extra_labels: [], forked_thread: nil,
                     logger: DdprofRecorder.logger, extra_values: 0, gc: false, timeline: false, gvl_index: nil)
        @forked_thread = forked_thread || ThreadSampler.forked_thread
        @padding = Array.new(extra_values, 0).freeze
        @gvl_index = gvl_index
        @gc = gc
        # Unix time minus the clock's monotonic time, to date the samples (nil: no timeline).
        @unix_offset_ns = (Process.clock_gettime(Process::CLOCK_REALTIME, :nanosecond) - clock.now_ns if timeline)
        @recorder = recorder
        @internal = internal
        @clock = clock
        # Whether the clock queues thread ends and counts threads begun (a fake clock may not).
        @clock_ends = clock.respond_to?(:thread_ends)
        @clock_begun = clock.respond_to?(:threads_begun)
        @extra_labels = extra_labels.map(&:freeze).freeze
        @logger = logger
        @threads = {}.compare_by_identity
        # CPU clock reading up to which each native thread's CPU has been charged. Per native
        # thread, since Ruby reuses the native thread of a finished Ruby thread (clock and all).
        @charged_cpu = {}
        # The native ids of the profiler's own threads, as the passes list them: their native
        # threads' exits are the profiler's CPU, not an unsampled thread's (the sampler thread's
        # exit at a stop under GC.stress showed as one, with its 128 ms).
        @internal_tids = {}
        @lock = Mutex.new
        # The known threads' states, native ids and CPU clocks when last looked at (nil: look
        # again), in parallel arrays for one native scan per pass (see #pass_locked).
        @scan_states = []
        @scan_tids = []
        @scan_seen = []
        @counts = { passes: 0, samples: 0, on_cpu_samples: 0, signal_samples: 0, carried_cpu_samples: 0,
                    job_cpu_ns: 0, start_cpu_ns: 0, errors: 0, thread_ends: 0, thread_exits: 0,
                    thread_end_cpu_ns: 0, unsampled_thread_cpu_ns: 0, signal_blocked_threads: 0,
                    signal_unarmed_threads: 0 }
        # `[native id, CPU clock]` of the thread that started the profiler: its ticks and jobs
        # before that clock reading were inside Profiler#start (nil while it is under way);
        # and of the thread stopping it, after which they are inside Profiler#stop.
        @start_cut = @stopping = @stopping_cpu = nil
        # Threads accounted at their end, while Thread.list may still list them (see
        # #thread_ended), and per native id the labels and CPU clock of the thread that ended
        # there last, for its exit, with the prune count then (see #prune_ended).
        @ended = {}.compare_by_identity
        @ended_on = {}
        @prunes = 0
        @scan_stale = false
        # Signal sampling (#start_signals): the timers' period, and the states by native id.
        @signal_period_ns = nil
        @by_tid = {}
        @pending_signal = []
        @last_job_ns = nil
        @last_pass_ns = @clock.now_ns
        # Passes made (each stands for one or more periods in `counts[:passes]`, #pass_periods).
        @passes_made = 0
        # The clock's count of threads begun when the pass last listed the threads (nil: list).
        @listed_begun = nil
        # ThreadStates made, for their keys (see #pass_stack).
        @stack_keys = 0
        @consecutive_errors = 0
        @messages = []
        # Before anything is named: how frames are named, once per process.
        FrameNames.check
      end

      # The threads alive now count from now: their time before it is not ours. Baselines
      # every native thread of the process (/proc/self/task), idle cached ones included, so
      # that a Ruby thread started later on a reused native thread is not charged the CPU of
      # the threads that ran there before.
      #
      # @param starting [Boolean] the calling thread is starting the profiler: its samples
      #   until #started are the profiler's work.
      def baseline(native_ids, threads, starting: false)
        now = @clock.now_ns
        native_ids.each do |tid|
          cpu = @clock.thread_cpu_ns(tid)
          @charged_cpu[tid] = cpu if cpu
        end
        threads.each { |thread| @threads[thread] = new_state(thread, now) unless @internal.call(thread) }
        caller_tid = starting ? @threads[Thread.current]&.native_id : nil
        @start_cut = caller_tid && [caller_tid, nil]
        @last_pass_ns = now
      end

      # At the end of Profiler#start, on the thread that called it (and #baseline): the CPU it
      # used since #baseline was the profiler's starting work (arming timers, installing hooks,
      # the allocation calibration), so its account starts at its clock now, and a tick or a
      # job of it until then records nothing: its stack was inside Profiler#start. The clock
      # is read last, under the lock: a job that runs in here (at any C method's return)
      # keeps its samples for later, when they are judged by that clock; a clock read before
      # let through the samples taken after it, in here (`started` frames in record's profile
      # of a short program at 999 Hz, two busy processes beside).
      #
      # @return [void]
      def started
        @lock.synchronize do
          tid = @start_cut&.first
          state = @threads[Thread.current]
          next unless tid && state&.native_id == tid

          cpu_ns = @clock.current_cpu_ns
          @counts[:start_cpu_ns] += uncharged_cpu(tid, cpu_ns)
          charged_up_to(tid, cpu_ns)
          looked(state, cpu_ns)
          @start_cut = [tid, cpu_ns]
        end
      end

      # Profiler#stop's first step, on the thread that called it: a tick or a job of it records
      # nothing from now on (its stack is inside Profiler#stop; #flush charges what it carries
      # to where it called from). From now, not from a clock read, and before any method
      # call: a method's return, C ones too (`vm_pop_frame`), runs the jobs, and the first
      # one in stop recorded a tick taken on the way there (CI, 3.1.2 and 3.3.8, wall ticks
      # at 999 Hz: Profiler#stop frames in record_spec's profile, one at its first line). So
      # until this thread is known (`Thread.current` is such a call), no thread's tick
      # records: theirs then stays to be charged at their next. No lock: the GVL makes each
      # write one step.
      #
      # @return [Integer, nil] what it replaced, for #not_stopping.
      def stopping
        previous = @stopping
        @stopping = true
        @stopping = @threads[Thread.current]&.native_id
        # Its signal samples still waiting in a batch (see #take_signal_samples), taken before
        # this clock less START_SLACK_NS, are the program's: #own_work? lets the flush record
        # them.
        @stopping_cpu = Profiler._native_current_thread_cpu_time_ns if @signal_period_ns && @stopping
        previous
      end

      # Profiler#stop did not stop from this thread after all (a trap handler's call): what
      # #stopping replaced is back.
      #
      # @param previous [Integer, nil] what #stopping returned.
      # @return [void]
      def not_stopping(previous)
        @stopping = previous
        @stopping_cpu = nil
      end

      # The sampling job's handler, on the thread that holds the GVL.
      #
      # @param on_time [Boolean] false when the job ran late because its thread was blocked.
      # @param cpu_ns [Integer] the thread's CPU clock when the job started.
      # @param now_ns [Integer] the monotonic clock then.
      # @return [Boolean] whether it sampled. Not on the profiler's own threads: a job there
      #   does nothing, and the trigger, told so, keeps waking the sampler thread.
      def call(on_time, cpu_ns, now_ns)
        return false if @internal.call(Thread.current) || @ended.key?(Thread.current)

        thread = Thread.current
        # An armed thread's on-CPU samples come from its CPU ticks (#signal_samples), not from
        # here, where its stack is wherever the VM checked interrupts: the job only passes.
        armed = @threads[thread]&.armed
        unless armed
          # The frames below this method are the interrupted stack: read natively (no Ruby
          # object made), before anything else, and kept under the thread's key, its native
          # thread id (negated for a late job's stack, which is not an on-CPU one).
          tid = native_id(thread)
          key = tid && (on_time ? tid : -tid)
          depth = key ? Profiler._native_capture_stack(key) : 0
          locations = caller_locations(1) unless key
        end
        return if gave_up? || !@lock.try_lock # a pass or a flush is under way (switched out)

        begin
          @last_job_ns = now_ns
          sample_running(thread, key ? (key if depth.positive?) : locations, on_time, cpu_ns, now_ns) unless armed
          pass_locked(now_ns, thread)
          succeeded
        rescue StandardError => e
          failed(e)
        ensure
          # The lock goes back even if the accounting raises (it reads a clock natively).
          begin
            skip_own_cpu(thread, cpu_ns, on_time && !armed)
          ensure
            @lock.unlock
          end
        end
        true
      end

      # From now on every thread (known and new) gets a CPU-time timer (Profiler.
      # _native_signal_arm), and its on-CPU samples come from its ticks (#signal_samples);
      # `period_ns` is the CPU a sample stands for on average (1/hz). After Profiler.
      # _native_sampling_start installed the handler.
      def start_signals(period_ns)
        @lock.synchronize do
          @signal_period_ns = period_ns
          @threads.each_value { |state| arm(state) }
        end
      end

      # Signal sampling stopped for the rest of the run (the program took our signal and no
      # other was free: Profiler#keep_signal): what the slots hold is recorded, and every
      # thread's on-CPU samples come from the passes from now on, as with `signals: false`.
      def stop_signals
        @lock.synchronize do
          take_signal_samples
          @signal_period_ns = nil
          @threads.each_value { |state| state.armed = nil }
        end
      end

      # The sampling job of the signal handler (ext/ddprof_recorder/src/sampling/signal_sampler.rs),
      # with the GVL: each sample was taken at a thread's CPU tick, with its stack read then.
      # The thread's CPU since its previous on-CPU sample is charged to that stack.
      #
      # @param samples [Array<Integer>] `[tid, cpu_ns, at_ns, depth, key]` per sample, flat:
      #   the thread's native id, its CPU clock and the monotonic clock at the tick, the depth
      #   of the stack kept (0: none) and the key it is kept under.
      # @param job_cpu_ns [Integer] the calling thread's CPU clock when the job started.
      # @param now_ns [Integer] the monotonic clock then.
      # @return [Boolean] whether it also made the wall pass, as it does once half a period
      #   went by since the last one: the trigger then registers no job for a period
      #   (ext/ddprof_recorder/src/sampling/trigger.rs, SIGNAL_PASS_NS), so a busy thread runs one job
      #   where it would run two. False too if the samples wait for the next job (a pass is
      #   under way).
      #
      # Which ticks are samples: every scheduler tick a thread runs through is a candidate,
      # drawn independently with the same probability (ext/ddprof_recorder/src/sampling/signal_sampler.rs),
      # so the samples fall on the thread's stacks in proportion to the CPU they use.
      def signal_samples(samples, job_cpu_ns, now_ns)
        unless !gave_up? && @lock.try_lock
          @pending_signal.concat(samples) if @pending_signal.size < MAX_PENDING_SIGNAL_SAMPLES * 5
          return false
        end

        passed = false
        begin
          record_signal_samples(samples)
          # Samples alone are not a pass: a run of failing passes is not broken by them.
          if now_ns - @last_pass_ns >= @signal_period_ns / 2
            pass_locked(now_ns, Thread.current)
            passed = true
            succeeded
          end
        rescue StandardError => e
          failed(e)
        ensure
          begin
            skip_own_cpu(Thread.current, job_cpu_ns, false)
          ensure
            @lock.unlock
          end
        end
        passed
      end

      # A wall pass over every live thread but `except` (and the profiler's own).
      #
      # @return [Boolean] false if another pass was under way.
      def pass(now_ns = @clock.now_ns, except: nil)
        return false if gave_up? || !@lock.try_lock

        begin
          pass_locked(now_ns, except)
          succeeded
        rescue StandardError => e
          failed(e)
        ensure
          @lock.unlock
        end
        true
      end

      # @return [Boolean] whether it stopped sampling after {MAX_CONSECUTIVE_ERRORS} failures
      #   in a row (it logs each, then gives up rather than flood the log).
      def gave_up?
        @consecutive_errors >= MAX_CONSECUTIVE_ERRORS
      end

      # Records what is added up or carried: before a window closes (all threads) or when a
      # thread has ended.
      #
      # @param caller_cpu_ns [Integer, nil] when the calling thread is one the profiler
      #   samples (it is stopping the profiler): its CPU clock when it called, so that the
      #   profiler's own stopping work is not charged to it;
      # @param caller_stack [Array<Thread::Backtrace::Location>, nil] and where it called from,
      #   an on-CPU moment, for the CPU it carries.
      def flush(caller_cpu_ns: nil, caller_stack: nil)
        caller_stack = FrameNames.caller_frames(caller_stack)
        @lock.synchronize do
          take_signal_samples
          take_thread_ends
          rebuild_scan if @scan_stale
          @threads.each do |thread, state|
            if thread.equal?(Thread.current) && caller_cpu_ns
              flush_thread(thread, state, cpu: caller_cpu_ns, stack: caller_stack)
            else
              flush_thread(thread, state)
            end
          end
        end
      end

      # The labels of `thread`'s samples, or nil for the profiler's own threads.
      #
      # @return [Array<Array>, nil] frozen; the same object while the thread's name and id stay.
      def labels_for(thread)
        return nil if @internal.call(thread)

        state = @threads[thread]
        return state.labels if state&.labels && same_labels?(state, thread)

        slot = Labels.slot_of(thread)
        build_labels(thread, native_id(thread), slot ? slot.pairs : Labels::NONE)
      end

      # Writes the messages of failed jobs and passes to the logger. Not from a job.
      def write_log
        @logger.public_send(*@messages.shift) until @messages.empty?
      end

      private

      def new_state(thread, wall_ns)
        @stack_keys += 1
        state = ThreadState.new(thread, wall_ns, nil, nil, nil, nil, nil, nil, @scan_states.size,
                                @counts[:passes] + 1, nil, nil, nil, nil, nil, PASS_STACK_KEYS - @stack_keys,
                                nil, nil, Labels::NONE)
        @scan_states << state
        @scan_tids << nil
        @scan_seen << nil
        refresh_labels(state, thread)
        state
      end

      # Its CPU-time timer. A thread that cannot be armed is sampled at interrupt checks
      # (counted natively).
      def arm(state)
        tid = state.native_id
        return if tid.nil? || state.armed == tid

        armed = Profiler._native_signal_arm(tid)
        # No slot: its passes sample it. It blocks our signal: so too, and it is tried again.
        blocks_signal(state, tid) if armed.nil?
        no_slot(state) if armed == false
        return unless armed

        @unarmed&.delete(state)
        state.armed = tid
        @by_tid[tid] = state
      end

      # Threads that blocked our signal after they were armed (ext/ddprof_recorder/src/sampling/
      # signal_sampler.rs, "Threads that block our signal"): disarmed, and left to the passes.
      # The CPU they used since their last tick goes to their stack at their next pass.
      def unarm_masked(tids)
        tids.each do |tid|
          state = @by_tid[tid]
          unless state
            Profiler._native_signal_disarm(tid)
            next
          end
          disarm(state)
          state.armed = nil
          blocks_signal(state, tid)
        end
      end

      # A thread that blocks our signal: its passes sample it from now on, and every
      # REARM_EVERY passes it is tried again. Counted once (`:signal_blocked_threads`), said
      # once in the log.
      def blocks_signal(state, tid)
        (@unarmed ||= {}.compare_by_identity)[state] = true
        return if state.unarmed_why == :blocked

        state.unarmed_why = :blocked
        @counts[:signal_blocked_threads] += 1
        return if @counts[:signal_blocked_threads] > 1

        @messages << [:warn, "profiler: thread #{display_name(state.thread).inspect} (#{tid}) blocks the profiler's signal: " \
                             "it is sampled at the wall passes instead (stats[:signals][:signal_blocked_threads])"]
      end

      # A thread that got no slot (Profiler::SIGNAL_SLOTS are armed already, or the kernel
      # refused its ticks): sampled at the passes. Counted once (`:signal_unarmed_threads`).
      def no_slot(state)
        return if state.unarmed_why

        state.unarmed_why = :no_slot
        @counts[:signal_unarmed_threads] += 1
      end

      # The threads that could not be armed, tried again (a slot came free; the signal unblocked).
      def rearm_unarmed
        @unarmed.each_key.to_a.each do |state|
          if @threads[state.thread].equal?(state) && @signal_period_ns
            arm(state)
          else
            @unarmed.delete(state)
          end
        end
        @unarmed = nil if @unarmed.empty?
      end

      # The cpu-time of a signal sample: not the CPU its thread used since its previous one, but
      # about the thread's average CPU per sample. Each sample is an equally likely draw of
      # where the CPU goes, but the CPU between two samples is not: the first tick after a
      # sleep follows less CPU than one in the middle of a run, so charging each sample the CPU
      # before it would take CPU from the code that runs after blocking calls (measured on
      # bench/accuracy/sleepy.rb: the method after each sleep got 35% of the CPU against a
      # truth of 59%). The CPU not charged yet (the thread's CPU clock less what it was
      # charged) is kept near a reserve of SIGNAL_RESERVE averages, brought back over about
      # SIGNAL_SPREAD samples from what it was before this sample's own CPU, so that totals
      # stay exact: what is left at a window's end goes to the thread's last on-CPU stack
      # (#flush_thread), as any carried CPU.
      def signal_charge(state, tid, cpu_ns)
        available = cpu_ns - (@charged_cpu[tid] || 0)
        since = state.signal_cpu_ns && (cpu_ns - state.signal_cpu_ns)
        state.signal_cpu_ns = cpu_ns
        average = state.signal_average || @signal_period_ns
        state.signal_average = average + ((since - average) / SIGNAL_AVERAGE_SAMPLES) if since&.positive?
        return 0 unless available.positive?

        before = available - (since || 0)
        charge = average + ((before - (SIGNAL_RESERVE * average)) / SIGNAL_SPREAD)
        charge.clamp(0, available)
      end

      # The samples of #signal_samples (with any kept while a pass held the lock), oldest first
      # for each thread. With the lock.
      def record_signal_samples(samples)
        unless @pending_signal.empty?
          samples = @pending_signal.concat(samples)
          @pending_signal = []
        end
        i = 0
        while i < samples.size
          signal_sample(samples[i], samples[i + 1], samples[i + 2], samples[i + 3], samples[i + 4])
          i += 5
        end
      end

      # The signal samples still waiting natively: the handler keeps a busy thread's samples
      # in batches (ext/ddprof_recorder/src/sampling/signal_sampler.rs, "Batches"), which every pass
      # and flush records first, before any thread's end or idle time is accounted. With the
      # lock.
      def take_signal_samples
        samples = Profiler._native_take_signal_samples if @signal_period_ns
        record_signal_samples(samples) if samples
      end

      # A sample of #signal_samples: a busy thread's hot path, run with cold caches (the
      # program ran for a period since), where each method call costs microseconds. The steps
      # that most samples skip (idle passes to add up, a start or stop under way, the GC's
      # time) are checked here, before their methods are called.
      def signal_sample(tid, cpu_ns, at_ns, depth, key)
        state = @by_tid[tid]
        # Not armed for this thread any more, or nothing to record: its CPU stays uncharged,
        # for its next sample.
        return unless state && state.armed == tid && depth.positive?
        return if (@stopping || @start_cut) && own_work?(tid, cpu_ns)

        passes = @counts[:passes]
        flush_idle(state) if state.sample_mark < passes
        thread = state.thread
        # The application labels on at the tick (the sample may be recorded some ticks later).
        app_labels(state)
        app = state.slot ? state.slot.at(at_ns) : Labels::NONE
        refresh_labels(state, thread, app) unless same_labels?(state, thread, app)
        take_gc(state, at_ns) if @gc
        cpu_used = signal_charge(state, tid, cpu_ns)
        @charged_cpu[tid] = (@charged_cpu[tid] || 0) + cpu_used
        state.on_cpu_locations = key
        @counts[:on_cpu_samples] += 1
        @counts[:signal_samples] += 1
        record(state, key, cpu_used, 1, at_ns, RUNNING)
        state.signal_pass = passes
        looked(state, cpu_ns)
      end

      # Whether a sample of `tid` at CPU clock `cpu_ns` was taken inside Profiler#start or
      # #stop (see #started and #stopping). The start's cut stays until that thread ends (a
      # new thread that reuses the native id starts its clock at 0: #forget_stacks drops it):
      # a sample taken inside start may be recorded after a later one (it waited for the
      # lock), and dropping the cut at the first later sample let it through (seen with wall
      # ticks at 999 Hz under load: autostart.rb and recording.rb frames in the profile).
      def own_work?(tid, cpu_ns)
        stopping = @stopping
        if stopping && (stopping.equal?(true) || stopping.equal?(tid))
          cut = @stopping_cpu
          return true unless cut && stopping.equal?(tid) && cpu_ns < cut - START_SLACK_NS
        end

        start = @start_cut
        return false unless start && start[0] == tid

        start[1].nil? || cpu_ns < start[1] + START_SLACK_NS
      end

      # Its CPU clock when looked at; the scan finds it idle while the clock reads that, if
      # there is a stack to record its idle passes on.
      def looked(state, cpu)
        state.seen_cpu_ns = cpu
        @scan_seen[state.index] = state.locations ? cpu : nil
      end

      def state_for(thread, now_ns)
        # New since the previous pass: its wall time counts from that pass.
        @threads[thread] ||= new_state(thread, [@last_pass_ns, now_ns].min)
      end

      # `stack`: the key of a natively captured stack (Integer), or frames (`[name, path, line]`
      # arrays from FrameNames, or Locations on Ruby < 3.1).
      def sample_running(thread, stack, on_time, cpu_ns, now_ns)
        return if no_stack?(stack)

        state = state_for(thread, now_ns)
        tid = state.native_id
        return if own_work?(tid, cpu_ns)

        flush_idle(state)
        refresh_labels(state, thread) unless same_labels?(state, thread)
        cpu_used = 0
        if on_time
          take_gc(state, now_ns)
          cpu_used = uncharged_cpu(tid, cpu_ns)
          charged_up_to(tid, cpu_ns) if tid
          state.on_cpu_locations = stack
          @counts[:on_cpu_samples] += 1
        else
          @counts[:carried_cpu_samples] += 1
        end
        record(state, stack, cpu_used, 1, now_ns, on_time ? RUNNING : BLOCKED)
        looked(state, cpu_ns)
      end

      # The job's own CPU (reading stacks, recording) is left out of the thread's account.
      def skip_own_cpu(thread, cpu_at_start, on_time)
        state = @threads[thread]
        tid = state&.native_id
        return unless tid

        cpu_now = @clock.current_cpu_ns
        cost = cpu_now - cpu_at_start
        return unless cost.positive?

        @counts[:job_cpu_ns] += cost
        if on_time
          charged_up_to(tid, cpu_now)
        else
          @charged_cpu[tid] = (@charged_cpu[tid] || 0) + cost
        end
        looked(state, cpu_now)
      end

      # The idle path is the one taken most (a server's pool waits), so a pass does no Ruby
      # work for an idle thread: one native call reads every known thread's CPU clock and
      # names those that moved, and an idle thread's passes are counted from the pass count
      # when it is next recorded (#flush_idle). Measured with 30 threads waiting on a Queue
      # and a busy one at 99 Hz, a pass looking at each thread in Ruby cost 80–125 µs, and
      # the profiler 1.6–2.3% of the process CPU. New threads are looked for (Thread.list) only
      # when the thread-event hook saw one begin since the last look (see #list_threads).
      def pass_locked(now_ns, except)
        take_signal_samples
        masked = Profiler._native_signal_masked if @signal_period_ns
        unarm_masked(masked) if masked
        rearm_unarmed if @unarmed && (@passes_made % REARM_EVERY).zero?
        take_thread_ends
        list_threads(now_ns, except)
        rebuild_scan if @scan_stale
        @clock.moved(@scan_tids, @scan_seen).each do |i|
          state = @scan_states[i]
          next if state.thread.equal?(except)
          # It had a sample at its CPU tick since the previous pass: its time is accounted.
          next if state.armed && state.signal_pass == @counts[:passes]

          sample_other(state.thread, state, now_ns)
        end
        @counts[:passes] += pass_periods(now_ns)
        @passes_made += 1
        prune_locked if (@passes_made % 64).zero?
        @last_pass_ns = now_ns
      end

      # The sampling periods a pass stands for: the periods since the previous pass, rounded,
      # at least one. Passes come once a period, except while the signal handler keeps a busy
      # thread's samples in batches and no other thread ran (ext/ddprof_recorder/src/
      # trigger.rs, "Batches"): then up to BATCH_PASS_PERIODS go by, and an idle thread's
      # passes (#flush_idle) count each of them, as a pass at each would have.
      def pass_periods(now_ns)
        return 1 unless @signal_period_ns

        periods = (((now_ns - @last_pass_ns) * 2) + @signal_period_ns) / (2 * @signal_period_ns)
        periods < 1 ? 1 : periods
      end

      # Gives each thread that has none a state. Only when a thread began since the last look,
      # as the thread-end hook counts them (thread_end.rs, read before the list, so one that
      # begins after is seen at the next pass), or when it cannot count them (nil: the hook is
      # off, as on 3.1 with YJIT), and every LIST_EVERY passes whatever it says. A thread made
      # but not begun yet is listed, and listed again once it begins: no thread is missed, and a
      # pass with no new thread makes no Array of them (cold, Thread.list and this loop were a
      # fifth of a busy thread's sampling job).
      def list_threads(now_ns, except)
        begun = @clock_begun ? @clock.threads_begun : nil
        return if begun&.equal?(@listed_begun) && !(@passes_made % LIST_EVERY).zero?

        @listed_begun = begun
        Thread.list.each do |thread|
          # Its own threads never get a state, so only new threads need the internal check.
          next if @threads.key?(thread) || @ended.key?(thread)

          if @internal.call(thread)
            tid = thread.native_thread_id if thread.respond_to?(:native_thread_id)
            @internal_tids[tid] = true if tid
            next
          end

          if thread.equal?(except)
            @listed_begun = nil # a new thread left out here: look again at the next pass
            next
          end
          state_for(thread, now_ns)
        end
      end

      # A thread the scan found moved (or never looked at, or with nothing to add idle
      # passes to).
      def sample_other(thread, state, now_ns)
        tid = state.native_id
        cpu = tid && @clock.thread_cpu_ns(tid)

        # false or nil: the thread has ended.
        status = thread.status
        return unless status

        # Its idle passes so far were on the stack it had: recorded before that is read again.
        flush_idle(state)
        # "run": runnable but not the GVL holder, i.e. preempted while running Ruby: its stack
        # is where it ran. "sleep": blocked; its CPU is carried (see the class doc). An armed
        # thread's CPU is charged at its CPU ticks only.
        on_cpu = cpu && status == "run" && !state.armed
        # Its frames named as the job names its own thread's (see FrameNames). An on-CPU stack
        # stays the thread's last on-CPU one after the next pass: it is made of Ruby frames,
        # not kept under the key that pass reads into.
        locations = on_cpu ? FrameNames.thread_stack(thread) : pass_stack(thread, state)
        # nil: the thread is dead; empty: not started yet or ending. Nothing to attribute the
        # time to: its next sample gets it (its clocks are left as they are).
        return if no_stack?(locations)

        refresh_labels(state, thread) unless same_labels?(state, thread)
        cpu_used = 0
        if on_cpu
          take_gc(state, now_ns)
          cpu_used = uncharged_cpu(state.native_id, cpu)
          charged_up_to(state.native_id, cpu)
          state.on_cpu_locations = locations
        end
        record(state, locations, cpu_used, 1, now_ns, thread_state(thread, status))
        looked(state, cpu)
      end

      # The stack of `thread` (alive: its status is not false or nil), read natively and kept
      # under the state's key, which stays its `locations` until its next pass: no Ruby object
      # is made. (Threads of a pool that wake for short requests are read at most passes, and
      # making Ruby frames of their stacks was most of a pass in a Puma worker.) Ruby frames
      # where frames are named the weaker way (see FrameNames).
      #
      # @return [Integer, Array, nil] the key; frames; nil or empty for no stack.
      def pass_stack(thread, state)
        depth = Profiler._native_capture_thread_stack(thread, state.stack_key)
        return FrameNames.thread_stack(thread) if depth.nil?

        state.stack_key if depth.positive?
      end

      # Records on the thread's last stack, `state.locations`. A key whose stack is gone (the
      # frame names' cache starts over when full) falls back to the thread's stack now, or
      # THREAD_EXIT_STACK for a thread that is gone.
      def record_last_stack(state, values, labels)
        return if record_stack(state.locations, values, labels)

        thread = state.thread
        stack = FrameNames.thread_stack(thread) if thread.status && !thread.equal?(Thread.current)
        stack = THREAD_EXIT_STACK if no_stack?(stack)
        @recorder.record_sample(stack, values, labels)
      end

      # A state the sampler drops: the stack its passes kept goes.
      def forget_pass_stack(state)
        Profiler._native_forget_stack(state.stack_key)
      end

      # Without GVL events, what a thread did in a run of idle passes (it did not run): a
      # thread cannot block without running, so one last seen waiting was still waiting, and
      # one last seen blocked is taken to have stayed so (a wake-up then a wait is missed).
      # After an on-CPU sample it was preempted or blocked: its status now tells, if another
      # thread is looking (the caller's own is "run").
      def idle_state(state)
        last = state.last_state
        return last unless last.nil? || last.equal?(RUNNING)

        thread = state.thread
        !thread.equal?(Thread.current) && thread.status == "run" ? WAITING : BLOCKED
      end

      # What a thread a pass found (so not the one running the pass: it holds the GVL) is
      # doing: with GVL events, waiting for the GVL while it is ready without it (also on its
      # way back from a blocking call), else runnable ("run": preempted, or woken and not
      # running yet) is waiting, the rest ("sleep") blocked. Only with the timeline.
      def thread_state(thread, status)
        return unless @unix_offset_ns

        waiting = Profiler._native_gvl_waiting(thread) if @gvl_index
        waiting = status == "run" if waiting.nil?
        waiting ? WAITING : BLOCKED
      end

      # `gvl_ns`: the `gvl-wait-time` (see #gvl_waited), where the recorder has one.
      def values(cpu_ns, count, wall_ns, gvl_ns = 0)
        values = [cpu_ns, count, wall_ns]
        return values if @padding.empty?

        values.concat(@padding)
        values[@gvl_index] = gvl_ns if @gvl_index
        values
      end

      # Ns `thread` waited for the GVL since its last sample (0 when not measured).
      def gvl_waited(thread)
        (@gvl_index && Profiler._native_gvl_take(thread)) || 0
      end

      # Before the thread's CPU is charged: the GC time it spent since, on the GC's frames
      # (its CPU then no longer counts as the thread's own; its wall time neither). The GC's
      # wall time moves the thread's wall clock on, even past `now_ns`: a signal sample's time
      # is its tick, and the GC it takes may have run after the tick, before the job (cut at
      # `now_ns`, as it was, a GC-heavy program lost a tenth of its wall time under load). The
      # sample then gets what is left (see #record), so the thread's wall time adds up.
      def take_gc(state, now_ns)
        tid = state.native_id
        return unless @gc && tid

        times = Profiler._native_take_gc(tid)
        return unless times

        gc_cpu = 0
        GC_BUCKETS.each_with_index do |(stack, kind), i|
          cpu = times[2 * i]
          wall = times[(2 * i) + 1]
          next unless cpu.positive? || wall.positive?

          state.wall_ns += wall if now_ns
          # Dated at the end of its wall time counted from the thread's previous sample: the
          # GC's spans come first in the time up to this sample.
          @recorder.record_sample(stack, values(cpu, 0, now_ns ? wall : 0),
                                  timed([*state.labels, kind], now_ns && state.wall_ns, IN_GC))
          gc_cpu += cpu
        end
        @charged_cpu[tid] = (@charged_cpu[tid] || 0) + gc_cpu
      end

      # `labels`, and with the timeline on, the time of a sample taken at monotonic `at_ns`
      # (nil: none), a timed sample (StackRecorder#record_sample), with `thread_state` (one of
      # RUNNING, WAITING, BLOCKED, IN_GC).
      def timed(labels, at_ns, thread_state)
        return labels unless @unix_offset_ns && at_ns

        [*labels, thread_state, [END_TIMESTAMP_LABEL, at_ns + @unix_offset_ns]]
      end

      # Native thread `tid`'s CPU is charged up to its clock reading `cpu`, unless it already is
      # further: a charge never moves back. An end is taken at the pass after it, and on Ruby
      # 3.1 the next Ruby thread on the same native thread may have been charged meanwhile;
      # moving its account back to the end's clock had its CPU since charged twice (with 1,500
      # threads of 2 ms, 4 native threads: 4-6% of the process's CPU, twice; the thread-ends
      # spec failed on a new machine). Every charge up to a clock reading comes here; the
      # others add an amount (a signal sample's share, the GC's time, a job's own CPU).
      def charged_up_to(tid, cpu)
        @charged_cpu[tid] = cpu if cpu > (@charged_cpu[tid] || 0)
      end

      # CPU the native thread `tid` used since it was last charged, given its clock `cpu`.
      def uncharged_cpu(tid, cpu)
        return 0 unless tid && cpu

        previous = @charged_cpu[tid] || 0
        cpu > previous ? cpu - previous : 0
      end

      # `stack`: frames (see #sample_running), or the key of a natively captured stack. A
      # captured stack is not kept as the thread's `locations` (the idle path needs frames it can
      # record again). `thread_state`: see #timed.
      def record(state, stack, cpu_ns, count, now_ns, thread_state)
        wall = now_ns - state.wall_ns
        wall = 0 if wall.negative?
        # The calls that do nothing without GVL waits, extra values or the timeline are left
        # out then (see #signal_sample).
        values = if @padding.empty?
                   [cpu_ns, count, wall]
                 else
                   values(cpu_ns, count, wall, @gvl_index ? gvl_waited(state.thread) : 0)
                 end
        labels = @unix_offset_ns ? timed(state.labels, now_ns, thread_state) : state.labels
        if stack.is_a?(Integer)
          @recorder._native_record_captured(stack, values, labels)
        else
          @recorder.record_sample(stack, values, labels)
        end
        state.last_state = thread_state
        # A signal sample can come after a pass that looked later (its job ran late).
        state.wall_ns = now_ns if now_ns > state.wall_ns
        # A signal sample's key is read again for a later sample: only a pass's is kept.
        state.locations = stack.is_a?(Integer) && stack != state.stack_key ? nil : stack
        # Its passes after this one are idle ones (a sample in a job comes before its pass).
        state.sample_mark = @counts[:passes] + 1
        @counts[:samples] += 1
      end

      # @return [Boolean] false if `stack` is the key of a captured stack that is gone (the
      #   key's native thread ran another Ruby thread since, whose end forgot it): nothing
      #   was recorded.
      def record_stack(stack, values, labels)
        return @recorder._native_record_captured(stack, values, labels) if stack.is_a?(Integer)

        @recorder.record_sample(stack, values, labels)
        true
      end

      # The passes that found the thread idle since its last sample, recorded as one sample on
      # its last stack: `cpu-samples` = how many, `wall-time` = up to the last of them. The
      # thread did not run all along: it was blocked, or waiting for the GVL (a busy thread
      # among others waits a whole time slice, 100 ms, for its turn). Its GVL waits so far go
      # on this sample, and say which: waiting for more than half its wall time is WAITING.
      # Without GVL events (Ruby 3.1), see #idle_state. `until_ns`: when a thread that ended
      # did (the passes since did not see it: its wall time stops there).
      def flush_idle(state, until_ns = nil)
        idle = @counts[:passes] - state.sample_mark
        return unless idle.positive? && state.locations

        last_ns = until_ns && until_ns < @last_pass_ns ? until_ns : @last_pass_ns
        wall = last_ns - state.wall_ns
        wall = 0 if wall.negative?
        waited = gvl_waited(state.thread)
        if @unix_offset_ns
          thread_state = if @gvl_index
                           waited * 2 > wall ? WAITING : BLOCKED
                         else
                           idle_state(state)
                         end
        end
        record_last_stack(state, values(0, idle, wall, waited), timed(state.labels, last_ns, thread_state))
        state.last_state = thread_state
        @counts[:samples] += idle
        state.wall_ns += wall
        state.sample_mark = @counts[:passes]
      end

      # The idle samples, then the carried CPU: on the last on-CPU stack, else the stack now.
      def flush_thread(thread, state, cpu: nil, stack: nil)
        flush_idle(state)
        tid = state.native_id
        return unless tid

        cpu ||= @clock.thread_cpu_ns(tid) || state.seen_cpu_ns
        # A live thread's time up to now is this window's: the GC's, then the rest.
        now_ns = @clock.now_ns if thread.alive?
        take_gc(state, now_ns)
        flush_wall(thread, state, stack, now_ns) if now_ns
        carried = uncharged_cpu(tid, cpu)
        waited = gvl_waited(thread)
        return unless carried.positive? || waited.positive?

        # An armed thread's carried CPU is mostly the reserve its signal samples keep
        # (#signal_charge): its last signal sample's stack is a fair draw for it, the stack
        # of a caller stopping the profiler is not.
        stack = state.on_cpu_locations if no_stack?(stack) || (state.armed && state.on_cpu_locations)
        # The current thread is in the profiler (stopping it, or closing a window).
        other = thread.alive? && !thread.equal?(Thread.current)
        # Never sampled on a CPU: its stack now if it is runnable (preempted where it ran),
        # else not where it waits.
        if no_stack?(stack) && carried.positive?
          stack = other && thread.status == "run" ? nil : CPU_NOT_SAMPLED_STACK
        end
        stack ||= other ? FrameNames.thread_stack(thread) : nil
        stack = state.locations if no_stack?(stack)
        return if no_stack?(stack)

        carried_values = values(carried, 0, 0, waited)
        # Dated (with the timeline), as every sample of a thread: a thread whose only samples
        # were these had no lane while the summary counted it.
        labels = timed(state.labels, now_ns || @clock.now_ns, RUNNING)
        unless record_stack(stack, carried_values, labels)
          if no_stack?(state.locations)
            return if thread.alive?

            record_stack(THREAD_EXIT_STACK, carried_values, labels)
          else
            record_last_stack(state, carried_values, labels)
          end
        end
        charged_up_to(tid, cpu)
      end

      # The wall time of a live thread since its last sample, up to `now_ns`, on the stack it
      # is at (`stack`, the caller's own when it is the one stopping the profiler), as a
      # sample of no `cpu-samples`: without it a window lost each thread's last moments (a
      # busy thread's up to a sampling period, more when the jobs lag on a loaded machine:
      # 43 ms of 310 in a CI run of spec/profiler/thread_states_spec.rb), and the next
      # window got them.
      def flush_wall(thread, state, stack, now_ns)
        wall = now_ns - state.wall_ns
        return unless wall.positive?

        current = thread.equal?(Thread.current)
        stack = FrameNames.thread_stack(thread) if no_stack?(stack) && !current
        # The caller (stopping the profiler, or closing a window) runs; another thread is as
        # its status says.
        labels = timed(state.labels, now_ns, current ? RUNNING : thread_state(thread, thread.status))
        if no_stack?(stack)
          return if no_stack?(state.locations)

          record_last_stack(state, values(0, 0, wall), labels)
        else
          @recorder.record_sample(stack, values(0, 0, wall), labels)
        end
        state.wall_ns = now_ns
      end

      # Forgets the finished threads (after recording what they held) and native threads
      # (their tids may come back for new threads, which then count from 0 as they should).
      #
      # A native thread's exit watch queues its record before the thread is gone, so the
      # native threads found gone are read first, then the queue is taken: an account is
      # dropped only once its exit (if watched) was charged against it.
      def prune_locked
        gone = @charged_cpu.each_key.select { |tid| @clock.thread_cpu_ns(tid).nil? }
        take_thread_ends
        @threads.delete_if do |thread, state|
          next false if thread.alive?

          flush_thread(thread, state)
          forget_stacks(state.native_id)
          forget_pass_stack(state)
          disarm(state)
          true
        end
        gone.each { |tid| @charged_cpu.delete(tid) }
        prune_ended
        rebuild_scan
      end

      # Forgets the ended threads that are gone, and the ends whose native thread exited
      # unwatched (or whose exit record was dropped) a few prunes ago.
      def prune_ended
        @prunes += 1
        @ended.delete_if { |thread, _| !thread.alive? }
        @ended_on.delete_if { |tid, (_, _, prune)| prune < @prunes - 2 && @clock.thread_cpu_ns(tid).nil? }
      end

      def rebuild_scan
        @scan_stale = false
        @scan_states = @threads.values
        @scan_states.each_with_index { |state, i| state.index = i }
        @scan_tids = @scan_states.map(&:native_id)
        @scan_seen = @scan_states.map { |state| state.locations && state.seen_cpu_ns }
      end

      # What the thread-end hook and the exit watches queued since the last take.
      def take_thread_ends
        return unless @clock_ends

        ends, exits = @clock.thread_ends
        return unless ends

        i = 0
        while i < ends.size
          thread_ended(ends[i], ends[i + 1], ends[i + 2], ends[i + 3])
          i += 4
        end
        i = 0
        while i < exits.size
          thread_exited(exits[i], exits[i + 1])
          i += 2
        end
      end

      # `thread` ended on native thread `tid`, whose CPU clock read `cpu_ns` then: the CPU
      # since its last charge goes to its last on-CPU stack (a fair draw of where its CPU went,
      # as in #flush_thread), else (seen waiting only) CPU_NOT_SAMPLED_STACK, its wall time to
      # its last stack, else (a thread no pass saw) THREAD_EXIT_STACK,
      # as a sample with `cpu-samples` 0 (and so no wall time). A thread no pass saw is charged
      # from its native thread's birth (the account is per native thread: see #baseline). Its
      # state goes.
      def thread_ended(thread, tid, cpu_ns, at_ns)
        return if @internal.call(thread)

        @ended[thread] = true
        state = @threads.delete(thread)
        if state
          flush_idle(state, at_ns)
          take_gc(state, at_ns)
          # Its name may have changed since its last sample (and a dead thread's native id
          # reads nil on 3.1: `tid` is the one it ended on).
          labels = thread.name.equal?(state.name) ? state.labels : build_labels(thread, tid)
        else
          labels = build_labels(thread, tid)
        end
        @counts[:thread_ends] += 1
        carried = uncharged_cpu(tid, cpu_ns)
        waited = gvl_waited(thread)
        # Its wall time from its last sample to its end goes with its last CPU (see
        # #flush_wall for a live thread's).
        tail = state && at_ns ? [at_ns - state.wall_ns, 0].max : 0
        if carried.positive? || waited.positive? || tail.positive?
          dated = timed(labels, at_ns || @clock.now_ns, RUNNING)
          stack = state&.on_cpu_locations
          cpu = carried
          if no_stack?(stack) && !no_stack?(state&.locations)
            # Seen waiting only: its wall time and waits go there, its CPU does not.
            record_stack(CPU_NOT_SAMPLED_STACK, values(carried, 0, 0), dated) if carried.positive?
            cpu = 0
            stack = state.locations
          end
          stack = THREAD_EXIT_STACK if no_stack?(stack)
          if cpu.positive? || waited.positive? || tail.positive?
            carried_values = values(cpu, 0, tail, waited)
            record_stack(stack, carried_values, dated) || record_stack(THREAD_EXIT_STACK, carried_values, dated)
          end
          charged_up_to(tid, cpu_ns)
          @counts[:thread_end_cpu_ns] += carried
        end
        @ended_on[tid] = [labels, cpu_ns, @prunes]
        return unless state

        # Its captured stacks stay until its native thread exits (#thread_exited): they are
        # kept by native id, and a sample of the next thread there may be waiting for a job.
        forget_pass_stack(state)
        disarm(state)
        @scan_stale = true
      end

      # Native thread `tid` exited with its CPU clock at `cpu_ns`: what it used since its last
      # charge (Ruby's cleanup after the end hook, or a whole thread whose end hook did not
      # fire) goes to THREAD_EXIT_STACK for the thread that ended there, to the last stack of
      # a dead thread the sampler knew there, else to UNSAMPLED_STACK. Its account goes.
      def thread_exited(tid, cpu_ns)
        @counts[:thread_exits] += 1
        forget_stacks(tid)
        return @charged_cpu.delete(tid) if @internal_tids.delete(tid)
        ended = @ended_on.delete(tid)
        charged = @charged_cpu.delete(tid)
        charged = [charged || 0, ended[1]].max if ended
        carried = cpu_ns - (charged || 0)
        return unless carried.positive?

        @counts[:thread_end_cpu_ns] += carried
        now_ns = @clock.now_ns
        return record_stack(THREAD_EXIT_STACK, values(carried, 0, 0), timed(ended[0], now_ns, RUNNING)) if ended

        thread, state = @threads.find { |t, s| s.native_id == tid && !t.alive? }
        stack = state && (no_stack?(state.on_cpu_locations) ? CPU_NOT_SAMPLED_STACK : state.on_cpu_locations)
        if no_stack?(stack)
          stack = UNSAMPLED_STACK
          @counts[:unsampled_thread_cpu_ns] += carried
        end
        labels = timed(state ? state.labels : unsampled_labels(tid), now_ns, RUNNING)
        record_stack(stack, values(carried, 0, 0), labels) || record_stack(THREAD_EXIT_STACK, values(carried, 0, 0), labels)
        return unless state

        @threads.delete(thread)
        forget_pass_stack(state)
        disarm(state)
        @scan_stale = true
      end

      def unsampled_labels(tid)
        [[THREAD_ID_LABEL, tid.to_s].freeze, [THREAD_NAME_LABEL, "(unsampled thread)"].freeze, *@extra_labels].freeze
      end

      def no_stack?(stack)
        stack.nil? || (stack.is_a?(Array) && stack.empty?)
      end

      def forget_stacks(tid)
        return unless tid

        Profiler._native_forget_thread_stacks(tid)
        @start_cut = nil if @start_cut&.first == tid
      end

      # Ruby gives the native thread of a finished thread to a new one, which then has the
      # timer (and the native id) already: only the last state armed for an id disarms it.
      def disarm(state)
        tid = state.armed
        return unless tid && @by_tid[tid].equal?(state)

        @by_tid.delete(tid)
        Profiler._native_signal_disarm(tid)
      end

      # A dead thread has no native id any more (Ruby 3.1 gives nil): its samples still come
      # in after its death (signal samples wait for a job), and keep the id it had.
      def same_labels?(state, thread, app = app_labels(state))
        return false unless thread.name.equal?(state.name) && app.equal?(state.app)

        id = native_id(thread)
        id.equal?(state.native_id) || (id.nil? && !state.native_id.nil? && !thread.alive?)
      end

      # The `"thread id"` label of `thread`: `"<native id> (<object_id>)"`, or the object_id
      # alone when the native id is unknown (nil: Ruby 3.0). `native_id` defaults to the
      # thread's own, which is what a profiler started in this process reads (see #native_id).
      def self.thread_id(thread, native_id = thread.respond_to?(:native_thread_id) ? thread.native_thread_id : nil)
        native_id ? "#{native_id} (#{thread.object_id})" : thread.object_id.to_s
      end

      # `Thread#native_thread_id` came with Ruby 3.1; before it, no thread's CPU clock can be
      # read and cpu-time stays 0.
      if Thread.method_defined?(:native_thread_id)
        # In a forked child, the thread that forked, if its `native_thread_id` is still the
        # parent's (Ruby bug #19873, below): the live thread whose id is no thread of this
        # process. A profiler the fork hook restarts is told it; one started later in the child
        # (`Profiler.new.start` in a worker, or after `Process.daemon`) finds it here. Before,
        # such a profiler could arm no timer for it (`signal_arm_failures` 1, no signal sample)
        # and read its stacks at interrupt checks only.
        #
        # @return [Thread, nil]
        def self.forked_thread
          tids = Profiler._native_task_ids
          Thread.list.find { |thread| (id = thread.native_thread_id) && !tids.include?(id) }
        end

        # The thread that forked keeps its id from the parent in the child (Ruby bug #19873,
        # fixed in 3.3), where it is not a thread: a forked child's one thread is its main
        # thread, whose id is the pid (Linux).
        def native_id(thread)
          thread.equal?(@forked_thread) ? Process.pid : thread.native_thread_id
        end
      else
        def self.forked_thread = nil

        def native_id(_thread)
          nil
        end
      end

      # The application labels of the state's thread now (Labels): its slot's current set, a
      # slot being looked for only when one was made since the last look (most threads never
      # have one).
      def app_labels(state)
        slot = state.slot
        return slot.pairs if slot

        made = Labels::SLOTS_MADE[0]
        return Labels::NONE if made.equal?(state.slots_seen)

        state.slots_seen = made
        slot = state.slot = Labels.slot_of(state.thread)
        slot ? slot.pairs : Labels::NONE
      end

      def refresh_labels(state, thread, app = app_labels(state))
        state.name = thread.name
        state.native_id = native_id(thread)
        state.app = app
        @scan_tids[state.index] = state.native_id
        state.labels = build_labels(thread, state.native_id, app)
        # A thread seen before it started has no native id yet: it is armed once it has one.
        arm(state) if @signal_period_ns
      end

      def build_labels(thread, native_id, app = Labels::NONE)
        id = ThreadSampler.thread_id(thread, native_id)
        [[THREAD_ID_LABEL, id].freeze, [THREAD_NAME_LABEL, display_name(thread)].freeze, *@extra_labels, *app].freeze
      end

      # `Thread#name`, or "main", or where the thread was created (from `Thread#inspect`,
      # `#<Thread:0x... file.rb:12 run>`).
      def display_name(thread)
        return thread.name if thread.name
        return "main" if thread.equal?(Thread.main)

        thread.inspect[/\A#<Thread:0x\h+ (.+) \w+>\z/, 1] || "thread #{thread.object_id}"
      end

      def succeeded
        @consecutive_errors = 0
      end

      # Logged later by {#write_log}: a job runs with Ruby's trap interrupt masked, where
      # `Mutex#lock` raises ThreadError ("can't be called from trap context", Ruby 3.1
      # `thread_sync.c`), and a Logger locks one.
      def failed(error)
        @counts[:errors] += 1
        @consecutive_errors += 1
        @messages << [:warn, "profiler: sampling failed: #{error.class}: #{error.message}"]
        return unless gave_up?

        @messages << [:error, "profiler: #{MAX_CONSECUTIVE_ERRORS} sampling passes failed in a row; sampling stops"]
      end
    end
  end
end
