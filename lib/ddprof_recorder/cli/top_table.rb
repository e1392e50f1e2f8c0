# frozen_string_literal: true

require_relative "format"

module DdprofRecorder
  class CLI
    # `top`'s output: a header line, then one row per function with its self and total value
    # and their shares of the whole, in columns as wide as their widest cell.
    class TopTable
      include Format

      HEADER = ["self", "self%", "total", "total%", "function", "file"].freeze

      # @param title [String] what the header calls the profile (Format.files_title).
      # @param top [Hash] DdprofRecorder.top's result (`:value`, `:unit`, `:total`).
      # @param rows [Array<Hash>] the rows to print, in order.
      # @param count [Integer] how many functions there are in all.
      def initialize(title, top, rows, count)
        @title = title
        @top = top
        @rows = rows
        @count = count
      end

      # @param io [IO]
      # @return [nil]
      def print(io)
        total = @top[:total]
        io.puts("#{@title}: #{@top[:value]}, #{quantity(total, @top[:unit])} in all, #{@count} functions" \
                "#{@rows.size < @count ? " (top #{@rows.size})" : ''}")
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

      def line(cells, widths)
        format("%*s  %*s  %*s  %*s  %-*s  %s", widths[0], cells[0], widths[1], cells[1], widths[2], cells[2],
               widths[3], cells[3], widths[4], cells[4], cells[5]).rstrip
      end
    end
  end
end
