# frozen_string_literal: true

require "zlib"

# The arithmetic of `bench/run accuracy` (bench/accuracy.rb), kept apart from the runs so that
# spec/bench/accuracy_analysis_spec.rb can check it with hand-made distributions. Pure functions over
# plain Hashes; no Ruby extension of this project is needed (pprofs are decoded here).
#
# A distribution is a Hash `{function name => share}` whose shares add up to 1; weights
# (samples, nanoseconds) become one with {shares}.
module AccuracyAnalysis
  # Frames stackprof makes up for samples taken during GC. They have no Ruby frame under
  # them, and a profiler that reads CPU clocks charges that time to the frame that allocated
  # instead, so they are left out of stackprof's distribution (see bench/accuracy.rb).
  GC_FRAMES = ["(garbage collection)", "(marking)", "(sweeping)"].freeze

  # What a profiler's frame label and ours have in common: the bare method name.
  # Removes `block in `, `block (N levels) in `, `rescue in `, `ensure in ` (repeatedly:
  # `rescue in block in foo`), then any receiver qualifier before the last `#` or `.`
  # (`Foo#bar`, `Foo.bar`, `Foo::Bar#baz`, `#<Class:0x...>#baz`). Scopes that are not methods
  # meet whichever way they are spelled: Ruby's (stackprof: `<main>`, `<class:Foo>`,
  # `<module:Foo>`, `<top (required)>`, `<singleton class>`) and ours (docs/profiler.md,
  # "Frame names": `main`, `class Foo`, `module Foo`, `top level of PATH`, `singleton class`)
  # become `main`, `class Foo`, `module Foo`, `top level` (stackprof's label has no path) and
  # the label without its brackets, kept whole. rbspy's ` [c function]` after a C function's
  # name goes.
  #
  # @param label [String] e.g. "block (2 levels) in HotSpot.crunch", "Array#sort", "sort", "Object#<main>".
  # @return [String] e.g. "crunch", "sort", "sort", "<main>".
  def self.normalize_name(label)
    name = label.delete_suffix(" [c function]").sub(/\A(?:(?:block(?: \(\d+ levels\))?|rescue|ensure) in )+/, "")
    case name
    when EVAL_FILE then name # `(erb)`, `(eval at lib/x.rb:3)`: kept whole (see .frame_name)
    when TEMPLATE_PATH then name # `app/views/items/_item.html.erb`: kept whole (see .frame_name)
    when "<main>", "main" then "main"
    when "<top (required)>", /\Atop level of / then "top level"
    when /\A<(class|module):(.+)>\z/, /\A(class|module) (.+)\z/ then "#{Regexp.last_match(1)} #{Regexp.last_match(2)}"
    when /\A<([a-z][\w ]*)>\z/ then Regexp.last_match(1) # `<singleton class>`, not `<=>`: ours drops them
    else name.sub(/\A.*[#.](?=[^#.]+\z)/, "")
    end
  end

  # The file Ruby gives code eval'd from a string when the eval names none (ERB's `(erb)`,
  # `(eval)`, 3.3's `(eval at lib/x.rb:3)`).
  EVAL_FILE = /\A\(.+\)\z/

  # A frame named for a template's file, as ours names a compiled template's method
  # (`app/views/items/_item.html.erb`, `/tmp/views/list.erb`): a path, with no `#` (not
  # `Integer#/`) and no space.
  TEMPLATE_PATH = %r{\A[^#\s]*/[^#\s]*\z}

  # An ActionView template's method (Rails 6.1 and 7, ActionView::Template#method_name): `_`,
  # the template's path with every character but a-z and `_` made `_`, `__`, its path's hash
  # (`___` when negative), `_`, the Template's object id.
  ACTIONVIEW_METHOD = /\A_([a-z_]+?)___?\d+_\d+\z/

  # A stackprof frame's name, before normalize_name, where ours names a frame for a template
  # (docs/profiler.md, "Frame names", "Templates"):
  # - eval'd code (ERB#result): ours names it by its file, stackprof by the label Ruby gives
  #   an eval's iseq, its caller's (`block (2 levels) in <main>`), with that file as the
  #   frame's file; so a frame whose file is an eval's (EVAL_FILE) is named by its file;
  # - an ActionView template's method (ACTIONVIEW_METHOD, in the template's file): ours names
  #   it by the end of its file that the method's name spells (the path from Rails.root,
  #   `app/views/items/_item.html.erb`), whatever the numbers, which differ from worker to
  #   worker; so is stackprof's (its blocks too).
  #
  # @param frame [Hash] a stackprof frame, `name:` and `file:`.
  # @return [String]
  def self.frame_name(frame)
    file = frame[:file].to_s
    return file if EVAL_FILE.match?(file)

    name = frame.fetch(:name)
    spelled = ACTIONVIEW_METHOD.match(normalize_name(name))&.[](1)
    spelled && spelled_suffix(file, spelled) || name
  end

  # The shortest end of `path`, from a `/`, whose characters but a-z and `_` made `_` are
  # `spelled`; nil if none.
  def self.spelled_suffix(path, spelled)
    parts = path.split("/")
    (1..parts.size).each do |k|
      suffix = parts.last(k).join("/")
      return suffix if suffix.gsub(/[^a-z_]/, "_") == spelled
    end
    nil
  end

  # @param weights [Hash{String => Numeric}] non-negative weights.
  # @return [Hash{String => Float}] each weight over their sum; zero weights left out;
  #   empty when the sum is 0.
  def self.shares(weights)
    total = weights.values.sum
    return {} unless total.positive?

    weights.each_with_object({}) { |(name, w), out| out[name] = w.fdiv(total) if w.positive? }
  end

  # @return [Float] Σ_f min(p_f, q_f): 1 for the same distribution, 0 for disjoint ones.
  def self.overlap(p, q)
    p.sum { |name, share| [share, q.fetch(name, 0.0)].min }
  end

  # The overlap with `p` that a sampler without bias reaches with `n` samples of `p`: the
  # mean, over `draws` multinomial draws of `n` samples, of overlap(p, the draw's shares).
  # It is below 1 only because n is finite; it is the ceiling a profiler with n samples can
  # be expected to reach against p.
  #
  # @param p [Hash{String => Float}] a distribution.
  # @param n [Integer] samples per draw.
  # @param draws [Integer]
  # @param seed [Integer] of the Random used (the result is a function of its arguments).
  # @return [Float, nil] nil when n is 0 or p empty.
  def self.unbiased_overlap(p, n, draws: 200, seed: 1)
    return nil if n <= 0 || p.empty?

    draw = sampler(p)
    rng = Random.new(seed)
    total = 0.0
    draws.times { total += overlap(p, draw.call(n, rng)) }
    total / draws
  end

  # The overlap that two samplers without bias reach with each other, both drawing from `p`:
  # one `n` samples (ours), the other `m` (the reference's own count): the mean over `draws`
  # pairs of multinomial draws. The reference is a sample too, so against it even a perfect
  # profiler with n samples expects this, not unbiased_overlap(p, n), which takes the
  # reference for the exact distribution; the two meet as m grows. A flat profile (many
  # functions of small share) sets them far apart: rubocop's by 0.04 with 1,300-2,900 samples
  # of rbspy (bench/RESULTS.md, "Accuracy on each Ruby").
  #
  # @return [Float, nil] nil when n or m is 0 or p empty.
  def self.two_sample_overlap(p, n, m, draws: 200, seed: 1)
    return nil if n <= 0 || m <= 0 || p.empty?

    draw = sampler(p)
    rng = Random.new(seed)
    total = 0.0
    draws.times { total += overlap(draw.call(n, rng), draw.call(m, rng)) }
    total / draws
  end

  # A function of (k, rng) that draws k samples of `p` and returns their shares.
  def self.sampler(p)
    names = p.keys.sort # the draws do not depend on the Hash's order
    cumulative = []
    sum = 0.0
    names.each { |name| cumulative << (sum += p[name]) }
    lambda do |k, rng|
      counts = Hash.new(0)
      k.times do
        u = rng.rand * sum
        counts[names[cumulative.bsearch_index { |c| c > u } || (names.size - 1)]] += 1
      end
      shares(counts)
    end
  end
  private_class_method :sampler

  # @return [Array<Array(String, Float)>] the `k` largest shares, largest first (ties by name).
  def self.top(dist, k = 5)
    dist.sort_by { |name, share| [-share, name] }.first(k)
  end

  # Self samples per function of a stackprof result (`StackProf.results`, aggregate mode):
  # each frame's `:samples` is how often it was the leaf.
  #
  # @param dump [Hash] with `:frames => {id => {name:, samples:, ...}}`.
  # @return [Hash] `weights:` {normalized name => samples}, GC frames left out;
  #   `gc_samples:` the samples of the GC frames; `samples:` all leaf samples.
  def self.stackprof_self(dump)
    weights = Hash.new(0)
    gc = 0
    dump.fetch(:frames).each_value do |frame|
      count = frame.fetch(:samples)
      next if count.zero?

      if GC_FRAMES.include?(frame.fetch(:name))
        gc += count
      else
        weights[normalize_name(frame_name(frame))] += count
      end
    end
    { weights: weights, gc_samples: gc, samples: weights.values.sum + gc }
  end

  # The raw stacks of a stackprof result taken with `raw: true` (`:raw`: for each stack its
  # length, its frame ids from the root, and its count), as [names leaf first (frame_name,
  # normalize_name), samples]; the stacks whose leaf is a GC frame are left out, as
  # stackprof_self leaves them out.
  #
  # @param dump [Hash] with `:raw` and `:frames`.
  # @return [Array<Array(Array<String>, Integer)>]
  # @raise [ArgumentError] if the result has no raw stacks.
  def self.stackprof_stacks(dump)
    raw = dump[:raw] or raise ArgumentError, "the stackprof result has no raw stacks (StackProf.start(raw: true))"
    frames = dump.fetch(:frames)
    stacks = []
    i = 0
    while i < raw.size
      length = raw[i]
      ids = raw[i + 1, length]
      count = raw[i + 1 + length]
      i += length + 2
      labels = ids.reverse.map { |id| frames.fetch(id) }
      next if labels.empty? || GC_FRAMES.include?(labels.first.fetch(:name))

      stacks << [labels.map { |frame| normalize_name(frame_name(frame)) }, count]
    end
    stacks
  end

  # The stacks of a pprof's samples whose `value` is positive, as [names leaf first
  # (normalize_name), value]; the samples whose leaf is in `leave_out` are left out.
  #
  # @param pprof [String] raw or gzip.
  # @return [Array<Array(Array<String>, Integer)>]
  def self.pprof_stacks(pprof, value: "cpu-time", leave_out: [])
    profile = Pprof.decode(pprof)
    vi = profile.value_index(value)
    profile.samples.filter_map do |location_ids, values|
      v = values[vi] || 0
      next unless v.positive?

      names = profile.names(location_ids)
      [names.map { |name| normalize_name(name) }, v] unless leave_out.include?(names.first)
    end
  end

  # A template's frame: a path (TEMPLATE_PATH) ending in a template's extension.
  TEMPLATE_FRAME = %r{/[^/]+\.(?:erb|haml|slim|builder|jbuilder|rhtml)\z}

  # What the stacks (stackprof_stacks, pprof_stacks) put on each template: `self:` the weight
  # of the stacks whose leaf is the template's frame; `total:` of those with its frame
  # anywhere in them, each stack once per template (a template under itself, or two blocks of
  # one template, count once). Shares of `all:`, the weight of every stack.
  #
  # @return [Hash] `self:`, `total:` {template => weight}, `all:` the stacks' weight.
  def self.template_weights(stacks)
    self_weights = Hash.new(0)
    total = Hash.new(0)
    all = 0
    stacks.each do |names, weight|
      all += weight
      self_weights[names.first] += weight if TEMPLATE_FRAME.match?(names.first)
      names.grep(TEMPLATE_FRAME).uniq.each { |template| total[template] += weight }
    end
    { self: self_weights, total: total, all: all }
  end

  # Self value per function of a pprof (the leaf frame of each sample) and the number of
  # on-CPU samples: the `count` value summed over the samples whose `value` is positive.
  #
  # @param pprof [String] raw or gzip.
  # @param leave_out [Array<String>] leaf frames (as written in the pprof) whose samples are
  #   left out of the weights and of the count, e.g. GC_FRAMES for a profile taken with `--gc`.
  # @return [Hash] `weights:` {normalized name => value}, `on_cpu_samples:`, `total:` (the
  #   weights' sum), `left_out:` (the value of the samples left out).
  # @raise [ArgumentError] if it is not a pprof or lacks one of the two sample types.
  # `within`: if given, only the samples for whose frames' function names (leaf first) it
  # returns true count. `to_caller`: leaf frames whose value goes to the first frame under
  # them that is not one of them (ours' `(garbage collection)` leaf over the allocating
  # code, next to a reference that charges the GC to that code). `hz`: if given, a sample
  # counts at most ceil(value × hz / 1e9) toward `on_cpu_samples` (a CPU tick every 1/hz of a
  # thread's CPU, each charged about 1/hz): a pprof sample adds up every pass of one stack and
  # thread, and a server's idle thread (Puma's pool, waiting) passes hundreds of times with
  # the stack it woke on with a little CPU, so its `count` is far above its on-CPU passes.
  def self.pprof_self(pprof, value: "cpu-time", count: "cpu-samples", leave_out: [], within: nil, to_caller: [],
                      hz: nil)
    profile = Pprof.decode(pprof)
    vi = profile.value_index(value)
    ci = profile.value_index(count)
    weights = Hash.new(0)
    n = 0
    left_out = 0
    profile.samples.each do |location_ids, values|
      v = values[vi] || 0
      next unless v.positive?
      next if within && !within.call(profile.names(location_ids))

      leaf = profile.leaf_name(location_ids)
      if to_caller.include?(leaf)
        leaf = profile.names(location_ids).find { |name| !to_caller.include?(name) } || leaf
      end
      if leave_out.include?(leaf)
        left_out += v
        next
      end
      passes = values[ci] || 0
      n += hz ? [passes, (v * hz / 1e9).ceil].min : passes
      weights[normalize_name(leaf)] += v
    end
    { weights: weights, on_cpu_samples: n, total: weights.values.sum, left_out: left_out }
  end

  # A minimal pprof (profile.proto) reader: the sample types, each sample's location ids and
  # values, and the name of each location's leaf function. Written here rather than taken
  # from the profiler under test so that a bug in the profiler's views cannot hide in this
  # benchmark.
  class Pprof
    # Field numbers of profile.proto used here.
    PROFILE_SAMPLE_TYPE = 1
    PROFILE_SAMPLE = 2
    PROFILE_LOCATION = 4
    PROFILE_FUNCTION = 5
    PROFILE_STRING_TABLE = 6
    VALUE_TYPE_TYPE = 1
    SAMPLE_LOCATION_ID = 1
    SAMPLE_VALUE = 2
    LOCATION_ID = 1
    LOCATION_LINE = 4
    LINE_FUNCTION_ID = 1
    FUNCTION_ID = 1
    FUNCTION_NAME = 2

    GZIP_MAGIC = "\x1f\x8b".b.freeze

    # @return [Array<Array(Array<Integer>, Array<Integer>)>] `[location_ids, values]` per sample.
    attr_reader :samples

    # @param pprof [String] raw or gzip.
    # @return [Pprof]
    def self.decode(pprof)
      data = pprof.b
      data = Zlib.gunzip(data) if data.start_with?(GZIP_MAGIC)
      new(data)
    rescue Zlib::Error => e
      raise ArgumentError, "not a gzip pprof: #{e.message}"
    end

    def initialize(data)
      @type_indexes = []
      @samples = []
      @leaf_function = {} # location id => function id of its first (innermost) line
      @function_name = {} # function id => string index
      @strings = []
      each_field(data) do |field, value|
        case field
        when PROFILE_SAMPLE_TYPE then @type_indexes << message_varint(value, VALUE_TYPE_TYPE)
        when PROFILE_SAMPLE then @samples << read_sample(value)
        when PROFILE_LOCATION then read_location(value)
        when PROFILE_FUNCTION then read_function(value)
        when PROFILE_STRING_TABLE then @strings << value.dup.force_encoding(Encoding::UTF_8)
        end
      end
    end

    # @return [Array<String>] the sample types, in the order of each sample's values.
    def value_types
      @type_indexes.map { |i| @strings.fetch(i, "") }
    end

    # @raise [ArgumentError] naming the types the profile has.
    def value_index(type)
      value_types.index(type) ||
        raise(ArgumentError, "the pprof has no #{type.inspect} sample type (it has #{value_types.join(', ')})")
    end

    # @return [String] the function name of a sample's leaf ("" if unknown).
    def leaf_name(location_ids)
      location_name(location_ids.first)
    end

    # @return [Array<String>] the function names of a sample's frames, leaf first.
    def names(location_ids)
      location_ids.map { |id| location_name(id) }
    end

    private

    def location_name(id)
      @strings.fetch(@function_name.fetch(@leaf_function[id], 0), "")
    end

    # Yields (field number, value) for each field of a message: an Integer for varints, a
    # binary String for length-delimited fields (fixed-width fields are skipped).
    def each_field(data)
      pos = 0
      while pos < data.bytesize
        key, pos = varint(data, pos)
        case key & 7
        when 0 then value, pos = varint(data, pos)
        when 1 then pos += 8
        when 2
          length, pos = varint(data, pos)
          raise ArgumentError, "not a pprof: a field runs past the end" if pos + length > data.bytesize

          value = data.byteslice(pos, length)
          pos += length
        when 5 then pos += 4
        else raise ArgumentError, "not a pprof: wire type #{key & 7}"
        end
        yield key >> 3, value if value
        value = nil
      end
    end

    def varint(data, pos)
      result = 0
      shift = 0
      loop do
        byte = data.getbyte(pos) or raise ArgumentError, "not a pprof: truncated varint"
        pos += 1
        result |= (byte & 0x7f) << shift
        return [result, pos] if byte < 0x80

        shift += 7
        raise ArgumentError, "not a pprof: varint too long" if shift > 63
      end
    end

    # A repeated integer field: packed (a String of varints) or one varint.
    def integers(value)
      return [value] if value.is_a?(Integer)

      out = []
      pos = 0
      while pos < value.bytesize
        v, pos = varint(value, pos)
        out << v
      end
      out
    end

    def int64(v)
      v >= (1 << 63) ? v - (1 << 64) : v
    end

    def message_varint(data, wanted)
      found = 0
      each_field(data) { |field, value| found = value if field == wanted && value.is_a?(Integer) }
      found
    end

    def read_sample(data)
      location_ids = []
      values = []
      each_field(data) do |field, value|
        case field
        when SAMPLE_LOCATION_ID then location_ids.concat(integers(value))
        when SAMPLE_VALUE then values.concat(integers(value).map { |v| int64(v) })
        end
      end
      [location_ids, values]
    end

    def read_location(data)
      id = 0
      function = nil
      each_field(data) do |field, value|
        case field
        when LOCATION_ID then id = value
        when LOCATION_LINE then function ||= message_varint(value, LINE_FUNCTION_ID)
        end
      end
      @leaf_function[id] = function
    end

    def read_function(data)
      id = 0
      name = 0
      each_field(data) do |field, value|
        case field
        when FUNCTION_ID then id = value
        when FUNCTION_NAME then name = value
        end
      end
      @function_name[id] = name
    end
  end
end
