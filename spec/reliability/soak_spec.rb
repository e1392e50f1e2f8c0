# frozen_string_literal: true

require_relative "../../bench/soak"

# Issue 4, "Soak", the short form that fits in CI: 100 serialize cycles of the small workload of
# bench/gen_workload.rb (bench/soak.rb runs the long one: 1,000 cycles of medium). Memory must
# not grow across cycles, and ObjectSpace.memsize_of must report the native memory the recorder
# really holds (measured as what glibc malloc gets back when the recorder is freed).
RSpec.describe DdprofRecorder::StackRecorder, "soak" do
  cycles = Integer(ENV.fetch("SOAK_CYCLES", "100"))

  it "keeps RSS and memsize_of flat over #{cycles} serialize cycles, and memsize_of matches what it holds" do
    figures = Soak.run(size: "small", cycles: cycles)
    File.write(ENV["SOAK_REPORT_FILE"], JSON.generate(figures)) if ENV["SOAK_REPORT_FILE"]

    expect(figures[:samples_lost]).to eq(0)
    expect(figures[:samples_dropped]).to eq(0)
    expect(figures[:samples_recorded]).to eq(cycles * figures[:samples_per_cycle])
    # RSS is the whole process's: about 30 MiB when this file runs alone, but 180 MiB or more
    # late in the suite, where the Ruby heap and malloc's arenas still settle in the first
    # cycles (+24% from cycle 10 to 100 in a loaded CI run on 3.3.8, +4.1% of it after cycle
    # 50). A leak grows with every cycle: it shows in the second half, checked here; the
    # issue's 10% from the start holds on medium in bench/soak.rb.
    expect(figures[:rss_growth_after_warm_percent]).to be < 15, -> { "RSS grew: #{figures}" }
    expect(figures[:memsize_last]).to be <= figures[:memsize_early] * 1.10, -> { "memsize_of grew: #{figures}" }
    # The recorder holds megabytes here; memsize_of is within 10% of what freeing it returns.
    expect(figures[:native_bytes_freed]).to be > 1_000_000, -> { "nothing measured: #{figures}" }
    expect(figures[:memsize_error_percent].abs).to be < 10, -> { "memsize_of is off: #{figures}" }
  end

  it "reports a new recorder's memory, and more once it holds samples", gc_stress: true do
    recorder = described_class.new
    empty = ObjectSpace.memsize_of(recorder)
    expect(empty).to be > 0
    100.times { |i| recorder.record_sample([["f#{i}", "soak.rb", i]], [1, 1, 1]) }
    expect(ObjectSpace.memsize_of(recorder)).to be > empty
  end
end
