# frozen_string_literal: true

module DdprofRecorder
  VERSION = "0.1.0"
end
