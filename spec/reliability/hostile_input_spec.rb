# frozen_string_literal: true

# Issue 4, "Hostile input from Ruby": a property test. A seeded generator builds thousands of
# random arguments for record_sample, record_endpoint and the constructor, valid or malformed
# (wrong types, nils, huge and negative numbers, deep and cyclic arrays, frozen and non-UTF-8
# strings, String subclasses, objects whose to_s / to_str / to_int raise, ...), and knows for
# each whether it is valid. Every call must then either succeed (valid) or raise ArgumentError /
# TypeError (RangeError too for a constructor bignum) and record nothing; the next serialize must
# hold exactly the valid samples (decoded with google-protobuf), and stats must count them.
#
# HOSTILE_SEED=n picks another sequence (the default is fixed, so CI is repeatable);
# HOSTILE_ROUNDS=n runs more rounds. A failure message names the seed, round and call.
#
# Ruby does not let Integer be subclassed usefully (`Class.new(Integer).new` raises
# NoMethodError: Integer has no allocator), so "Integer subclasses" are objects that pretend to
# be Integers (to_int, to_i, coerce, is_a? overridden): they must be TypeErrors.
module HostileInput
  # The text the recorder keeps for a String's bytes: valid UTF-8 as is, whatever the encoding
  # tag; invalid sequences as U+FFFD (Rust's from_utf8_lossy and Ruby's scrub agree on the
  # maximal-subpart rule for the byte patterns used here).
  def self.norm(string)
    utf8 = string.b.force_encoding(Encoding::UTF_8)
    utf8.valid_encoding? ? utf8 : utf8.scrub("\uFFFD")
  end

  # The canonical key of a local root span id: an Integer equals the String of its digits.
  def self.span_key(text)
    text.match?(/\A-?(0|[1-9][0-9]*)\z/) && text != "-0" && Integer(text).bit_length < 64 ? Integer(text) : text
  end

  # A short description of generated arguments for failure messages (inspect may raise here).
  def self.show(args)
    parts = args.map do |arg|
      arg.inspect[0, 400]
    rescue StandardError, NoMethodError => e
      "(not inspectable: #{e.class})"
    end
    parts.join(", ")
  end

  INT64 = (-(2**63))..((2**63) - 1)
  ALLOWED = [ArgumentError, TypeError].freeze

  class HostileString < String; end
  class HostileArray < Array; end
  class HostileHash < Hash; end
  class HostileError < StandardError; end

  # Produces random arguments, each with whether it is valid and, if so, what the recorder
  # should keep of it.
  class Generator
    attr_reader :rng

    # small: short stacks only (for GC.stress, where every allocation is a full GC).
    def initialize(rng, small: false)
      @rng = rng
      @small = small
      @locations = caller_locations(0) # real Thread::Backtrace::Location objects
    end

    def pick(list) = list[rng.rand(list.size)]

    def chance(percent) = rng.rand(100) < percent

    # Objects that are no valid String, Integer, Array or Hash argument, whatever they claim.
    def impostor
      pick([
        -> { nil }, -> { true }, -> { 1.5 }, -> { Float::NAN }, -> { Rational(1, 2) }, -> { 1i },
        -> { :sym }, -> { Object.new }, -> { BasicObject.new }, -> { Class }, -> { -> {} },
        -> { Struct.new(:a, :b, :c).new("f", "f.rb", 1) }, -> { (1..3) }, -> { Time.at(0) },
        -> { raising(:to_s) }, -> { raising(:to_str) }, -> { raising(:to_int) }, -> { raising(:to_ary) },
        -> { raising(:to_hash) }, -> { fake_integer }, -> { fake_string }, -> { fake_array },
        -> { cyclic_array }, -> { deep_array(rng.rand(1..2_000)) },
      ]).call
    end

    # An impostor that can be a Hash key (BasicObject has no #hash).
    def impostor_key
      loop do
        obj = impostor
        return obj unless BasicObject === obj && !(Object === obj) # rubocop:disable Style/CaseEquality
      end
    end

    def raising(method)
      Object.new.tap { |o| o.define_singleton_method(method) { |*| raise HostileError, "#{method} raised" } }
    end

    def fake_integer
      Object.new.tap do |o|
        o.define_singleton_method(:to_int) { 1 }
        o.define_singleton_method(:to_i) { 1 }
        o.define_singleton_method(:is_a?) { |klass| klass == Integer || super(klass) }
        o.define_singleton_method(:coerce) { |other| [other, 1] }
      end
    end

    def fake_string
      Object.new.tap do |o|
        o.define_singleton_method(:to_str) { "fake" }
        o.define_singleton_method(:to_s) { "fake" }
      end
    end

    def fake_array
      Object.new.tap do |o|
        o.define_singleton_method(:to_ary) { [["f", "f.rb", 1]] }
        o.define_singleton_method(:to_a) { [["f", "f.rb", 1]] }
        o.define_singleton_method(:each) { |&block| [["f", "f.rb", 1]].each(&block) }
      end
    end

    def cyclic_array
      a = ["f", "f.rb"]
      a << a
      a
    end

    def deep_array(depth)
      (1..depth).reduce(["f", "f.rb", 1]) { |inner, _| [inner] }
    end

    # [String, kept text]
    def good_text
      text = pick([
        -> { "" }, -> { "main" }, -> { "Foo::Bar#baz" }, -> { "/app/models/user.rb" }, -> { "é" },
        -> { "😀 emoji" }, -> { "a\0b" }, -> { "x" * rng.rand(1..5_000) }, -> { "frozen".freeze },
        -> { "\xff".b }, -> { "caf\xe9".b.force_encoding(Encoding::ISO_8859_1) },
        -> { "\xe2\x82".dup.force_encoding(Encoding::UTF_8) }, -> { "a\xf0\x9f\x98b".b },
        -> { "ab".encode(Encoding::UTF_16LE) }, -> { HostileString.new("subclass") },
        -> { "with raising to_s".dup.tap { |s| s.define_singleton_method(:to_s) { raise HostileError } } },
        -> { "with raising to_str".dup.tap { |s| s.define_singleton_method(:to_str) { raise HostileError } } },
        -> { "r#{rng.rand(1_000)}" },
      ]).call
      [text, HostileInput.norm(text)]
    end

    # [Integer, value] in signed 64-bit range
    def good_int
      n = pick([0, 1, -1, 42, (2**31), (2**62), (2**63) - 1, -(2**63), rng.rand(-10**9..10**9)])
      [n, n]
    end

    def bad_int
      pick([-> { 2**63 }, -> { -(2**63) - 1 }, -> { 10**40 }, -> { -(10**40) }, -> { 2**64 },
            -> { "1" }, -> { 1.0 }, -> { impostor }]).call
    end

    def bad_text = pick([-> { impostor }, -> { 1 }, -> { 2**70 }, -> { :symbol }]).call

    # [location, valid?, [name, filename, line]]
    def location
      case rng.rand(20)
      when 0..13
        name, kept_name = good_text
        file, kept_file = good_text
        line, kept_line = good_int
        frame = chance(50) ? [name, file, line] : HostileArray[name, file, line]
        [chance(50) ? frame.freeze : frame, true, [kept_name, kept_file, kept_line]]
      when 14
        loc = pick(@locations)
        [loc, true, [loc.base_label.to_s, loc.path.to_s, loc.lineno]]
      when 15
        name, = good_text
        file, = good_text
        line, = good_int
        slot = rng.rand(3)
        frame = [name, file, line]
        frame[slot] = slot == 2 ? bad_int : bad_text
        [frame, false, nil]
      when 16
        [Array.new(pick([0, 1, 2, 4, 5])) { good_text.first }, false, nil]
      when 17
        [pick([cyclic_array, deep_array(rng.rand(1..50))]), false, nil]
      else
        [impostor, false, nil]
      end
    end

    # [locations, valid?, kept frames leaf first]
    def locations
      return [impostor, false, nil] if chance(4)

      size = @small ? rng.rand(0..4) : pick([0, 1, 2, 3, 5, 8, 13, rng.rand(0..40), rng.rand(0..600)])
      frames = Array.new(size) { chance(97) ? location_good : location }
      valid = frames.all? { |_, ok, _| ok }
      list = frames.map(&:first)
      list = HostileArray.new(list) if chance(10)
      [list, valid, valid ? frames.map(&:last) : nil]
    end

    def location_good
      loop do
        loc = location
        return loc if loc[1]
      end
    end

    VALUE_TYPES = %w[cpu-time cpu-samples wall-time].freeze

    # [values, valid?, [v0, v1, v2]]
    def values
      case rng.rand(10)
      when 0..5
        list = Array.new(3) { good_int.first }
        if chance(10)
          list[rng.rand(3)] = bad_int
          return [list, false, nil]
        end
        return [list.dup.tap { _1.pop }, false, nil] if chance(3)
        return [list + [1], false, nil] if chance(3)

        [list, true, list]
      when 6..8
        hash = chance(20) ? HostileHash.new : {}
        hash.compare_by_identity if chance(5)
        kept = [0, 0, 0]
        valid = true
        seen = {}
        rng.rand(0..4).times do
          name = pick(VALUE_TYPES + ["heap-size", ""])
          key = pick([-> { name.dup }, -> { name.to_sym }, -> { HostileString.new(name) }, -> { impostor_key }]).call
          value = chance(90) ? good_int.first : bad_int
          next if hash.key?(key)

          hash[key] = value
          name = label_key_name(key)
          index = name && VALUE_TYPES.index(name)
          valid = false unless index && !seen[name] && Integer === value && INT64.cover?(value)
          seen[name] = true if name
          kept[index] = value if index && Integer === value
        end
        [hash, valid, valid ? kept : nil]
      else
        [impostor, false, nil]
      end
    end

    LABEL_KEYS = ["thread id", "thread name", "local root span id", "trace endpoint", "", "span id",
                  "é", "\xff".b, "k"].freeze

    # [labels, valid?, [[key, value], ...] as kept]
    def labels
      return [nil, true, []] if chance(30)
      return [pick([1, "labels", :labels, 1.5, Object.new, fake_array, raising(:to_hash), cyclic_array]), false, nil] if chance(3)

      pairs = Array.new(rng.rand(0..5)) { label_pair }
      names = pairs.map { |p| p[2]&.first }
      valid = pairs.all? { |_, ok, _| ok } && names.uniq.size == names.size &&
              names.none? { |n| n == "" || n == "trace endpoint" }
      kept = valid ? pairs.map(&:last) : nil
      if chance(50) && pairs.map(&:first).all? { Array === _1 && _1.size == 2 && Object === _1[0] }
        hash = {}
        pairs.each { |(key, value), _, _| hash[key] = value }
        # A Hash cannot hold one key twice: the generated duplicates collapse, so recompute.
        return label_hash_case(hash)
      end
      list = pairs.map(&:first)
      [list, valid, kept]
    end

    def label_hash_case(hash)
      kept = []
      valid = true
      hash.each do |key, value|
        name = label_key_name(key)
        kept_value = label_value(value)
        valid = false if name.nil? || kept_value.nil? || name == "" || name == "trace endpoint"
        kept << [name, kept_value&.last]
      end
      names = kept.map(&:first)
      valid &&= names.uniq.size == names.size
      [hash, valid, valid ? kept : nil]
    end

    def label_key_name(key)
      case key
      when String then HostileInput.norm(key)
      when Symbol then HostileInput.norm(key.name)
      end
    end

    # [kind, kept] or nil when invalid
    def label_value(value)
      case value
      when String then [:str, HostileInput.norm(value)]
      when Integer then INT64.cover?(value) ? [:num, value] : nil # rubocop:disable Style/CaseEquality
      end
    end

    # [pair, valid?, [key name, kept value]]
    def label_pair
      return [pick([impostor, ["only key"], ["k", 1, 2]]), false, nil] if chance(3)

      name = pick(LABEL_KEYS)
      key = case rng.rand(10)
            when 0..5 then name.dup
            when 6..7 then name.to_sym
            when 8 then HostileString.new(name)
            else impostor_key
            end
      value = case rng.rand(10)
              when 0..4 then good_text.first
              when 5..8 then good_int.first
              else pick([bad_int, impostor])
              end
      name = label_key_name(key)
      kept_value = label_value(value)
      valid = !name.nil? && !kept_value.nil?
      [[key, value], valid, [name, kept_value&.last]]
    end

    # [id, valid?, span key] for record_endpoint
    def span_id
      case rng.rand(10)
      when 0..3 then pick([[1, true, 1], [42, true, 42], [-7, true, -7], [2**64, true, (2**64).to_s],
                           [(2**63) - 1, true, (2**63) - 1]])
      when 4..7
        text = pick(["1", "42", "042", "-0", "abc", (2**64).to_s, "", "\xff".b, HostileString.new("42")])
        [text, true, HostileInput.span_key(
          HostileInput.norm(text)
        )]
      else [pick([nil, :sym, 1.5, impostor, raising(:to_s)]), false, nil]
      end
    end
  end

  # The samples the profile should hold, from the calls that succeeded: {[frames, labels] => values}
  # in the shape PprofHelpers#samples_from decodes (labels sorted; a "" string label reads as 0).
  class Expectation
    attr_reader :samples

    def initialize(max_frames)
      @max_frames = max_frames
      @samples = Hash.new { |h, k| h[k] = [0, 0, 0] }
      @endpoints = {}
    end

    # Keyed like the recorder's aggregation (labels in any order are one set; a String and an
    # Integer label value differ), summed with the recorder's saturating add.
    def add(frames, values, labels)
      frames = truncate(frames)
      key = [frames, labels.sort_by { |k, _| k }]
      sums = @samples[key]
      values.each_with_index { |v, i| sums[i] = (sums[i] + v).clamp(INT64.min, INT64.max) }
    end

    def endpoint(span_key, endpoint)
      @endpoints[span_key] = endpoint
    end

    def truncate(frames)
      return frames if frames.size <= @max_frames

      kept = frames.first(@max_frames - 1)
      kept + [["", "#{frames.size - kept.size} frames omitted", 0]]
    end

    def resolved
      out = Hash.new { |h, k| h[k] = [0, 0, 0] }
      @samples.each do |(frames, labels), values|
        labels = labels.dup
        span = labels.find { |k, _| k == "local root span id" }
        if span
          key = Integer === span[1] ? span[1] : HostileInput.span_key(span[1])
          labels << ["trace endpoint", @endpoints[key]] if @endpoints.key?(key)
        end
        labels = labels.map { |k, v| [k, v == "" ? 0 : v] }.sort_by { |k, _| k }
        sums = out[[frames, labels]]
        values.each_with_index { |v, i| sums[i] += v }
      end
      out
    end
  end

  # Counts of inputs tried, for bench/reliability (printed when HOSTILE_STATS_FILE is set).
  module Stats
    @counts = Hash.new(0)

    def self.add(key, n)
      @counts[key] += n
      path = ENV.fetch("HOSTILE_STATS_FILE", nil)
      File.write(path, @counts.map { |k, v| "#{k} #{v}" }.join("\n") << "\n") if path
    end
  end
