# frozen_string_literal: true

require "zlib"
require_relative "../../bench/accuracy/analysis"

# The arithmetic of `bench/run accuracy` (bench/accuracy/analysis.rb) on hand-made inputs; the
# benchmark itself is not run here (slow and timing-dependent).
RSpec.describe AccuracyAnalysis do
  describe ".normalize_name" do
    {
      "HotSpot.crunch" => "crunch",
      "Kernel#sleep" => "sleep",
      "Array#sort" => "sort",
      "Foo::Bar#baz" => "baz",
      "Foo::Bar.baz" => "baz",
      "#<Class:0x000055d5c0a1b2c8>#qux" => "qux",
      "JSON::Ext::Generator::State#generate" => "generate",
      "Regexp#match?" => "match?",
      "Array#[]" => "[]",
      "Integer#<=>" => "<=>",
      "block in HotSpot.crunch" => "crunch",
      "block (3 levels) in Foo#bar" => "bar",
      "rescue in block in Foo#bar" => "bar",
      "ensure in work" => "work",
      "block in <main>" => "main",
      "block in main" => "main",
      "main" => "main",
      "<main>" => "main",
      "<top (required)>" => "top level",
      "top level of /app/lib/x.rb" => "top level",
      "block (2 levels) in top level of lib/x.rb" => "top level",
      "<class:Foo>" => "class Foo",
      "class Foo" => "class Foo",
      "<module:Foo>" => "module Foo",
      "module Foo" => "module Foo",
      "<compiled>" => "compiled",
      "crunch" => "crunch",
      "sort" => "sort",
      # Operators, bare (our base_label) and qualified (stackprof's label).
      "<<" => "<<",
      "Integer#<<" => "<<",
      "Integer#^" => "^",
      "<=>" => "<=>",
      "Comparable#<" => "<",
      "Kernel#is_a?" => "is_a?",
      "Object#work" => "work",
      # Eval'd code, as ours names it (by its file) and as AccuracyAnalysis.frame_name names stackprof's.
      "(erb)" => "(erb)",
      "(eval at lib/x.rb:3)" => "(eval at lib/x.rb:3)",
      # A compiled template's frame, as ours names it (by its file), kept whole; `/` is still an operator.
      "app/views/items/_item.html.erb" => "app/views/items/_item.html.erb",
      "block in app/views/items/index.html.erb" => "app/views/items/index.html.erb",
      "/tmp/views/list.erb" => "/tmp/views/list.erb",
      "Integer#/" => "/",
      "/" => "/",
    }.each do |label, name|
      it "turns #{label.inspect} into #{name.inspect}" do
        expect(described_class.normalize_name(label)).to eq(name)
      end
    end

    # stackprof's spellings (Ruby's labels) and ours (docs/profiler.md, "Frame names") meet.
    {
      "main" => ["<main>", "main", "block in <main>", "block (2 levels) in main", "rescue in <main>"],
      "top level" => ["<top (required)>", "top level of /app/lib/x.rb", "block in <top (required)>"],
      "class Foo" => ["<class:Foo>", "class Foo", "block in <class:Foo>", "block in class Foo"],
      "module Foo::Bar" => ["<module:Foo::Bar>", "module Foo::Bar"],
      "singleton class" => ["<singleton class>", "singleton class"],
    }.each do |name, labels|
      it "turns every spelling of #{name} into #{name}" do
        expect(labels.map { |label| described_class.normalize_name(label) }.uniq).to eq([name])
      end
    end
  end

  describe ".shares" do
    it "divides by the sum and leaves zero weights out" do
      expect(described_class.shares({ "a" => 3, "b" => 1, "c" => 0 })).to eq({ "a" => 0.75, "b" => 0.25 })
    end

    it "is empty when there is no weight" do
      expect(described_class.shares({ "a" => 0 })).to eq({})
    end
  end

  describe ".overlap" do
    it "is 1 for the same distribution and 0 for disjoint ones" do
      p = { "a" => 0.6, "b" => 0.4 }
      expect(described_class.overlap(p, p)).to be_within(1e-12).of(1.0)
      expect(described_class.overlap(p, { "c" => 1.0 })).to eq(0.0)
    end

    it "adds the smaller share of each function, whichever side has it" do
      p = { "a" => 0.5, "b" => 0.3, "c" => 0.2 }
      q = { "a" => 0.2, "b" => 0.7, "d" => 0.1 }
      expect(described_class.overlap(p, q)).to be_within(1e-12).of(0.2 + 0.3)
      expect(described_class.overlap(q, p)).to be_within(1e-12).of(0.5)
    end
  end

  describe ".unbiased_overlap" do
    it "is 1 for a single function whatever n" do
      expect(described_class.unbiased_overlap({ "a" => 1.0 }, 3)).to be_within(1e-12).of(1.0)
    end

    it "is 0.5 for two equal functions and one sample (a draw is all one function)" do
      expect(described_class.unbiased_overlap({ "a" => 0.5, "b" => 0.5 }, 1, draws: 50)).to be_within(1e-12).of(0.5)
    end

    it "is the expected overlap for two equal functions and two samples: 0.75" do
      # Half the draws split 1:1 (overlap 1), half are one function twice (overlap 0.5).
      expect(described_class.unbiased_overlap({ "a" => 0.5, "b" => 0.5 }, 2, draws: 4000)).to be_within(0.03).of(0.75)
    end

    it "grows towards 1 with n" do
      p = { "a" => 0.4, "b" => 0.3, "c" => 0.2, "d" => 0.1 }
      small = described_class.unbiased_overlap(p, 10)
      large = described_class.unbiased_overlap(p, 2000)
      expect(small).to be < 0.9
      expect(large).to be > 0.97
      expect(large).to be < 1.0
    end

    it "gives the same result for the same seed and no result without samples" do
      p = { "a" => 0.7, "b" => 0.3 }
      expect(described_class.unbiased_overlap(p, 7, seed: 3)).to eq(described_class.unbiased_overlap(p, 7, seed: 3))
      expect(described_class.unbiased_overlap(p, 0)).to be_nil
      expect(described_class.unbiased_overlap({}, 5)).to be_nil
    end
  end

  describe ".two_sample_overlap" do
    it "is 1 for a single function whatever n and m" do
      expect(described_class.two_sample_overlap({ "a" => 1.0 }, 3, 5)).to be_within(1e-12).of(1.0)
    end

    it "is the chance that two one-sample draws of two equal functions agree: 0.5" do
      # Each pair is the same function (overlap 1) or not (overlap 0), half the time each.
      p = { "a" => 0.5, "b" => 0.5 }
      expect(described_class.two_sample_overlap(p, 1, 1, draws: 4000)).to be_within(0.03).of(0.5)
    end

    it "is below the one-sample ceiling for a noisy reference, and meets it as the reference grows" do
      p = (1..40).to_h { |i| ["f#{i}", 1.0 / 40] } # flat, as rubocop's
      one = described_class.unbiased_overlap(p, 500)
      expect(described_class.two_sample_overlap(p, 500, 500)).to be < one - 0.03
      expect(described_class.two_sample_overlap(p, 500, 200_000, draws: 20)).to be_within(0.01).of(one)
    end

    it "gives the same result for the same seed and no result without samples" do
      p = { "a" => 0.7, "b" => 0.3 }
      expect(described_class.two_sample_overlap(p, 7, 9, seed: 3)).to eq(described_class.two_sample_overlap(p, 7, 9, seed: 3))
      expect(described_class.two_sample_overlap(p, 0, 9)).to be_nil
      expect(described_class.two_sample_overlap(p, 7, 0)).to be_nil
      expect(described_class.two_sample_overlap({}, 5, 5)).to be_nil
    end
  end

  describe ".top" do
    it "keeps the largest shares, largest first, ties by name" do
      dist = { "c" => 0.2, "a" => 0.2, "b" => 0.5, "d" => 0.1 }
      expect(described_class.top(dist, 3)).to eq([["b", 0.5], ["a", 0.2], ["c", 0.2]])
    end
  end

  describe ".stackprof_self" do
    it "counts leaf samples per normalized name and leaves the GC frames out" do
      dump = {
        samples: 16,
        frames: {
          1 => { name: "HotSpot.crunch", samples: 6, total_samples: 6 },
          2 => { name: "block in HotSpot.crunch", samples: 2, total_samples: 8 },
          3 => { name: "Array#sort", samples: 5, total_samples: 5 },
          4 => { name: "<main>", samples: 0, total_samples: 13 },
          5 => { name: "(marking)", samples: 2, total_samples: 2 },
          6 => { name: "(sweeping)", samples: 1, total_samples: 1 },
          7 => { name: "(garbage collection)", samples: 0, total_samples: 3 },
        },
      }
      expect(described_class.stackprof_self(dump)).to eq(weights: { "crunch" => 8, "sort" => 5 }, gc_samples: 3, samples: 16)
    end

    it "names the frames of eval'd code (a file in parentheses) by their file, as ours are named" do
      dump = {
        samples: 10,
        frames: {
          1 => { name: "block (2 levels) in <main>", file: "(erb)", samples: 4, total_samples: 6 },
          2 => { name: "<main>", file: "(erb)", samples: 2, total_samples: 8 },
          3 => { name: "<main>", file: "/app/run.rb", samples: 1, total_samples: 10 },
          4 => { name: "Integer#times", file: "<cfunc>", samples: 3, total_samples: 9 },
        },
      }
      expect(described_class.stackprof_self(dump)).to eq(weights: { "(erb)" => 6, "main" => 1, "times" => 3 },
                                                          gc_samples: 0, samples: 10)
    end
  end

  describe ".frame_name" do
    root = "/srv/shop"

    it "names an ActionView template's method by the end of its file that the method's name spells" do
      {
        "#<Class:0x00007f00aff6b4c0>#_app_views_items__item_html_erb__2859900258489122927_6880" =>
          "#{root}/app/views/items/_item.html.erb",
        "#<Class:0x00007f00aff6b718>#_app_views_items_index_html_erb___1572220595263791585_6840" =>
          "#{root}/app/views/items/index.html.erb",
        "block in #<Class:0x00007f00aff6b718>#_app_views_layouts_application_html_erb__12140406_6240" =>
          "#{root}/app/views/layouts/application.html.erb",
      }.each do |name, file|
        expect(described_class.frame_name(name: name, file: file)).to eq(file.delete_prefix("#{root}/"))
      end
    end

    it "names it by its whole file when no end of it is spelled by the name (no Rails.root)" do
      name = "#<Class:0x1>#__tmp_tf_av_app_views_pages_index_html_erb__22719_320"
      expect(described_class.frame_name(name: name, file: "/tmp/tf/av/app/views/pages/index.html.erb"))
        .to eq("/tmp/tf/av/app/views/pages/index.html.erb")
    end

    it "keeps the name of a method that only looks like one, or is not in its template's file" do
      expect(described_class.frame_name(name: "Foo#_app_views_x_html_erb__1_2", file: "/srv/lib/foo.rb"))
        .to eq("Foo#_app_views_x_html_erb__1_2")
      expect(described_class.frame_name(name: "Foo#_helper", file: "/srv/app/views/x.html.erb")).to eq("Foo#_helper")
      expect(described_class.frame_name(name: "Array#each", file: "<cfunc>")).to eq("Array#each")
    end

    it "names eval'd code by its file" do
      expect(described_class.frame_name(name: "block (2 levels) in <main>", file: "(erb)")).to eq("(erb)")
    end
  end

  describe ".stackprof_stacks" do
    it "reads raw stacks (root first) leaf first, named as stackprof_self names them, GC stacks left out" do
      dump = {
        frames: {
          1 => { name: "<main>", file: "/srv/run.rb" },
          2 => { name: "#<Class:0x1>#_app_views_items_index_html_erb__1_2", file: "/srv/app/views/items/index.html.erb" },
          3 => { name: "Array#each", file: "<cfunc>" },
          4 => { name: "(garbage collection)" },
          5 => { name: "(marking)" },
        },
        raw: [3, 1, 2, 3, 7, 2, 1, 2, 4, 2, 4, 5, 2],
      }
      expect(described_class.stackprof_stacks(dump))
        .to eq([[["each", "app/views/items/index.html.erb", "main"], 7], [["app/views/items/index.html.erb", "main"], 4]])
    end

    it "says so when the result has no raw stacks" do
      expect { described_class.stackprof_stacks({ frames: {} }) }.to raise_error(ArgumentError, /raw: true/)
    end
  end

  describe ".pprof_stacks" do
    it "gives each sample with cpu-time its names leaf first, the samples of a left-out leaf left out" do
      recorder = DdprofRecorder::StackRecorder.new(compression: :gzip)
      recorder.record_sample([["Array#each", "", 0], ["app/views/a.html.erb", "/srv/app/views/a.html.erb", 3]], [100, 1, 1000])
      recorder.record_sample([["sleep", "a.rb", 7]], [0, 7, 5000]) # off CPU
      recorder.record_sample([["(marking)", "", 0], ["(garbage collection)", "", 0]], [30, 1, 0])
      pprof = recorder.serialize!

      expect(described_class.pprof_stacks(pprof, leave_out: described_class::GC_FRAMES))
        .to eq([[["each", "app/views/a.html.erb"], 100]])
    end
  end

  describe ".template_weights" do
    it "puts on each template the stacks it is the leaf of (self) and those it is in, once a stack (total)" do
      layout = "app/views/layouts/application.html.erb"
      index = "app/views/items/index.html.erb"
      item = "app/views/items/_item.html.erb"
      stacks = [
        [[item, "render", index, "render", "main"], 3],
        [["h", item, "render", item, "render", index, "main"], 5], # a partial in itself: once
        [["concat", layout, "main"], 2],
        [["crunch", "main"], 10],
        [["(erb)", "result", "main"], 1], # eval'd code has no template file
      ]
      expect(described_class.template_weights(stacks))
        .to eq(self: { item => 3 }, total: { item => 8, index => 8, layout => 2 }, all: 21)
    end
  end

  describe ".pprof_self" do
    it "sums cpu-time at the leaf per function and counts the cpu-samples that had cpu-time" do
      recorder = DdprofRecorder::StackRecorder.new(compression: :gzip)
      recorder.record_sample([["crunch", "a.rb", 3], ["run", "a.rb", 9]], [100, 1, 1000])
      recorder.record_sample([["HotSpot.crunch", "a.rb", 3], ["main", "a.rb", 1]], [40, 2, 1000])
      recorder.record_sample([["sort", "a.rb", 5], ["run", "a.rb", 9]], [50, 3, 1000])
      recorder.record_sample([["sleep", "a.rb", 7], ["run", "a.rb", 9]], [0, 7, 5000]) # off CPU
      pprof = recorder.serialize!

      expect(described_class.pprof_self(pprof))
        .to eq(weights: { "crunch" => 140, "sort" => 50 }, on_cpu_samples: 6, total: 190, left_out: 0)
    end

    it "leaves out the samples whose leaf is one of the frames asked (GC, for a profile taken with --gc)" do
      recorder = DdprofRecorder::StackRecorder.new(compression: :gzip)
      recorder.record_sample([["crunch", "a.rb", 3], ["run", "a.rb", 9]], [100, 1, 1000])
      recorder.record_sample([["(marking)", "", 0], ["(garbage collection)", "", 0], ["crunch", "a.rb", 3]], [30, 2, 0])
      recorder.record_sample([["(sweeping)", "", 0], ["(garbage collection)", "", 0], ["run", "a.rb", 9]], [20, 1, 0])
      pprof = recorder.serialize!

      expect(described_class.pprof_self(pprof, leave_out: described_class::GC_FRAMES))
        .to eq(weights: { "crunch" => 100 }, on_cpu_samples: 1, total: 100, left_out: 50)
      expect(described_class.pprof_self(pprof)[:weights]).to eq({ "crunch" => 100, "(marking)" => 30, "(sweeping)" => 20 })
    end

    it "gives the value of a `to_caller` leaf to the first frame under it that is not one (GC over the allocating code)" do
      recorder = DdprofRecorder::StackRecorder.new(compression: :gzip)
      recorder.record_sample([["crunch", "a.rb", 3], ["run", "a.rb", 9]], [100, 1, 1000])
      recorder.record_sample([["(garbage collection)", "", 0], ["Class#new", "a.rb", 4], ["run", "a.rb", 9]], [30, 2, 0])
      recorder.record_sample([["(garbage collection)", "", 0]], [5, 1, 0]) # nothing under it: stays
      pprof = recorder.serialize!

      expect(described_class.pprof_self(pprof, to_caller: ["(garbage collection)"]))
        .to eq(weights: { "crunch" => 100, "new" => 30, "(garbage collection)" => 5 }, on_cpu_samples: 4, total: 135,
               left_out: 0)
      expect(described_class.pprof_self(pprof, leave_out: described_class::GC_FRAMES))
        .to eq(weights: { "crunch" => 100 }, on_cpu_samples: 1, total: 100, left_out: 35)
    end

    it "counts only the samples whose frames `within` accepts, given their names leaf first" do
      recorder = DdprofRecorder::StackRecorder.new(compression: :gzip)
      recorder.record_sample([["crunch", "a.rb", 3], ["Work.run", "a.rb", 9]], [100, 1, 1000])
      recorder.record_sample([["Kernel#eval", "", 0], ["Kernel#require", "", 0]], [70, 1, 1000]) # start-up
      pprof = recorder.serialize!
      seen = []
      within = lambda do |names|
        seen << names
        names.any? { |name| name.end_with?(".run") }
      end

      expect(described_class.pprof_self(pprof, within: within))
        .to eq(weights: { "crunch" => 100 }, on_cpu_samples: 1, total: 100, left_out: 0)
      expect(seen).to contain_exactly(%w[crunch Work.run], %w[Kernel#eval Kernel#require])
    end

    it "counts a sample at most as many times as its cpu-time holds CPU ticks at `hz` (an idle thread's passes)" do
      recorder = DdprofRecorder::StackRecorder.new(compression: :gzip)
      recorder.record_sample([["crunch", "a.rb", 3]], [30_000_000, 2, 1000]) # 3 ticks' CPU at 100 Hz, 2 passes
      recorder.record_sample([["wait", "a.rb", 5]], [1_000_000, 400, 1000]) # woke 400 times, a tenth of a tick
      pprof = recorder.serialize!

      expect(described_class.pprof_self(pprof, hz: 100)[:on_cpu_samples]).to eq(2 + 1)
      expect(described_class.pprof_self(pprof)[:on_cpu_samples]).to eq(402)
    end

    it "takes the innermost line of a location with inlined lines, and reads raw pprofs" do
      pp = Perftools::Profiles
      profile = pp::Profile.new(
        string_table: ["", "cpu-time", "nanoseconds", "cpu-samples", "count", "leaf", "inliner", "caller"],
        sample_type: [pp::ValueType.new(type: 3, unit: 4), pp::ValueType.new(type: 1, unit: 2)],
        function: [pp::Function.new(id: 1, name: 5), pp::Function.new(id: 2, name: 6), pp::Function.new(id: 3, name: 7)],
        location: [
          pp::Location.new(id: 10, line: [pp::Line.new(function_id: 1, line: 1), pp::Line.new(function_id: 2, line: 2)]),
          pp::Location.new(id: 11, line: [pp::Line.new(function_id: 3, line: 3)]),
        ],
        sample: [
          pp::Sample.new(location_id: [10, 11], value: [4, 300]),
          pp::Sample.new(location_id: [11], value: [1, 100]),
          pp::Sample.new(location_id: [10, 11], value: [9, -5]), # not positive: not on CPU
        ],
      )
      raw = pp::Profile.encode(profile)

      expected = { weights: { "leaf" => 300, "caller" => 100 }, on_cpu_samples: 5, total: 400, left_out: 0 }
      expect(described_class.pprof_self(raw)).to eq(expected)
      expect(described_class.pprof_self(Zlib.gzip(raw))).to eq(expected)
    end

    it "names the sample types it has when one is missing" do
      pprof = DdprofRecorder::StackRecorder.new(value_types: [["wall-time", "nanoseconds"]]).serialize!
      expect { described_class.pprof_self(pprof) }.to raise_error(ArgumentError, /no "cpu-time" sample type \(it has wall-time\)/)
    end

    it "rejects bytes that are not a pprof" do
      expect { described_class.pprof_self("\x1f\x8bnot gzip".b) }.to raise_error(ArgumentError, /gzip/)
      expect { described_class.pprof_self("\xff".b) }.to raise_error(ArgumentError, /not a pprof/)
    end
  end
end
