# frozen_string_literal: true

require "optparse"
require "shellwords"

require_relative "../ddprof_recorder"
require_relative "recording"

module DdprofRecorder
  # `ddprof-recorder`, the command line (exe/ddprof-recorder): record a Ruby program's
  # profile, then look at it as a table or a flamegraph. Every failure the user can cause
  # (a missing or non-pprof file, an unknown value type, a bad option) is one line on
  # $stderr and a non-zero exit status, never a Ruby backtrace.
  class CLI
    # Exit statuses: 1 for a failure, 2 for a usage error (as OptionParser users expect).
    FAILURE = 1
    USAGE = 2

    # A failure to report as one line.
    class Failure < StandardError
      attr_reader :status

      def initialize(message, status = FAILURE)
        super(message)
        @status = status
      end
    end

    COMMANDS = {
      "record" => "profile a Ruby program and write its pprof",
      "top" => "the hottest functions of a pprof, self and total",
      "flamegraph" => "draw a pprof as an SVG flamegraph",
      "speedscope" => "write a pprof as a speedscope file (speedscope.app, `speedscope FILE`)",
      "folded" => "print a pprof as folded stacks (root;...;leaf value)",
      "merge" => "merge pprof files into one",
    }.freeze

    DEFAULT_OUT = "profile.pb.gz"
    DEFAULT_VALUE = "cpu-time"
    DEFAULT_TOP = 20
    # The record summary lists this many processes, one per line; the rest are counted.
    MAX_PROCESS_LINES = 8

    # @param argv [Array<String>]
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
        send("cmd_#{command}", argv)
      else
        raise Failure.new("unknown command #{command.inspect} (commands: #{COMMANDS.keys.join(', ')})", USAGE)
      end
    rescue Failure => e
      error(e.message)
      e.status
    rescue OptionParser::ParseError => e
      error("#{command}: #{e.message} (see `ddprof-recorder #{command} --help`)")
      USAGE
    rescue ArgumentError, TypeError, DdprofRecorder::Error => e
      error(e.message)
      FAILURE
    rescue Errno::EPIPE
      0 # the reader went away (`| head`): nothing left to say
    rescue SystemCallError => e
      error(e.message)
      FAILURE
    rescue Interrupt
      130
    end

    private

    def usage
      <<~TEXT
        Usage: ddprof-recorder COMMAND [options]

        Profile Ruby programs and look at the result (pprof files, raw or gzip).

        Commands:
        #{COMMANDS.map { |name, text| format('  %-12s %s', name, text) }.join("\n")}

        Examples:
          ddprof-recorder record -o profile.pb.gz -- ruby examples/hot_spot.rb
          ddprof-recorder top profile.pb.gz --value cpu-time -n 10
          ddprof-recorder flamegraph profile.pb.gz -o profile.svg
          ddprof-recorder speedscope profile.pb.gz -o profile.speedscope.json
          ddprof-recorder merge -o all.pb.gz profile.pb.gz profile.pid*.pb.gz

        The views (top, flamegraph, speedscope, folded) take one FILE or several, which they merge.

        Run `ddprof-recorder COMMAND --help` for a command's options.
      TEXT
    end

    def error(message)
      @err.puts("ddprof-recorder: #{message}")
    end

    # Parses `argv` with `parser`; `--help` prints the parser's help and returns nil.
    def parse(parser, argv)
      help = false
      parser.on("-h", "--help", "show this help") { help = true }
      rest = parser.parse(argv)
      if help
        @out.puts(parser.help)
        return nil
      end
      rest
    end

    def value_option(parser, options)
      parser.on("--value TYPE", "sample type to use (default #{DEFAULT_VALUE}; e.g. wall-time, cpu-samples)") do |v|
        options[:value] = v
      end
    end

    # --by-thread, --by-process and --filenames, shared by `flamegraph` and `folded`.
    def stack_options(parser, options)
      parser.on("--by-thread", "the \"thread name\" label as the root frame (one tower per thread)") do
        group_by(options, Profiler::THREAD_NAME_LABEL, "--by-thread")
      end
      parser.on("--by-process", "the \"process id\" label as the root frame (one tower per process)") do
        group_by(options, Profiler::PROCESS_ID_LABEL, "--by-process")
      end
      parser.on("--filenames", "name frames \"function (file)\"") { options[:filenames] = true }
    end

    def group_by(options, label, flag)
      if options[:group_by] && options[:group_by] != label
        raise Failure.new("give --by-thread or --by-process, not both (#{flag})", USAGE)
      end

      options[:group_by] = label
    end

    # The FILE arguments of `top`, `flamegraph`, `folded` and `merge`, read (once each).
    #
    # @return [Array(Array<String>, Array<String>)] the paths and their contents.
    def read_profiles(rest, command)
      raise Failure.new("#{command}: give a pprof FILE (see `ddprof-recorder #{command} --help`)", USAGE) if rest.empty?

      data = rest.map do |path|
        raise Failure, "#{path}: no such file" unless File.exist?(path)
        raise Failure, "#{path}: is a directory, not a pprof file" if File.directory?(path)

        File.binread(path)
      end
      [rest, data]
    end

    # The argument for the views: the one pprof, or the Array of several (which they merge).
    def view_input(data)
      data.size == 1 ? data.first : data
    end

    # Runs the view or merge, naming the file its errors are about: with one file, the message
    # of a bad argument (not a pprof, unknown value) after the file's name; with several, each
    # `pprofs[i]` of a message (not a pprof, other value types) becomes the i-th file's name.
    def on_profiles(paths)
      yield
    rescue ArgumentError, DdprofRecorder::Error => e
      named = e.message.gsub(/pprofs\[(\d+)\]/) { paths.fetch(Regexp.last_match(1).to_i) }
      raise Failure, named unless named == e.message
      raise Failure, "#{paths.first}: #{e.message}" if paths.size == 1 && e.is_a?(ArgumentError)

      raise
    end

    # How a header names the files: the one, or "3 profiles (a, b, c)".
    def files_title(paths)
      return paths.first if paths.size == 1

      shown = paths.first(3).join(", ")
      "#{paths.size} profiles (#{shown}#{paths.size > 3 ? ', ...' : ''})"
    end

    # --- record -------------------------------------------------------------------------

    def cmd_record(argv)
      options = { out: DEFAULT_OUT, hz: Profiler::DEFAULT_HZ, interval: nil }
      parser = OptionParser.new do |o|
        o.banner = "Usage: ddprof-recorder record [-o FILE] [--hz N] [--interval S] -- COMMAND ..."
        o.separator ""
        o.separator "Runs COMMAND, a Ruby program (ruby, bundle exec, rake, ...), profiling its threads;"
        o.separator "writes the pprof (gzip if FILE ends in .gz) and prints a summary."
        o.separator "Exits with COMMAND's exit status."
        o.separator ""
        o.on("-o", "--output FILE", "where to write the pprof (default #{DEFAULT_OUT})") { |v| options[:out] = v }
        o.on("--hz N", Integer, "samples per second and thread (1..1000, default #{Profiler::DEFAULT_HZ})") { |v| options[:hz] = v }
        o.on("--interval S", Float, "also cut the profile every S seconds: one file per window,",
             "FILE with a number (profile.0001.pb.gz, ...)") { |v| options[:interval] = v }
        o.separator ""
        o.separator "Forked children (a server's workers) are profiled too, each into a file of its own:"
        o.separator "FILE with its pid (profile.pid4242.pb.gz; windows: profile.pid4242.0001.pb.gz)."
      end
      command = parse(parser, argv)
      return 0 if command.nil?
      raise Failure.new("record: no COMMAND given (usage: #{parser.banner.sub('Usage: ', '')})", USAGE) if command.empty?
      unless Profiler::HZ_RANGE.cover?(options[:hz])
        raise Failure.new("record: --hz must be in #{Profiler::HZ_RANGE}, got #{options[:hz]}", USAGE)
      end
      raise Failure.new("record: --interval must be positive", USAGE) if options[:interval] && !options[:interval].positive?

      record(command, options)
    end

    def record(command, options)
      out = File.expand_path(options[:out])
      raise Failure, "record: #{options[:out]}: directory does not exist" unless File.directory?(File.dirname(out))

      Recording.profile_files(out).each_value { |stale| stale.each { |f| File.delete(f) if File.file?(f) } }

      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      status = run_profiled(command, record_env(out, options))
      elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      files = Recording.profile_files(out)
      if files.empty?
        raise Failure, "record: no profile was written by `#{display_command(command)}` " \
                       "(is it a Ruby program? did it end through exit! or a signal?)"
      end

      print_record_summary(command, status, elapsed, files, options)
      exit_status(status)
    end

    def record_env(out, options)
      autostart = File.expand_path("autostart", __dir__)
      require_flag =
        if autostart.match?(/\s/)
          # RUBYOPT is split on spaces: load it by feature name through RUBYLIB instead.
          lib = File.expand_path("..", __dir__)
          env_lib = { "RUBYLIB" => [lib, ENV["RUBYLIB"]].compact.reject(&:empty?).join(File::PATH_SEPARATOR) }
          "-rddprof_recorder/autostart"
        else
          "-r#{autostart}"
        end
      (env_lib || {}).merge(
        "RUBYOPT" => [ENV["RUBYOPT"], require_flag].compact.reject(&:empty?).join(" "),
        Recording::OUT => out,
        Recording::HZ => options[:hz].to_s,
        Recording::INTERVAL => options[:interval]&.to_s,
        Recording::OWNER => nil,
      )
    end

    # Runs the command and waits, leaving Ctrl-C to it: the program gets the SIGINT (same
    # process group), writes its profile at exit, and we still print the summary.
    def run_profiled(command, env)
      previous = trap("INT") {}
      pid = begin
        Process.spawn(env, *command)
      rescue Errno::EPIPE
      0 # the reader went away (`| head`): nothing left to say
    rescue SystemCallError => e
        raise Failure.new("record: cannot run #{command.first}: #{e.message}", 127)
      end
      Process.wait2(pid).last
    ensure
      trap("INT", previous || "DEFAULT")
    end

    def exit_status(status)
      status.exitstatus || (128 + (status.termsig || 0))
    end

    # One screen about the recording. `files` are the profile files by process (see
    # Recording.profile_files), each read once here.
    def print_record_summary(command, status, elapsed, files, options)
      processes = files.map do |child_pid, paths|
        data = paths.map { |f| File.binread(f) }
        summaries = data.map { |d| DdprofRecorder.summary(d) }
        totals = Hash.new(0)
        summaries.each { |s| s[:totals].each { |k, v| totals[k] += v } }
        pid = child_pid || summaries.flat_map { |s| s[:process_ids] }.first
        { pid: pid, paths: paths, data: data, summaries: summaries, totals: totals,
          bytes: data.sum(&:bytesize) }
      end
      summaries = processes.flat_map { |p| p[:summaries] }
      totals = Hash.new(0)
      processes.each { |p| p[:totals].each { |k, v| totals[k] += v } }
      duration = summaries.map { |s| s[:finish] }.max - summaries.map { |s| s[:start] }.min
      threads = summaries.flat_map { |s| s[:thread_names] }.uniq
      thread_ids = summaries.flat_map { |s| s[:thread_ids] }.uniq
      samples = totals["cpu-samples"]
      all_data = processes.flat_map { |p| p[:data] }

      lines = []
      lines << "ddprof-recorder: recorded `#{display_command(command)}` (#{status_text(status)}, #{format('%.2f', elapsed)} s)"
      lines << row("duration", format("%.2f s profiled", duration))
      rate = thread_ids.empty? || duration <= 0 ? "" : format(", about %.0f per second per thread (asked %d)", samples / thread_ids.size / duration, options[:hz])
      lines << row("samples", "#{samples}#{rate}")
      lines << row("threads", "#{thread_ids.size}: #{threads.first(6).join(', ')}#{threads.size > 6 ? ', ...' : ''}")
      lines << row("cpu-time", format("%.2f s   wall-time %.2f s", totals["cpu-time"] / 1e9, totals["wall-time"] / 1e9))
      hottest = DdprofRecorder.top(view_input(all_data), value: "cpu-time", limit: 1)[:rows].first
      if hottest && totals["cpu-time"].positive?
        lines << row("hottest", format("%s (%s) %.1f%% of cpu-time", hottest[:name], display_path(hottest[:filename]), 100.0 * hottest[:self] / totals["cpu-time"]))
      end
      lines.concat(processes.size == 1 ? written_lines(processes.first, options) : process_lines(processes))
      lines.concat(view_lines(files.keys, processes.first[:paths].first, options))
      @out.puts(lines)
    end

    # The files of a recording without forked children.
    def written_lines(process, options)
      paths = process[:paths]
      shown = display_path(paths.first)
      if paths.size == 1
        [row("written", "#{shown} (#{process[:bytes]} bytes)")]
      else
        [row("written", "#{paths.size} windows of #{options[:interval]} s: #{shown} ... #{display_path(paths.last)}")]
      end
    end

    # One line per process: pid, samples, cpu-time and its files.
    def process_lines(processes)
      lines = [row("processes", "#{processes.size}: the command's and #{processes.size - 1} forked")]
      width = processes.map { |p| p[:pid].to_s.size }.max
      processes.first(MAX_PROCESS_LINES).each do |p|
        paths = p[:paths]
        written = paths.size == 1 ? display_path(paths.first) : "#{display_path(paths.first)} ... #{display_path(paths.last)}"
        lines << row("", format("%-*s  samples %-6d cpu-time %6.2f s  %s (%d bytes)", width, p[:pid] || "-",
                                p[:totals]["cpu-samples"], p[:totals]["cpu-time"] / 1e9, written, p[:bytes]))
      end
      rest = processes.drop(MAX_PROCESS_LINES)
      lines << row("", "... and #{rest.size} more (#{rest.sum { |p| p[:paths].size }} files)") unless rest.empty?
      lines << row("written", "#{processes.sum { |p| p[:paths].size }} files, " \
                              "#{processes.sum { |p| p[:bytes] }} bytes in all")
      lines
    end

    # How to look at the files: the one file, or, with forked children, shell patterns that
    # name the files of every process (the views merge them).
    def view_lines(pids, first, options)
      out = display_path(first)
      if pids == [nil]
        shown = out.shellescape
        svg = svg_name(out).shellescape
        by = ""
      else
        base = display_path(File.expand_path(options[:out]))
        shown = [profile_glob(base, options[:interval] ? "[0-9]*" : nil), profile_glob(base, "pid*")].join(" ")
        svg = svg_name(base).shellescape
        by = " --by-process"
      end
      [row("view it", "ddprof-recorder top #{shown}"),
       row("", "ddprof-recorder flamegraph#{by} #{shown} -o #{svg}"),
       row("", "go tool pprof -top #{shown}")]
    end

    # A shell word naming `out` with `middle` (a glob, unescaped) after its stem:
    # `profile.pb.gz` → `profile.pid*.pb.gz`.
    def profile_glob(out, middle)
      dir = File.dirname(out)
      stem, dot, ext = File.basename(out).partition(".")
      prefix = dir == "." ? stem : File.join(dir, stem)
      word = prefix.shellescape
      word += ".#{middle}" if middle
      word += (dot + ext).shellescape unless ext.empty? && dot.empty?
      word
    end

    # The command as one would type it: words with shell characters in single quotes.
    def display_command(command)
      command.map { |word| word.match?(%r{\A[\w@%+=:,./-]+\z}) ? word : "'#{word.gsub("'", "'\\\\''")}'" }.join(" ")
    end

    def row(label, text)
      format("  %-9s %s", label, text)
    end

    def status_text(status)
      status.exitstatus ? "exit status #{status.exitstatus}" : "killed by signal #{status.termsig}"
    end

    # A path relative to the current directory when it is inside it.
    def display_path(path)
      return path if path.nil? || path.empty?

      here = "#{Dir.pwd}/"
      path.start_with?(here) ? path.delete_prefix(here) : path
    end

    def svg_name(path)
      view_name(path, ".svg")
    end

    # `path` with `ext` for its .pb / .pb.gz / .gz: `hot.pb.gz` → `hot.svg`.
    def view_name(path, ext)
      base = path.sub(/\.pb(\.gz)?\z/, "").sub(/\.gz\z/, "")
      base = path if base.empty?
      "#{base}#{ext}"
    end

    # --- top ----------------------------------------------------------------------------

    def cmd_top(argv)
      options = { value: DEFAULT_VALUE, limit: DEFAULT_TOP, sort: :self }
      parser = OptionParser.new do |o|
        o.banner = "Usage: ddprof-recorder top FILE... [--value TYPE] [-n N] [--sort self|total]"
        o.separator ""
        o.separator "The hottest functions of a pprof (raw or gzip): self (as the leaf of a stack) and"
        o.separator "total (anywhere in it), with their share of the whole. Several FILEs are merged."
        o.separator ""
        value_option(o, options)
        o.on("-n", "--limit N", Integer, "how many functions (default #{DEFAULT_TOP})") { |v| options[:limit] = v }
        o.on("--sort KEY", %i[self total], "order by self (default) or total") { |v| options[:sort] = v }
      end
      rest = parse(parser, argv)
      return 0 if rest.nil?
      raise Failure.new("top: -n must be positive", USAGE) unless options[:limit].positive?

      paths, data = read_profiles(rest, "top")
      top = on_profiles(paths) { DdprofRecorder.top(view_input(data), value: options[:value]) }
      rows = top[:rows]
      rows = rows.sort_by { |r| [-r[:total], -r[:self], r[:name]] } if options[:sort] == :total
      print_top(files_title(paths), top, rows.first(options[:limit]), rows.size)
      0
    end

    def print_top(title, top, rows, count)
      total = top[:total]
      @out.puts("#{title}: #{top[:value]}, #{quantity(total, top[:unit])} in all, #{count} functions" \
                "#{rows.size < count ? " (top #{rows.size})" : ''}")
      return if rows.empty?

      cells = rows.map do |r|
        [quantity(r[:self], top[:unit]), percent(r[:self], total), quantity(r[:total], top[:unit]), percent(r[:total], total),
         r[:name].empty? ? "(#{r[:filename]})" : r[:name], display_path(r[:filename])]
      end
      header = ["self", "self%", "total", "total%", "function", "file"]
      widths = header.each_index.map { |i| ([header[i]] + cells.map { |c| c[i] }).map(&:length).max }
      line = lambda do |c|
        format("%*s  %*s  %*s  %*s  %-*s  %s", widths[0], c[0], widths[1], c[1], widths[2], c[2], widths[3], c[3],
               widths[4], c[4], c[5]).rstrip
      end
      @out.puts(line.call(header))
      cells.each { |c| @out.puts(line.call(c)) }
    end

    def percent(part, whole)
      whole.zero? ? "-" : format("%.1f%%", 100.0 * part / whole)
    end

    # `value` in `unit`, readable: nanoseconds become s / ms / µs.
    def quantity(value, unit)
      return value.to_s unless unit == "nanoseconds" && !value.zero?

      v = value.abs
      if v >= 1_000_000_000 then format("%.2fs", value / 1e9)
      elsif v >= 1_000_000 then format("%.1fms", value / 1e6)
      elsif v >= 1_000 then format("%.1fµs", value / 1e3)
      else "#{value}ns"
      end
    end

    # --- flamegraph ---------------------------------------------------------------------

    def cmd_flamegraph(argv)
      options = { value: DEFAULT_VALUE, out: nil, title: nil, group_by: nil, filenames: false }
      parser = OptionParser.new do |o|
        o.banner = "Usage: ddprof-recorder flamegraph FILE... [-o out.svg] [--value TYPE] [--by-thread|--by-process]"
        o.separator ""
        o.separator "Draws a pprof (raw or gzip) as an SVG flamegraph (open it in a browser: click to zoom,"
        o.separator "Ctrl-F to search). Several FILEs are merged."
        o.separator ""
        o.on("-o", "--output FILE", "where to write the SVG (default: the first FILE with .svg; - for stdout)") { |v| options[:out] = v }
        value_option(o, options)
        o.on("--title TEXT", "the title (default: \"<value> flamegraph\")") { |v| options[:title] = v }
        stack_options(o, options)
      end
      rest = parse(parser, argv)
      return 0 if rest.nil?

      paths, data = read_profiles(rest, "flamegraph")
      svg = on_profiles(paths) do
        DdprofRecorder.flamegraph(view_input(data), value: options[:value], title: options[:title],
                                                    group_by: options[:group_by], filenames: options[:filenames])
      end
      out = options[:out] || svg_name(paths.first)
      if out == "-"
        @out.write(svg)
      else
        File.write(out, svg)
        @out.puts("ddprof-recorder: wrote #{out} (#{options[:value]}, #{svg.bytesize} bytes)")
      end
      0
    end

    # --- speedscope ---------------------------------------------------------------------

    def cmd_speedscope(argv)
      options = { out: nil, values: [], group_by: nil }
      parser = OptionParser.new do |o|
        o.banner = "Usage: ddprof-recorder speedscope FILE... [-o out.speedscope.json] [--value TYPE]... [--by-thread|--by-process]"
        o.separator ""
        o.separator "Writes a pprof (raw or gzip) as a speedscope file: open it at https://www.speedscope.app"
        o.separator "or with `speedscope FILE` (npm install -g speedscope). One profile per value type"
        o.separator "(cpu-time first), or per value type and thread/process; speedscope's profile menu"
        o.separator "switches between them. Several FILEs are merged."
        o.separator ""
        o.on("-o", "--output FILE", "where to write the JSON (default: the first FILE with .speedscope.json; - for stdout)") do |v|
          options[:out] = v
        end
        o.on("--value TYPE", "only this sample type (again for more; default: all of them)") { |v| options[:values] << v }
        o.on("--by-thread", "one profile per value type and \"thread name\" label") do
          group_by(options, Profiler::THREAD_NAME_LABEL, "--by-thread")
        end
        o.on("--by-process", "one profile per value type and \"process id\" label") do
          group_by(options, Profiler::PROCESS_ID_LABEL, "--by-process")
        end
      end
      rest = parse(parser, argv)
      return 0 if rest.nil?

      paths, data = read_profiles(rest, "speedscope")
      json = on_profiles(paths) do
        DdprofRecorder.speedscope(view_input(data), value: options[:values].empty? ? nil : options[:values],
                                                    group_by: options[:group_by], name: File.basename(paths.first))
      end
      out = options[:out] || view_name(paths.first, ".speedscope.json")
      if out == "-"
        @out.write(json)
      else
        File.write(out, json)
        profiles = json.scan('"type":"sampled"').size
        @out.puts("ddprof-recorder: wrote #{out} (#{profiles} profile#{profiles == 1 ? '' : 's'}, #{json.bytesize} bytes)")
      end
      0
    end

    # --- folded -------------------------------------------------------------------------

    def cmd_folded(argv)
      options = { value: DEFAULT_VALUE, group_by: nil, filenames: false }
      parser = OptionParser.new do |o|
        o.banner = "Usage: ddprof-recorder folded FILE... [--value TYPE] [--by-thread|--by-process] [--filenames]"
        o.separator ""
        o.separator "Prints a pprof (raw or gzip) as folded stacks, one `root;...;leaf value` line per stack:"
        o.separator "the input of flamegraph.pl, inferno-flamegraph and speedscope. Several FILEs are merged."
        o.separator ""
        value_option(o, options)
        stack_options(o, options)
      end
      rest = parse(parser, argv)
      return 0 if rest.nil?

      paths, data = read_profiles(rest, "folded")
      @out.write(on_profiles(paths) do
        DdprofRecorder.folded(view_input(data), value: options[:value], group_by: options[:group_by],
                                                filenames: options[:filenames])
      end)
      0
    end

    # --- merge --------------------------------------------------------------------------

    def cmd_merge(argv)
      options = { out: nil }
      parser = OptionParser.new do |o|
        o.banner = "Usage: ddprof-recorder merge -o OUT FILE..."
        o.separator ""
        o.separator "Merges pprof files (raw or gzip, with the same value types) into one, e.g. the"
        o.separator "profiles of a server's processes that `record` wrote. Samples with the same stack and"
        o.separator "labels are added up; the \"process id\" label keeps the processes apart."
        o.separator ""
        o.on("-o", "--output OUT", "where to write the pprof (gzip if OUT ends in .gz; - for stdout, raw)") { |v| options[:out] = v }
      end
      rest = parse(parser, argv)
      return 0 if rest.nil?
      raise Failure.new("merge: give the output file with -o OUT", USAGE) unless options[:out]

      paths, data = read_profiles(rest, "merge")
      out = options[:out]
      compression = out != "-" && out.end_with?(".gz") ? :gzip : :none
      merged = on_profiles(paths) { DdprofRecorder.merge(data, compression: compression) }
      if out == "-"
        @out.binmode
        @out.write(merged)
      else
        Recording.write(out, merged)
        @out.puts("ddprof-recorder: merged #{paths.size} profiles into #{out} (#{merged.bytesize} bytes)")
      end
      0
    end
  end
end
