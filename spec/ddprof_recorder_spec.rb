# frozen_string_literal: true

require "logger"
require "stringio"

# docs/design.md, section 3 (the contract): the module's logger and error class.
RSpec.describe DdprofRecorder do
  describe ".logger" do
    it "defaults to a Logger on $stderr at WARN" do
      described_class.instance_variable_set(:@logger, nil)

      logger = described_class.logger
      expect(logger).to be_a(Logger)
      expect(logger.level).to eq Logger::WARN
      expect(logger.instance_variable_get(:@logdev).dev).to be $stderr
    end

    it "returns the same Logger each time" do
      expect(described_class.logger).to be described_class.logger
    end
  end

  describe ".logger=" do
    it "replaces the logger the recorder logs through" do
      log = StringIO.new
      logger = Logger.new(log, level: Logger::DEBUG)

      described_class.logger = logger
      DdprofRecorder::StackRecorder.new.serialize

      expect(described_class.logger).to be logger
      expect(log.string).to include "Encoded profile covering"
    end
  end

  describe DdprofRecorder::Error do
    it "is a StandardError" do
      expect(described_class.ancestors).to include(StandardError)
      expect(described_class.superclass).to be StandardError
    end
  end

  it "has a version" do
    expect(DdprofRecorder::VERSION).to match(/\A\d+\.\d+\.\d+/)
  end
end