end

RSpec.describe DdprofRecorder::StackRecorder, "hostile input" do
  seed = Integer(ENV.fetch("HOSTILE_SEED", "20261130"))
  rounds = Integer(ENV.fetch("HOSTILE_ROUNDS", "40"))

  # Under GC_STRESS=1 only the recorder's own calls run with GC.stress: generating arguments,
  # decoding profiles and RSpec's matchers are the spec's work, and would take hours with it.
  def stressed(stress)
    GC.stress = stress
    yield
  ensure
    GC.stress = false
  end

  def decode_samples(pprof)
    out = Hash.new { |h, k| h[k] = [0, 0, 0] }
    samples_from(decode_pprof(pprof)).each do |sample|
      labels = sample[:labels].to_a.sort_by { |k, _| k }
      sums = out[[sample[:frames], labels]]
      sample[:values].values.each_with_index { |v, i| sums[i] += v }
    end
    out
  end

  def expect_allowed(raised, what)
    expect(HostileInput::ALLOWED.any? { raised.is_a?(_1) }).to be(true),
                                                 -> { "#{what.call}: expected ArgumentError/TypeError, got #{raised.inspect}" }
  end

  # Runs `calls` random record_sample / record_endpoint calls on a fresh recorder, then checks
  # the serialized profile and the stats. Returns the number of calls made.
  def run_round(gen, calls, where)
    stress = GC.stress
    GC.stress = false
    max_frames = gen.pick([2, 3, 5, 8, 64, 400])
    compression = gen.pick(%i[none gzip])
    recorder = stressed(stress) { described_class.new(max_frames: max_frames, compression: compression) }
    expectation = HostileInput::Expectation.new(max_frames)
    recorded = rejected = 0
    calls.times do |call|
      if gen.chance(85)
        locations, locations_ok, frames = gen.locations
        values, values_ok, kept_values = gen.values
        labels, labels_ok, kept_labels = gen.labels
        what = lambda {
          "#{where}, call #{call}, valid: #{[locations_ok, values_ok, labels_ok]}, " \
            "args: #{HostileInput.show([locations, values, labels])}"
        }
        raised = result = nil
        stressed(stress) do
          result = recorder.record_sample(locations, values, labels)
        rescue Exception => e # rubocop:disable Lint/RescueException -- anything else is the bug we look for
          raised = e
        end
        if locations_ok && values_ok && labels_ok
          expect(raised).to be_nil, -> { "#{what.call}: a valid sample raised #{raised.inspect}" }
          expect(result).to be_nil
          expectation.add(frames, kept_values, kept_labels)
          recorded += 1
        else
          expect_allowed(raised, what)
          rejected += 1
        end
      else
        id, id_ok, span_key = gen.span_id
        endpoint, kept_endpoint = gen.chance(90) ? gen.good_text : [gen.bad_text, nil]
        what = -> { "#{where}, call #{call}, args: #{HostileInput.show([id, endpoint])}" }
        raised = nil
        stressed(stress) do
          recorder.record_endpoint(id, endpoint)
        rescue Exception => e # rubocop:disable Lint/RescueException
          raised = e
        end
        if id_ok && kept_endpoint
          expect(raised).to be_nil, -> { "#{what.call}: a valid endpoint raised #{raised.inspect}" }
          expectation.endpoint(span_key, kept_endpoint)
        else
          expect_allowed(raised, what)
        end
      end
    end
    result = stressed(stress) { recorder.serialize }
    expect(result).not_to be_nil
    profile = decode_samples(result[2])
    expect(profile == expectation.resolved).to be(true), lambda {
      "#{where}: the profile does not hold exactly the valid samples:\n#{profile}\n#{expectation.resolved}"
    }
    stats = stressed(stress) { recorder.stats }
    expect(stats).to include(samples_recorded: recorded, samples_rejected: rejected, samples_lost: 0,
                             samples_dropped: 0)
    calls
  ensure
    GC.stress = stress
  end

  it "accepts exactly the valid record_sample / record_endpoint calls and the profile holds exactly them" do
    total = 0
    rounds.times do |round|
      gen = HostileInput::Generator.new(Random.new(seed + round))
      total += run_round(gen, 150, "seed #{seed}, round #{round}")
    end
    expect(total).to eq(rounds * 150)
    HostileInput::Stats.add(:record_calls, total)
  end

  it "does the same under GC.stress (fewer calls)", gc_stress: true do
    stressed = ENV["GC_STRESS"] == "1"
    gen = HostileInput::Generator.new(Random.new(seed - 1), small: stressed)
    calls = stressed ? 12 : 150
    # run_round checks each call and the profile against what it expects; every call is counted.
    made = run_round(gen, calls, "seed #{seed - 1}, gc round")
    expect(made).to eq(calls)
    HostileInput::Stats.add(:record_calls, made)
  end

  describe "a Thread::Backtrace::Location whose methods misbehave" do
    it "is a TypeError when base_label, path or lineno return the wrong type, and records nothing" do
      recorder = described_class.new
      %i[base_label path lineno].each do |method|
        location = caller_locations(0).first
        location.define_singleton_method(method) { 1.5 }
        expect { recorder.record_sample([location], [1, 1, 1]) }.to raise_error(TypeError, /locations\[0\]/)
      end
      expect(serialized_samples(recorder)).to be_empty
    end

    it "propagates an exception its own method raises, unchanged, and records nothing" do
      recorder = described_class.new
      location = caller_locations(0).first
      location.define_singleton_method(:path) { raise HostileInput::HostileError, "path raised" }
      expect { recorder.record_sample([location], [1, 1, 1]) }.to raise_error(HostileInput::HostileError)
      expect(recorder.stats[:samples_rejected]).to eq(1)
      expect(serialized_samples(recorder)).to be_empty
    end
  end

  describe "the constructor" do
    limit_keywords = %i[max_stacks max_strings max_label_sets max_samples]

    def good_value_types(gen)
      size = gen.rng.rand(1..16)
      names = Array.new(size) { |i| "type#{i}" }
      list = names.map { |n| [gen.pick([n.dup, n.freeze, HostileInput::HostileString.new(n), n.encode(Encoding::UTF_16LE)]), "count"] }
      [list, list.map { |t, _| HostileInput.norm(t) }.uniq.size == size]
    end

    def value_types_case(gen)
      case gen.rng.rand(12)
      when 0..4 then good_value_types(gen)
      when 5 then [[], false]
      when 6 then [Array.new(17) { |i| ["t#{i}", "u"] }, false]
      when 7 then [[["cpu", "ns"], ["cpu", "count"]], false]
      when 8 then [[["", "ns"]], false]
      when 9 then [[["cpu", ""]], false]
      when 10 then [[gen.pick([["cpu"], ["cpu", "ns", "x"], [:cpu, "ns"], ["cpu", nil], gen.impostor])], false]
      else [gen.impostor, false]
      end
    end

    it "accepts only valid options and raises ArgumentError, TypeError or RangeError otherwise" do
      gen = HostileInput::Generator.new(Random.new(seed + 7))
      tried = 0
      1_500.times do |i|
        kwargs = {}
        valid = true
        if gen.chance(70)
          kwargs[:value_types], ok = value_types_case(gen)
          valid &&= ok
        end
        if gen.chance(60)
          kwargs[:max_frames] = gen.pick([2, 400, 10_000, 1, 0, -1, 10_001, 2**64, -(2**64), 1.5, "400", nil,
                                          gen.fake_integer, gen.raising(:to_int)])
          valid &&= Integer === kwargs[:max_frames] && (2..10_000).cover?(kwargs[:max_frames])
        end
        if gen.chance(50)
          kwargs[:compression] = gen.pick([:none, :gzip, "gzip", :zstd, nil, 1, gen.raising(:to_s), BasicObject.new])
          valid &&= [:none, :gzip].any? { |c| c.equal?(kwargs[:compression]) }
        end
        limit_keywords.each do |keyword|
          next unless gen.chance(20)

          kwargs[keyword] = gen.pick([1, 10, 1_000_000, 0, -1, 2**32, 2**70, 1.5, nil, "10", gen.fake_integer])
          valid &&= Integer === kwargs[keyword] && (1..described_class::MAX_LIMIT).cover?(kwargs[keyword])
        end
        raised = nil
        begin
          recorder = described_class.new(**kwargs)
        rescue Exception => e # rubocop:disable Lint/RescueException
          raised = e
        end
        if valid
          expect(raised).to be_nil, "case #{i} #{kwargs.keys}: valid options raised #{raised.inspect}"
          size = (kwargs[:value_types] || described_class::DEFAULT_VALUE_TYPES).size
          recorder.record_sample([["f", "f.rb", 1]], Array.new(size, 1))
          expect(value_totals(serialized_samples(recorder)).values).to eq(Array.new(size, 1))
        else
          allowed = [ArgumentError, TypeError, RangeError]
          expect(allowed.any? { raised.is_a?(_1) }).to be(true),
                                                       "case #{i} #{kwargs.keys}: expected ArgumentError/TypeError/RangeError, got #{raised.inspect}"
        end
        tried += 1
      end
      HostileInput::Stats.add(:constructor_calls, tried)
    end
  end
