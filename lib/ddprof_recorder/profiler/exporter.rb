# frozen_string_literal: true

module DdprofRecorder
  class Profiler
    # Hands the profiler's windows to the user's exporter, in a thread of its own so that an
    # exporter may take its time (upload over the network...) while sampling goes on. An
    # exception the exporter raises is logged and forgotten.
    #
    # At most `max_queued` windows wait for the thread (each one is a whole pprof: an exporter
    # slower than the interval would otherwise grow the process without end). When one more
    # comes, the oldest waiting window is dropped, counted and logged: the windows the
    # exporter still gets are then the latest ones, contiguous up to the last window (which
    # {Profiler#stop} hands over itself), so what a slow backend receives tells the most
    # recent state of the program, and the gap is in the past rather than just before the end.
    class Exporter
      # @return [Thread, nil] the exporting thread, while it runs.
      attr_reader :thread

      # @param target [#export, #call] `export(start, finish, pprof)` if it has it, else `call`.
      # @param max_queued [Integer] windows that may wait for the thread, at least 1.
      def initialize(target, max_queued:, logger: DdprofRecorder.logger)
        @target = target
        @max_queued = max_queued
        @logger = logger
        @windows = nil
        @thread = nil
        @lock = Mutex.new
        # accepted: windows the queue kept (not dropped when full); taken: those the thread
        # finished with; exported / failed: deliveries that returned / raised; dropped: windows
        # never handed over.
        @counts = { accepted: 0, taken: 0, exported: 0, failed: 0, dropped: 0 }
      end

      # Starts the exporting thread.
      def start
        @windows = Queue.new
        windows = @windows
        @thread = OwnThread.new { run(windows) }
        @thread.name = "ddprof_recorder exporter"
        @thread.report_on_exception = false
        self
      end

      # Queues a window `[start, finish, pprof]` for the thread; drops the oldest waiting one
      # if {#initialize}'s `max_queued` are waiting. Called by one thread (the sampler's).
      def <<(window)
        dropped = nil
        @lock.synchronize do
          return nil if @windows.closed? # stopping: the window is in the last one

          while @windows.size >= @max_queued
            oldest = begin
              @windows.pop(true)
            rescue ThreadError # the exporting thread took it meanwhile
              break
            end
            @counts[:dropped] += 1
            @counts[:accepted] -= 1
            dropped = oldest
          end
          @windows << window
          @counts[:accepted] += 1
        end
        log_dropped(dropped) if dropped
      rescue ClosedQueueError
        nil
      end

      # Hands over what is queued, then ends the thread, waiting at most `timeout` seconds.
      # If it has to be killed, the windows it never finished with are counted as dropped,
      # and logged.
      #
      # @return [Boolean] whether it ended in time (else it was killed).
      def close(timeout)
        @lock.synchronize { @windows&.close }
        thread = @thread
        @thread = nil
        return true if thread.nil? || thread.equal?(Thread.current) || thread.join(timeout)

        thread.kill
        thread.join(1) # let it go before counting (an exporter in C may not notice at once)
        lost, total = @lock.synchronize do
          @windows.clear
          lost = @counts[:accepted] - @counts[:taken]
          @counts[:dropped] += lost
          @counts[:taken] = @counts[:accepted]
          [lost, @counts[:dropped]]
        end
        @logger.warn("profiler: #{thread.name} did not stop in #{timeout} s; killing it: " \
                     "#{lost} window#{'s' unless lost == 1} not exported (#{total} dropped in all)")
        false
      end

      # Hands one window to the exporter, in the calling thread.
      #
      # @param queued [Boolean] whether it comes from the queue (the exporting thread's).
      # @return [Boolean] whether the exporter returned (false: it raised, which is logged).
      def deliver(window, queued: false)
        if @target.respond_to?(:export)
          @target.export(*window)
        else
          @target.call(*window)
        end
        count(:exported, queued)
        true
      rescue StandardError => e
        count(:failed, queued)
        @logger.error("profiler: the exporter raised #{e.class}: #{e.message}")
        false
      end

      # @return [Hash{Symbol => Integer}] `:exported` (windows the exporter returned from, the
      #   last one too), `:failed` (windows it raised on), `:queued` (waiting now), `:dropped`
      #   (never handed over: the oldest waiting when the queue was full, and at {#close}
      #   those a killed thread did not finish). Without the lock, so that a trap handler may
      #   read them (one C call copies the counts).
      def stats
        counts = @counts.slice(:exported, :failed, :dropped)
        { exported: counts[:exported], failed: counts[:failed], queued: @windows ? @windows.size : 0,
          dropped: counts[:dropped] }
      end

      private

      def run(windows)
        while (window = windows.pop)
          deliver(window, queued: true)
        end
      end

      # One delivery's outcome, and (for a queued one) that the thread is done with it, at once.
      def count(outcome, queued)
        @lock.synchronize do
          @counts[outcome] += 1
          @counts[:taken] += 1 if queued
        end
      end

      def log_dropped(window)
        start, finish, = window
        dropped = @lock.synchronize { @counts[:dropped] }
        @logger.warn("profiler: the exporter is behind (#{@max_queued} windows waiting: max_queued_windows): " \
                     "dropped the oldest waiting window (#{start.getutc} to #{finish.getutc}); " \
                     "#{dropped} dropped so far")
      end
    end
  end
end
