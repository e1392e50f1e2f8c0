# frozen_string_literal: true

# DdprofRecorder.merge and the views given several pprofs (lib/ddprof_recorder/pprof_views.rb),
# checked with google-protobuf (spec/support), never with the gem's own decoder.
RSpec.describe "DdprofRecorder.merge" do
  # A pprof of the profiler's value types with the given samples `[stack, values, labels]`.
  def pprof_of(samples, compression: :gzip)
    recorder = DdprofRecorder::StackRecorder.new(compression: compression)
    samples.each { |stack, values, labels| recorder.record_sample(stack, values, labels) }
    recorder.serialize!
  end

  let(:worker_one) do
    pprof_of([[[["crunch", "app.rb", 3], ["call", "app.rb", 1]], [700, 1, 800], { "process id" => 11 }],
              [[["sleep", "app.rb", 9], ["call", "app.rb", 1]], [0, 2, 900], { "process id" => 11 }]])
  end
  let(:worker_two) do
    pprof_of([[[["crunch", "app.rb", 3], ["call", "app.rb", 1]], [300, 1, 350], { "process id" => 12 }]],
             compression: :none)
  end
  let(:worker_one_later) do
    pprof_of([[[["crunch", "app.rb", 3], ["call", "app.rb", 1]], [5, 1, 5], { "process id" => 11 }]])
  end

  it "keeps every sample, adding up equal ones, and the processes apart" do
    merged = DdprofRecorder.merge([worker_one, worker_two, worker_one_later])
    expect(merged.encoding).to eq(Encoding::BINARY)
    expect(merged.b).to start_with("\x1f\x8b".b)
    samples = samples_from(decode_pprof(merged))
    expect(value_totals(samples)).to eq("cpu-time" => 1005, "cpu-samples" => 5, "wall-time" => 2055)
    by_pid = samples.group_by { |s| s[:labels]["process id"] }.transform_values { |ss| value_totals(ss)["cpu-time"] }
    expect(by_pid).to eq(11 => 705, 12 => 300)
    expect(samples.size).to eq(3) # worker one's two crunch samples are one
    expect(samples.map { |s| s[:frames].first }).to include(["crunch", "app.rb", 3], ["sleep", "app.rb", 9])

    raw = DdprofRecorder.merge([worker_one, worker_two], compression: :none)
    expect(raw.b).not_to start_with("\x1f\x8b".b)
    expect(value_totals(samples_from(decode_pprof(raw)))["cpu-time"]).to eq(1000)
  end

  it "spans from the earliest start to the latest finish" do
    first = DdprofRecorder.summary(worker_one)
    last = DdprofRecorder.summary(worker_one_later)
    merged = DdprofRecorder.summary(DdprofRecorder.merge([worker_one_later, worker_one]))
    expect(merged[:start]).to eq(first[:start])
    expect(merged[:finish]).to eq(last[:finish])
  end

  it "is what the views see when given an Array" do
    all = [worker_one, worker_two, worker_one_later]
    merged = DdprofRecorder.merge(all)
    expect(DdprofRecorder.top(all)).to eq(DdprofRecorder.top(merged))
    expect(DdprofRecorder.top(all)[:rows].first).to include(name: "crunch", self: 1005)
    expect(DdprofRecorder.folded(all, group_by: "process id")).to eq(
      "process id=11;call;crunch 705\nprocess id=12;call;crunch 300\n",
    )
    expect(DdprofRecorder.flamegraph(all)).to eq(DdprofRecorder.flamegraph(merged))
    summary = DdprofRecorder.summary(all)
    expect(summary[:totals]).to eq("cpu-time" => 1005, "cpu-samples" => 5, "wall-time" => 2055)
    expect(summary[:process_ids]).to eq([11, 12])
    expect(DdprofRecorder.top([worker_two])).to eq(DdprofRecorder.top(worker_two))
  end

  it "keeps every distinct comment once, in the order they first appear" do
    commented = lambda do |comments|
      recorder = DdprofRecorder::StackRecorder.new
      recorder.comments = comments
      recorder.record_sample([["crunch", "app.rb", 3]], [1, 1, 1])
      recorder.serialize!
    end
    inputs = [commented.call(["sampling: ticks", "process 11"]), worker_two,
              commented.call(["process 12", "sampling: ticks", "process 12"])]
    merged = decode_pprof(DdprofRecorder.merge(inputs))
    expect(merged.comment.map { |i| merged.string_table[i] }).to eq(["sampling: ticks", "process 11", "process 12"])
    expect(merged.string_table.to_a.uniq).to eq(merged.string_table.to_a)
    expect(decode_pprof(DdprofRecorder.merge([worker_one, worker_two])).comment.to_a).to eq([])
  end

  it "refuses different value types with DdprofRecorder::Error, and bad input with ArgumentError or TypeError" do
    alloc = DdprofRecorder::StackRecorder.new(value_types: [%w[alloc-samples count]])
    alloc.record_sample([["new", "a.rb", 1]], [1])
    alloc = alloc.serialize!
    expect { DdprofRecorder.merge([worker_one, alloc]) }.to raise_error(
      DdprofRecorder::Error,
      "pprofs[0] has the value types cpu-time/nanoseconds, cpu-samples/count, wall-time/nanoseconds and " \
      "pprofs[1] has alloc-samples/count: only profiles of the same value types merge",
    )
    expect { DdprofRecorder.top([worker_one, alloc]) }.to raise_error(DdprofRecorder::Error, /pprofs\[1\] has alloc/)
    expect { DdprofRecorder.merge([worker_one, "not a pprof"]) }
      .to raise_error(ArgumentError, /\Approfs\[1\]: not a pprof profile: /)
    expect { DdprofRecorder.folded([worker_one, ""]) }
      .to raise_error(ArgumentError, "pprofs[1]: not a pprof profile: the input is empty")
    expect { DdprofRecorder.merge([]) }.to raise_error(ArgumentError, /pprofs is empty/)
    expect { DdprofRecorder.merge([worker_one, 42]) }.to raise_error(TypeError, "pprofs[1] must be a String, got Integer")
    expect { DdprofRecorder.merge(worker_one) }.to raise_error(TypeError, /Array of Strings, got String/)
    expect { DdprofRecorder.merge([worker_one], compression: :zstd) }.to raise_error(ArgumentError, /compression/)
    expect { DdprofRecorder.top([worker_one, worker_two], value: "alloc") }
      .to raise_error(ArgumentError, /unknown value type "alloc"/)
  end

  it "builds its Ruby results safely (GC.stress under GC_STRESS=1)", gc_stress: true do
    merged = DdprofRecorder.merge([worker_one, worker_two])
    expect(value_totals(samples_from(decode_pprof(merged)))["cpu-time"]).to eq(1000)
    expect(DdprofRecorder.summary([worker_one, worker_two])[:process_ids]).to eq([11, 12])
  end
end
