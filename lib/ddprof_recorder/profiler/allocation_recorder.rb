# frozen_string_literal: true

module DdprofRecorder
  class Profiler
    # Records the sampled allocations: the postponed job of
    # ext/ddprof_recorder/src/memory/allocations.rs calls {#call} on the allocating thread,
    # after the NEWOBJ hook read the allocating stack and the job named it (kept natively
    # under `stack_key`). Each sample gets `alloc-samples` 1 and
    # `alloc-count` its weight (the allocations it stands for), the thread's labels and
    # `"allocation class"`.
    class AllocationRecorder
      CLASS_LABEL = "allocation class"
      # Label sets kept for reuse, by thread labels and class, before the cache starts over.
      MAX_CACHED_LABELS = 4096

      # @return [Integer] samples that could not be recorded (the recorder raised).
      attr_reader :errors

      # @param recorder [StackRecorder]
      # @param labels_for [#call] `labels_for.call(thread)`: the thread's labels, or nil for
      #   the profiler's own threads (not recorded).
      # @param value_count [Integer] the recorder's number of value types.
      # @param samples_index [Integer] where `alloc-samples` is (`alloc-count` follows).
      def initialize(recorder, labels_for:, value_count:, samples_index:)
        @recorder = recorder
        @labels_for = labels_for
        @values = Array.new(value_count, 0)
        @values[samples_index] = 1
        @count_index = samples_index + 1
        @labels = {}.compare_by_identity
        @cached = 0
        @errors = 0
      end

      # From the allocation job (the allocating thread, GVL held).
      #
      # @param thread [Thread] the allocating thread.
      # @param class_name [String] the allocated object's class, `"(hidden)"` if none.
      # @param weight [Integer] the allocations this sample stands for.
      # @param stack_key [Integer] where the job keeps the named stack.
      # @return [Boolean] whether it was recorded.
      def call(thread, class_name, weight, stack_key)
        thread_labels = @labels_for.call(thread)
        return false unless thread_labels

        labels = labels(thread_labels, class_name)
        # A copy: another thread's job may run while this one is switched out.
        values = @values.dup
        values[@count_index] = weight
        @recorder._native_record_captured(stack_key, values, labels)
      rescue StandardError
        @errors += 1
        false
      end

      private

      def labels(thread_labels, class_name)
        by_class = (@labels[thread_labels] ||= {})
        by_class[class_name] || begin
          if @cached >= MAX_CACHED_LABELS
            @labels.clear
            @cached = 0
            by_class = (@labels[thread_labels] = {})
          end
          @cached += 1
          by_class[class_name] = [*thread_labels, [CLASS_LABEL, class_name.dup.freeze].freeze].freeze
        end
      end
    end
  end
end
