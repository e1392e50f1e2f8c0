# frozen_string_literal: true

require_relative "command"

module DdprofRecorder
  class CLI
    # `ddprof-recorder folded FILE...`: folded stacks on @out (DdprofRecorder.folded).
    class Folded < Command
      NAME = "folded"
      DESCRIPTION = "print a pprof as folded stacks (root;...;leaf value)"

      Options = files_options(:value, :group_by, :filenames, :max_output)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new
        parser = files_parser(
          options, "Usage: ddprof-recorder folded FILE... [--value TYPE] [--by-thread|--by-process|--group-by LABEL] " \
                   "[--filenames] [--label KEY=VALUE]...",
          "Prints a pprof (raw or gzip) as folded stacks, one `root;...;leaf value` line per stack:",
          "the input of flamegraph.pl, inferno-flamegraph and speedscope. Several FILEs are merged."
        ) do |o|
          value_option(o, options)
          stack_options(o, options)
        end
        parse_with_files(parser, argv, options)
      end

      # @return [Integer] the exit status.
      def run(options)
        @out.write(view(:folded, options, value: options.value, group_by: options.group_by, filenames: options.filenames))
        0
      end
    end
  end
end
