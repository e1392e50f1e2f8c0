# frozen_string_literal: true

require_relative "../../bench/soak"

# Issue 4, "Soak", the short form that fits in CI: 100 serialize cycles of the small workload of
# bench/gen_workload.rb (bench/soak.rb runs the long one: 1,000 cycles of medium). Memory must
# not grow across cycles, and ObjectSpace.memsize_of must report the native memory the recorder
# really holds (measured as what glibc malloc gets back when the recorder is freed).
RSpec.describe DdprofRecorder::StackRecorder, "soak" do
  cycles = Integer(ENV.fetch("SOAK_CYCLES", "100"))

  it "keeps native memory, Ruby objects and memsize_of flat over #{cycles} serialize cycles, and memsize_of matches what it holds" do
    figures = Soak.run(size: "small", cycles: cycles)
    File.write(ENV["SOAK_REPORT_FILE"], JSON.generate(figures)) if ENV["SOAK_REPORT_FILE"]

    expect(figures[:samples_lost]).to eq(0)
    expect(figures[:samples_dropped]).to eq(0)
    expect(figures[:samples_recorded]).to eq(cycles * figures[:samples_per_cycle])
    # A leak grows with every cycle: native memory (glibc malloc's in-use bytes) or Ruby
    # objects (the heap's live slots after a GC), checked over the second half. RSS is not
    # asserted here: it also holds what glibc keeps of freed memory, and on Ruby 3.3.8 it went
    # from 38 to 92 MiB between cycles 50 and 100 of this file run alone, with in-use bytes and
    # live slots flat to 0.02%, and fell back to 30 MiB when the soak's thread ended. The issue's
    # RSS bound (10% from the start) is bench/soak.rb's, on medium.
    expect(figures[:malloc_growth_after_warm_percent]).to be < 10, -> { "native memory grew: #{figures}" }
    expect(figures[:live_slots_last]).to be <= figures[:live_slots_warm] * 1.10, -> { "Ruby objects grew: #{figures}" }
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
