# frozen_string_literal: true

require_relative "command"

module DdprofRecorder
  class CLI
    # `ddprof-recorder flamegraph FILE...`: an SVG flamegraph (DdprofRecorder.flamegraph).
    class Flamegraph < Command
      NAME = "flamegraph"
      DESCRIPTION = "draw a pprof as an SVG flamegraph"

      # @!attribute out [String, nil] the SVG's path, "-" for @out; nil: after the first FILE.
      # @!attribute group_by [String, nil] the label whose value is the root frame.
      Options = files_options(:value, :out, :title, :group_by, :filenames, :max_output)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new
        parser = files_parser(
          options, "Usage: ddprof-recorder flamegraph FILE... [-o out.svg] [--value TYPE] " \
                   "[--by-thread|--by-process|--group-by LABEL] [--label KEY=VALUE]...",
          "Draws a pprof (raw or gzip) as an SVG flamegraph (open it in a browser: click to zoom,",
          "Ctrl-F to search). Several FILEs are merged."
        ) do |o|
          output_option(o, options, "where to write the SVG (default: the first FILE with .svg; - for stdout)")
          value_option(o, options)
          o.on("--title TEXT", "the title (default: \"<value> flamegraph\", and the --label KEY=VALUEs)") do |v|
            options.title = v
          end
          stack_options(o, options)
        end
        parse_with_files(parser, argv, options)
      end

      # @return [Integer] the exit status.
      def run(options)
        title = options.title || with_labels("#{options.value} flamegraph", options.labels)
        svg = view(:flamegraph, options, value: options.value, title: title, group_by: options.group_by,
                                         filenames: options.filenames)
        write_view(options.out || view_name(options.paths.first, ".svg"), svg) { with_labels(options.value, options.labels) }
        0
      end
    end
  end
end
