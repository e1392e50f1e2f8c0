# frozen_string_literal: true

require_relative "../ddprof_recorder"

module DdprofRecorder
  # `ddprof-recorder`, the command line (exe/ddprof-recorder): record a Ruby program's
  # profile, then look at it as a table or a flamegraph. One class per command under
  # lib/ddprof_recorder/cli/ (CLI::Command says how a command is parsed, then run); this
  # class picks the command and owns the one error path. Every failure the user can cause (a
  # missing or non-pprof file, an unknown value type, a bad option) is one line on $stderr and
  # a non-zero exit status, never a Ruby backtrace; any other exception is a bug in the CLI
  # and is printed with its backtrace.
  class CLI
    # Exit statuses: 1 for a failure, 2 for a usage error (as OptionParser users expect).
    FAILURE = 1
    USAGE = 2
  end
end

require_relative "cli/record"
require_relative "cli/top"
require_relative "cli/flamegraph"
require_relative "cli/speedscope"
require_relative "cli/timeline"
require_relative "cli/folded"
require_relative "cli/merge"

module DdprofRecorder
  class CLI
    # The commands by name, in the order the usage text lists them.
    COMMANDS = [Record, Top, Flamegraph, Speedscope, Timeline, Folded, Merge].to_h { |c| [c::NAME, c] }.freeze

    # @param argv [Array<String>]
    # @param out [IO] the commands' output.
    # @param err [IO] error messages (and a bug's backtrace).
    # @return [Integer] the exit status.
    def self.run(argv, out: $stdout, err: $stderr)
      new(out: out, err: err).run(argv)
    end

    def initialize(out: $stdout, err: $stderr)
      @out = out
      @err = err
    end

    # @return [Integer] the exit status.
    def run(argv)
      argv = argv.dup
      command = argv.shift
      # OptionParser and the path helpers match argv against regexps, which raise on bytes
      # that are not valid in the string's encoding (the locale's, for ARGV).
      bad = argv.find { |arg| !arg.valid_encoding? }
      raise Failure, "#{bad.inspect}: not valid #{bad.encoding} (the locale's encoding)" if bad
      case command
      when nil
        @err.puts(usage)
        USAGE
      when "-h", "--help", "help"
        @out.puts(usage)
        0
      when "-v", "--version"
        @out.puts("ddprof-recorder #{DdprofRecorder::VERSION}")
        0
      when *COMMANDS.keys
        COMMANDS.fetch(command).new(out: @out).call(argv)
      else
        raise Failure.new("unknown command #{command.inspect} (commands: #{COMMANDS.keys.join(', ')})", USAGE)
      end
    rescue Failure => e
      error(e.message)
      e.status
    rescue OptionParser::ParseError => e
      error("#{command}: #{e.message} (see `ddprof-recorder #{command} --help`)")
      USAGE
    rescue Errno::EPIPE
      0 # the reader went away (`| head`): nothing left to say
    rescue SystemCallError => e
      # The commands name the file of a failed read or write (Command#write_output); this
      # is any other one, still one line.
      error(e.message)
      FAILURE
    rescue Interrupt
      130
    rescue StandardError => e
      bug(e)
    end

    private

    def usage
      <<~TEXT
        Usage: ddprof-recorder COMMAND [options]

        Profile Ruby programs and look at the result (pprof files, raw or gzip).

        Commands:
        #{COMMANDS.map { |name, c| format('  %-12s %s', name, c::DESCRIPTION) }.join("\n")}

        Examples:
          ddprof-recorder record -o profile.pb.gz -- ruby examples/hot_spot.rb
          ddprof-recorder top profile.pb.gz --value cpu-time -n 10
          ddprof-recorder flamegraph profile.pb.gz -o profile.svg
          ddprof-recorder speedscope profile.pb.gz -o profile.speedscope.json
          ddprof-recorder record --timeline -o t.pb.gz -- ruby app.rb && ddprof-recorder timeline t.pb.gz
          ddprof-recorder merge -o all.pb.gz profile.pb.gz profile.pid*.pb.gz

        The views (top, flamegraph, speedscope, timeline, folded) take one FILE or several, which they merge.

        Run `ddprof-recorder COMMAND --help` for a command's options.
      TEXT
    end

    def error(message)
      @err.puts("ddprof-recorder: #{message}")
    end

    # An exception that no user input explains (NoMethodError, TypeError, an ArgumentError
    # outside the views' documented ones...): a bug, shown whole, as Ruby shows an uncaught
    # one, and with its exit status, 1.
    def bug(exception)
      error("this is a bug in ddprof-recorder #{DdprofRecorder::VERSION}; please report it with what follows:")
      @err.puts(exception.full_message(highlight: false, order: :top))
      FAILURE
    end
  end
end
