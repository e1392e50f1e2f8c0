# frozen_string_literal: true

# The golden pprof files of crates/core/tests/golden/ (the core's byte-stability test writes
# and checks them; the recordings are described in crates/core/tests/golden.rs), decoded here
# with google-protobuf: the bytes the encoder must reproduce are a valid pprof of what was
# recorded.
RSpec.describe "golden pprof files" do
  golden_dir = File.expand_path("../../crates/core/tests/golden", __dir__)
  read = ->(name) { File.binread(File.join(golden_dir, name)) }

  it "are the same profile raw and gzip" do
    %w[empty varied over_limits many].each do |name|
      expect(decode_pprof(read.call("#{name}.pprof.gz"))).to eq decode_pprof(read.call("#{name}.pprof"))
    end
  end

  describe "varied" do
    let(:profile) { decode_pprof(read.call("varied.pprof")) }

    it "covers the window 2025-12-01T12:00:00.123456789Z plus 60.864197532 s" do
      expect(profile.time_nanos).to eq 1_764_590_400_123_456_789
      expect(profile.duration_nanos).to eq 60_864_197_532
      expect(profile.sample_type.map { |t| [profile.string_table[t.type], profile.string_table[t.unit]] })
        .to eq [%w[cpu-time nanoseconds], %w[wall-time nanoseconds], %w[cpu-samples count]]
    end

    it "holds the recorded samples, aggregated, truncated, with their labels and endpoints" do
      leaf = ["leaf", "/app/a.rb", 10]
      main = ["<main>", "/app/main.rb", 1]
      block = ["block in Worker#run", "/app/worker.rb", -1]
      native = ["Integer#times", "", 0]
      deep = (0..4).map { |line| ["recurse", "/app/deep.rb", line] }
      values = ->(cpu, wall, count) { { "cpu-time" => cpu, "wall-time" => wall, "cpu-samples" => count } }

      expect(samples_from(profile)).to eq [
        { frames: [leaf, main], values: values.call(1500, 2600, 2),
          labels: { "thread id" => 1234, "thread name" => "main" } },
        { frames: [["leaf", "/app/a.rb", 11], main], values: values.call(7, 8, 1),
          labels: { "local root span id" => 77, "thread name" => "worker 1", "trace endpoint" => "GET /users/:id" } },
        { frames: [block, native, leaf, main], values: values.call(0, 0, 0),
          labels: { "local root span id" => "77", "trace endpoint" => "GET /users/:id" } },
        { frames: [["résumé", "/app/ünïcode.rb", 300], block, main], values: values.call(-5, (2**63) - 1, 1),
          labels: { "local root span id" => "abc-1", "thread id" => 1234, "trace endpoint" => "POST /jobs" } },
        { frames: [], values: values.call(1, 1, 1), labels: {} },
        { frames: [native], values: values.call(-2**63, -1, 1), labels: { "negative" => -42 } },
        { frames: deep + [["", "3 frames omitted", 0]], values: values.call(3, 3, 1),
          labels: { "thread name" => "main" } },
        { frames: deep.first(4) + [["", "4 frames omitted", 0]], values: values.call(4, 4, 1),
          labels: { "thread name" => "main" } }
      ]
    end
  end

  it "over_limits folds what did not fit into the placeholder, keeping the total" do
    samples = samples_from(decode_pprof(read.call("over_limits.pprof")))
    expect(samples.sum { |sample| sample[:values]["wall-time"] }).to eq 10 + 20 + 30 + 40 + 50 + 60
    expect(samples.map { |sample| sample[:frames].first.first }).to include "(dropped: profile limits reached)"
  end
end
