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
    # The GC-event hook of `gc: true` is no safer: while any hook on an internal GC event is on,
    # Ruby 3.1 sends every allocation through `newobj_of`'s slow path, and a Ractor's thread
    # allocating there died with `[BUG] Segmentation fault` in `rb_wb_unprotected_newobj_of`
    # (8 runs of 20 of 5 x 3 Ractors that allocate under `Profiler.new(gc: true)`; 0 of 20
    # without `gc:`).
    #
    # So a profiler with `allocations:`, `heap:` or `gc:` stops those hooks the moment a Ractor
    # is about to start (`Ractor.new`, prepended below): the live heap goes into the current
    # window first, the profile's comments say when and why (`record`'s summary shows them),
    # the log says it once, and `stats[:allocations][:stopped]` and `stats[:gc_stopped]` hold
    # the reason. Stack sampling goes on. A profiler asked for allocations or GC time while
    # another Ractor is alive refuses to start.
    module RactorGuard
      # What `stats[:allocations][:stopped]` and the profile's comment say.
      REASON = "a Ractor started (Ruby's allocation hooks are not safe with Ractors)"
      # What `stats[:gc_stopped]` and the profile's comment say.
      GC_REASON = "a Ractor started (Ruby's GC-event hooks are not safe with Ractors)"

      @owner = nil
      @lock = Mutex.new

      class << self
        # The profiler whose allocation or GC hooks are on (the native hooks are process-wide:
        # one at a time), or nil.
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
