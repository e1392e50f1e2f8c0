# frozen_string_literal: true

require_relative "command"
require_relative "../recording"

module DdprofRecorder
  class CLI
    # `ddprof-recorder merge -o OUT FILE...`: one pprof of several (DdprofRecorder.merge).
    class Merge < Command
      NAME = "merge"
      DESCRIPTION = "merge pprof files into one"

      # @!attribute out [String] the pprof's path (gzip for a .gz name), or "-" for @out (raw).
      Options = files_options(:out)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new
        parser = files_parser(
          options, "Usage: ddprof-recorder merge -o OUT FILE... [--label KEY=VALUE]... [--max-decompressed BYTES] " \
                   "[--max-input BYTES]",
          "Merges pprof files (raw or gzip, with the same value types) into one, e.g. the",
          "profiles of a server's processes that `record` wrote. Samples with the same stack and",
          "labels are added up; the \"process id\" label keeps the processes apart. With --label,",
          "only those samples: e.g. one endpoint's pprof (of one FILE too), for go tool pprof."
        ) do |o|
          output_option(o, options, "where to write the pprof (gzip if OUT ends in .gz; - for stdout, raw)", "OUT")
        end
        parse_with_files(parser, argv, options) do
          raise usage_error("merge: give the output file with -o OUT") unless options.out
        end
      end

      # @return [Integer] the exit status.
      def run(options)
        out = options.out
        compression = out != "-" && out.end_with?(".gz") ? :gzip : :none
        merged = with_profiles(options.paths, options.max_input, options.max_decompressed) do |data|
          DdprofRecorder.merge(data, compression: compression, label: options.labels,
                                     max_decompressed_bytes: options.max_decompressed)
        end
        if out == "-"
          @out.binmode
          @out.write(merged)
        else
          write_output(out) { Recording.write(out, merged) }
          @out.puts("ddprof-recorder: merged #{options.paths.size} profiles into #{out}#{kept(options.labels, merged)} " \
                    "(#{merged.bytesize} bytes)")
        end
        0
      end

      private

      # What --label kept: `, keeping the 12 samples with trace endpoint=X` (distinct pprof
      # samples), or that none has it; "" without --label.
      def kept(labels, merged)
        return "" if labels.empty?

        samples = DdprofRecorder.summary(merged)[:samples]
        return ", keeping no sample: none has #{labels_text(labels)}" if samples.zero?

        ", keeping the #{samples} sample#{samples == 1 ? '' : 's'} with #{labels_text(labels)}"
      end
    end
  end
end
