# frozen_string_literal: true

require "rexml/document"

# `ddprof-recorder timeline` in process (lib/ddprof_recorder/cli/timeline.rb): its --label.
# The drawing itself is checked in spec/views/timeline_spec.rb.
RSpec.describe "ddprof-recorder timeline" do
  before { File.binwrite(File.join(@dir, "dated.pb"), dated_endpoint_pprof) }

  def lanes(svg)
    REXML::XPath.match(REXML::Document.new(svg), "//g[@class='lane']/title").map(&:text)
  end

  it "draws the samples of --label only, titled with it" do
    out, err, status = run_cli("timeline", "dated.pb", "-o", "heavy.svg", "--label", "trace endpoint=PagesController#heavy")
    expect([err, status]).to eq(["", 0])
    expect(out).to start_with("ddprof-recorder: wrote heavy.svg (2 threads, ")
    svg = File.read(File.join(@dir, "heavy.svg"))
    expect(svg).to include(">dated.pb (trace endpoint=PagesController#heavy)<")
    expect(lanes(svg)).to eq(["t1 (1 (1))\nrunning 100.0%, waiting for GVL 0.0%, blocked 0.0%, gc 0.0%; on a CPU 100.0%",
                              "t2 (2 (2))\nrunning 0.0%, waiting for GVL 100.0%, blocked 0.0%, gc 0.0%; on a CPU 0.0%"])
    out, = run_cli("timeline", "dated.pb", "-o", "t2.svg", "--label", "thread id=2 (2)")
    expect(out).to start_with("ddprof-recorder: wrote t2.svg (1 thread, ")

    out, err, status = run_cli("timeline", "dated.pb", "--label", "thread id=3 (3)")
    expect([out, status]).to eq(["", 1])
    expect_one_line(err, /\Addprof-recorder: nothing to draw: no sample has thread id=3 \(3\)$/)
  end

  # One page, one story: on Ruby 3.1 the table said "blocked 92-93%" while the same threads'
  # lanes were mostly red (waiting for GVL), and "running" was on a CPU in the table but
  # holding the GVL in the lanes. Each lane's hover and its table row now say the same
  # numbers under the same words, the lanes' legend's.
  it "writes a page whose table says what each lane's hover says, in the lanes' words" do
    _, err, status = run_cli("timeline", "dated.pb", "-o", "page.html")
    expect([err, status]).to eq(["", 0])
    html = File.read(File.join(@dir, "page.html"))
    svg = html[/<svg .*<\/svg>/m]
    hovers = lanes(svg).to_h { |t| t.split("\n", 2) }
    headers = html.scan(%r{<th>([^<]*)</th>}).flatten
    expect(headers).to eq(["thread", "wall-time", "running", "waiting for GVL", "blocked", "gc", "on a CPU"])
    legend = REXML::XPath.match(REXML::Document.new(svg), "/svg/text").map(&:text)
    expect(legend).to include("running", "waiting for GVL", "blocked", "gc")
    rows = html.scan(%r{<tr><td>(.*?)</td><td>[^<]*</td>((?:<td>[^<]*</td>)+)</tr>}).to_h do |thread, cells|
      values = cells.scan(%r{<td>([^<]*)</td>}).flatten
      named = headers[2..-2].zip(values).map { |h, v| "#{h} #{v}" }.join(", ")
      [thread, "#{named}; on a CPU #{values.last}"]
    end
    expect(rows.size).to eq(2)
    expect(rows).to eq(hovers)
    expect(html).not_to include("blocked or waiting")
  end
end
