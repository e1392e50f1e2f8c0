# frozen_string_literal: true

require "json"
require "rexml/document"

# The views by label (lib/ddprof_recorder/pprof_views.rb, crates/core/src/views/filter.rs and
# top.rs): `top(by:)`, `label:` on every view and on merge, `group_by:` on a label that some
# samples lack, on the web server's profile of spec/support/endpoint_profiles.rb, checked
# against its samples as google-protobuf decodes them.
RSpec.describe "DdprofRecorder views by label" do
  let(:pprof) { endpoint_pprof }
  let(:decoded) { samples_from(decode_pprof(pprof)) }

  # cpu-time per value of label `key` (nil: without it), from the decoded samples.
  def cpu_by(key, samples = decoded)
    samples.group_by { |s| s[:labels][key] }.transform_values { |ss| value_totals(ss)["cpu-time"] }
  end

  describe "top(by:)" do
    it "sums the value per label value, with a row for the samples without it, highest first" do
      top = DdprofRecorder.top(pprof, by: "trace endpoint")
      expect(top).to include(value: "cpu-time", unit: "nanoseconds", by: "trace endpoint", total: 1_000_000_000,
                             profile_total: 1_000_000_000, samples: decoded.size)
      expected = cpu_by("trace endpoint").sort_by { |label, cpu| [-cpu, label.nil? ? 1 : 0] }
                                         .map { |label, cpu| { label: label, total: cpu } }
      expect(top[:rows]).to eq(expected)
      expect(top[:rows]).to eq([{ label: EndpointProfiles::HEAVY, total: 750_000_000 },
                                { label: EndpointProfiles::INDEX, total: 200_000_000 },
                                { label: nil, total: 50_000_000 }])
      expect(top[:rows].sum { |r| r[:total] }).to eq(top[:total])
    end

    it "reads numeric labels, another value, a limit, and leaves out rows of 0" do
      by_pid = DdprofRecorder.top(pprof, by: :"process id", value: "wall-time")
      expect(by_pid[:rows]).to eq([{ label: 11, total: 1_560_000_000 }, { label: 12, total: 60_000_000 }])
      # main's cpu-time is its gc sample's (sleep has none); "puma 2" (50 ms, after main by name) is past the limit.
      by_thread = DdprofRecorder.top(pprof, by: "thread name", limit: 2)
      expect(by_thread[:rows]).to eq([{ label: "puma 1", total: 900_000_000 }, { label: "main", total: 50_000_000 }])
    end

    it "raises ArgumentError naming the keys there are for a key no sample has, and on bad by:" do
      expect { DdprofRecorder.top(pprof, by: "trace endpoints") }.to raise_error(
        ArgumentError, 'no sample has a label "trace endpoints"; this profile\'s labels: local root span id, ' \
                       "process id, thread name, trace endpoint"
      )
      expect { DdprofRecorder.top(pprof, by: 1) }.to raise_error(TypeError, "by must be a String, Symbol or nil, got Integer")
      expect { DdprofRecorder.top(pprof, by: "") }.to raise_error(ArgumentError, "by must not be empty")
      # A profile without samples has no label to miss: an empty answer.
      empty = DdprofRecorder::StackRecorder.new.serialize!
      expect(DdprofRecorder.top(empty, by: "trace endpoint")[:rows]).to eq([])
    end
  end

  describe "label:" do
    let(:heavy) { decoded.select { |s| s[:labels]["trace endpoint"] == EndpointProfiles::HEAVY } }

    it "keeps the samples with every label given, for top, and says what share of the profile they are" do
      top = DdprofRecorder.top(pprof, label: { "trace endpoint" => EndpointProfiles::HEAVY })
      expect(top).to include(total: value_totals(heavy)["cpu-time"], profile_total: 1_000_000_000, samples: 2)
      expect(top[:rows].map { |r| [r[:name], r[:self], r[:total]] }).to eq([["render_json", 700_000_000, 700_000_000],
                                                                            ["heavy", 50_000_000, 750_000_000],
                                                                            ["dispatch", 0, 750_000_000]])
      both = DdprofRecorder.top(pprof, label: { "trace endpoint" => EndpointProfiles::HEAVY, "process id" => 12 })
      expect(both[:rows].map { |r| r[:name] }).to eq(%w[heavy dispatch])
      by_thread = DdprofRecorder.top(pprof, by: "thread name", label: { :"trace endpoint" => EndpointProfiles::HEAVY })
      expect(by_thread[:rows]).to eq(cpu_by("thread name", heavy).map { |name, cpu| { label: name, total: cpu } }
                                                                   .sort_by { |r| -r[:total] })
    end

    it "compares values as text: an Integer or its decimal String matches a numeric label" do
      as_number = DdprofRecorder.folded(pprof, label: { "process id" => 12 })
      expect(as_number).to eq("dispatch;heavy 50000000\n")
      expect(DdprofRecorder.folded(pprof, label: { "process id" => "12" })).to eq(as_number)
      expect(DdprofRecorder.folded(pprof, label: { "local root span id" => "3" })).to eq("dispatch;index 200000000\n")
    end

    it "filters every view: folded, flamegraph, speedscope, summary, over several pprofs too" do
      label = { "trace endpoint" => EndpointProfiles::INDEX }
      expect(DdprofRecorder.folded([pprof, pprof], label: label)).to eq("dispatch;index 400000000\n")
      svg = REXML::Document.new(DdprofRecorder.flamegraph(pprof, label: label))
      titles = REXML::XPath.match(svg, "//title").map(&:text)
      expect(titles).to include(a_string_starting_with("index ("))
      expect(titles.grep(/heavy|render_json|gc/)).to eq([])
      json = JSON.parse(DdprofRecorder.speedscope(pprof, value: "cpu-time", label: label))
      expect(json["profiles"].map { |p| [p["name"], p["weights"]] }).to eq([["cpu-time", [200_000_000]]])
      summary = DdprofRecorder.summary(pprof, label: label)
      expect(summary).to include(samples: 1, thread_names: ["puma 1"], process_ids: [11])
      expect(summary[:totals]).to eq("cpu-time" => 200_000_000, "cpu-samples" => 20, "wall-time" => 300_000_000)
      expect(DdprofRecorder.summary(pprof)[:label_keys]).to eq(["local root span id", "process id", "thread name",
                                                                "trace endpoint"])
    end

    it "keeps no sample for a value no sample has: top and folded are empty, the drawings raise" do
      label = { "trace endpoint" => "PagesController#nope" }
      expect(DdprofRecorder.top(pprof, label: label)).to include(total: 0, samples: 0, rows: [],
                                                                 profile_total: 1_000_000_000)
      expect(DdprofRecorder.folded(pprof, label: label)).to eq("")
      %i[flamegraph speedscope].each do |view|
        expect { DdprofRecorder.public_send(view, pprof, label: label) }
          .to raise_error(DdprofRecorder::Error, "nothing to draw: no sample has trace endpoint=PagesController#nope")
      end
      expect { DdprofRecorder.speedscope(pprof, timeline: true, label: label) }
        .to raise_error(DdprofRecorder::Error, /no sample has trace endpoint=PagesController#nope/)
    end

    it "raises ArgumentError for a key no sample has, and on bad arguments, naming label" do
      expect { DdprofRecorder.folded(pprof, label: { "endpoint" => "x" }) }
        .to raise_error(ArgumentError, /\Ano sample has a label "endpoint"; this profile's labels: local root span id, /)
      { [["a", "b"]] => [TypeError, "label must be a Hash of label key => value, got Array"],
        { 1 => "x" } => [TypeError, "label keys must be Strings or Symbols, got Integer"],
        { "x" => 1.5 } => [TypeError, 'label "x" must be a String or an Integer, got Float'],
        { "" => "x" } => [ArgumentError, "label keys must not be empty"],
        { "x" => "" } => [ArgumentError, 'label "x" must not be empty'],
        { "x" => "1", x: "2" } => [ArgumentError, 'label "x" is given twice (as a String and a Symbol)'] }.each do |label, (error, message)|
        %i[top folded flamegraph speedscope timeline summary].each do |view|
          expect { DdprofRecorder.public_send(view, pprof, label: label) }.to raise_error(error, message)
        end
        expect { DdprofRecorder.merge([pprof], label: label) }.to raise_error(error, message)
      end
    end
  end

  describe "timeline(label:)" do
    let(:dated) { dated_endpoint_pprof }

    it "draws only the matching samples, and the shares of their wall time" do
      lanes = ->(svg) { REXML::XPath.match(REXML::Document.new(svg), "//g[@class='lane']/title").map(&:text) }
      expect(lanes.call(DdprofRecorder.timeline(dated)).size).to eq(2)
      heavy = lanes.call(DdprofRecorder.timeline(dated, label: { "trace endpoint" => EndpointProfiles::HEAVY }))
      expect(heavy).to eq(["t1 (1 (1))\nrunning 100.0%, waiting for GVL 0.0%, blocked 0.0%, gc 0.0%; on a CPU 100.0%",
                           "t2 (2 (2))\nrunning 0.0%, waiting for GVL 100.0%, blocked 0.0%, gc 0.0%; on a CPU 0.0%"])
      expect { DdprofRecorder.timeline(dated, label: { "local root span id" => 3 }) }
        .to raise_error(DdprofRecorder::Error, "nothing to draw: no sample has local root span id=3")
    end
  end

  describe "merge(label:)" do
    it "writes a pprof of the matching samples only, values and labels kept" do
      merged = DdprofRecorder.merge([pprof, endpoint_pprof(compression: :gzip)], compression: :none,
                                                                                 label: { "trace endpoint" => EndpointProfiles::HEAVY })
      samples = samples_from(decode_pprof(merged))
      expect(samples.map { |s| [s[:frames].first.first, s[:labels]["local root span id"], s[:values]["cpu-time"]] }.sort)
        .to eq([["heavy", 2, 100_000_000], ["render_json", 1, 1_400_000_000]])
      expect(samples.map { |s| s[:labels]["trace endpoint"] }.uniq).to eq([EndpointProfiles::HEAVY])
      expect(DdprofRecorder.merge([pprof], label: { "trace endpoint" => "nope" }, compression: :none))
        .to satisfy { |bytes| decode_pprof(bytes).sample.empty? }
      expect { DdprofRecorder.merge([pprof], label: { "endpoint" => "x" }) }.to raise_error(ArgumentError, /no sample has a label "endpoint"/)
    end
  end

  describe "group_by:" do
    it "makes one root per value, and one named (no key) for the samples without it" do
      folded = DdprofRecorder.folded(pprof, group_by: "trace endpoint")
      expect(folded.lines.map { |l| l.split(";").first }.uniq).to eq(["(no trace endpoint)", "trace endpoint=#{EndpointProfiles::HEAVY}",
                                                                       "trace endpoint=#{EndpointProfiles::INDEX}"])
      roots = folded.lines.group_by { |l| l.split(";").first }.transform_values { |ls| ls.sum { |l| l.split.last.to_i } }
      expect(roots.values).to eq([50_000_000, 750_000_000, 200_000_000])
      svg = REXML::Document.new(DdprofRecorder.flamegraph(pprof, group_by: "trace endpoint"))
      expect(REXML::XPath.match(svg, "//title").map(&:text))
        .to include("trace endpoint=#{EndpointProfiles::HEAVY} (750 ms of cpu-time, 75.00%)", "(no trace endpoint) (50 ms of cpu-time, 5.00%)")
      names = JSON.parse(DdprofRecorder.speedscope(pprof, value: "cpu-time", group_by: "trace endpoint"))["profiles"].map { |p| p["name"] }
      expect(names).to eq(["cpu-time, trace endpoint=#{EndpointProfiles::HEAVY}", "cpu-time, trace endpoint=#{EndpointProfiles::INDEX}",
                           "cpu-time, (no trace endpoint)"])
      expect { DdprofRecorder.flamegraph(pprof, group_by: "endpoint") }.to raise_error(ArgumentError, /no sample has a label "endpoint"/)
      expect { DdprofRecorder.folded(pprof, group_by: "") }.to raise_error(ArgumentError, "group_by must not be empty")
    end
  end
end
