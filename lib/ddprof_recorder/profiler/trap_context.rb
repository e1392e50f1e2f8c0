# frozen_string_literal: true

module DdprofRecorder
  class Profiler
    # {Profiler.start}, {Profiler.stop} and a profiler's own {Profiler#start} and
    # {Profiler#stop} from a `trap` handler. A trap handler may not lock a Mutex (Ruby raises
    # ThreadError, "can't be called from trap context"), and start and stop lock theirs, and
    # call the exporter, which may lock its own (a Logger, an HTTP client's pool). So there
    # they do their work in a thread of their own, and the handler waits for it (a trap
    # handler may create and join threads): it gets what the call returns, or the exception
    # it raised.
    #
    # Except when the thread the handler runs on (the main thread) itself holds the lock the
    # work needs: the signal came while that thread was inside start or stop. The work could
    # only run once the interrupted call goes on, after the handler, so the handler does not
    # wait for it: the call returns nil at once, and the work runs when the lock is free (an
    # exception it raises is logged).
    module TrapContext
      module_function

      # Whether the caller runs where Mutex#lock raises: in a trap handler (or in one of the
      # profiler's postponed jobs, which run with the trap interrupt masked too).
      def trap_context?
        probe = Mutex.new
        probe.lock
        probe.unlock
        false
      rescue ThreadError
        true
      end

      # Runs the block in a new thread named after `what`; returns its value (raising what it
      # raised), unless the calling thread holds one of `locks`: then nil, at once.
      def outside_trap(what, locks)
        wait = locks.none? { |lock| lock&.owned? }
        thread = Thread.new do
          Thread.current.report_on_exception = false
          yield
        rescue StandardError => e
          raise if wait

          DdprofRecorder.logger.error("profiler: #{what}, called from a trap handler, raised #{e.class}: #{e.message}")
          nil
        end
        thread.name = "ddprof_recorder #{what} (from a trap handler)"
        wait ? thread.value : nil
      end
    end
  end
end
