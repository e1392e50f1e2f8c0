# frozen_string_literal: true

require "time"

module DdprofRecorder
  # Keeps the samples a profiler takes (stacks, values, labels), aggregated, and hands back
  # a pprof for each time window. A sampler thread recording samples never waits for the
  # thread that serializes, and Ruby keeps running while the profile is encoded.
  #
  # The native half (`_native_*`) lives in ext/ddprof_recorder/src/recorder/stack_recorder.rs.
  class StackRecorder
    # dd-trace-rb 1.9.0's enabled value types, in value order.
    DEFAULT_VALUE_TYPES = [
      ["cpu-time", "nanoseconds"],
      ["cpu-samples", "count"],
      ["wall-time", "nanoseconds"],
    ].map { |pair| pair.map(&:freeze).freeze }.freeze

    # Deepest stack kept; deeper ones keep their leaf-most frames plus a placeholder.
    DEFAULT_MAX_FRAMES = 400

    # @param value_types [Array<Array(String, String)>] 1..16 `[type, unit]` pairs, in the
    #   order `record_sample` takes values.
    # @param max_frames [Integer] 2..10_000: deeper stacks keep `max_frames - 1` leaf-side
    #   frames and a root-most `"N frames omitted"` placeholder.
    # @param compression [Symbol] `:none` (raw protobuf) or `:gzip`.
    # @param max_stacks [Integer] most distinct stacks one profile (time window) keeps.
    # @param max_strings [Integer] most distinct strings one profile keeps (function names,
    #   filenames, label keys and values, endpoints).
    # @param max_label_sets [Integer] most distinct label sets one profile keeps; also its most
    #   endpoints.
    # @param max_samples [Integer] most distinct (stack, label set) pairs one profile keeps.
    # @param max_timed_samples [Integer] most timed samples (see {#record_sample}) one profile
    #   keeps apart; one more is aggregated without its time (`stats[:timestamps_dropped]`).
    #
    # The five limits (each 1..MAX_LIMIT; the defaults, DEFAULT_MAX_*, are generous) bound the
    # memory a profile can take. A sample that would go over one of the first four is folded
    # into a single placeholder sample whose one frame is named
    # `"(dropped: profile limits reached)"`, so value totals stay exact; `stats[:samples_dropped]`
    # counts them. An endpoint over the limits is ignored (`stats[:endpoints_dropped]`).
    # @raise [ArgumentError, TypeError, RangeError] on a bad option (naming it).
    def self.new(value_types: DEFAULT_VALUE_TYPES, max_frames: DEFAULT_MAX_FRAMES, compression: :none,
                 max_stacks: DEFAULT_MAX_STACKS, max_strings: DEFAULT_MAX_STRINGS,
                 max_label_sets: DEFAULT_MAX_LABEL_SETS, max_samples: DEFAULT_MAX_SAMPLES,
                 max_timed_samples: DEFAULT_MAX_TIMED_SAMPLES)
      _native_new(value_types, max_frames, compression, max_stacks, max_strings, max_label_sets, max_samples,
                  max_timed_samples)
    end

    # Records one sample in the current window. Samples with the same stack and labels are
    # aggregated (values summed). Never blocks on a serialization in progress.
    #
    # A sample with a numeric `"end_timestamp_ns"` label (its end time, in nanoseconds since the
    # Unix epoch, as dd-trace-rb's timeline samples have) is a timed sample: it is kept apart,
    # not aggregated, and comes out as one pprof sample with that label, after the aggregated
    # ones. Up to `max_timed_samples` per window; past that it is aggregated without its time.
    #
    # @param locations [Array<Thread::Backtrace::Location, Array(String, String, Integer)>]
    #   the stack, leaf first; `[function_name, filename, line]` arrays or backtrace locations.
    # @param values [Array<Integer>, Hash{String, Symbol => Integer}] one Integer per value
    #   type in order, or a Hash by value type name (missing ones are 0).
    # @param labels [Hash, Array<Array(String|Symbol, String|Integer)>, nil] string or numeric
    #   labels; `"trace endpoint"` is reserved, `"end_timestamp_ns"` must be an Integer >= 0.
    # @return [nil]
    # @raise [ArgumentError, TypeError] on bad input, naming the argument; nothing is recorded.
    def record_sample(locations, values, labels = nil)
      _native_record_sample(locations, values, labels)
    end

    # Links the samples of the current window whose `"local root span id"` label equals
    # `local_root_span_id` to `endpoint` (label `"trace endpoint"`), whether they were recorded
    # before or after this call. The latest endpoint for an id wins.
    #
    # @param local_root_span_id [Integer, String] an Integer equals the String of its digits.
    # @param endpoint [String]
    # @return [nil]
    def record_endpoint(local_root_span_id, endpoint)
      _native_record_endpoint(local_root_span_id, endpoint)
    end

    # Ends the current window and returns it. Waits for a serialization in progress through
    # this method, {#serialize!} or {#clear} (on the recorder's Mutex, without the GVL); a direct
    # `_native_serialize` call in progress makes it fail instead ("another serialization of this
    # recorder is in progress").
    #
    # @return [Array(Time, Time, String), nil] `[start, finish, pprof]` (pprof is a binary
    #   String, gzip-compressed if the recorder was built with `compression: :gzip`), or nil
    #   after logging an error through {DdprofRecorder.logger}.
    def serialize
      status, result = serializer_mutex.synchronize { self.class._native_serialize(self) }
      if status == :ok
        start, finish, encoded_pprof = result
        # The window is taken: from here to the return nothing may process an interrupt that
        # the caller deferred to blocking points (`handle_interrupt(Object => :on_blocking)`),
        # or the window is lost with it. Logging can block: a DEBUG logger writes to its IO,
        # and the default logger is made here on first use, where logger 1.6 (Ruby 3.3 and
        # 3.4; not 1.5 on 3.1, where $stderr has no #path) calls File.exist?($stderr.path)
        # (log_device.rb, set_dev): a stat without the GVL, after which Ruby processes
        # interrupts at blocking timing (3.4.5: file.c:1181 stat_without_gvl, internal/io.h:18,
        # thread.c:1584-1586 RUBY_VM_CHECK_INTS_BLOCKING in rb_nogvl; 3.3.8: file.c:1171,
        # thread.c:1553-1555). So the log runs with every interrupt deferred; one that arrives
        # meanwhile is processed as soon as the caller's mask allows. `Object`, not
        # `Exception`: Thread#kill is queued as the Integer 0 (3.4.5: internal/thread.h:33,
        # thread.c:2786; 3.1.2: thread.c:148), which only a mask of one of Integer's
        # ancestors defers (thread.c:2062-2076; one of `Exception` alone skips it explicitly
        # on 3.3 and 3.4, 2052-2059 in 3.4.5).
        Thread.handle_interrupt(Object => :never) do
          DdprofRecorder.logger.debug { "Encoded profile covering #{start.iso8601} to #{finish.iso8601}" }
        end
        [start, finish, encoded_pprof]
      else
        DdprofRecorder.logger.error("Failed to serialize profiling data: #{result}")
        nil
      end
    end

    # Like {#serialize}, but returns only the pprof and raises on failure.
    #
    # @return [String] the pprof.
    # @raise [DdprofRecorder::Error] with the native message.
    def serialize!
      status, result = serializer_mutex.synchronize { self.class._native_serialize(self) }
      raise Error, "Failed to serialize profiling data: #{result}" unless status == :ok

      result[2]
    end

    # Drops everything recorded so far: a serialization whose result is thrown away.
    #
    # @return [Time] the finish time of the dropped window (the start of the next one).
    # @raise [DdprofRecorder::Error] with the native message.
    def clear
      status, result = serializer_mutex.synchronize { self.class._native_clear(self) }
      raise Error, "Failed to clear profiling data: #{result}" unless status == :ok

      result
    end

    # Back to the initial state (both windows empty, endpoints dropped, start time = now),
    # whatever state a fork left the recorder in. A forked child need not call it: the
    # recorder notices the fork by itself and does the same before its first use there. The
    # counters of {#stats} are kept (they are over the recorder's life, the parent's part
    # included), and so are the {#comments}. It never waits: a serialization in progress in another thread finishes with the
    # window it took.
    #
    # @return [true]
    # @raise [DdprofRecorder::Error] on an internal error (a native panic); nothing is changed.
    def reset_after_fork
      self.class._native_reset_after_fork(self)
    end

    # Sets the comments every pprof serialized from now on carries, in pprof's `comment` field
    # (`go tool pprof -comments FILE` prints them; {DdprofRecorder.summary} returns them), e.g.
    # how the profile was sampled: `["sampling: each thread at each 1/99 s of its CPU (perf events) ..."]`. A serialization
    # already under way keeps the comments it started with. They are kept across
    # {#reset_after_fork} and forks, like the value types. `[]` (the default) writes no
    # `comment` field: the pprof is byte for byte what it was before comments existed.
    #
    # @param comments [Array<String>] at most MAX_COMMENTS, each non-empty and at most
    #   MAX_COMMENT_BYTES bytes long (invalid UTF-8 becomes U+FFFD, as for every string).
    # @return [Array<String>] `comments`.
    # @raise [TypeError] if `comments` is not an Array or an entry not a String.
    # @raise [ArgumentError] if there are too many, or one is empty or too long (naming it);
    #   the comments are then unchanged.
    def comments=(comments)
      _native_set_comments(comments)
    end

    # @return [Array<String>] the comments set by {#comments=} (new Strings; `[]` if none).
    def comments
      _native_comments
    end

    # Counters over the recorder's life.
    #
    # @return [Hash{Symbol => Integer}] `:samples_recorded`, `:samples_rejected`,
    #   `:samples_dropped` (recorded, but folded into the placeholder by the limits),
    #   `:endpoints_dropped`, `:timestamps_dropped` (timed samples aggregated without their
    #   time: over `max_timed_samples`), `:samples_lost`, `:serializations`,
    #   `:last_serialization_ns`, `:last_serialization_bytes`.
    def stats
      _native_stats
    end

    private

    # Only one serializer at a time (dd-trace-rb's guard; docs/design.md, section 3): serialize, serialize! and clear. The
    # native side keeps it in @serialize_mutex and hands out a new one after a fork or a reset,
    # since a serializer thread of the parent may have held the old one.
    def serializer_mutex
      self.class._native_serializer_mutex(self)
    end

    private :_native_record_sample, :_native_record_endpoint, :_native_stats, :_native_set_comments,
            :_native_comments
  end
end
