# frozen_string_literal: true

require_relative "command"
require_relative "top_table"

module DdprofRecorder
  class CLI
    # `ddprof-recorder top FILE...`: the hottest functions, printed as a TopTable; with
    # --by LABEL, the values of a label holding the most (TopTable::ByLabel).
    class Top < Command
      NAME = "top"
      DESCRIPTION = "the hottest functions of a pprof, self and total, or its hottest label values (--by)"
      DEFAULT_LIMIT = 20
      # The most rows -n may ask for, far more than anyone reads; a number past what Array#first
      # takes (2**63) was a RangeError, shown as a bug.
      MAX_LIMIT = 1_000_000

      # @!attribute paths [Array<String>] the FILEs (merged when several).
      # @!attribute value [String] the value type to rank by.
      # @!attribute limit [Integer] how many rows to print.
      # @!attribute sort [Symbol, nil] :self or :total (nil: not given, :self).
      # @!attribute by [String, nil] the label whose values are the rows (--by).
      # @!attribute labels [Hash{String => String}] the --label KEY=VALUEs.
      Options = files_options(:value, :limit, :sort, :by)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new(limit: DEFAULT_LIMIT)
        parser = files_parser(
          options, "Usage: ddprof-recorder top FILE... [--value TYPE] [-n N] [--sort self|total] [--by LABEL] " \
                   "[--label KEY=VALUE]... [--max-decompressed BYTES] [--max-input BYTES]",
          "The hottest functions of a pprof (raw or gzip): self (as the leaf of a stack) and",
          "total (anywhere in it), with their share of the whole. With --by LABEL, the values of",
          "that label instead (--by \"trace endpoint\": which endpoint burns the CPU), and a row for",
          "the samples without it. Several FILEs are merged."
        ) do |o|
          value_option(o, options)
          o.on("-n", "--limit N", Integer, "how many rows (1..#{MAX_LIMIT}, default #{DEFAULT_LIMIT})") { |v| options.limit = v }
          o.on("--sort KEY", %i[self total], "order functions by self (default) or total") { |v| options.sort = v }
          o.on("--by LABEL", "one row per value of label LABEL (a string or numeric label), by its value") do |v|
            raise usage_error("top: --by needs a label key, got an empty one") if v.empty?

            options.by = v
          end
        end
        parse_with_files(parser, argv, options) do
          unless (1..MAX_LIMIT).cover?(options.limit)
            raise usage_error("top: -n must be in 1..#{MAX_LIMIT}, got #{options.limit}")
          end
          if options.by && options.sort
            raise usage_error("top: --sort orders functions; --by's rows are ordered by their value (give one)")
          end
        end
      end

      # @return [Integer] the exit status.
      def run(options)
        title = with_labels(files_title(options.paths), options.labels)
        filtered = !options.labels.empty?
        if options.by
          top = view(:top, options, value: options.value, by: options.by)
          table = TopTable::ByLabel
        else
          top = view(:top, options, value: options.value, sort: options.sort || :self)
          table = TopTable
        end
        rows = top[:rows]
        table.new(title, top, rows.first(options.limit), rows.size, filtered: filtered).print(@out)
        @out.puts(no_match_note(options)) if filtered && top[:samples].zero?
        0
      end

      private

      # Why the table is empty when --label matched no sample, and how to see the values
      # there are: `top --by` the first --label's key.
      def no_match_note(options)
        key = options.labels.keys.first
        command = ["ddprof-recorder", "top", "--by", key, *options.paths]
        "no sample has #{labels_text(options.labels)}; `#{display_command(command)}` lists the values of #{key}"
      end
    end
  end
end
