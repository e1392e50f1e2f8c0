# frozen_string_literal: true

require_relative "format"

module DdprofRecorder
  class CLI
    # `top`'s output: a header line, then one row per function with its self and total value
    # and their shares of the whole, in columns as wide as their widest cell. {ByLabel} is
    # `top --by LABEL`'s: one row per value of the label.
    class TopTable
      include Format

      HEADER = ["self", "self%", "total", "total%", "function", "file"].freeze

      # @param title [String] what the header calls the profile (Format.files_title, and the
      #   --label KEY=VALUEs).
      # @param top [Hash] DdprofRecorder.top's result (`:value`, `:unit`, `:total`,
      #   `:profile_total`).
      # @param rows [Array<Hash>] the rows to print, in order.
      # @param count [Integer] how many rows there are in all.
      # @param filtered [Boolean] --label kept some samples: the header says their share of the
      #   profile.
      def initialize(title, top, rows, count, filtered: false)
        @title = title
        @top = top
        @rows = rows
        @count = count
        @filtered = filtered
      end

      # @param io [IO]
      # @return [nil]
      def print(io)
        total = @top[:total]
        io.puts("#{@title}: #{@top[:value]}, #{in_all}, #{@count} functions#{shown}")
        return if @rows.empty?

        cells = @rows.map do |r|
          [quantity(r[:self], @top[:unit]), percent(r[:self], total), quantity(r[:total], @top[:unit]),
           percent(r[:total], total), r[:name].empty? ? "(#{r[:filename]})" : r[:name], display_path(r[:filename])]
        end
        widths = HEADER.each_index.map { |i| ([HEADER[i]] + cells.map { |c| c[i] }).map(&:length).max }
        io.puts(line(HEADER, widths))
        cells.each { |c| io.puts(line(c, widths)) }
        nil
      end

      private

      # `1.00s in all`; of the samples --label kept, `712.0ms in all (71.2% of the profile's
      # 1.00s)`.
      def in_all
        text = "#{quantity(@top[:total], @top[:unit])} in all"
        return text unless @filtered

        whole = @top[:profile_total]
        "#{text} (#{percent(@top[:total], whole)} of the profile's #{quantity(whole, @top[:unit])})"
      end

      # ` (top 20)` when the rows are fewer than there are.
      def shown
        @rows.size < @count ? " (top #{@rows.size})" : ""
      end

      def line(cells, widths)
        format("%*s  %*s  %*s  %*s  %-*s  %s", widths[0], cells[0], widths[1], cells[1], widths[2], cells[2],
               widths[3], cells[3], widths[4], cells[4], cells[5]).rstrip
      end

      # `top --by LABEL`: one row per value of the label (DdprofRecorder.top's `by:` rows), its
      # total and share, and a row for the samples without it, `(no LABEL)`.
      class ByLabel < TopTable
        # @param (see TopTable#initialize) `count`: how many rows there are in all, the one
        #   without the label too.
        def print(io)
          key = @top[:by]
          values = @count - (@top[:rows].any? { |r| r[:label].nil? } ? 1 : 0)
          io.puts("#{@title}: #{@top[:value]} by #{key}, #{in_all}, #{values} value#{values == 1 ? '' : 's'}#{shown}")
          return if @rows.empty?

          header = ["total", "total%", key]
          cells = @rows.map do |r|
            [quantity(r[:total], @top[:unit]), percent(r[:total], @top[:total]), r[:label].nil? ? "(no #{key})" : r[:label].to_s]
          end
          widths = (0..1).map { |i| ([header[i]] + cells.map { |c| c[i] }).map(&:length).max }
          [header, *cells].each { |c| io.puts(format("%*s  %*s  %s", widths[0], c[0], widths[1], c[1], c[2]).rstrip) }
          nil
        end
      end
    end
  end
end
