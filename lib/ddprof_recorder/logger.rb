# frozen_string_literal: true

require "logger"

module DdprofRecorder
  class << self
    # @return [Logger] where the recorder logs; defaults to $stderr at WARN.
    def logger
      @logger ||= Logger.new($stderr, level: Logger::WARN, progname: "ddprof_recorder")
    end

    # @param logger [Logger] replaces the default logger.
    attr_writer :logger
  end
end
