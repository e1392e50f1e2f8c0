# frozen_string_literal: true

require "json"
require "tmpdir"
require_relative "../../bench/support/server_bench"

# The arithmetic the server benches share (bench/support/server_bench.rb: bench/rails_endpoints.rb,
# bench/sinatra_endpoints.rb), on hand-made inputs; the servers themselves are not run here.
RSpec.describe BenchServer do
  describe ".compare_endpoints" do
    it "gives the largest gap in points between the labelled cpu-time's shares and the truth's, and the coverage" do
      truth = { "A#heavy" => 600, "A#light" => 300, "B#json" => 100 }
      ours = { "A#heavy" => 480, "A#light" => 270, "B#json" => 50, nil => 100 } # 100 outside any endpoint

      compared = described_class.compare_endpoints(truth, ours)
      expect(compared[:truth]).to eq("A#heavy" => 60.0, "A#light" => 30.0, "B#json" => 10.0)
      expect(compared[:ours]).to eq("A#heavy" => 60.0, "A#light" => 33.75, "B#json" => 6.25)
      expect(compared[:gap]).to be_within(1e-9).of(3.75)
      expect(compared[:coverage]).to be_within(1e-12).of(0.8)
    end

    it "counts an endpoint only one side has as a gap of its whole share" do
      compared = described_class.compare_endpoints({ "GET /a" => 90, "GET /b" => 10 }, { "GET /a" => 90, "GET" => 10 })
      expect(compared[:gap]).to be_within(1e-9).of(10.0)
      expect(described_class.endpoint_detail(compared)).to eq("GET 10.0/0.0, GET /a 90.0/90.0, GET /b 0.0/10.0")
    end

    it "has a zero coverage and no shares without a truth or a label" do
      compared = described_class.compare_endpoints({}, { nil => 5 })
      expect(compared).to eq(gap: 0.0, coverage: 0.0, ours: {}, truth: {})
    end
  end

  describe ".read_truth" do
    it "adds up the CPU of the files that the app's processes wrote" do
      Dir.mktmpdir do |dir|
        prefix = File.join(dir, "truth.json")
        File.write("#{prefix}.101", JSON.generate("GET /a" => { "requests" => 3, "cpu_ns" => 30 }))
        File.write("#{prefix}.102", JSON.generate("GET /a" => { "requests" => 1, "cpu_ns" => 12 },
                                                  "GET /b" => { "requests" => 2, "cpu_ns" => 7 }))
        expect(described_class.read_truth(prefix)).to eq("GET /a" => 42, "GET /b" => 7)
      end
    end
  end

  describe ".wrk_rps" do
    it "reads wrk's requests per second" do
      report = "Running 5s test @ http://127.0.0.1:3000/\n  2 threads and 8 connections\n" \
               "  486 requests in 5.01s, 1.2MB read\nRequests/sec:     97.02\nTransfer/sec:    240.12KB\n"
      expect(described_class.wrk_rps(report)).to eq(97.02)
      expect(described_class.wrk_rps("unable to connect to 127.0.0.1:3000 Connection refused")).to eq(0.0)
    end
  end

  describe ".alternate" do
    it "runs each pair's two kinds, plain first in even rounds, and gives their values by kind" do
      calls = []
      pairs = described_class.alternate(3) do |kind, round|
        calls << [round, kind]
        "#{kind}#{round}"
      end
      expect(calls).to eq([[0, :plain], [0, :profiled], [1, :profiled], [1, :plain], [2, :plain], [2, :profiled]])
      expect(pairs).to eq([{ plain: "plain0", profiled: "profiled0" }, { plain: "plain1", profiled: "profiled1" },
                           { plain: "plain2", profiled: "profiled2" }])
    end
  end
end
