# frozen_string_literal: true

require "logger"
require "stringio"

# The windows waiting for a slow exporter: at most `max_queued_windows`; past that the oldest
# waiting one is dropped, counted in stats[:exporter] and logged. At stop, what an exporter
# that does not finish in `export_timeout` never took is counted and logged too.
RSpec.describe DdprofRecorder::Profiler, "export queue" do
  let(:log) { StringIO.new }

  before { DdprofRecorder.logger = Logger.new(log) }

  it "has documented defaults" do
    expect(described_class::DEFAULT_MAX_QUEUED_WINDOWS).to eq(4)
    expect(described_class::EXPORT_TIMEOUT).to eq(30)
  end

  it "rejects a bad bound or timeout" do
    [0, -1, 2.5, "4", nil].each do |bad|
      expect { described_class.new(exporter: proc {}, max_queued_windows: bad) }
        .to raise_error(ArgumentError, "max_queued_windows must be a positive Integer, got #{bad.inspect}")
    end
    expect { described_class.new(exporter: proc {}, max_queued_windows: BasicObject.new) }
      .to raise_error(ArgumentError, /\Amax_queued_windows must be a positive Integer, got #<BasicObject/)
    [-1, Float::INFINITY, Float::NAN, "30", nil, Complex(1, 1), BasicObject.new].each do |bad|
      expect { described_class.new(exporter: proc {}, export_timeout: bad) }
        .to raise_error(ArgumentError, /\Aexport_timeout must be a finite number of seconds >= 0, got /)
    end
  end

  it "keeps at most max_queued_windows waiting, drops the oldest, counts and logs them" do
    gate = Queue.new
    got = []
    exporter = lambda do |start, finish, _pprof|
      got << [start, finish]
      gate.pop if got.size == 1 # the first window holds the exporter until released
    end
    profiler = described_class.new(hz: 99, interval: 0.1, max_queued_windows: 3, exporter: exporter)
    profiler.start
    most_queued = 0
    wait_until("4 windows dropped", timeout: 30) do
      stats = profiler.stats[:exporter]
      most_queued = [most_queued, stats[:queued]].max
      sleep 0.005
      stats[:dropped] >= 4
    end
    expect(most_queued).to eq(3)
    gate << true
    sleep 0.1 # the exporter takes the waiting windows, and new ones
    last = profiler.stop
    stats = profiler.stats
    expect(stats[:exporter]).to include(queued: 0, failed: 0)
    expect(stats[:exporter][:dropped]).to be >= 4
    # Every window cut (the last one too) was either exported or dropped.
    expect(stats[:exporter][:exported] + stats[:exporter][:dropped]).to eq(stats[:recorder][:serializations])
    expect(stats[:exporter][:exported]).to eq(got.size)
    expect(got.last).to eq(last[0, 2])
    # The oldest were dropped: one gap, right after the window that held the exporter; from
    # there on the windows are contiguous up to the last one.
    expect(got[1][0]).to be > got[0][1]
    got.drop(1).each_cons(2) { |a, b| expect(b[0]).to eq(a[1]) }
    expect(log.string).to match(/WARN -- : profiler: the exporter is behind \(3 windows waiting: max_queued_windows\): dropped the oldest waiting window \(.+ UTC to .+ UTC\); 1 dropped so far/)
    expect(log.string).to include("; #{stats[:exporter][:dropped]} dropped so far")
  end

  it "counts and logs, at stop, the windows an exporter that did not finish in export_timeout never took" do
    # Stuck on each window in its thread (an upload that hangs); the last one, which stop
    # hands over itself, goes through.
    exporter = ->(*) { sleep 30 if Thread.current.name == "ddprof_recorder exporter" }
    profiler = described_class.new(hz: 99, interval: 0.1, max_queued_windows: 2, export_timeout: 0.2, exporter: exporter)
    profiler.start
    wait_until("2 windows waiting", timeout: 30) { profiler.stats[:exporter][:queued] == 2 }
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    last = profiler.stop
    took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
    expect(last[2]).to be_a(String)
    expect(took).to be_between(0.2, 5) # export_timeout, then the kill
    stats = profiler.stats[:exporter]
    expect(stats).to include(queued: 0, exported: 1) # the last window, in stop
    expect(stats[:exported] + stats[:dropped]).to eq(profiler.stats[:recorder][:serializations])
    # The 2 waiting and the one it was stuck on (the first: any other was dropped when cut).
    expect(log.string).to match(/WARN -- : profiler: ddprof_recorder exporter did not stop in 0.2 s; killing it: 3 windows not exported \(#{stats[:dropped]} dropped in all\)/)
  end

  it "reports no exporter stats without an exporter" do
    profiler = described_class.new(hz: 99)
    profiler.start
    profiler.stop
    expect(profiler.stats).not_to have_key(:exporter)
  end
end
