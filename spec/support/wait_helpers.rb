# frozen_string_literal: true

# Waiting for another thread without ever hanging the suite.
module WaitHelpers
  # Passes control to other threads until the block is true; raises (failing the example,
  # naming what it waited for) after `timeout` seconds instead of spinning forever.
  def wait_until(what, timeout: 60)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    until yield
      raise "timed out after #{timeout} s waiting until #{what}" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      Thread.pass
    end
  end
end
