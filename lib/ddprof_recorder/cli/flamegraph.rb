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
      # @!attribute max_decompressed [Integer] the views' read limit, in bytes.
      # @!attribute max_input [Integer] how many bytes of each FILE may be read.
      Options = Struct.new(:paths, :value, :out, :title, :group_by, :filenames, :max_decompressed, :max_input,
                           keyword_init: true)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new(value: DEFAULT_VALUE, filenames: false)
        parser = files_parser(
          options, "Usage: ddprof-recorder flamegraph FILE... [-o out.svg] [--value TYPE] [--by-thread|--by-process]",
          "Draws a pprof (raw or gzip) as an SVG flamegraph (open it in a browser: click to zoom,",
          "Ctrl-F to search). Several FILEs are merged."
        ) do |o|
          o.on("-o", "--output FILE", "where to write the SVG (default: the first FILE with .svg; - for stdout)") do |v|
            options.out = v
          end
          value_option(o, options)
          o.on("--title TEXT", "the title (default: \"<value> flamegraph\")") { |v| options.title = v }
          stack_options(o, options)
        end
        parse_with_files(parser, argv, options)
      end

      # @return [Integer] the exit status.
      def run(options)
        svg = view(:flamegraph, options, value: options.value, title: options.title, group_by: options.group_by,
                                         filenames: options.filenames)
        write_view(options.out || view_name(options.paths.first, ".svg"), svg) { options.value }
        0
      end
    end
  end
end
