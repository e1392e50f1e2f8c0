# frozen_string_literal: true

require "logger"
require "stringio"

# docs/design.md, section 3 (windows): `serialize`, `serialize!`, `clear`, their timestamps, logging and error
# paths, and the one-serializer guard.
RSpec.describe DdprofRecorder::StackRecorder do
  subject(:stack_recorder) { described_class.new }

  let(:frame) { ["do_work", "/app/worker.rb", 10] }

  def serialize
    stack_recorder.serialize.tap { |result| expect(result).not_to be_nil }
  end

  describe "#serialize" do
    it "returns [start Time, finish Time, binary pprof String]", gc_stress: true do
      start, finish, encoded_pprof = serialize

      expect(start).to be_a(Time)
      expect(finish).to be_a(Time)
      expect(encoded_pprof).to be_a(String)
      expect(encoded_pprof.encoding).to eq Encoding::BINARY
      expect { decode_pprof(encoded_pprof) }.not_to raise_error
    end

    it "returns UTC times with start <= finish" do
      start, finish, = serialize

      expect(start).to be_utc
      expect(finish).to be_utc
      expect(start).to be <= finish
    end

    it "starts the first profile when the recorder is created" do
      before_new = Time.now
      recorder = described_class.new
      after_new = Time.now

      start, = recorder.serialize
      expect(start).to be_between(before_new, after_new)
    end

    it "finishes the profile at the wall-clock time of the call" do
      before_serialize = Time.now
      _, finish, = serialize
      after_serialize = Time.now

      expect(finish).to be_between(before_serialize, after_serialize)
    end

    it "starts each profile at the previous profile's finish", gc_stress: true do
      results = Array.new(4) { serialize }

      results.each_cons(2) do |(_, previous_finish, _), (next_start, next_finish, _)|
        expect(next_start).to eq previous_finish
        expect(next_start).to be <= next_finish
      end
    end

    it "chains timestamps across #clear and #serialize!" do
      _, first_finish, = serialize
      cleared_at = stack_recorder.clear
      stack_recorder.serialize!
      start, = serialize

      expect(cleared_at).to be >= first_finish
      expect(start).to be >= cleared_at
    end

    it "keeps nanoseconds: time_nanos is the start and duration_nanos is finish - start" do
      stack_recorder.record_sample([frame], [1, 1, 1])
      start, finish, encoded_pprof = serialize
      profile = decode_pprof(encoded_pprof)

      expect(profile.time_nanos).to eq unix_ns(start)
      expect(profile.duration_nanos).to eq unix_ns(finish) - unix_ns(start)
    end

    it "logs dd-trace-rb's debug line with the profile's start and finish" do
      log = StringIO.new
      DdprofRecorder.logger = Logger.new(log, level: Logger::DEBUG)

      start, finish, = serialize

      expect(log.string).to include "Encoded profile covering #{start.iso8601} to #{finish.iso8601}"
    end

    it "does not log the debug line at the default WARN level" do
      log = StringIO.new
      DdprofRecorder.logger = Logger.new(log, level: Logger::WARN)

      serialize

      expect(log.string).to eq ""
    end

    it "serializes each sample only once: the next profile does not repeat it" do
      stack_recorder.record_sample([frame], [1, 2, 3])

      expect(serialized_samples(stack_recorder).size).to eq 1
      expect(serialized_samples(stack_recorder)).to eq []
    end

    context "when the native serialization fails" do
      before do
        allow(described_class).to receive(:_native_serialize).and_return([:error, "test error message"])
      end

      it "returns nil" do
        DdprofRecorder.logger = Logger.new(StringIO.new)

        expect(stack_recorder.serialize).to be nil
      end

      it "logs the native message as an error through DdprofRecorder.logger" do
        logger = Logger.new(StringIO.new)
        DdprofRecorder.logger = logger
        expect(logger).to receive(:error).with(/test error message/)

        stack_recorder.serialize
      end
    end

    # A pprof of 4 MiB or more goes into a String made before the window is encoded, as large as
    # the previous window's pprof needed, or into a new one if it does not fit; a smaller one
    # into a String of its own size. 40,000 stacks with incompressible names make ~7 MB raw and
    # ~5 MB gzip; 5,000 make under 1 MB.
    [:none, :gzip].each do |compression|
      it "hands back every sample as pprofs grow and shrink between windows (compression: #{compression})" do
        recorder = described_class.new(compression: compression)
        [10, 40_000, 5_000, 40_000, 41_000, 10, 0].each do |distinct_stacks|
          distinct_stacks.times do |i|
            name = "#{i}-#{Random.new(i).bytes(60).unpack1("H*")}"
            recorder.record_sample([[name, "/app/file_#{i % 97}.rb", i], frame], [i, 1, 2])
          end
          _, _, pprof = recorder.serialize

          expect(pprof.bytesize).to eq(recorder.stats[:last_serialization_bytes])
          samples = samples_from(decode_pprof(pprof))
          expect(samples.size).to eq(distinct_stacks)
          expect(value_totals(samples)["cpu-time"].to_i).to eq((0...distinct_stacks).sum)
        end
      end
    end

    it "calls _native_serialize with the recorder (the thin-wrapper contract)" do
      expect(described_class).to receive(:_native_serialize).with(stack_recorder).and_call_original

      serialize
    end
  end

  describe "#serialize!" do
    it "returns the pprof String alone" do
      stack_recorder.record_sample([frame], [4, 5, 6])

      encoded_pprof = stack_recorder.serialize!

      expect(encoded_pprof).to be_a(String)
      expect(samples_from(decode_pprof(encoded_pprof)))
        .to eq [{ frames: [frame], values: { "cpu-time" => 4, "cpu-samples" => 5, "wall-time" => 6 }, labels: {} }]
    end

    it "raises DdprofRecorder::Error with the native message when the native serialization fails" do
      allow(described_class).to receive(:_native_serialize).and_return([:error, "test error message"])

      expect { stack_recorder.serialize! }.to raise_error(DdprofRecorder::Error, /test error message/)
    end
  end

  describe "#clear" do
    it "returns the finish Time, taken during the call", gc_stress: true do
      before_clear = Time.now
      finish = stack_recorder.clear
      after_clear = Time.now

      expect(finish).to be_a(Time)
      expect(finish).to be_utc
      expect(finish).to be_between(before_clear, after_clear)
    end

    it "drops everything recorded so far, and the next profile starts at its finish" do
      stack_recorder.record_sample([frame], [1, 1, 1])
      stack_recorder.record_endpoint(1, "GET /dropped")
      finish = stack_recorder.clear

      start, _, encoded_pprof = serialize

      expect(start).to eq finish
      expect(samples_from(decode_pprof(encoded_pprof))).to eq []
    end

    it "keeps samples recorded after it" do
      stack_recorder.record_sample([["before", "a.rb", 1]], [1, 1, 1])
      stack_recorder.clear
      stack_recorder.record_sample([["after", "a.rb", 2]], [2, 2, 2])

      expect(serialized_samples(stack_recorder).map { |s| s[:frames] }).to eq [[["after", "a.rb", 2]]]
    end

    it "raises DdprofRecorder::Error with the native message when the native clear fails" do
      allow(described_class).to receive(:_native_clear).and_return([:error, "test clear message"])

      expect { stack_recorder.clear }.to raise_error(DdprofRecorder::Error, /test clear message/)
    end
  end

  describe "the native entry points" do
    it "_native_serialize returns [:ok, [start, finish, pprof]]" do
      status, (start, finish, encoded_pprof) = described_class._native_serialize(stack_recorder)

      expect(status).to eq :ok
      expect([start, finish]).to all(be_a(Time))
      expect(encoded_pprof).to be_a(String)
    end

    it "_native_clear returns [:ok, finish]" do
      status, finish = described_class._native_clear(stack_recorder)

      expect(status).to eq :ok
      expect(finish).to be_a(Time)
    end

    it "raise TypeError rather than crash when given something that is not a StackRecorder" do
      expect { described_class._native_serialize(Object.new) }.to raise_error(TypeError)
      expect { described_class._native_clear(nil) }.to raise_error(TypeError)
      expect { described_class._native_reset_after_fork("recorder") }.to raise_error(TypeError)
    end
  end

  describe "the serializer guard (one Ruby Mutex per recorder)" do
    # Holds every _native_serialize / _native_clear call open until released, and records how
    # many were inside at once.
    let(:entered) { Queue.new }
    let(:release) { Queue.new }
    let(:counts) { { inside: 0, max_inside: 0 } }

    before do
      lock = Mutex.new
      %i[_native_serialize _native_clear].each do |method_name|
        allow(described_class).to receive(method_name).and_wrap_original do |original, recorder|
          lock.synchronize { counts[:max_inside] = [counts[:max_inside], counts[:inside] += 1].max }
          entered << method_name
          release.pop
          lock.synchronize { counts[:inside] -= 1 }
          original.call(recorder)
        end
      end
    end

    it "lets only one of serialize, serialize! and clear run at a time" do
      first = Thread.new { stack_recorder.serialize }
      entered.pop # `first` is inside _native_serialize, holding the guard
      others = [
        Thread.new { stack_recorder.serialize! },
        Thread.new { stack_recorder.clear },
        Thread.new { stack_recorder.serialize },
      ]
      # The others wait on the guard (sleeping), none of them inside a native call.
      wait_until("the other serializers wait on the guard") { others.all? { |thread| thread.status == "sleep" } }
      expect(entered.size).to eq 0

      4.times { release << true }
      [first, *others].each(&:join)

      expect(counts[:max_inside]).to eq 1
      expect(entered.size).to eq 3
    end

    it "is not shared between recorders" do
      other = described_class.new

      first = Thread.new { stack_recorder.serialize }
      entered.pop
      second = Thread.new { other.serialize }
      entered.pop # the other recorder got in while the first one is still inside

      2.times { release << true }
      expect([first.value, second.value]).to all(be_an(Array))
      expect(counts[:max_inside]).to eq 2
    end
  end
end
