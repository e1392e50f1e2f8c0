# frozen_string_literal: true

require_relative "command"
require_relative "top_table"

module DdprofRecorder
  class CLI
    # `ddprof-recorder top FILE...`: the hottest functions, printed as a TopTable.
    class Top < Command
      NAME = "top"
      DESCRIPTION = "the hottest functions of a pprof, self and total"
      DEFAULT_LIMIT = 20
      # The most rows -n may ask for, far more than anyone reads; a number past what Array#first
      # takes (2**63) was a RangeError, shown as a bug.
      MAX_LIMIT = 1_000_000

      # @!attribute paths [Array<String>] the FILEs (merged when several).
      # @!attribute value [String] the value type to rank by.
      # @!attribute limit [Integer] how many rows to print.
      # @!attribute sort [Symbol] :self or :total.
      Options = files_options(:value, :limit, :sort)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new(limit: DEFAULT_LIMIT, sort: :self)
        parser = files_parser(
          options, "Usage: ddprof-recorder top FILE... [--value TYPE] [-n N] [--sort self|total] " \
                   "[--max-decompressed BYTES] [--max-input BYTES]",
          "The hottest functions of a pprof (raw or gzip): self (as the leaf of a stack) and",
          "total (anywhere in it), with their share of the whole. Several FILEs are merged."
        ) do |o|
          value_option(o, options)
          o.on("-n", "--limit N", Integer, "how many functions (1..#{MAX_LIMIT}, default #{DEFAULT_LIMIT})") { |v| options.limit = v }
          o.on("--sort KEY", %i[self total], "order by self (default) or total") { |v| options.sort = v }
        end
        parse_with_files(parser, argv, options) do
          unless (1..MAX_LIMIT).cover?(options.limit)
            raise usage_error("top: -n must be in 1..#{MAX_LIMIT}, got #{options.limit}")
          end
        end
      end

      # @return [Integer] the exit status.
      def run(options)
        top = view(:top, options, value: options.value, sort: options.sort)
        rows = top[:rows]
        TopTable.new(files_title(options.paths), top, rows.first(options.limit), rows.size).print(@out)
        0
      end
    end
  end
end
