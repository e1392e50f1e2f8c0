# frozen_string_literal: true

module DdprofRecorder
  class Profiler
    # `GC.auto_compact` turned on while the signal handler reads stacks, before Ruby 3.2.
    # There compaction protects the pages of moved objects with a read barrier between GC
    # steps (`mprotect`, whose SIGSEGV handler is not async-signal-safe), so a handler must not
    # read the heap once the program may compact (ext/ddprof_recorder/src/sampling/
    # signal_sampler.rs, "The handler"). A profiler that starts with it on reads its stacks at
    # the jobs from the start (`:safepoint`, Profiler#sampling_mode); one that starts with it
    # off has this module prepended to GC's singleton class, which sees `GC.auto_compact =`
    # before Ruby does: the sampling profiler then reads its stacks at the jobs from that
    # moment on, before any compaction, and says so once (the log, the profile's comment,
    # `stats[:sampling_mode]`). The sampler thread checks `GC.auto_compact` at its wake-ups
    # too, for a setter that bypassed this one.
    module AutoCompactGuard
      # Whether this Ruby needs the guard: 3.2 removed the read barrier (compaction updates
      # the references instead, `gc.c`).
      NEEDED = Gem::Version.new(RUBY_VERSION) < Gem::Version.new("3.2") && GC.respond_to?(:auto_compact=)
      # Why the stacks are read at the jobs (Profiler#sampling_mode_reason).
      REASON = "GC.auto_compact is on (Ruby < 3.2)"

      # Prepends the guard to GC's singleton class, once.
      #
      # @return [void]
      def self.install
        GC.singleton_class.prepend(self) if NEEDED && !GC.singleton_class.include?(self)
      end

      def auto_compact=(flag)
        Profiler.auto_compact_turned_on if flag
        super
      end
    end
  end
end
