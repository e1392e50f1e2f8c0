# frozen_string_literal: true

require_relative "command"

module DdprofRecorder
  class CLI
    # `ddprof-recorder timeline FILE...`: what each thread was doing, and when, as an SVG or an
    # HTML page (DdprofRecorder.timeline), from a profile recorded with --timeline.
    class Timeline < Command
      NAME = "timeline"
      DESCRIPTION = "draw the threads of a pprof recorded with --timeline, one lane each (SVG or HTML)"

      # @!attribute out [String, nil] the file's path, "-" for @out; nil: after the first FILE.
      #   Its extension (.svg or .html) says the format unless --format does.
      Options = files_options(:out, :format, :title, :max_output)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new
        parser = files_parser(
          options, "Usage: ddprof-recorder timeline FILE... [-o out.svg|out.html] [--format svg|html] [--label KEY=VALUE]...",
          "Draws the samples of a pprof recorded with --timeline (record --timeline, or",
          "Profiler.new(timeline: true)): one lane per thread (per process and thread for several",
          "processes' files), colored by what it was doing (running, waiting for GVL, blocked, gc),",
          "with the stack on hover and a time axis. The HTML page adds a table of each thread's",
          "shares of wall time. Several FILEs are merged. With --label, only those samples: when",
          "they ran, and the shares of their wall time (how one endpoint's time was spent)."
        ) do |o|
          output_option(o, options, "where to write it (default: the first FILE with .timeline.html; - for stdout)")
          o.on("--format FORMAT", %w[svg html], "svg or html (default: from -o's extension, else html)") do |v|
            options.format = v.to_sym
          end
          o.on("--title TEXT", "the title (default: the first FILE's name, and the --label KEY=VALUEs)") { |v| options.title = v }
        end
        parse_with_files(parser, argv, options)
      end

      # @return [Integer] the exit status.
      def run(options)
        format = options.format || (options.out&.end_with?(".svg") ? :svg : :html)
        out = options.out || view_name(options.paths.first, ".timeline.#{format}")
        title = options.title || with_labels(File.basename(options.paths.first), options.labels)
        text = view(:timeline, options, format: format, title: title)
        write_view(out, text) do
          lanes = text.scan('<g class="lane">').size
          "#{lanes} thread#{lanes == 1 ? '' : 's'}"
        end
        0
      end
    end
  end
end
