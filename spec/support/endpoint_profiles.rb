# frozen_string_literal: true

# A web server's profile for the views by label (spec/views/label_views_spec.rb and the CLI
# specs of --by, --label and --group-by): requests of two endpoints on two threads and two
# processes, labelled by the recorder's record_endpoint as the profiler's would be, and samples
# outside any request.
module EndpointProfiles
  HEAVY = "PagesController#heavy"
  INDEX = "PagesController#index"
  DISPATCH = ["dispatch", "metal.rb", 1].freeze
  # `[stack (leaf first), [cpu-time, cpu-samples, wall-time], labels]`; span 1 and 2 are
  # HEAVY, 3 is INDEX. cpu-time: HEAVY 750 ms, INDEX 200 ms, outside any endpoint 50 ms.
  SAMPLES = [
    [[["render_json", "pages.rb", 3], ["heavy", "pages.rb", 10], DISPATCH], [700_000_000, 70, 710_000_000],
     { "local root span id" => 1, "thread name" => "puma 1", "process id" => 11 }],
    [[["heavy", "pages.rb", 12], DISPATCH], [50_000_000, 5, 60_000_000],
     { "local root span id" => 2, "thread name" => "puma 2", "process id" => 12 }],
    [[["index", "pages.rb", 5], DISPATCH], [200_000_000, 20, 300_000_000],
     { "local root span id" => 3, "thread name" => "puma 1", "process id" => 11 }],
    [[["sleep", "x.rb", 1], ["main", "x.rb", 1]], [0, 0, 500_000_000], { "thread name" => "main", "process id" => 11 }],
    [[["gc", "x.rb", 1]], [50_000_000, 5, 50_000_000], { "thread name" => "main", "process id" => 11 }],
  ].freeze
  ENDPOINTS = { 1 => HEAVY, 2 => HEAVY, 3 => INDEX }.freeze

  # @return [String] the pprof of SAMPLES and ENDPOINTS (the profiler's value types).
  def endpoint_pprof(compression: :none)
    recorder = DdprofRecorder::StackRecorder.new(compression: compression)
    SAMPLES.each { |stack, values, labels| recorder.record_sample(stack, values, labels) }
    ENDPOINTS.each { |span, endpoint| recorder.record_endpoint(span, endpoint) }
    recorder.serialize!
  end

  # @return [String] a pprof of dated samples (the profiler's --timeline): threads "1 (1)"
  #   (t1) and "2 (2)" (t2), each with a sample of span 1 (HEAVY) and one of span 2 (no
  #   endpoint), 10 ms of wall-time each; t1 runs in span 1, t2 waits for the GVL in it.
  def dated_endpoint_pprof
    recorder = DdprofRecorder::StackRecorder.new
    [[1, "1 (1)", 10, "running"], [2, "1 (1)", 20, "blocked"], [1, "2 (2)", 30, "waiting for GVL"],
     [2, "2 (2)", 40, "running"]].each do |span, thread, end_ms, state|
      cpu = state == "running" ? 10_000_000 : 0
      recorder.record_sample([["work", "a.rb", 1]], [cpu, 1, 10_000_000],
                             { "local root span id" => span, "thread id" => thread, "thread name" => "t#{thread[0]}",
                               "thread state" => state, "end_timestamp_ns" => end_ms * 1_000_000 })
    end
    recorder.record_endpoint(1, HEAVY)
    recorder.serialize!
  end
end

RSpec.configure { |config| config.include EndpointProfiles }