end

# The profiler's memory options (allocations, allocation_interval, allocation_overhead, heap,
# gc): random values,
# valid or not, through the public constructor and the native entry point behind it.
RSpec.describe DdprofRecorder::Profiler, "hostile memory options" do
  let(:seed) { RSpec.configuration.seed }

  it "accepts only valid memory options, raises ArgumentError otherwise, and starts nothing" do
    gen = HostileInput::Generator.new(Random.new(seed + 11))
    flags = [true, false, nil, 1, 0, "true", :true, gen.fake_integer, BasicObject.new]
    intervals = [1, 64, 4096, described_class::MAX_ALLOCATION_INTERVAL, 0, -1, 2**41, 2**70, 1.5, "64", nil,
                 gen.fake_integer, gen.raising(:to_int)]
    overheads = [0.02, 0.5, 1.0, 1, 1e-9, 0, 0.0, -0.1, 1.5, Float::NAN, Float::INFINITY, "0.1", nil, Rational(1, 2),
                 gen.fake_integer]
    profiled = valid_cases = 0
    400.times do |i|
      kwargs = {}
      valid = true
      %i[allocations heap gc].each do |key|
        next unless gen.chance(60)

        kwargs[key] = gen.pick(flags)
        valid &&= [true, false].any? { |v| v.equal?(kwargs[key]) }
      end
      if gen.chance(60)
        kwargs[:allocation_interval] = gen.pick(intervals)
        valid &&= Integer === kwargs[:allocation_interval] &&
                  described_class::ALLOCATION_INTERVAL_RANGE.cover?(kwargs[:allocation_interval])
      end
      if gen.chance(40)
        kwargs[:allocation_overhead] = overhead = gen.pick(overheads)
        valid &&= [Integer, Float].any? { |c| c === overhead } && overhead.positive? && overhead <= 1
      end
      raised = nil
      begin
        profiler = described_class.new(compression: :none, **kwargs)
      rescue Exception => e # rubocop:disable Lint/RescueException
        raised = e
      end
      expect(described_class.running?).to be(false)
      unless valid
        expect(raised).to be_a(ArgumentError), "case #{i} #{kwargs.keys}: expected ArgumentError, got #{raised.inspect}"
        next
      end
      expect(raised).to be_nil, "case #{i} #{kwargs.keys}: valid options raised #{raised.inspect}"
      valid_cases += 1
      next unless (valid_cases % 10) == 1 # starting a profiler takes threads: a few of the valid ones

      pprof = profiler.profile { 2_000.times { [i] } }
      types = decode_pprof(pprof).then { |p| p.sample_type.map { |t| p.string_table[t.type] } }
      expect(types.include?("alloc-count")).to eq(kwargs[:allocations] == true || kwargs[:heap] == true)
      expect(types.include?("heap-live-size")).to eq(kwargs[:heap] == true)
      profiled += 1
    end
    expect(profiled).to be_positive
  end

  it "refuses bad arguments to the native entry point with a Ruby exception" do
    gen = HostileInput::Generator.new(Random.new(seed + 13))
    200.times do
      interval = gen.pick([0, -1, 2**41, 2**70, 1.5, "1", nil, gen.fake_integer])
      expect { described_class._native_allocations_start(interval, Object.new, gen.pick([true, false, nil, 1]), 0.02, -> {}) }
        .to raise_error { |e| expect([ArgumentError, TypeError, RangeError].any? { e.is_a?(_1) }).to be(true), e.inspect }
      overhead = gen.pick([0, 0.0, -0.5, 1.5, Float::NAN, Float::INFINITY, "0.1", nil, Object.new])
      expect { described_class._native_allocations_start(4096, Object.new, false, overhead, -> {}) }
        .to raise_error { |e| expect([ArgumentError, TypeError].any? { e.is_a?(_1) }).to be(true), e.inspect }
      expect(described_class._native_allocations_stats[:hook_on_share]).to be_a(Float)
    end
  ensure
    described_class._native_allocations_stop
  end
end
