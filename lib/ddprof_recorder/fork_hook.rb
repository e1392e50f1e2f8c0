# frozen_string_literal: true

module DdprofRecorder
  # Makes the process-wide profiler ({Profiler.start}) follow `fork`: in a child forked while it
  # runs, it starts again at once ({Profiler#restart_after_fork}), in a window of its own with
  # the same options and exporter, so that the workers of a forking server (Puma's cluster mode,
  # Unicorn) are profiled like their master. A profiler of its own (`Profiler.new.start`,
  # `Profiler.profile`) is not restarted: it belongs to the code that started it.
  #
  # The hook is `Process._fork` (Ruby 3.1+), prepended to `Process`'s singleton class. Ruby
  # calls it for every fork of the Ruby process: `Kernel#fork`, `Process.fork` and
  # `IO.popen("-")` (process.c, `rb_fork_ruby`; its documentation names `_fork` as the method for
  # "application monitoring libraries" to override). It returns 0 in the child, before the code
  # that called `fork` goes on there. Hooking `fork` itself would miss the forms that
  # do not call it (`Process.fork` and `IO.popen("-")` do not go through `Kernel#fork`).
  # `Process.daemon` forks without calling `_fork`, and `spawn`, `system` and backticks start
  # new programs (their Ruby, if any, is not profiled, see {Recording}).
  #
  # Threads do not survive a fork: the child has only the thread that forked. The restart makes
  # new ones and never waits for the parent's (see {Profiler#restart_after_fork}). A failure to
  # restart is logged; the fork itself always goes on.
  #
  # Event hooks do survive it (Ruby's hook lists are process memory): the hooks of whatever
  # profiler was sampling in the parent, the process-wide one or one of its own. They measure
  # nothing in the child (the fork generation, docs/profiler.md "Fork and exit") but would be
  # called at every GC step, allocation, or thread start and end, so every child first removes
  # them ({remove_parent_hooks}); a profiler started there adds its own.
  module ForkHook
    # Prepended to `Process.singleton_class`.
    module ProcessMethods
      # @return [Integer, nil] what Ruby's `Process._fork` returns: the child's pid in the
      #   parent, 0 in the child.
      def _fork
        profiler = Profiler.current if Profiler.running?
        pid = super
        if pid.zero?
          ForkHook.remove_parent_hooks
          ForkHook.after_fork_in_child(profiler) if profiler
        end
        pid
      end
    end

    # Installs the hook (once). lib/ddprof_recorder.rb calls it.
    #
    # @return [void]
    def self.install
      return if Process.singleton_class.ancestors.include?(ProcessMethods)

      Process.singleton_class.prepend(ProcessMethods)
    end

    # In every child: removes the event hooks a profiler sampling in the parent left enabled
    # (each call does nothing if its hook is off). A profiler started here starts afresh.
    #
    # @return [void]
    def self.remove_parent_hooks
      Profiler._native_sampling_stop(nil) # the thread-end hook, the GC_EXIT tick hook, the signals
      Profiler._native_gvl_stop
      Profiler._native_gc_stop
      Profiler._native_allocations_stop
      Profiler._native_heap_stop
    rescue StandardError => e
      DdprofRecorder.logger.error("profiler: could not remove the parent's hooks after fork: #{e.class}: #{e.message}")
    end

    # In the child: restarts the profiler that was running in the parent.
    #
    # @param profiler [Profiler]
    # @return [void]
    def self.after_fork_in_child(profiler)
      profiler.restart_after_fork
    rescue StandardError => e
      DdprofRecorder.logger.error("profiler: could not restart after fork: #{e.class}: #{e.message}")
    end
  end
end
