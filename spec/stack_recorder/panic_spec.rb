# frozen_string_literal: true

# Issue 10, item 1: a panic in native code never becomes `fatal` (which ends the process). Every
# `_native_*` entry point runs its body through one helper; the Testing hooks below panic on
# purpose in each kind of entry point, and each panic must come back as DdprofRecorder::Error,
# with the recorder still working afterwards.
RSpec.describe DdprofRecorder::StackRecorder, "panics" do
  let(:testing) { described_class::Testing }
  let(:recorder) { described_class.new }

  def expect_working(recorder)
    recorder.record_sample([["after_panic", "a.rb", 1]], [1, 1, 1])
    expect(samples_from(decode_pprof(recorder.serialize!)).map { _1[:frames] }).to eq([[["after_panic", "a.rb", 1]]])
    expect(recorder.stats[:samples_lost]).to eq(0)
  end

  it "in an entry point on a recorder (fork check + guard) become DdprofRecorder::Error" do
    expect { testing._native_panic(recorder, "on purpose") }
      .to raise_error(DdprofRecorder::Error, "internal error in ddprof_recorder: on purpose")
    expect_working(recorder)
  end

  it "in the no-GVL section of an entry point become DdprofRecorder::Error" do
    expect { testing._native_panic_without_gvl(recorder, "without the GVL") }
      .to raise_error(DdprofRecorder::Error, "internal error in ddprof_recorder: without the GVL")
    expect_working(recorder)
  end

  it "in an entry point with no recorder (a module function: the guard only) become DdprofRecorder::Error" do
    expect { testing._native_panic_in_module_function("module function") }
      .to raise_error(DdprofRecorder::Error, "internal error in ddprof_recorder: module function")
  end

  it "in a by-hand reset_after_fork become DdprofRecorder::Error, and the next reset works" do
    recorder.record_sample([["before", "a.rb", 1]], [1, 1, 1])
    testing._native_panic_in_next_reset
    expect { recorder.reset_after_fork }.to raise_error(DdprofRecorder::Error, /a reset panicked on purpose/)
    expect(recorder.reset_after_fork).to be(true)
    expect_working(recorder)
  end

  it "in the reset of a forked child's first use (the fork check) become DdprofRecorder::Error" do
    skip "Process.fork is not available here" unless Process.respond_to?(:fork)

    recorder.record_sample([["parent", "p.rb", 1]], [1, 1, 1])
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      testing._native_panic_in_next_reset # a module function: no fork check, no reset
      outcome = begin
        recorder.stats
        "no exception"
      rescue DdprofRecorder::Error => e
        e.message
      end
      # The next entry point resets the recorder for real.
      recorder.record_sample([["child", "c.rb", 1]], [1, 1, 1])
      frames = samples_from(decode_pprof(recorder.serialize!)).map { _1[:frames] }
      writer.write(Marshal.dump([outcome, frames]))
      writer.close
      exit!(0)
    end
    writer.close
    status = wait_child(pid, 30)
    outcome, frames = Marshal.load(reader.read) # rubocop:disable Security/MarshalLoad
    reader.close

    expect(status&.exitstatus).to eq(0)
    expect(outcome).to match(/internal error in ddprof_recorder: a reset panicked on purpose/)
    expect(frames).to eq([[["child", "c.rb", 1]]])
    expect(serialized_samples(recorder).map { _1[:frames] }).to eq([[["parent", "p.rb", 1]]])
  end
end
