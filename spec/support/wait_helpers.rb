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

  # Waits up to `timeout` seconds for the child `pid`; kills it (and returns nil) if it hangs,
  # else returns its Process::Status. A blocking wait (the GVL released) with a watchdog:
  # polling would wait for the GVL behind busy threads at every turn.
  def wait_child(pid, timeout)
    killed = false
    watchdog = Thread.new do
      sleep timeout
      killed = true
      Process.kill(:KILL, pid)
    rescue Errno::ESRCH
      nil
    end
    _, status = Process.wait2(pid)
    watchdog.kill
    killed ? nil : status
  end
end
