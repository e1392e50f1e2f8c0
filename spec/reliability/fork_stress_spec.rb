# frozen_string_literal: true

# Issue 4, "Fork stress": the main thread forks again and again while three threads record
# samples and another serializes in a loop, so that forks land in the middle of slot flips (the
# serializer encodes without the GVL, which is exactly when the main thread can fork). Each child
# records and serializes WITHOUT calling reset_after_fork (or anything else) first, checks what
# it gets, and exits 0. A child that hangs (a lock of a parent thread waited for) is killed after
# 10 s and fails the example. The parent's own accounting must stay exact meanwhile.
#
# FORK_STRESS_FORKS sets the number of forks (default 60).
RSpec.describe DdprofRecorder::StackRecorder, "fork stress" do
  forks = Integer(ENV.fetch("FORK_STRESS_FORKS", "60"))
  testing = DdprofRecorder::StackRecorder::Testing

  def cpu_samples(pprof)
    profile = decode_pprof(pprof)
    index = profile.sample_type.index { |t| profile.string_table[t.type] == "cpu-samples" }
    profile.sample.sum { |s| s.value[index] }
  end

  # What a child checks; returns a list of problems (empty when all is well).
  def child_problems(recorder, testing, inherited = nil)
    problems = []
    inherited&.concat(testing._native_slot_locks_before_fork_check(recorder))
    # The first use in the child: no reset_after_fork before it.
    recorder.record_sample([["child", "child.rb", 1]], [7, 1, 7], { "pid" => Process.pid })
    active = testing._native_active_slot(recorder)
    locked = [testing._native_slot_one_mutex_locked?(recorder), testing._native_slot_two_mutex_locked?(recorder)]
    problems << "slots after fork: active #{active}, locked #{locked}" unless active == 1 && locked == [false, true]
    2.times do |round|
      recorder.record_sample([["child", "child.rb", 1]], [7, 1, 7], { "pid" => Process.pid }) if round == 1
      result = recorder.serialize
      if result.nil?
        problems << "serialize #{round} returned nil"
        next
      end
      samples = samples_from(decode_pprof(result[2]))
      unless samples.size == 1 && samples[0][:frames] == [["child", "child.rb", 1]] &&
             samples[0][:values] == { "cpu-time" => 7, "cpu-samples" => 1, "wall-time" => 7 }
        problems << "serialize #{round}: expected only the child's sample, got #{samples.inspect[0, 300]}"
      end
      problems << "serialize #{round}: start after finish" if result[0] > result[1]
    end
    problems << "samples_lost #{recorder.stats[:samples_lost]}" unless recorder.stats[:samples_lost].zero?
    problems
  rescue Exception => e # rubocop:disable Lint/RescueException
    problems << "#{e.class}: #{e.message}"
  end

  it "every child records and serializes without calling reset_after_fork, and exits 0" do
    recorder = described_class.new
    stop = false
    recorded = Array.new(3, 0)
    samplers = Array.new(3) do |t|
      Thread.new do
        stacks = Array.new(300) { |s| Array.new(5 + (s % 40)) { |f| ["t#{t}_s#{s}_f#{f}", "/app/f#{f}.rb", s] } }
        i = 0
        until stop
          recorder.record_sample(stacks[i % stacks.size], [1, 1, 1], { "thread id" => t.to_s, "span" => i % 50 })
          recorded[t] += 1
          i += 1
          # Busy loops would make the forking thread wait a whole time slice (100 ms) for the GVL
          # after each of its blocking calls; a real sampler sleeps between samples anyway.
          Thread.pass if (i % 16).zero?
        end
      end
    end
    obtained = []
    serializer = Thread.new do
      obtained << recorder.serialize.fetch(2) until stop
    end

    rng = Random.new(7)
    results = Array.new(forks) do
      sleep(rng.rand * 0.01)
      # Whether a serialization was in progress (a serializer thread inside `serialize`, maybe
      # in the native flip or encoding, holding the recorder's locks) when this fork happens.
      busy = recorder.instance_variable_get(:@serialize_mutex)&.locked?
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        inherited = []
        problems = child_problems(recorder, testing, inherited)
        # One line: the slot locks as the fork left them, then any problems.
        writer.write(([inherited.inspect] + problems).join("\n"))
        writer.close
        exit!(problems.empty? ? 0 : 1)
      end
      writer.close
      status = wait_child(pid, 10)
      inherited, *problems = reader.read.split("\n")
      reader.close
      [status&.exitstatus, problems, inherited, busy]
    end

    stop = true
    (samplers + [serializer]).each { |t| expect(t.join(30)).not_to be_nil }
    failed = results.reject { |code, _| code&.zero? }
    expect(failed).to be_empty, -> { "children failed (exit code, problems): #{failed.first(5).inspect}" }
    # Both slots held (or both free) at the fork: the serializer was between the steps of a flip.
    mid_flip = results.count { |_, _, inherited| %w[[true,\ true] [false,\ false]].include?(inherited) }

    # The parent was not disturbed: every sample it recorded is in exactly one of its profiles.
    final = recorder.serialize.fetch(2)
    total = obtained.sum { |p| cpu_samples(p) } + cpu_samples(final)
    expect(total).to eq(recorded.sum)
    expect(recorder.stats).to include(samples_recorded: recorded.sum, samples_lost: 0)
    busy = results.count { |*, serializing| serializing }
    ForkStressReport.record(forks: forks, survived: results.count { |code, _| code&.zero? },
                            while_serializing: busy, mid_flip: mid_flip)
  end

  # Issue 10: the child must not unlock a lock of the parent that has a parked waiter. Such an
  # unlock goes through parking_lot's parking table and, once the waiter has waited a while,
  # hands the lock to it (eventual fairness): a thread that does not exist in the child, so the
  # lock would stay held for ever. The child of each round forks while the serializer is parked
  # on the slot a sampler holds.
  it "every child forked while a serializer is parked on a held slot records, serializes and exits 0" do
    parked_forks = Integer(ENV.fetch("FORK_PARKED_FORKS", "200"))
    recorder = described_class.new
    results = Array.new(parked_forks) do |round|
      recorder.record_sample([["parent", "p.rb", 1]], [1, 1, 1], { "round" => round })
      status = nil
      held, serialized = with_parked_serializer(recorder) do
        pid = fork { exit!(child_problems(recorder, testing).empty? ? 0 : 1) }
        status = wait_child(pid, 10)
      end
      samples = serialized && samples_from(decode_pprof(serialized[2])).map { _1[:labels] }
      [status&.exitstatus, held, samples == [{ "round" => round }]]
    end

    # nil: the child hung (killed after 10 s).
    expect(results.map(&:first).tally).to eq(0 => parked_forks)
    # The parent's serialization ended once the slot was released, with its window.
    expect(results.map { _1[1..] }.tally).to eq([true, true] => parked_forks)
    expect(recorder.stats).to include(samples_lost: 0, samples_recorded: parked_forks)
    ForkStressReport.record(parked_forks: parked_forks, parked_survived: results.count { _1[0]&.zero? })
  end

  it "resets a child of a child too" do
    recorder = described_class.new
    recorder.record_sample([["parent", "p.rb", 1]], [1, 1, 1])
    pid = fork do
      recorder.record_sample([["child", "c.rb", 1]], [1, 1, 1])
      grandchild = fork do
        problems = child_problems(recorder, testing)
        exit!(problems.empty? ? 0 : 1)
      end
      _, status = Process.wait2(grandchild)
      samples = samples_from(decode_pprof(recorder.serialize.fetch(2)))
      exit!(status.success? && samples.map { _1[:frames] } == [[["child", "c.rb", 1]]] ? 0 : 1)
    end
    expect(wait_child(pid, 20)&.exitstatus).to eq(0)
    expect(serialized_samples(recorder).map { _1[:frames] }).to eq([[["parent", "p.rb", 1]]])
  end

  it "the explicit reset_after_fork still works, in a child and in the parent" do
    recorder = described_class.new
    recorder.record_sample([["parent", "p.rb", 1]], [1, 1, 1])
    pid = fork do
      ok = recorder.reset_after_fork == true && child_problems(recorder, testing).empty?
      exit!(ok ? 0 : 1)
    end
    expect(wait_child(pid, 20)&.exitstatus).to eq(0)
    expect(recorder.reset_after_fork).to be(true)
    expect(serialized_samples(recorder)).to be_empty
  end
end

# Figures for bench/reliability (appended when FORK_REPORT_FILE is set).
module ForkStressReport
  def self.record(figures)
    path = ENV.fetch("FORK_REPORT_FILE", nil)
    File.open(path, "a") { |f| f.puts(figures.map { |k, v| "#{k}=#{v}" }.join(" ")) } if path
  end
end
