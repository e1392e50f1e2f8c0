# frozen_string_literal: true

# The threads of bench/profiler_rate.rb: busy loops, each in a method of its own so that the
# profile tells them apart, an idle thread, and a fixed amount of work.
module RateWork
  STOP = [false] # the busy loops stop when it holds true

  module_function

  def stop!
    STOP[0] = true
  end

  def busy_1
    x = 0
    x = ((x * 31) + 7) % 1_000_003 until STOP[0]
    x
  end

  def busy_2
    x = 0
    x = ((x * 37) + 11) % 1_000_033 until STOP[0]
    x
  end

  def busy_3
    x = 0
    x = ((x * 41) + 13) % 1_000_037 until STOP[0]
    x
  end

  def busy_4
    x = 0
    x = ((x * 43) + 17) % 1_000_039 until STOP[0]
    x
  end

  def idle_sleep
    sleep
  end

  # `iterations` rounds of integer arithmetic (pure Ruby, never lets go of the GVL).
  def fixed_work(iterations)
    x = 0
    i = 0
    while i < iterations
      x = ((x * 31) + i) % 1_000_003
      i += 1
    end
    x
  end
end
