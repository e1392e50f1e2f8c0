# frozen_string_literal: true

require "optparse"

require_relative "format"
require_relative "../recording"

module DdprofRecorder
  class CLI
    # A failure the user caused, to report as one line: a missing or non-pprof file, an unknown
    # value type, a bad option value. Anything else that a command raises is a bug (CLI#run).
    class Failure < StandardError
      attr_reader :status

      def initialize(message, status = FAILURE)
        super(message)
        @status = status
      end
    end

    # What every command shares. A command is two steps, as rbspy's `Args::from_args` and
    # `SubCmd`: {#parse} turns argv into the command's typed `Options` (a Struct) and checks
    # what argv alone can tell (usage errors, status 2); {#run} does the work with them. The
    # subclasses say NAME and DESCRIPTION (for the tool's usage text) and the two steps.
    class Command
      include Format

      DEFAULT_VALUE = "cpu-time"
      # The default --max-input: the most bytes read of each FILE, gzip or raw, before the
      # views' limits apply. A pprof's gzip is smaller than the pprof, so this is as large as
      # the default --max-decompressed; it bounds what a FILE costs to read (it is read into
      # memory, then copied once for the native reader) whatever it is: a 2 GB file is refused
      # from its size, /dev/zero or a pipe after this many bytes.
      DEFAULT_MAX_INPUT = 1 << 30
      # How much of a FILE that is not a regular file (a pipe, a device) one read takes.
      READ_CHUNK = 1 << 20

      # The typed options of a command that takes FILE... (a view or `merge`): a keyword Struct
      # of `paths` (the FILEs), the command's own `fields`, then `labels` (--label, a Hash of
      # key => value: #label_option), `max_decompressed` and `max_input`, the read limits
      # (#read_limit_options). A view that writes what it draws names `:max_output` among its
      # fields (--max-output).
      def self.files_options(*fields)
        Struct.new(:paths, *fields, :labels, :max_decompressed, :max_input, keyword_init: true)
      end

      # @param out [IO] where the command's output goes (a StringIO in the specs). A command
      # writes no error line: it raises, and CLI#run reports.
      def initialize(out: $stdout)
        @out = out
      end

      # Parses `argv`, then runs the command.
      #
      # @param argv [Array<String>] the arguments after the command's name.
      # @return [Integer] the exit status.
      # @raise [Failure, OptionParser::ParseError] on a user error.
      def call(argv)
        options = parse(argv)
        options.nil? ? 0 : run(options)
      end

      private

      def name
        self.class::NAME
      end

      # Parses `argv` with `parser`; `--help` prints the parser's help and returns nil.
      #
      # @return [Array<String>, nil] the arguments that are not options.
      def parse_options(parser, argv)
        help = false
        parser.on("-h", "--help", "show this help") { help = true }
        rest = parser.parse(argv)
        if help
          @out.puts(parser.help)
          return nil
        end
        rest
      end

      def usage_error(message)
        Failure.new(message, USAGE)
      end

      # --value TYPE (`options.value`, which this sets to its default).
      def value_option(parser, options)
        options.value = DEFAULT_VALUE
        parser.on("--value TYPE", "sample type to use (default #{DEFAULT_VALUE}; e.g. wall-time, cpu-samples)") do |v|
          options.value = v
        end
      end

      # -o/--output `argument` (`options.out`).
      def output_option(parser, options, help, argument = "FILE")
        parser.on("-o", "--output #{argument}", help) { |v| options.out = v }
      end

      # --max-decompressed BYTES and --max-input BYTES (`options.max_decompressed` and
      # `options.max_input`, which this sets to their defaults): how much each pprof may be
      # once decompressed, the views' read limit (see
      # DdprofRecorder::DEFAULT_MAX_DECOMPRESSED_BYTES), and how much of each FILE is read, as
      # it is on disk ({DEFAULT_MAX_INPUT}).
      def read_limit_options(parser, options)
        options.max_decompressed = DdprofRecorder::DEFAULT_MAX_DECOMPRESSED_BYTES
        options.max_input = DEFAULT_MAX_INPUT
        parser.on("--max-decompressed BYTES", Integer, "read pprofs of at most BYTES once decompressed " \
                                                       "(default #{options.max_decompressed}, 1 GiB)") do |v|
          options.max_decompressed = byte_limit("--max-decompressed", v)
        end
        parser.on("--max-input BYTES", Integer, "read at most BYTES of each FILE, as stored (default " \
                                                "#{options.max_input}, 1 GiB; pipes and devices too)") do |v|
          options.max_input = byte_limit("--max-input", v)
        end
        return unless options.respond_to?(:max_output)

        parser.on("--max-output BYTES", Integer, "write at most BYTES (default #{DdprofRecorder::DEFAULT_OUTPUT_PER_BYTE} x the " \
                                                 "pprofs' decompressed bytes, at least #{DdprofRecorder::MIN_DEFAULT_OUTPUT_BYTES >> 20} MiB)") do |v|
          options.max_output = byte_limit("--max-output", v)
        end
      end

      def byte_limit(flag, value)
        unless value.positive? && value < 2**64
          raise usage_error("#{name}: #{flag} must be positive and below 2**64, got #{value}")
        end

        value
      end

      # --by-thread, --by-process and --group-by LABEL (`options.group_by`), with the help text
      # of each; `group_by` says what --group-by does with the label.
      def group_options(parser, options, by_thread, by_process, group_by)
        parser.on("--by-thread", by_thread) { group_by(options, Profiler::THREAD_NAME_LABEL, "--by-thread") }
        parser.on("--by-process", by_process) { group_by(options, Profiler::PROCESS_ID_LABEL, "--by-process") }
        parser.on("--group-by LABEL", group_by) do |key|
          raise usage_error("#{name}: --group-by needs a label key, got an empty one") if key.empty?

          group_by(options, key, "--group-by")
        end
      end

      # --by-thread, --by-process, --group-by and --filenames (`options.filenames`, false unless
      # given), shared by `flamegraph` and `folded`.
      def stack_options(parser, options)
        options.filenames = false
        group_options(parser, options, "the \"thread name\" label as the root frame (one tower per thread)",
                      "the \"process id\" label as the root frame (one tower per process)",
                      "label LABEL (e.g. \"trace endpoint\") as the root frame, one tower per value")
        parser.on("--filenames", "name frames \"function (file)\"") { options.filenames = true }
      end

      def group_by(options, label, flag)
        if options.group_by && options.group_by != label
          raise usage_error("give one of --by-thread, --by-process and --group-by (#{flag})")
        end

        options.group_by = label
      end

      # --label KEY=VALUE, again for more (`options.labels`, {} unless given): the samples the
      # view keeps, those with every label given (the views' `label:`, compared as text).
      # KEY is what comes before the first `=` (an endpoint may hold one, a label key does
      # not); both must be there, and a KEY once.
      def label_option(parser, options)
        options.labels = {}
        parser.on("--label KEY=VALUE", "only the samples whose label KEY is VALUE (e.g. \"trace endpoint=Users#show\",",
                  "\"process id=4242\"); again for more, all of them must match") do |arg|
          key, equals, value = arg.partition("=")
          raise usage_error("#{name}: --label takes KEY=VALUE, got #{arg.inspect}") if equals.empty?
          raise usage_error("#{name}: --label #{arg.inspect}: the KEY before = is empty") if key.empty?
          raise usage_error("#{name}: --label #{arg.inspect}: the VALUE after = is empty") if value.empty?
          if options.labels.key?(key)
            raise usage_error("#{name}: --label #{key.inspect} is given twice: a sample has one value per key, " \
                              "and every --label must match")
          end

          options.labels[key] = value
        end
      end

      # How a header names the samples that --label kept: `key=value and key=value`; nil
      # without --label.
      def labels_text(labels)
        labels.map { |k, v| "#{k}=#{v}" }.join(" and ") unless labels.empty?
      end

      # `text` with what --label kept after it, in parentheses: `hot.pb.gz (trace endpoint=X)`.
      def with_labels(text, labels)
        kept = labels_text(labels)
        kept ? "#{text} (#{kept})" : text
      end

      # The OptionParser of a command that takes FILE... (a view or `merge`): its help is the
      # `banner`, the `about` lines between two blank lines, the options the block adds to the
      # parser it yields, then --label (#label_option), --max-decompressed, --max-input and, for
      # a view that writes, --max-output (#read_limit_options).
      def files_parser(options, banner, *about)
        OptionParser.new do |o|
          o.banner = banner
          o.separator ""
          about.each { |line| o.separator(line) }
          o.separator ""
          yield o
          label_option(o, options)
          read_limit_options(o, options)
        end
      end

      # Parses `argv` for a command that takes FILE... (a view or `merge`): the block checks the
      # options first (usage errors), then at least one FILE must be there.
      #
      # @return [Struct, nil] `options` with its `paths`, or nil after --help.
      def parse_with_files(parser, argv, options)
        rest = parse_options(parser, argv)
        return nil if rest.nil?

        yield if block_given?
        raise usage_error("#{name}: give a pprof FILE (see `ddprof-recorder #{name} --help`)") if rest.empty?

        options.paths = rest
        options
      end

      # Reads the files, each once and each within `max_input` bytes, and a raw one within
      # `max_decompressed` (#read_input), and yields their contents to a view or merge (see
      # #on_profiles for its errors).
      #
      # @return the block's value.
      def with_profiles(paths, max_input, max_decompressed)
        data = paths.map do |path|
          raise Failure, "#{path}: no such file" unless File.exist?(path)
          raise Failure, "#{path}: is a directory, not a pprof file" if File.directory?(path)

          begin
            read_input(path, max_input, max_decompressed)
          rescue SystemCallError => e
            raise Failure, "#{path}: cannot read it: #{Recording.reason(e)}"
          end
        end
        on_profiles(paths) { yield data }
      end

      # The bytes of `path`, if there are at most `limit`, and at most `max_decompressed` when
      # they are not gzip (a raw pprof is as long as its protobuf, which the views refuse past
      # `max_decompressed`: a 300 MB raw file with --max-decompressed 1000000 was read whole,
      # then copied, 604 MB of RSS, to be refused). A regular file larger than that is refused
      # from its size, before anything but its first two bytes is read; anything else (a
      # pipe, /dev/zero) is read up to the limit + 1 bytes, which tell that there are more.
      #
      # @raise [Failure] over the limit.
      def read_input(path, limit, max_decompressed)
        File.open(path, "rb") do |file|
          stat = file.stat
          raise input_too_large(path, limit) if stat.file? && stat.size > limit

          magic = file.read(2) || String.new(encoding: Encoding::BINARY)
          raw = !magic.start_with?(GZIP_MAGIC)
          most = raw ? [limit, max_decompressed].min : limit
          too_large = -> { raw && most < limit ? decompressed_too_large(path, most) : input_too_large(path, limit) }
          raise too_large.call if stat.file? && stat.size > most

          # A regular file's size is the capacity needed (unless it grows meanwhile), once it is
          # known to be within the limit (a 512 MiB capacity for a file then refused took more
          # than 1 GiB of address space on 3.3.8: NoMemoryError).
          data = String.new(capacity: stat.file? ? stat.size + 1 : READ_CHUNK, encoding: Encoding::BINARY)
          data << magic
          chunk = String.new(encoding: Encoding::BINARY)
          data << chunk while data.bytesize <= most && file.read([READ_CHUNK, most + 1 - data.bytesize].min, chunk)
          raise too_large.call if data.bytesize > most

          data
        end
      end

      # The first bytes of a gzip stream.
      GZIP_MAGIC = "\x1f\x8b".b.freeze

      def input_too_large(path, limit)
        Failure.new("#{path}: the file is more than #{limit} bytes (--max-input: #{limit}); raise --max-input to read it")
      end

      # What the views say of a raw pprof over the limit (ViewError::TooLarge).
      def decompressed_too_large(path, limit)
        Failure.new("#{path}: the pprof is more than #{limit} bytes (--max-decompressed: #{limit}); " \
                    "raise --max-decompressed to read it")
      end

      # What a view wrote: its text to `out`, or to @out when `out` is "-". For a file, a line
      # says so, with what the block returns about the text (its value type, its profiles).
      def write_view(out, text)
        if out == "-"
          @out.write(text)
        else
          write_output(out) { Recording.write(out, text) }
          @out.puts("ddprof-recorder: wrote #{out} (#{yield}, #{text.bytesize} bytes)")
        end
      end

      # The one check of an output file, before a command writes there (`record` before it
      # runs the program): one line naming the file. The file is written through a rename
      # (Recording.write), which replaces only a regular file: an existing directory, symlink,
      # device or FIFO is refused (`-o /dev/null` would replace the device).
      #
      # @raise [Failure] if the directory does not exist, or the file exists and is not a
      #   regular file.
      def check_output(path)
        raise Failure, "#{name}: #{path}: directory does not exist" unless File.directory?(File.dirname(File.expand_path(path)))

        kind = Recording.not_regular(path)
        raise Failure, "#{name}: #{path}: cannot write it: Is a directory" if kind == "a directory"
        raise Failure, "#{name}: #{path}: is #{kind}, not a regular file: not replacing it" if kind
      end

      # Runs the block that writes `path` (an `-o` file), after #check_output. The errors of
      # the write (no permission, a path that became a symlink meanwhile) are one line naming
      # the file as given, without Ruby's `@ rb_sysopen` and the name of a temporary file.
      #
      # @raise [Failure]
      def write_output(path)
        check_output(path)
        yield
      rescue SystemCallError => e
        raise Failure, "#{name}: #{path}: cannot write it: #{Recording.reason(e)}"
      rescue Recording::OutputError => e
        raise Failure, "#{name}: #{e.message}"
      end

      # Runs the view `method` of DdprofRecorder (:top, :folded...) on the FILEs: the one pprof,
      # or the Array of several (which it merges), on the samples of the --label options,
      # within the --max-input and --max-decompressed read limits.
      #
      # @return the view's result.
      def view(method, options, **keywords)
        keywords[:max_output_bytes] = options.max_output if options.respond_to?(:max_output)
        with_profiles(options.paths, options.max_input, options.max_decompressed) do |data|
          DdprofRecorder.public_send(method, data.size == 1 ? data.first : data, **keywords,
                                     label: options.labels, max_decompressed_bytes: options.max_decompressed)
        end
      end

      # Runs the view or merge on the user's files. The errors that the views document for bad
      # input (ArgumentError: not a pprof, no such value type; DdprofRecorder::Error: nothing to
      # draw, other value types, over the read limit) become a Failure that names the file:
      # with one file, the message of an ArgumentError or of a read-limit error after the file's
      # name; with several, each `pprofs[i]` of a message becomes the i-th file's name. The
      # read-limit errors name the views' keyword: here it is --max-decompressed. Other errors
      # (a TypeError...) are bugs: they pass.
      def on_profiles(paths)
        yield
      rescue ArgumentError, DdprofRecorder::Error => e
        read_limit = e.message.match?(/max_decompressed_bytes|max_output_bytes/)
        message = e.message.gsub("max_decompressed_bytes", "--max-decompressed").gsub("max_output_bytes", "--max-output")
        named = message.gsub(/pprofs\[(\d+)\]/) { paths.fetch(Regexp.last_match(1).to_i) }
        raise Failure, named unless named == message
        raise Failure, "#{paths.first}: #{message}" if paths.size == 1 && (e.is_a?(ArgumentError) || read_limit)

        raise Failure, message
      end
    end
  end
end
