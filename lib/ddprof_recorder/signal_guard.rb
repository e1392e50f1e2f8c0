# frozen_string_literal: true

module DdprofRecorder
  # Keeps the profiler's sampling signal (a real-time one, `stats[:signals][:signal]`) to the
  # profiler: it never reaches a program that `exec`s, nor a handler the program installs for it
  # (ext/ddprof_recorder/src/sampling/signal_sampler.rs, "Exec" and "Our signal").
  #
  # - `exec` (`Kernel#exec`, `Kernel.exec`, `Process.exec`): a real-time signal still pending
  #   survives `execve`, and the new program, which has the default action for it, dies of it
  #   (7 of 150 children that started the profiler at 999 Hz and exec'd a shell, before). So
  #   before the exec, this thread blocks the signal, every thread is disarmed (no timer or perf
  #   event of ours is left), the signals pending here are taken, and the mask is given back;
  #   if the exec fails, the threads are armed again. The handler stays installed: `execve`
  #   resets it to the default itself, and until then a stray signal finds it rather than the
  #   default action. `spawn`, `system`, backticks and `IO.popen` need nothing: Ruby forks a
  #   child that has no pending signal, no timer and no perf event of ours (their descriptors
  #   close at exec), and execs there.
  # - `trap` (`Signal.trap`, `Kernel#trap`) of our signal: before Ruby installs the program's
  #   handler, the profiler moves its ticks to another free real-time signal (or, with none
  #   free, stops signal sampling), so the program's handler never runs for a tick of ours.
  #   A handler installed by other means (a C extension's `sigaction`) is seen by the sampler
  #   thread within {Profiler::HOUSEKEEPING_SECONDS} ({Profiler#keep_signal}). Either way the
  #   log, `stats[:signals][:signal_taken]` and the profile's `signal:` comment say so.
  #
  # The hooks are prepended to `Kernel`, `Kernel`'s, `Process`'s and `Signal`'s singleton
  # classes, once (lib/ddprof_recorder.rb).
  module SignalGuard
    # Prepended to `Kernel`'s, `Process`'s and `Signal`'s singleton classes.
    module Methods
      # @return what Ruby's `exec` returns: nothing (it raises if the exec fails).
      def exec(*args, **options)
        SignalGuard.around_exec { super }
      end

      # @return what Ruby's `trap` returns: the signal's previous handler.
      def trap(signal, *args, &block)
        SignalGuard.before_trap(signal)
        super
      end
    end

    # Prepended to `Kernel`: the same methods, private as Kernel's own.
    module KernelMethods
      include Methods
      private :exec, :trap
    end

    # Installs the hooks (once).
    #
    # @return [void]
    def self.install
      return if Kernel.ancestors.include?(KernelMethods)

      Kernel.prepend(KernelMethods)
      [Kernel, Process, Signal].each { |mod| mod.singleton_class.prepend(Methods) }
    end

    # Runs the `exec` in the block with no signal of ours left to reach the new program.
    #
    # @api private
    def self.around_exec
      Profiler._native_prepare_exec
      yield
    ensure
      # The exec failed (it raised), or this is not the exec'ing path at all: arm again.
      Profiler._native_resume_after_exec
    end

    # Before the program's `trap` of `signal`: moves our ticks off it if it is ours.
    #
    # @api private
    def self.before_trap(signal)
      signo = signal_number(signal)
      Profiler._native_keep_signal(signo) if signo
    rescue StandardError => e # never expected; the program's trap goes on
      DdprofRecorder.logger.error("profiler: could not keep the sampling signal: #{e.class}: #{e.message}")
    end

    # The number of a signal as `trap` takes it (an Integer, or a name with or without `SIG`),
    # nil if it names none: `trap` itself then raises.
    #
    # @api private
    def self.signal_number(signal)
      return signal if signal.is_a?(Integer)
      return nil unless signal.is_a?(String) || signal.is_a?(Symbol)

      Signal.list[signal.to_s.delete_prefix("SIG")]
    end
  end
end
