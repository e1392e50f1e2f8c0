# frozen_string_literal: true

require "objspace"

# Issue 4, "Bounded memory that degrades, never fails": per-profile limits (constructor
# keywords), the "(dropped: profile limits reached)" placeholder, stats[:samples_dropped] and
# ObjectSpace.memsize_of.
RSpec.describe DdprofRecorder::StackRecorder, "limits" do
  dropped = "(dropped: profile limits reached)"

  def frame(i) = ["f#{i}", "limits.rb", i]

  def stacks_of(samples) = samples.map { _1[:frames] }

  it "has generous defaults and exposes them", gc_stress: true do
    expect(described_class::DEFAULT_MAX_STACKS).to be >= 1_000_000
    expect(described_class::DEFAULT_MAX_STRINGS).to be >= 1_000_000
    expect(described_class::DEFAULT_MAX_LABEL_SETS).to be >= 1_000_000
    expect(described_class::DEFAULT_MAX_SAMPLES).to be >= 1_000_000
    expect(described_class::MAX_LIMIT).to be >= described_class::DEFAULT_MAX_SAMPLES
  end

  it "folds samples over max_stacks into the placeholder, keeping totals exact", gc_stress: true do
    recorder = described_class.new(max_stacks: 2)
    5.times { |i| recorder.record_sample([frame(i)], [i, 1, 10]) }
    recorder.record_sample([frame(0)], [100, 1, 10]) # an existing stack still aggregates
    samples = serialized_samples(recorder)
    expect(stacks_of(samples)).to contain_exactly([frame(0)], [frame(1)], [[dropped, "", 0]])
    placeholder = samples.find { _1[:frames] == [[dropped, "", 0]] }
    expect(placeholder[:values]).to eq("cpu-time" => 2 + 3 + 4, "cpu-samples" => 3, "wall-time" => 30)
    expect(placeholder[:labels]).to be_empty
    expect(value_totals(samples)).to eq("cpu-time" => 110, "cpu-samples" => 6, "wall-time" => 60)
    expect(recorder.stats).to include(samples_recorded: 6, samples_dropped: 3, samples_lost: 0)
  end

  it "applies per profile: the next window starts empty and accepts new content again" do
    recorder = described_class.new(max_stacks: 1)
    recorder.record_sample([frame(1)], [1, 1, 1])
    recorder.record_sample([frame(2)], [1, 1, 1])
    expect(stacks_of(serialized_samples(recorder))).to contain_exactly([frame(1)], [[dropped, "", 0]])
    recorder.record_sample([frame(2)], [1, 1, 1])
    expect(stacks_of(serialized_samples(recorder))).to eq([[frame(2)]])
    expect(recorder.stats[:samples_dropped]).to eq(1)
  end

  it "folds samples over max_strings, max_label_sets and max_samples", gc_stress: true do
    # "" plus "f0" and "limits.rb": a fourth string does not fit.
    recorder = described_class.new(max_strings: 3)
    recorder.record_sample([frame(0)], [1, 1, 1])
    recorder.record_sample([frame(0)], [1, 1, 1], { "k" => "v" })
    recorder.record_sample([frame(0)], [1, 1, 1])
    expect(serialized_samples(recorder).map { [_1[:frames], _1[:values]["cpu-samples"]] })
      .to contain_exactly([[frame(0)], 2], [[[dropped, "", 0]], 1])

    recorder = described_class.new(max_label_sets: 2)
    3.times { |i| recorder.record_sample([frame(0)], [1, 1, 1], { "thread id" => i.to_s }) }
    expect(serialized_samples(recorder).map { _1[:labels] })
      .to contain_exactly({ "thread id" => "0" }, { "thread id" => "1" }, {})

    recorder = described_class.new(max_samples: 2)
    3.times { |i| recorder.record_sample([frame(0)], [1, 1, 1], { "n" => i }) }
    expect(serialized_samples(recorder).size).to eq(3) # two samples and the placeholder
    expect(recorder.stats[:samples_dropped]).to eq(1)
  end

  it "drops endpoints over the limits and counts them" do
    recorder = described_class.new(max_label_sets: 1)
    recorder.record_sample([frame(0)], [1, 1, 1], { "local root span id" => 1 })
    recorder.record_endpoint(1, "GET /a")
    recorder.record_endpoint(2, "GET /b") # a second endpoint: over max_label_sets
    recorder.record_endpoint(1, "GET /c") # replacing one is fine
    expect(serialized_samples(recorder).first[:labels]).to include("trace endpoint" => "GET /c")
    expect(recorder.stats[:endpoints_dropped]).to eq(1)
  end

  it "validates the limits like the other options" do
    %i[max_stacks max_strings max_label_sets max_samples].each do |name|
      expect { described_class.new(name => 0) }.to raise_error(ArgumentError, /#{name}/)
      expect { described_class.new(name => -1) }.to raise_error(ArgumentError, /#{name}/)
      expect { described_class.new(name => described_class::MAX_LIMIT + 1) }.to raise_error(ArgumentError, /#{name}/)
      expect { described_class.new(name => 2**64) }.to raise_error(RangeError, /#{name}/)
      expect { described_class.new(name => "10") }.to raise_error(TypeError, /#{name}/)
      expect { described_class.new(name => nil) }.to raise_error(TypeError, /#{name}/)
      expect { described_class.new(name => 1.5) }.to raise_error(TypeError, /#{name}/)
      expect(described_class.new(name => 1)).to be_a(described_class)
      expect(described_class.new(name => described_class::MAX_LIMIT)).to be_a(described_class)
    end
  end

  describe "ObjectSpace.memsize_of" do
    it "grows with the content held and counts what serialization keeps for reuse", gc_stress: true do
      recorder = described_class.new
      empty = ObjectSpace.memsize_of(recorder)
      200.times { |i| recorder.record_sample([frame(i), frame(i + 1)], [1, 1, 1], { "thread id" => i.to_s }) }
      full = ObjectSpace.memsize_of(recorder)
      expect(full).to be > empty + 200 * 20
      recorder.serialize
      # Both windows' storage is kept for reuse (no growth across cycles, see spec/reliability/soak_spec.rb).
      expect(ObjectSpace.memsize_of(recorder)).to be >= full
    end

    it "stays bounded by the limits however many distinct samples arrive" do
      recorder = described_class.new(max_stacks: 100, max_strings: 300, max_label_sets: 100, max_samples: 100)
      2_000.times { |i| recorder.record_sample([frame(i)], [1, 1, 1], { "n" => i }) }
      bounded = ObjectSpace.memsize_of(recorder)
      20_000.times { |i| recorder.record_sample([frame(i)], [1, 1, 1], { "n" => i }) }
      expect(ObjectSpace.memsize_of(recorder)).to eq(bounded)
      expect(recorder.stats[:samples_dropped]).to eq(22_000 - 200) # the first 100 are stored, and stored again
      expect(value_totals(serialized_samples(recorder))["cpu-samples"]).to eq(22_000)
    end
  end
end
