# frozen_string_literal: true

# Problems known on some Rubies and not fixed yet. An example that meets one there is reported
# as pending (RSpec's `skip`, listed under "Pending" with the reason) instead of failing, and
# only when the problem shows: where it does not, the example passes or fails as usual.
module KnownIssues
  # Issue 19: the sampling job runs the profiler's Ruby handler on the sampled thread, and its
  # interrupt checks can take a Thread#raise, Thread#kill or Timeout aimed at that thread, which
  # then ends inside the handler and is lost. The deferral that keeps such an interrupt pending
  # until the job is over (ext/ddprof_recorder/src/interrupt_mask.rs) knows Ruby 3.1's structures
  # only and does nothing on any other Ruby. At exit, a lost kill from rb_thread_terminate_all
  # leaves a thread running and the process hung.
  LOST_INTERRUPTS = !RUBY_VERSION.start_with?("3.1.")

  # Marks the example pending if the lost-interrupt problem is known on this Ruby; `what` says
  # what was lost.
  def pending_lost_interrupts(what)
    skip "issue 19, interrupts lost on Ruby #{RUBY_VERSION} (interrupt_mask.rs is for 3.1 only): #{what}" if LOST_INTERRUPTS
  end
end
