# frozen_string_literal: true

require_relative "format"

module DdprofRecorder
  class CLI
    # `record`'s output: one screen about a recording (duration, samples, how they were taken,
    # threads, the hottest function, the files by process, how to look at them).
    class RecordSummary
      include Format

      # The summary lists this many processes, one per line; the rest are counted.
      MAX_PROCESS_LINES = 8
      # The lines about the files from before the run name this many.
      MAX_NAMED_FILES = 3
      # With --timeline, the shares of this many threads (the longest first), one per line.
      MAX_THREAD_LINES = 8
      # The label that the recorder's record_endpoint puts on a request's samples.
      ENDPOINT_LABEL = "trace endpoint"
      # The `endpoints` line names this many, the most cpu-time first; the rest are counted.
      MAX_ENDPOINTS = 3

      # A pprof comment that starts with this says how the profile was sampled (the profiler
      # sets it, through StackRecorder#comments=); the summary's `sampling` line shows the rest.
      SAMPLING_COMMENT = "sampling: "
      # Those that say allocation sampling or GC time stopped early (Profiler::RactorGuard), or
      # what became of the sampling signal when the program took it (Profiler#keep_signal), or
      # how many threads blocked it or had no slot (Profiler#note_unarmed_threads): shown
      # whole, under the `sampling` line.
      STOPPED_COMMENTS = ["allocations: stopped", "gc: stopped", Profiler::SIGNAL_COMMENT,
                          Profiler::BLOCKED_COMMENT, Profiler::NO_SLOT_COMMENT].freeze

      # @param options [Record::Options] what `record` was asked.
      # @param status [Process::Status] how the program ended.
      # @param elapsed [Float] seconds from the spawn to the program's end.
      # @param files [Hash{Integer, nil => Array<String>}] the profile files by process
      #   (Recording.profile_files), each read once here.
      # @param replaced [Array<String>] those of `files` that replaced a file from before the
      #   run.
      # @param left [Array<String>] the files from before the run with names of the same form
      #   (not read: an earlier run's, or the user's), left as they were.
      # @param lost [Array<Array(String, String)>] the files that were not written, `[path,
      #   why]` each (Recording.lost_files; path nil for a window dropped unwritten).
      def initialize(options, status, elapsed, files, replaced: [], left: [], lost: [])
        @options = options
        @lost = lost
        @status = status
        @elapsed = elapsed
        @files = files
        @replaced = replaced
        @left = left
        @processes = files.map { |child_pid, paths| process(child_pid, paths) }
      end

      # @param io [IO]
      # @return [nil]
      def print(io)
        io.puts(lines)
      end

      # @return [Array<String>] the summary's lines.
      def lines
        summaries = @processes.flat_map { |p| p[:summaries] }
        totals = Hash.new(0)
        @processes.each { |p| p[:totals].each { |k, v| totals[k] += v } }
        duration = summaries.map { |s| s[:finish] }.max - summaries.map { |s| s[:start] }.min
        thread_ids = summaries.flat_map { |s| s[:thread_ids] }.uniq
        samples = totals["cpu-samples"]

        lines = []
        lines << "ddprof-recorder: recorded `#{display_command(@options.command)}` " \
                 "(#{status_text(@status)}, #{format('%.2f', @elapsed)} s)"
        lines << row("duration", format("%.2f s profiled", duration))
        lines << row("samples", samples_text(samples, thread_ids.size, duration))
        lines.concat(sampling_lines(summaries))
        lines << row("threads", threads_text(thread_ids.size))
        lines.concat(state_lines(summaries)) if @options.timeline
        lines << row("cpu-time", format("%.2f s   wall-time %.2f s", totals["cpu-time"] / 1e9, totals["wall-time"] / 1e9))
        # Without a sample, the cpu-time is only what the threads used before the profiler
        # stopped, charged where they were then: no hottest function to name.
        lines.concat(hottest_lines(totals["cpu-time"])) if samples.positive?
        lines.concat(endpoint_lines) if endpoints?
        lines.concat(allocator_lines(totals["alloc-count"]))
        lines.concat(@processes.size == 1 ? written_lines(@processes.first) : process_lines)
        lines.concat(lost_lines)
        lines.concat(earlier_lines)
        lines.concat(view_lines(@files.keys, @processes.first[:paths].first))
      end

      private

      # One process's files, read once, and their summaries (DdprofRecorder.summary).
      def process(child_pid, paths)
        data = paths.map { |f| File.binread(f) }
        summaries = data.map { |d| DdprofRecorder.summary(d) }
        totals = Hash.new(0)
        summaries.each { |s| s[:totals].each { |k, v| totals[k] += v } }
        pid = child_pid || summaries.flat_map { |s| s[:process_ids] }.first
        { pid: pid, paths: paths, data: data, summaries: summaries, totals: totals, bytes: data.sum(&:bytesize) }
      end

      # How many samples, and at what rate per thread; for none, why.
      def samples_text(samples, threads, duration)
        if samples.zero?
          period = 1.0 / @options.hz
          return "0" unless duration < period

          shown = period < 1 ? format("%.1f ms", period * 1e3) : format("%.2f s", period)
          return "0: the profiled run was shorter than one sampling period (#{shown} at #{@options.hz} Hz)"
        end
        return samples.to_s if threads.zero? || duration <= 0

        format("%d, about %.0f per second per thread (asked %d)", samples, samples / threads / duration, @options.hz)
      end

      # How many threads, and their names; with forked children, each name says in how many
      # processes it is (a server's workers all have a "main").
      def threads_text(count)
        in_processes = Hash.new(0)
        @processes.each do |p|
          p[:summaries].flat_map { |s| s[:thread_names] }.uniq.each { |name| in_processes[name] += 1 }
        end
        several = @processes.size > 1
        names = in_processes.map do |name, n|
          next name unless n > 1

          "#{name} (in #{n == @processes.size ? 'each' : n})"
        end
        shown = "#{names.first(6).join(', ')}#{names.size > 6 ? ', ...' : ''}"
        several ? "#{count} in #{@processes.size} processes: #{shown}" : "#{count}: #{shown}"
      end

      # How the files say they were sampled: the text of each distinct "sampling: " comment
      # over every process's files, once (the first on the `sampling` line, any other below
      # it); nothing when no file has one.
      def sampling_lines(summaries)
        texts = summaries.flat_map { |s| s[:comments] }
                         .select { |c| c.start_with?(SAMPLING_COMMENT) }
                         .map { |c| c.delete_prefix(SAMPLING_COMMENT) }
                         .reject(&:empty?).uniq
        lines = texts.each_with_index.map { |text, i| row(i.zero? ? "sampling" : "", text) }
        lines + summaries.flat_map { |s| s[:comments] }.select { |c| c.start_with?(*STOPPED_COMMENTS) }.uniq
                         .map { |c| row("", c) }
      end

      # With --timeline: each thread's share of its wall time running, waiting for the GVL
      # (n/a on Ruby 3.1, whose blocked share holds the waits too), blocked and in the GC, over every file
      # (DdprofRecorder.summary's `:threads`), the longest first.
      def state_lines(summaries)
        threads = {}
        summaries.each do |s|
          s[:threads].each do |t|
            sum = threads[[t[:process_id], t[:thread_id]]] ||= t.merge(wall: 0, running: 0, waiting: t[:waiting] && 0,
                                                                       gc: 0, blocked: 0)
            sum[:name] = t[:name]
            %i[wall running gc blocked].each { |k| sum[k] += t[k] }
            sum[:waiting] += t[:waiting] if sum[:waiting] && t[:waiting]
          end
        end
        shown = threads.values.sort_by { |t| -t[:wall] }
        width = shown.first(MAX_THREAD_LINES).map { |t| thread_title(t).size }.max || 0
        lines = shown.first(MAX_THREAD_LINES).each_with_index.map do |t, i|
          share = ->(v) { v ? format("%5.1f%%", t[:wall].positive? ? 100.0 * v / t[:wall] : 0) : "  n/a " }
          row(i.zero? ? "states" : "",
              format("%-*s  running %s  waiting for GVL %s  blocked %s  gc %s", width, thread_title(t),
                     share.call(t[:running]), share.call(t[:waiting]), share.call(t[:blocked]), share.call(t[:gc])))
        end
        rest = shown.size - MAX_THREAD_LINES
        lines << row("", "... and #{rest} more (ddprof-recorder timeline draws them all)") if rest.positive?
        if shown.any? { |t| t[:waiting].nil? }
          lines << row("", "(waiting for GVL n/a: a Ruby without GVL events, 3.1; blocked holds the waits too)")
        end
        lines
      end

      def thread_title(thread)
        pid = thread[:process_id] && @processes.size > 1 ? "pid #{thread[:process_id]} " : ""
        "#{pid}#{thread[:name]}"
      end

      # The function with the most cpu-time as a leaf, over every file.
      def hottest_lines(cpu_time)
        data = @processes.flat_map { |p| p[:data] }
        hottest = DdprofRecorder.top(data.size == 1 ? data.first : data, value: "cpu-time", limit: 1)[:rows].first
        return [] unless hottest && cpu_time.positive?

        [row("hottest", format("%s (%s) %.1f%% of cpu-time", hottest[:name], display_path(hottest[:filename]),
                               100.0 * hottest[:self] / cpu_time))]
      end

      # Whether some sample of some file has a "trace endpoint" label.
      def endpoints?
        @processes.any? { |p| p[:summaries].any? { |s| s[:label_keys].include?(ENDPOINT_LABEL) } }
      end

      # The endpoints with the most cpu-time and their shares of it over every file, and the
      # share of the samples without one: `endpoints A 70.0%, B 20.0% of cpu-time, 10.0%
      # outside any endpoint`.
      def endpoint_lines
        data = @processes.flat_map { |p| p[:data] }
        top = DdprofRecorder.top(data.size == 1 ? data.first : data, value: "cpu-time", by: ENDPOINT_LABEL)
        endpoints, outside = top[:rows].partition { |r| r[:label] }
        return [row("endpoints", "none with cpu-time")] if endpoints.empty? || !top[:total].positive?

        text = endpoints.first(MAX_ENDPOINTS).map { |r| "#{r[:label]} #{percent(r[:total], top[:total])}" }.join(", ")
        text += " (+#{endpoints.size - MAX_ENDPOINTS} more)" if endpoints.size > MAX_ENDPOINTS
        text += " of cpu-time"
        text += ", #{percent(outside.first[:total], top[:total])} outside any endpoint" unless outside.empty?
        [row("endpoints", text)]
      end

      # With allocation samples: the function that allocated the most, as a leaf.
      def allocator_lines(allocated)
        return [] unless allocated.positive?

        data = @processes.flat_map { |p| p[:data] }
        top = DdprofRecorder.top(data.size == 1 ? data.first : data, value: "alloc-count", limit: 1)[:rows].first
        return [] unless top

        [row("allocator", format("%s (%s) %.1f%% of about %d allocations", top[:name], display_path(top[:filename]),
                                 100.0 * top[:self] / allocated, allocated))]
      end

      # The files of a recording without forked children.
      def written_lines(process)
        paths = process[:paths]
        shown = display_path(paths.first)
        if paths.size == 1
          [row("written", "#{shown} (#{process[:bytes]} bytes)")]
        else
          [row("written", "#{paths.size} windows of #{@options.interval} s: #{shown} ... #{display_path(paths.last)}")]
        end
      end

      # One line per process: pid, samples, cpu-time and its files.
      def process_lines
        processes = @processes
        lines = [row("processes", "#{processes.size}: the command's and #{processes.size - 1} forked")]
        width = processes.map { |p| p[:pid].to_s.size }.max
        processes.first(MAX_PROCESS_LINES).each do |p|
          paths = p[:paths]
          written = paths.size == 1 ? display_path(paths.first) : "#{display_path(paths.first)} ... #{display_path(paths.last)}"
          lines << row("", format("%-*s  samples %-6d cpu-time %6.2f s  %s (%d bytes)", width, p[:pid] || "-",
                                  p[:totals]["cpu-samples"], p[:totals]["cpu-time"] / 1e9, written, p[:bytes]))
        end
        rest = processes.drop(MAX_PROCESS_LINES)
        lines << row("", "... and #{rest.size} more (#{rest.sum { |p| p[:paths].size }} files)") unless rest.empty?
        lines << row("written", "#{processes.sum { |p| p[:paths].size }} files, " \
                                "#{processes.sum { |p| p[:bytes] }} bytes in all")
        lines
      end

      # The files (windows, with --interval) that were not written, by why: how many, and some
      # of their names.
      def lost_lines
        noun = @options.interval ? "window" : "file"
        @lost.group_by(&:last).each_with_index.map do |(why, entries), i|
          paths = entries.filter_map(&:first)
          names = paths.empty? ? "" : ": #{name_list(paths, MAX_NAMED_FILES)}"
          row(i.zero? ? "lost" : "", "#{entries.size} #{noun}#{'s' unless entries.size == 1} not written (#{why})#{names}")
        end
      end

      # What was there before the run: the files it replaced, and those it left untouched
      # (`record` removes nothing), by name (a few) and number.
      def earlier_lines
        lines = []
        unless @replaced.empty?
          lines << row("replaced", files_text(@replaced, ", from before this run", " from before this run: "))
        end
        unless @left.empty?
          text = files_text(@left, ": not from this run (a name of the same form)",
                            " not from this run (names of the same form): ")
          text += "; the patterns below match #{@left.size == 1 ? 'it' : 'them'} too" if patterns?
          lines << row("untouched", text)
        end
        lines
      end

      # One file: its name, then `one`; several: how many, `several`, then some names
      # ("3 files ...: a.pb, b.pb, c.pb", "9 files ...: a.pb, b.pb, c.pb, ...").
      def files_text(paths, one, several)
        return "#{display_path(paths.first)}#{one}" if paths.size == 1

        "#{paths.size} files#{several}#{name_list(paths, MAX_NAMED_FILES)}"
      end

      # Whether #view_lines names the files by shell patterns: with forked children, unless
      # files from before the run would match them (then it names this run's, if there are
      # at most MAX_PROCESS_LINES).
      def patterns?
        return false if @files.keys == [nil]

        @left.empty? || @files.values.sum(&:size) > MAX_PROCESS_LINES
      end

      # How to look at the files: the one file, or, with forked children, shell patterns that
      # name the files of every process (the views merge them), or the files themselves.
      def view_lines(pids, first)
        out = display_path(first)
        if pids == [nil]
          shown = out.shellescape
          stem = out
          by = ""
        else
          base = display_path(File.expand_path(@options.out))
          shown = if patterns?
                    [profile_glob(base, @options.interval ? "[0-9]*" : nil), profile_glob(base, "pid*")].join(" ")
                  else
                    @files.values.flatten.map { |path| display_path(path).shellescape }.join(" ")
                  end
          stem = base
          by = " --by-process"
        end
        svg = view_name(stem, ".svg").shellescape
        lines = [row("view it", "ddprof-recorder top #{shown}")]
        lines << row("", "ddprof-recorder top --by #{display_command([ENDPOINT_LABEL])} #{shown}") if endpoints?
        lines << row("", "ddprof-recorder flamegraph#{by} #{shown} -o #{svg}")
        if @options.timeline
          lines << row("", "ddprof-recorder timeline #{shown} -o #{view_name(stem, '.timeline.html').shellescape}")
        end
        lines << row("", "go tool pprof -top #{shown}")
      end
    end
  end
end
