# frozen_string_literal: true

# Accuracy workload `json` (bench/accuracy.rb): JSON of many small objects (stdlib json, its C
# generator and parser), as an API server or a log shipper makes it. No truth measured.
#
#   ruby bench/accuracy/json.rb [SECONDS]        (default 3)
#
# Each round builds a page of 40 events (small Hashes: a few Strings, Integers, a Float, a
# nested Hash and an Array; seeded, so every run makes the same ones) in Ruby, then:
# - writes each event as one log line (`JSON.generate(event)`, NDJSON),
# - answers with the page (`{ "data" => events, "meta" => ... }.to_json`),
# - reads the log lines back (`JSON.parse`) and checks a field of each.
# Each C call (`JSON::Ext::Generator::State#generate`, `Hash#to_json`, `JSON::Ext::Parser#parse`)
# takes a few microseconds: short against the Ruby around it (building the Hashes, the
# Ruby halves of `JSON.generate` and `JSON.parse`).
require "json"

module JsonWorkload
  PATHS = %w[/api/orders /api/orders/:id /api/customers /health /api/search /api/cart/items].freeze
  AGENTS = ["curl/7.88.1", "Mozilla/5.0 (X11; Linux x86_64)", "okhttp/4.12.0", "Go-http-client/1.1"].freeze
  PAGE = 40

  module_function

  def event(random, i)
    {
      "id" => i,
      "at" => 1_700_000_000 + (i * 7),
      "method" => i % 5 == 0 ? "POST" : "GET",
      "path" => PATHS[random.rand(PATHS.size)],
      "status" => random.rand(100) < 95 ? 200 : 500,
      "duration_ms" => (random.rand * 250).round(3),
      "user" => { "id" => random.rand(10_000), "name" => "user #{i % 97}", "admin" => (i % 31).zero? },
      "tags" => %w[web api v2].first(1 + (i % 3)),
      "agent" => AGENTS[i % AGENTS.size],
    }
  end

  def page(random, first)
    Array.new(PAGE) { |k| event(random, first + k) }
  end

  def round(random, first)
    events = page(random, first)
    lines = events.map { |e| JSON.generate(e) }
    body = { "data" => events, "meta" => { "first" => first, "count" => events.size, "next" => first + PAGE } }.to_json
    errors = lines.count { |line| JSON.parse(line)["status"] >= 500 }
    [body.bytesize, errors]
  end

  def run(seconds)
    random = Random.new(5)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds
    rounds = 0
    errors = 0
    while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      _, e = round(random, rounds * PAGE)
      errors += e
      rounds += 1
    end
    [rounds, errors]
  end
end

if $PROGRAM_NAME == __FILE__
  seconds = Float(ARGV.fetch(0, "3"))
  rounds, errors = JsonWorkload.run(seconds)
  puts "json: #{rounds} rounds of #{JsonWorkload::PAGE} events (#{errors} errors) in #{seconds} s"
end
