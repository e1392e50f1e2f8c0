# frozen_string_literal: true

# Accuracy workload `kramdown` (bench/accuracy.rb): Debian's ruby-kramdown (a pure-Ruby
# Markdown converter nobody here wrote: apt-get install ruby-kramdown) turning a README-like
# document into HTML again and again. No truth measured.
#
#   ruby bench/accuracy/kramdown.rb [SECONDS]    (default 3)
#
# The document (`document`, 27 kB) is made here from a seeded Random, so every run
# converts the same text: sections with headers, paragraphs with emphasis, code spans,
# links and HTML entities, nested lists, fenced code, block quotes, tables, footnotes and a
# definition list. Each `Kramdown::Document.new(text).to_html` parses (kramdown's parser is
# Ruby around StringScanner and Regexp calls, C methods of a microsecond or so) and converts
# the tree; conversions go on until SECONDS have passed. Syntax highlighting is off (its
# default, rouge, is not installed and would be a dependency of its own).
require "kramdown"

module KramdownWorkload
  WORDS = %w[profiler sample thread stack frame allocation heap interval signal clock window
             server worker request latency buffer encoder table flamegraph pprof export upload
             the a of to and in is for with that on by it from as at this be are].freeze
  OPTIONS = { syntax_highlighter: nil, auto_ids: true }.freeze

  module_function

  def words(random, count)
    Array.new(count) { WORDS[random.rand(WORDS.size)] }.join(" ")
  end

  # A paragraph with the inline elements a README has; adds the footnotes it cites to `notes`
  # (the document's, so that their names are unique).
  def paragraph(random, section, notes)
    parts = Array.new(4 + random.rand(4)) do |k|
      text = words(random, 5 + random.rand(10))
      case (section + k) % 6
      when 0 then "#{text} *#{words(random, 2)}*"
      when 1 then "#{text} `#{WORDS.sample(random: random)}_#{k}()`"
      when 2 then "#{text} [#{words(random, 2)}](https://example.com/docs/#{section}/#{k}#{'#frag' if k.odd?})"
      when 3 then "#{text} **#{words(random, 3)}** &amp; #{WORDS.sample(random: random)} &lt;= 10"
      when 4 then "#{text}[^#{(notes << "note-#{notes.size + 1}").last}]"
      else "#{text} <span class=\"kbd\">Ctrl-#{('A'.ord + k).chr}</span>"
      end
    end
    "#{parts.join('. ')}."
  end

  def section(random, number, notes)
    cited = notes.size
    out = ["## Section #{number}: #{words(random, 3)}", "", paragraph(random, number, notes), ""]
    out += Array.new(5) { |k| "#{'  ' * (k % 3)}- #{words(random, 4 + k)} `opt#{k}`" } + [""]
    out += ["1. #{words(random, 6)}", "2. #{words(random, 5)}", "   1. #{words(random, 4)}", ""]
    out += ["```ruby", "recorder = Recorder.new(hz: #{99 + number})",
            "recorder.record { work(#{number}) } # #{words(random, 3)}", "```", ""]
    out += ["> #{paragraph(random, number + 1, notes)}", ">", "> #{words(random, 8)}", ""]
    out += ["| name | hz | share |", "|------|---:|------:|"]
    out += Array.new(4) { |k| "| #{WORDS.sample(random: random)} | #{19 * (k + 1)} | #{random.rand(100)}% |" } + [""]
    out += [words(random, 2), ": #{words(random, 9)}", ""]
    out += ["### #{words(random, 2).capitalize}", "", paragraph(random, number + 2, notes), ""]
    out += notes.drop(cited).map { |label| "[^#{label}]: #{words(random, 6)}" } + [""]
    out.join("\n")
  end

  def document
    random = Random.new(3)
    notes = []
    intro = ["# #{words(random, 3).capitalize}", "", paragraph(random, 0, notes), ""]
    intro += notes.map { |label| "[^#{label}]: #{words(random, 6)}" } + [""]
    (intro + Array.new(12) { |i| section(random, i + 1, notes) }).join("\n")
  end

  def run(seconds)
    text = document
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    conversions = 0
    html = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      html = Kramdown::Document.new(text, OPTIONS).to_html.bytesize
      conversions += 1
    end
    [text.bytesize, html, conversions]
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  markdown, html, conversions = KramdownWorkload.run(seconds)
  puts "kramdown: #{conversions} conversions of #{markdown} bytes into #{html} bytes of HTML in #{seconds} s"
end
