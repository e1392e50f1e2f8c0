# frozen_string_literal: true

module DdprofRecorder
  # Labels that an application puts on its own samples: every sample the profiler takes of a
  # thread while a label set is on (on-CPU, wall, idle, GC and allocation samples) carries it.
  #
  #   DdprofRecorder.with_labels("tenant" => "acme") { handle(request) }
  #
  #   depth = DdprofRecorder.push_labels("job" => job.class.name)   # a middleware's form
  #   begin
  #     call_next
  #   ensure
  #     DdprofRecorder.pop_labels(depth)
  #   end
  #
  # Per thread (not per fiber: a fiber-switching server shares one set among its fibers), nested
  # (an inner set adds its keys to the outer one's, a key set again takes the inner value) and
  # restored on the way out, an exception too. Keys and values are Strings of 1 to
  # {MAX_BYTES} bytes (a value may be empty), at most {MAX_LABELS} on a thread at once; the
  # profiler's own keys ({RESERVED}) are refused. Bad input raises ArgumentError and changes
  # nothing.
  #
  # How the sampler reads them: each thread has one {Slot}, made at its first label set and
  # kept in a thread variable; the sampler keeps the slot in its state of the thread and, per
  # sample, compares the slot's current set with the one its labels were built from (one
  # identity check). A sample read at a CPU tick may be recorded a few ticks later (the signal
  # handler keeps them in batches): the slot keeps its last {Slot::HISTORY} changes with their
  # times, so that such a sample gets the set that was on at its tick, not the one on when it
  # is recorded.
  module Labels
    # The longest key or value, in bytes.
    MAX_BYTES = 1024
    # The most labels on a thread at once (nested sets together).
    MAX_LABELS = 16
    # Keys the profiler sets itself (ThreadSampler, Profiler, AllocationRecorder, the
    # recorder's endpoints): a sample cannot have a key twice.
    RESERVED = ["thread id", "thread name", "process id", "gc kind", "thread state", "end_timestamp_ns",
                "allocation class", "trace endpoint", "local root span id"].to_h { |k| [k, true] }.freeze
    # The key of a request's span id (see Endpoints): set by the endpoint middleware only.
    SPAN_ID_LABEL = "local root span id"
    # No labels.
    NONE = [].freeze
    # The thread variable that holds a thread's Slot.
    SLOT_KEY = :__ddprof_recorder_labels
    # How many slots were ever made, in one Array element: the sampler looks for a thread's slot
    # again only when it changed (an element read is cheaper than a thread variable lookup).
    SLOTS_MADE = [0]
    SLOT_LOCK = Mutex.new
    private_constant :SLOT_LOCK

    # One thread's label sets (native: ext/ddprof_recorder/src/labels.rs): the current one
    # (`pairs`, a frozen Array of frozen `[key, value]` Arrays), the sets below it (`push`
    # returns the depth that `pop` restores), and the last Slot::HISTORY changes with their
    # monotonic times (`at(ns)`: the set on then). `push_hash` validates and merges a Hash of
    # labels, and returns nil (changing nothing) on what {.refuse} says is wrong;
    # `next_span_id`, a span id no other request of the process has had (the slot's number,
    # then a count of its own); `open_body`, Endpoints' request whose body is being written.
    Slot.configure(MAX_BYTES, MAX_LABELS, RESERVED.keys)

    class << self
      # @return [Slot] the current thread's slot, made on first use.
      def slot
        thread = Thread.current
        thread.thread_variable_get(SLOT_KEY) || SLOT_LOCK.synchronize do
          # Counted once it is in place: a sampler that sees the count finds the slot.
          serial = SLOTS_MADE[0] + 1
          made = Slot.new(serial, NONE)
          thread.thread_variable_set(SLOT_KEY, made)
          SLOTS_MADE[0] = serial
          made
        end
      end

      # @return [Integer] a span id of the current thread's (see Slot#next_span_id).
      def next_span_id
        slot.next_span_id
      end

      # @return [Slot, nil] `thread`'s slot, if it ever had labels.
      def slot_of(thread)
        thread.thread_variable_get(SLOT_KEY)
      end

      # Pushes `labels` (validated) over the current thread's set.
      #
      # @return [Integer] the depth to give {.pop}.
      def push(labels)
        slot = self.slot
        slot.push_hash(labels) || slot.push(merge(slot.pairs, labels))
      end

      # Pushes a set with the span id `span_id` (an Integer) over the current thread's: for
      # Endpoints, which owns that key.
      def push_span(span_id)
        slot = self.slot
        # One more than an application may set: a request whose thread has MAX_LABELS on gets its
        # span id all the same (Endpoints must never raise into the app).
        pair = [SPAN_ID_LABEL, span_id].freeze
        slot.push_pair(pair, MAX_LABELS + 1) || slot.push(merged(slot.pairs, [pair], MAX_LABELS + 1))
      end

      def pop(depth)
        slot = slot_of(Thread.current)
        raise ArgumentError, "pop_labels: no labels were pushed on this thread" unless slot

        slot.pop(depth)
      end

      # @return [Hash{String => String}] the current thread's labels (a copy).
      def current
        (slot_of(Thread.current)&.pairs || NONE).to_h
      end

      private

      # `base` with the pairs of Hash `labels` (checked) on top: a new frozen Array.
      def merge(base, labels)
        unless labels.is_a?(Hash)
          raise ArgumentError, "labels must be a Hash of String keys to String values, got #{labels.class}"
        end

        pairs = []
        labels.each do |key, value|
          unless key.is_a?(String) && value.is_a?(String) && key.bytesize <= MAX_BYTES && value.bytesize <= MAX_BYTES &&
                 !key.empty? && !RESERVED.key?(key)
            refuse(key, value)
          end
          pairs << [key.frozen? ? key : -key, value.frozen? ? value : -value].freeze
        end
        merged(base, pairs)
      end

      def merged(base, pairs, limit = MAX_LABELS)
        all = if base.empty?
                pairs
              else
                keys = pairs.to_h { |k, _| [k, true] }
                base.reject { |k, _| keys.key?(k) }.concat(pairs)
              end
        if all.size > limit
          raise ArgumentError, "at most #{limit} labels on a thread at once, this would make #{all.size}"
        end

        all.freeze
      end

      # Raises the ArgumentError that says what is wrong with the pair.
      def refuse(key, value)
        [[key, "key"], [value, "value"]].each do |string, what|
          unless string.is_a?(String)
            raise ArgumentError, "label #{what} must be a String, got #{string.class} (key #{key.inspect[0, 40]})"
          end
          next if string.bytesize <= MAX_BYTES

          raise ArgumentError, "label #{what} is #{string.bytesize} bytes, over #{MAX_BYTES} (key #{key.inspect[0, 40]})"
        end
        raise ArgumentError, "label key must not be empty" if key.empty?

        raise ArgumentError, "label key #{key.inspect} is the profiler's own (reserved: #{RESERVED.keys.join(', ')})"
      end
    end
  end

  class << self
    # Runs the block with `labels` on every sample of this thread (see {Labels}).
    #
    # @param labels [Hash{String => String}]
    # @return the block's value
    # @raise [ArgumentError] on a bad label, before the block runs.
    def with_labels(labels)
      raise ArgumentError, "with_labels needs a block" unless block_given?

      depth = Labels.push(labels)
      begin
        yield
      ensure
        Labels.pop(depth)
      end
    end

    # Puts `labels` on this thread's samples until {.pop_labels} with the depth returned: the
    # form for a middleware, which restores in its `ensure`.
    #
    # @return [Integer] the depth to restore.
    def push_labels(labels)
      Labels.push(labels)
    end

    # Takes off the sets pushed since {.push_labels} returned `depth`.
    def pop_labels(depth)
      Labels.pop(depth)
    end

    # @return [Hash{String => String}] this thread's labels now.
    def current_labels
      Labels.current
    end
  end
end
