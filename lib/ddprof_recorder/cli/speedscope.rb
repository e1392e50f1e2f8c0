# frozen_string_literal: true

require_relative "command"

module DdprofRecorder
  class CLI
    # `ddprof-recorder speedscope FILE...`: a speedscope JSON file (DdprofRecorder.speedscope).
    class Speedscope < Command
      NAME = "speedscope"
      DESCRIPTION = "write a pprof as a speedscope file (speedscope.app, `speedscope FILE`)"

      # @!attribute values [Array<String>] the value types to write; empty: all of them.
      # @!attribute out [String, nil] the JSON's path, "-" for @out; nil: after the first FILE.
      # @!attribute timeline [Boolean] one time-ordered profile per thread (--timeline).
      Options = files_options(:values, :out, :group_by, :timeline, :max_output)

      # @return [Options, nil] nil after --help.
      def parse(argv)
        options = Options.new(values: [], timeline: false)
        parser = files_parser(
          options, "Usage: ddprof-recorder speedscope FILE... [-o out.speedscope.json] [--value TYPE]... " \
                   "[--by-thread|--by-process|--group-by LABEL|--timeline] [--label KEY=VALUE]...",
          "Writes a pprof (raw or gzip) as a speedscope file: open it at https://www.speedscope.app",
          "or with `speedscope FILE` (npm install -g speedscope). One profile per value type",
          "(cpu-time first), or per value type and thread/process; speedscope's profile menu",
          "switches between them. Several FILEs are merged."
        ) do |o|
          output_option(o, options, "where to write the JSON (default: the first FILE with .speedscope.json; - for stdout)")
          o.on("--value TYPE", "only this sample type (again for more; default: all of them)") { |v| options.values << v }
          group_options(o, options, "one profile per value type and \"thread name\" label",
                        "one profile per value type and \"process id\" label",
                        "one profile per value type and value of label LABEL (e.g. \"trace endpoint\")")
          o.on("--timeline", "of a pprof recorded with --timeline: one wall-time profile per thread, its samples",
               "in time order under a root frame naming the thread's state ([running], [waiting for",
               "GVL], [blocked], [gc]): speedscope's Time Order view shows what each did when") do
            options.timeline = true
          end
        end
        parse_with_files(parser, argv, options) do
          if options.timeline && (!options.values.empty? || options.group_by)
            raise usage_error("speedscope: --timeline takes no --value, --by-thread, --by-process or --group-by")
          end
        end
      end

      # @return [Integer] the exit status.
      def run(options)
        keywords = if options.timeline
                     { timeline: true }
                   else
                     { value: options.values.empty? ? nil : options.values, group_by: options.group_by }
                   end
        json = view(:speedscope, options, **keywords, name: with_labels(File.basename(options.paths.first), options.labels))
        write_view(options.out || view_name(options.paths.first, ".speedscope.json"), json) do
          profiles = json.scan('"type":"sampled"').size
          "#{profiles} profile#{profiles == 1 ? '' : 's'}"
        end
        0
      end
    end
  end
end
