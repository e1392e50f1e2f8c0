# frozen_string_literal: true

module DdprofRecorder
  class Profiler
    # Hands the profiler's windows to the user's exporter, in a thread of its own so that an
    # exporter may take its time (upload over the network...) while sampling goes on. An
    # exception the exporter raises is logged and forgotten.
    class Exporter
      # @return [Thread, nil] the exporting thread, while it runs.
      attr_reader :thread

      # @param target [#export, #call] `export(start, finish, pprof)` if it has it, else `call`.
      def initialize(target, logger: DdprofRecorder.logger)
        @target = target
        @logger = logger
        @windows = nil
        @thread = nil
      end

      # Starts the exporting thread.
      def start
        @windows = Queue.new
        windows = @windows
        @thread = Thread.new { run(windows) }
        @thread.name = "ddprof_recorder exporter"
        @thread.report_on_exception = false
        self
      end

      # Queues a window `[start, finish, pprof]` for the thread.
      def <<(window)
        @windows << window
      rescue ClosedQueueError
        nil # stopping: the window is in the last one
      end

      # Hands over what is queued, then ends the thread, waiting at most `timeout` seconds.
      #
      # @return [Boolean] whether it ended in time (else it was killed).
      def close(timeout)
        @windows&.close
        thread = @thread
        @thread = nil
        return true if thread.nil? || thread.equal?(Thread.current) || thread.join(timeout)

        @logger.warn("profiler: #{thread.name} did not stop in #{timeout} s; killing it")
        thread.kill
        false
      end

      # Hands one window to the exporter, in the calling thread.
      def deliver(window)
        if @target.respond_to?(:export)
          @target.export(*window)
        else
          @target.call(*window)
        end
      rescue StandardError => e
        @logger.error("profiler: the exporter raised #{e.class}: #{e.message}")
      end

      private

      def run(windows)
        while (window = windows.pop)
          deliver(window)
        end
      end
    end
  end
end
