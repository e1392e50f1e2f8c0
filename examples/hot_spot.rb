# frozen_string_literal: true

# A program with a known hot spot, to try the profiler on:
#
#   exe/ddprof-recorder record -o hot_spot.pb.gz -- ruby examples/hot_spot.rb
#
# One thread ("cruncher") spends almost all of its time in `HotSpot.crunch`, a tight loop
# of integer arithmetic; a second thread ("sleeper") only sleeps, so it has wall time and
# (almost) no CPU time; the main thread waits for both. A little work goes to
# `HotSpot.warm_up` so that the profile has a second, much smaller, CPU consumer.
#
# SECONDS (default 2.0) sets how long the cruncher runs. `HotSpot.work(iterations)` is the
# same CPU work without threads, for benchmarks.
module HotSpot
  module_function

  # The hot spot: a tight loop with no method calls but the integer operators.
  def crunch(iterations)
    x = 0
    i = 0
    while i < iterations
      x = (x * 31 + i) % 1_000_003
      i += 1
    end
    x
  end

  # About a tenth of the work, in a second method.
  def warm_up(iterations)
    crunch(iterations / 10)
  end

  # The CPU work of one cruncher round.
  def work(iterations)
    warm_up(iterations) + crunch(iterations)
  end

  # Runs `work` in rounds for `seconds` of wall time.
  def cruncher(seconds)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    rounds = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      work(200_000)
      rounds += 1
    end
    rounds
  end

  def nap(seconds)
    sleep(seconds)
  end

  def run(seconds)
    sleeper = Thread.new { nap(seconds) }
    sleeper.name = "sleeper"
    cruncher = Thread.new { cruncher(seconds) }
    cruncher.name = "cruncher"
    rounds = cruncher.value
    sleeper.join
    rounds
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ENV.fetch("SECONDS", "2.0"))
  rounds = HotSpot.run(seconds)
  puts "hot_spot: #{rounds} rounds of crunching in #{seconds} s"
end
