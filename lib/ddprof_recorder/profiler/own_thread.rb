# frozen_string_literal: true

module DdprofRecorder
  class Profiler
    # The profiler's own Ruby threads: the sampler thread and the exporter's. The sampler never
    # samples them (Profiler#internal_thread?), and knows them by their class from the moment
    # they exist: a pass that lists the threads between `Thread.new` and the assignment of its
    # result sees the new thread too.
    class OwnThread < Thread
    end
  end
end
