# frozen_string_literal: true

require_relative "../../bench/support/clock_helpers"

# The sampling jobs run Ruby at the interrupted thread's interrupt checks, so they share that
# thread's recursion guards. `Integer#==` with an argument that is not a number calls it back
# under numeric.c's guard on the pair (`num_funcall1`): a job that compared 0 with nil while
# the program was in `0 == nil` raised `NameError: ==0`, and a program looping on such a
# comparison, as new threads came, had its sampling stop (10 failed passes in a row) within
# a second at 999 Hz, on Ruby 3.1.2 (4 of 5 runs of 0.25 s). On 3.4, `Thread::Queue#pop` does
# `rb_equal(INT2FIX(0), timeout)` in C, so threads waiting on a Queue did it too.
RSpec.describe DdprofRecorder::Profiler, "inside the program's recursion guards" do
  include ClockHelpers # mono_ns

  it "keeps sampling while new threads compare Integers with nil in a loop" do
    profiler = described_class.new(hz: 999, compression: :none)
    profiler.start
    begin
      # 20 rounds of 8 new threads, each comparing for 30 ms.
      20.times do
        Array.new(8) do
          Thread.new do
            finish = mono_ns + 30_000_000
            compared = nil
            (compared = 0 == nil) while mono_ns < finish # rubocop:disable Style/NilComparison
            compared
          end
        end.each(&:join)
      end
    ensure
      pprof = profiler.stop.last
    end
    stats = profiler.stats
    expect(stats[:errors]).to eq(0), "sampling failed #{stats[:errors]} times (the log says why)"
    samples = samples_from(decode_pprof(pprof))
    on_loop = samples.select { |s| s[:frames].any? { |name, path, _| path == __FILE__ && name.include?("block") } }
    expect(on_loop.sum { |s| s[:values]["cpu-time"] }).to be_positive
  end
end
