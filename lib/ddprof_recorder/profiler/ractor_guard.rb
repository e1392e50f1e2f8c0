# frozen_string_literal: true

module DdprofRecorder
  class Profiler
    # Allocation sampling and Ractors do not go together. Ruby runs an internal NEWOBJ hook on
    # whichever thread allocates, and on a Ractor's thread that crashes the VM: Ruby 3.1's own
    # `ObjectSpace.trace_object_allocations_start` dies with `[BUG] Segmentation fault` in
    # `newobj_of` as soon as `Ractor.new { 1000.times.map(&:to_s) }` runs. Our hooks also assume
    # one GVL (the NEWOBJ hook's state and its postponed job's Ruby handler, which would run in
    # the Ractor, away from the objects it uses).
    #
    # So a profiler with `allocations:` or `heap:` stops both hooks the moment a Ractor is about
    # to start (`Ractor.new`, prepended below): the live heap goes into the current window
    # first, the profile's comments say when and why (`record`'s summary shows it), the log
    # says it once, and `stats[:allocations][:stopped]` holds the reason. Stack sampling goes
    # on. A profiler asked for allocations while another Ractor is alive refuses to start.
    module RactorGuard
      # What `stats[:allocations][:stopped]` and the profile's comment say.
      REASON = "a Ractor started (Ruby's allocation hooks are not safe with Ractors)"

      @owner = nil
      @lock = Mutex.new

      class << self
        # The profiler whose allocation hooks are on (the native hooks are process-wide: one
        # at a time), or nil.
        def owner=(profiler)
          @lock.synchronize { @owner = profiler }
        end

        # Called by Ractor.new before it makes the Ractor. In a Ractor that makes another, the
        # hooks are off already (and this module's state is the main Ractor's).
        def ractor_starting
          return unless ::Ractor.current == ::Ractor.main

          owner = @lock.synchronize { @owner }
          owner&.__send__(:stop_memory_for_ractor) # private to the Profiler: this is its one caller
        end

        # @return [Boolean] whether a Ractor other than the main one is alive.
        def ractors?
          defined?(::Ractor) && ::Ractor.count > 1
        end
      end

      # Prepended to Ractor's singleton class.
      module NewHook
        def new(*args, **kwargs, &block)
          RactorGuard.ractor_starting
          super
        end
      end
    end
  end
end

Ractor.singleton_class.prepend(DdprofRecorder::Profiler::RactorGuard::NewHook) if defined?(Ractor)
