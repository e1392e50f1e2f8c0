# frozen_string_literal: true

require "shellwords"

module DdprofRecorder
  class CLI
    # How the commands write numbers, paths and commands for people: the one place for the
    # text that `top`'s table, `record`'s summary and the commands' messages share. Included
    # by CLI::Command (as private methods); each is also callable as `Format.name(...)`.
    module Format
      module_function

      # A label and its text, one line of the record summary.
      def row(label, text)
        format("  %-9s %s", label, text)
      end

      # `part` as a percentage of `whole`, one decimal: "12.5%"; "-" when `whole` is 0.
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

      # A path relative to the current directory when it is inside it.
      def display_path(path)
        return path if path.nil? || path.empty?

        here = "#{Dir.pwd}/"
        path.start_with?(here) ? path.delete_prefix(here) : path
      end

      # The command as one would type it: words with shell characters in single quotes.
      def display_command(command)
        command.map { |word| word.match?(%r{\A[\w@%+=:,./-]+\z}) ? word : "'#{word.gsub("'", "'\\\\''")}'" }.join(" ")
      end

      # Some of `paths`, shown (#display_path) and joined: "a.pb, b.pb, c.pb, ..." past `max`.
      def name_list(paths, max = 3)
        "#{paths.first(max).map { |path| display_path(path) }.join(', ')}#{paths.size > max ? ', ...' : ''}"
      end

      # How a header names the files: the one, or "3 profiles (a, b, c)".
      def files_title(paths)
        return paths.first if paths.size == 1

        shown = paths.first(3).join(", ")
        "#{paths.size} profiles (#{shown}#{paths.size > 3 ? ', ...' : ''})"
      end

      # `path` with `ext` for its .pb / .pb.gz / .gz: `hot.pb.gz` → `hot.svg`.
      def view_name(path, ext)
        base = path.sub(/\.pb(\.gz)?\z/, "").sub(/\.gz\z/, "")
        base = path if base.empty?
        "#{base}#{ext}"
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

      # How a child process ended: "exit status 3" or "killed by signal 15".
      def status_text(status)
        status.exitstatus ? "exit status #{status.exitstatus}" : "killed by signal #{status.termsig}"
      end
    end
  end
end
