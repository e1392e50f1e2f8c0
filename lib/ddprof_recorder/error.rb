# frozen_string_literal: true

module DdprofRecorder
  # Raised when the native recorder reports a failure (e.g. by {StackRecorder#serialize!}).
  # Bad arguments raise Ruby's own ArgumentError / TypeError instead.
  class Error < StandardError; end
end
