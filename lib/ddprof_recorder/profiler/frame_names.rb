# frozen_string_literal: true

module DdprofRecorder
  class Profiler
    # One way of naming frames for every stack the profiler records, whichever thread and
    # whichever path read it (the rules: "Names" in ext/ddprof_recorder/src/sampling/stack_capture.rs;
    # for users: docs/profiler.md, "Frame names").
    #
    # Frames are named `Klass#meth`; a template's code by its template (`(erb)`,
    # `app/views/pages/index.html.erb`). They are read natively, for the current thread and for
    # others, through the VM's own structures (ext/ddprof_recorder/src/vm/frames.rs, on 3.1,
    # 3.3 and 3.4). That reader checks itself once per process ({.check}) before anything is
    # named. If the check fails, on 3.3+ frames are read through the public API
    # (`rb_profile_frames`, `rb_profile_thread_frames`) and still named `Klass#meth`; on 3.1
    # every frame is named the weaker way, from what a `Thread::Backtrace::Location` gives,
    # and other threads are read with `Thread#backtrace_locations`.
    module FrameNames
      @checked = false
      # The gem's own Ruby files: a frame in them is the profiler's work, not the program's.
      OWN_DIR = "#{File.expand_path('..', __dir__)}/".freeze

      class << self
        # Runs the native reader's self-check, once per process.
        #
        # @return [Boolean] whether frames get qualified names.
        def check
          return Profiler._native_qualified_names? if @checked

          @checked = true
          run_check
        end

        # @return [Boolean] whether frames get qualified names (false until {.check} ran).
        def qualified?
          Profiler._native_qualified_names?
        end

        # Another thread's stack, leaf first, as `[name, path, line]` frames named as the
        # sampling job names its own thread's. With the GVL, for a thread that is alive.
        #
        # @param thread [Thread]
        # @return [Array<Array>, nil] empty for a thread not started yet or ending; nil if it
        #   is dead.
        def thread_stack(thread)
          Profiler._native_thread_frames(thread) || location_frames(thread.backtrace_locations)
        end

        # The frames of `locations`, which the current thread read with `caller_locations`:
        # read again natively (the same frames, the root-most `locations.size` of the current
        # stack), or named from the Locations the weaker way.
        #
        # @param locations [Array<Thread::Backtrace::Location>, nil]
        # @return [Array<Array>, nil]
        def caller_frames(locations)
          return locations if locations.nil? || locations.empty?

          frames = Profiler._native_thread_frames(Thread.current)
          return location_frames(locations) unless frames && frames.size >= locations.size

          frames.last(locations.size)
        end

        # `locations` (leaf first) without the gem's own frames on top: where the program
        # called into the profiler (a `record` run's at_exit hook calls {Profiler#stop} from
        # lib/ddprof_recorder/recording.rb).
        #
        # @param locations [Array<Thread::Backtrace::Location>]
        # @return [Array<Thread::Backtrace::Location>]
        def program_locations(locations)
          locations.drop_while { |location| location.absolute_path&.start_with?(OWN_DIR) }
        end

        # Locations as frames named the weaker way: the `base_label`, spelled as every name
        # (`<main>` is `main`...), a compiled template's method named for its template
        # (ActionView's `_app_views_pages_index_html_erb___2930487_60120` is
        # `app/views/pages/index.html.erb`). Code eval'd from a string (an ERB template's)
        # keeps its Location's label, its caller's: a Location does not tell it apart.
        #
        # @param locations [Array<Thread::Backtrace::Location>, nil]
        # @return [Array<Array>, nil]
        def location_frames(locations)
          locations&.map do |location|
            path = location.path || ""
            [Profiler._native_frame_name(location.base_label || "", path), path, location.lineno]
          end
        end

        private

        # The check: the current thread read natively must match `rb_profile_frames`, and a
        # thread parked in `Queue#pop` must read as its Locations do (the same paths and lines,
        # frame for frame).
        def run_check
          return Profiler._native_frame_names_checked(false) unless Profiler._native_frame_reader?

          parked = Thread::Queue.new
          release = Thread::Queue.new
          thread = Thread.new { park(parked, release) }
          parked.pop
          Thread.pass until thread.status == "sleep" || !thread.alive?
          frames = check_from_bmethod(thread)
          passed = !frames.nil? && thread.status == "sleep" &&
                   same_frames?(frames, thread.backtrace_locations || [])
          Profiler._native_frame_names_checked(passed)
        ensure
          release&.push(nil)
          thread&.join
        end

        def park(parked, release)
          parked.push(nil)
          release.pop
        end

        def same_frames?(frames, locations)
          !frames.empty? && frames.map { |_, path, line| [path, line] } == locations.map { |l| [l.path, l.lineno] }
        end
      end

      # A `define_method` method: the native check needs one on the stack, called from a Ruby
      # method (vm/frames.rs).
      define_singleton_method(:check_from_bmethod) { |thread| Profiler._native_check_frames(thread) }
      private_class_method :check_from_bmethod
    end
  end
end
