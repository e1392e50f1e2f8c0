# Accuracy workload `micro_c` (bench/accuracy.rb): the program of the issue "Samples where the
# CPU is", as given there except that its 4 s come from the command line. It measures no truth.
#
#   ruby bench/accuracy/micro_c.rb [SECONDS]     (default 4)
#
# One Ruby method, `work`, whose loop body (`Integer#times`' block) calls cheap C methods
# (`Kernel#is_a?`, `Kernel#respond_to?`, `Integer#<<`, `Integer#^`; each well under a
# microsecond) between instructions that Ruby runs inline (`a[i & 3]`, `+`, `*`, `%`). A
# sampler that takes the stack where the CPU is finds `work` most of the time (stackprof in
# the issue: `work` 69%, `times` 12%, `respond_to?` 13%, `is_a?` 2%); one that waits for the
# VM's next interrupt check finds the C method that was just called instead (ours in the
# issue: `is_a?` 39%, `respond_to?` 28%, `<<` 18%, `^` 8%, `work` 6%).
# No magic comment: the issue's program had none (its "x" is not frozen).
def work(a)
  n = 0
  200.times do |i|
    x = a[i & 3]
    n += 1 if x.is_a?(String)
    n += 2 if x.respond_to?(:upcase)
    k = i * 3 % 7; k += i << 2; n += k ^ 5
  end
  n
end
seconds = Float(ARGV.fetch(0, "4"))
a = [1, "x", :y, 2.0]
t = Process.clock_gettime(Process::CLOCK_MONOTONIC)
n = 0
n += work(a) while Process.clock_gettime(Process::CLOCK_MONOTONIC) - t < seconds
p n
