# frozen_string_literal: true

module DdprofRecorder
  # Views of a pprof for people: folded stacks, a flamegraph, a speedscope file, the hottest
  # functions and a summary; the merge of several pprofs into one, and the samples of some
  # label values. All of them read any pprof (raw or gzip, ours or another tool's) natively
  # (see crates/core/src/views/); the Ruby methods below only check keywords.
  #
  # Each view takes one pprof String or an Array of them, which it sees as their merge (see
  # {.merge}): e.g. the profiles of a server's processes, or the windows of one. Errors about
  # one of an Array's pprofs name it `pprofs[i]`.
  #
  # Each view and {.merge} take `label:`, a Hash of label key => value (`{ "trace endpoint" =>
  # "PagesController#index" }`): they then see only the samples that have every one of those
  # labels with that value, compared as text (a String label of that text, or a numeric label
  # written so in decimal: `"process id" => 11` and `=> "11"` are the same). A key that no
  # sample has raises ArgumentError naming the keys there are (a typo, most likely); a value
  # that no sample has leaves no sample: {.top} and {.folded} say nothing, the views that
  # draw raise DdprofRecorder::Error (`nothing to draw: no sample has trace endpoint=...`).
  # {.filter}'s `labels:` are typed instead (a String never equals a number), and a key no
  # sample has keeps nothing there, without an error.
  #
  # A pprof is untrusted input: each one is read only up to `max_decompressed_bytes` of
  # protobuf (after gunzip, or as given), and reading it may take at most a fixed multiple of
  # that in memory (`MEMORY_PER_BYTE` in crates/core/src/views/reader.rs, whose module doc
  # states the limits). What a view writes ({.folded}, {.flamegraph}, {.speedscope},
  # {.timeline}), and holds to write it, is bounded by what it read: at most
  # `max_output_bytes`, by default {DEFAULT_OUTPUT_PER_BYTE} times the pprofs' protobuf bytes
  # and at least {MIN_DEFAULT_OUTPUT_BYTES} (a 2,978-byte pprof made `folded` write 1.05 GB
  # before). The views that draw names (the flamegraph, the timeline) cut one longer than
  # {MAX_DRAWN_NAME_CHARS} characters. A pprof over these limits raises DdprofRecorder::Error
  # naming the keyword.

  # The default `max_decompressed_bytes:` of the views: 1 GiB, far above any real profile.
  DEFAULT_MAX_DECOMPRESSED_BYTES = 1 << 30
  # (Set by the native extension, from the core's reader: DEFAULT_OUTPUT_PER_BYTE and
  # MIN_DEFAULT_OUTPUT_BYTES, the default bound of a view's output; MAX_DRAWN_NAME_CHARS.)

  class << self
    # Folded stacks: one line per distinct stack, `root;...;leaf value`, sorted, the input of
    # flamegraph.pl, inferno and speedscope. Stacks whose value is 0 are left out.
    #
    # @param pprof [String, Array<String>] a pprof, raw or gzip-compressed, or several.
    # @param value [String, Symbol] which sample type to use, e.g. `"cpu-time"`, `"wall-time"`.
    # @param filenames [Boolean] write frames as `name (file)` instead of `name`.
    # @param group_by [String, nil] a label key (e.g. `"thread name"`, `"trace endpoint"`)
    #   whose value becomes the root frame, `key=value` (`(no key)` for the samples without
    #   it): one tower per thread, or per endpoint, in a flamegraph.
    # @param label [Hash{String, Symbol => String, Integer}, nil] only the samples with these
    #   labels (see the module's doc).
    # @param max_decompressed_bytes [Integer] most bytes of protobuf each pprof may have once
    #   decompressed (default {DEFAULT_MAX_DECOMPRESSED_BYTES}, 1 GiB).
    # @param max_output_bytes [Integer, nil] most bytes the view may write (nil: the default
    #   bound from what was read, see the module's doc).
    # @return [String] UTF-8 text, one line per stack; empty when no sample is left.
    # @raise [ArgumentError] if `pprof` is not a pprof or has no such value type (the message
    #   lists the ones it has), or no sample has the `group_by` or a `label` key (the message
    #   lists the keys there are); if `group_by` or `label` is empty.
    # @raise [TypeError] if `group_by` or `label` is not of the types above.
    # @raise [DdprofRecorder::Error] if several pprofs have different value types, or a pprof
    #   is over the read limits.
    def folded(pprof, value: "cpu-time", filenames: false, group_by: nil, label: nil,
               max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES, max_output_bytes: nil)
      _native_folded(pprof, value_name(value), filenames ? true : false, label_key(group_by, "group_by"),
                     label_filters(label), read_limit(max_decompressed_bytes, max_output_bytes))
    end

    # A flamegraph of the profile as an SVG document, drawn by the inferno crate (the Rust
    # port of flamegraph.pl): open it in a browser to zoom and search. Nanosecond values are
    # shown in milliseconds.
    #
    # @param pprof [String, Array<String>] a pprof, raw or gzip-compressed, or several.
    # @param value [String, Symbol] which sample type to draw.
    # @param title [String, nil] defaults to `"<value> flamegraph"`.
    # @param filenames [Boolean] label frames `name (file)`.
    # @param group_by [String, nil] a label key whose value becomes the root frame: one tower
    #   per value (see {.folded}).
    # @param label [Hash{String, Symbol => String, Integer}, nil] only the samples with these
    #   labels (see the module's doc).
    # @param max_decompressed_bytes [Integer] see {.folded}.
    # @param max_output_bytes [Integer, nil] see {.folded}.
    # @return [String] the SVG (UTF-8).
    # @raise [ArgumentError] as {.folded}.
    # @raise [DdprofRecorder::Error] if no sample has a non-zero `value` (nothing to draw; `no
    #   sample has key=value` when `label` left none), several pprofs have different value
    #   types, or a pprof is over the read limits.
    def flamegraph(pprof, value: "cpu-time", title: nil, filenames: false, group_by: nil, label: nil,
                   max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES, max_output_bytes: nil)
      unless title.nil? || title.is_a?(String)
        raise TypeError, "title must be a String or nil, got #{title.class}"
      end

      _native_flamegraph(pprof, value_name(value), title, filenames ? true : false, label_key(group_by, "group_by"),
                         label_filters(label), read_limit(max_decompressed_bytes, max_output_bytes))
    end

    # The profile as a speedscope file (https://www.speedscope.app; also what stackprof and
    # rbspy write): one "sampled" profile per value type, each distinct stack a sample
    # weighted by its value, or with `group_by` one per value type and label value (e.g. per
    # thread), the heaviest first. speedscope opens the first and lists the others in its
    # profile menu. The stacks are sorted by name, root first: a pprof has no time order, so
    # speedscope's "Time Order" view reads like a flamegraph. Details:
    # crates/core/src/views/speedscope.rs.
    #
    # @param pprof [String, Array<String>] a pprof, raw or gzip-compressed, or several.
    # @param value [String, Symbol, Array<String, Symbol>, nil] the value type(s) to include,
    #   in that order; nil (default) for every value type of the pprof, in its order
    #   (cpu-time, cpu-samples, wall-time for the profiler's).
    # @param group_by [String, Symbol, nil] a label key (e.g. `"thread name"`): one profile per
    #   value of it, named `value type, key=value` (`(no key)` for the samples without it).
    # @param timeline [Boolean] instead, the samples that carry their time (the profiler's
    #   `timeline: true`): one `wall-time` profile per thread, its samples in time order, each
    #   weighted by its wall time and under a root frame naming the thread's state then
    #   (`[running]`, `[waiting for GVL]`, `[blocked]`, `[gc]`), so that "Time Order" shows
    #   what each thread did when. Not with `value` or `group_by`.
    # @param name [String] the file's name in speedscope's title bar.
    # @param label [Hash{String, Symbol => String, Integer}, nil] only the samples with these
    #   labels (see the module's doc); with `timeline` too.
    # @param max_decompressed_bytes [Integer] see {.folded}.
    # @param max_output_bytes [Integer, nil] see {.folded}.
    # @return [String] the JSON document (UTF-8).
    # @raise [ArgumentError] as {.folded}.
    # @raise [DdprofRecorder::Error] if no sample has a positive value of the value types
    #   (nothing to draw), or with `timeline` none has a time, or `label` left none; if several
    #   pprofs have different value types, or a pprof is over the read limits.
    def speedscope(pprof, value: nil, group_by: nil, timeline: false, name: "ddprof_recorder profile", label: nil,
                   max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES, max_output_bytes: nil)
      raise TypeError, "name must be a String, got #{name.class}" unless name.is_a?(String)

      values = value.nil? ? nil : Array(value).map { |v| value_name(v) }
      raise ArgumentError, "value must name at least one value type" if values&.empty?
      raise ArgumentError, "timeline: true takes no value: or group_by:" if timeline && (values || group_by)

      exporter = "ddprof_recorder #{VERSION}"
      labels = label_filters(label)
      limit = read_limit(max_decompressed_bytes, max_output_bytes)
      return _native_speedscope_timeline(pprof, name, exporter, labels, limit) if timeline

      _native_speedscope(pprof, values, label_key(group_by, "group_by"), name, exporter, labels, limit)
    end

    # What each thread was doing, and when: a timeline of the samples that carry their time
    # (the profiler's `timeline: true`), one lane per thread (per process and thread for
    # several processes' pprofs), each sample a span colored by the thread's state (running,
    # waiting for GVL, blocked, gc), with its stack and values on hover, under a time axis.
    # Each lane's name gives the thread's shares of wall time ({.summary}'s `:threads`).
    # Details: crates/core/src/views/timeline.rs.
    #
    # @param pprof [String, Array<String>] a pprof, raw or gzip-compressed, or several.
    # @param format [Symbol] `:svg`, or `:html` (the SVG in a page with a table of the shares).
    # @param title [String]
    # @param label [Hash{String, Symbol => String, Integer}, nil] only the samples with these
    #   labels (see the module's doc): the lanes show when they ran, and the shares are of
    #   their wall time (e.g. how one endpoint's time went: running, waiting for the GVL...).
    # @param max_decompressed_bytes [Integer] see {.folded}.
    # @param max_output_bytes [Integer, nil] see {.folded}.
    # @return [String] the document (UTF-8).
    # @raise [ArgumentError] if `pprof` is not a pprof, or has no wall-time, or `format` is
    #   neither; as {.folded} for `label`.
    # @raise [DdprofRecorder::Error] if no sample has a time (or `label` left none), or as
    #   {.folded}.
    def timeline(pprof, format: :svg, title: "ddprof_recorder timeline", label: nil,
                 max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES, max_output_bytes: nil)
      raise TypeError, "title must be a String, got #{title.class}" unless title.is_a?(String)
      raise ArgumentError, "format must be :svg or :html, got #{format.inspect}" unless %i[svg html].include?(format)

      _native_timeline(pprof, format, title, label_filters(label), read_limit(max_decompressed_bytes, max_output_bytes))
    end

    # The pprof with only the samples that have every label of `labels` (the same key with the
    # same value: a String for a string label, an Integer for a numeric one), e.g. one
    # thread's: `filter(pprof, labels: { "thread id" => id })`. Functions and locations stay.
    #
    # @param pprof [String, Array<String>] a pprof, raw or gzip-compressed, or several (merged).
    # @param labels [Hash{String, Symbol => String, Integer}]
    # @param compression [Symbol] `:gzip` (default) or `:none`.
    # @param max_decompressed_bytes [Integer] see {.folded}.
    # @return [String] the pprof (binary).
    # @raise [ArgumentError] if `pprof` is not a pprof.
    # @raise [DdprofRecorder::Error] if several pprofs have different value types, or a pprof
    #   is over the read limits.
    def filter(pprof, labels:, compression: :gzip, max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES)
      raise TypeError, "labels must be a Hash, got #{labels.class}" unless labels.is_a?(Hash)
      raise ArgumentError, "compression must be :none or :gzip, got #{compression.inspect}" unless %i[gzip none].include?(compression)

      strings = []
      numbers = []
      labels.each do |key, value|
        key = key.to_s if key.is_a?(Symbol)
        raise TypeError, "label keys must be Strings or Symbols, got #{key.class}" unless key.is_a?(String)

        case value
        when String then strings << [key, value]
        when Integer then numbers << [key, value]
        else raise TypeError, "label #{key.inspect} must be a String or an Integer, got #{value.class}"
        end
      end
      _native_filter(pprof, strings, numbers, compression, read_limit(max_decompressed_bytes))
    end

    # The functions holding the most of one value: self (as the leaf of a sample) and total
    # (anywhere in the stack, once per sample). With `by:`, the values of a label holding the
    # most of it instead: `top(pprof, by: "trace endpoint")` is which endpoint burns the CPU.
    #
    # @param pprof [String, Array<String>] a pprof, raw or gzip-compressed, or several.
    # @param value [String, Symbol] which sample type to rank by.
    # @param sort [Symbol] `:self` (default) or `:total`: the value rows are sorted by, highest
    #   first; ties by the other value (highest first), then name, then file. With `by:` the
    #   two are one (a sample has one value of a label): rows by their total.
    # @param limit [Integer, nil] keep only the first `limit` rows.
    # @param by [String, Symbol, nil] a label key (string or numeric label): one row per value
    #   of it, the sum of `value` over its samples, and one row (`label: nil`) for the samples
    #   without it; highest first, ties by label value, the row without it last. Rows of 0
    #   are left out; the rows add up to `:total`.
    # @param label [Hash{String, Symbol => String, Integer}, nil] only the samples with these
    #   labels (see the module's doc).
    # @param max_decompressed_bytes [Integer] see {.folded}.
    # @return [Hash] `{value:, unit:, total:, profile_total:, samples:, rows: [{name:,
    #   filename:, self:, total:}, ...]}`; with `by:`, `rows: [{label:, total:}, ...]` (a label
    #   value is a String or an Integer) and `by:` (the key). `:total` is the sum over the
    #   samples kept, `:profile_total` over the whole profile (the same without `label:`),
    #   `:samples` how many (distinct pprof) samples were kept: 0 when `label:` matched none.
    # @raise [ArgumentError] if `pprof` is not a pprof or has no such value type, `sort` is
    #   neither `:self` nor `:total`, `by` is empty or no sample has it, or as {.folded} for
    #   `label`.
    # @raise [TypeError] if `by` is not a String, Symbol or nil.
    # @raise [DdprofRecorder::Error] if several pprofs have different value types, or a pprof
    #   is over the read limits.
    def top(pprof, value: "cpu-time", sort: :self, limit: nil, by: nil, label: nil,
            max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES)
      value = value_name(value)
      raise ArgumentError, "sort must be :self or :total, got #{sort.inspect}" unless %i[self total].include?(sort)

      by = label_key(by, "by")
      labels = label_filters(label)
      limit_bytes = read_limit(max_decompressed_bytes)
      if by
        unit, total, profile_total, samples, rows = _native_top_by_label(pprof, value, by, labels, limit_bytes)
        rows = rows.first(limit) if limit
        rows = rows.map { |label_value, sum| { label: label_value, total: sum } }
        return { value: value, unit: unit, total: total, profile_total: profile_total, samples: samples, by: by,
                 rows: rows }
      end

      unit, total, profile_total, samples, rows = _native_top(pprof, value, sort, labels, limit_bytes)
      rows = rows.first(limit) if limit
      rows = rows.map { |name, filename, self_value, total_value| { name: name, filename: filename, self: self_value, total: total_value } }
      { value: value, unit: unit, total: total, profile_total: profile_total, samples: samples, rows: rows }
    end

    # What a profile holds, in numbers.
    #
    # @param pprof [String, Array<String>] a pprof, raw or gzip-compressed, or several.
    # @return [Hash] `:value_types` (`[[type, unit], ...]`), `:totals` (`{type => sum}`),
    #   `:start` and `:finish` (Time), `:duration` (seconds, Float), `:samples` (distinct
    #   pprof samples), `:functions`, `:thread_ids`, `:thread_names` and `:process_ids`
    #   (distinct values of the profiler's `"thread id"` / `"thread name"` / `"process id"`
    #   labels), `:label_keys` (every label key of the samples, sorted), `:comments` (the pprof's `comment` strings, e.g. StackRecorder#comments=;
    #   each distinct one once, in the order they first appear, over all the pprofs given),
    #   `:threads`: per thread (`"thread id"` label, and `"process id"`), by process then the
    #   longest first, a Hash of `:process_id`, `:thread_id`, `:name`, and its wall time and
    #   how it was spent, in ns: `:wall`, `:running` (its cpu-time outside the GC),
    #   `:waiting` (its gvl-wait-time; nil without that value: Ruby 3.1, where `:blocked`
    #   holds the waits too), `:gc` (the wall time of its GC samples), `:blocked` (the rest).
    # @param label [Hash{String, Symbol => String, Integer}, nil] only the samples with these
    #   labels (see the module's doc): e.g. one endpoint's totals and threads.
    # @param max_decompressed_bytes [Integer] see {.folded}.
    # @raise [ArgumentError] if `pprof` is not a pprof, or as {.folded} for `label`.
    # @raise [DdprofRecorder::Error] if several pprofs have different value types, or a pprof
    #   is over the read limits.
    def summary(pprof, label: nil, max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES)
      s = _native_summary(pprof, label_filters(label), read_limit(max_decompressed_bytes))
      start = Time.at(0, s[:time_nanos], :nanosecond).utc
      {
        value_types: s[:value_types],
        totals: s[:value_types].map(&:first).zip(s[:totals]).to_h,
        start: start,
        finish: Time.at(0, s[:time_nanos] + s[:duration_nanos], :nanosecond).utc,
        duration: s[:duration_nanos] / 1e9,
        samples: s[:samples],
        functions: s[:functions],
        thread_ids: s[:thread_ids],
        thread_names: s[:thread_names],
        process_ids: s[:process_ids],
        label_keys: s[:label_keys],
        comments: s[:comments],
        threads: s[:threads].map do |pid, tid, name, wall, running, waiting, gc, blocked|
          { process_id: pid, thread_id: tid, name: name, wall: wall, running: running, waiting: waiting, gc: gc,
            blocked: blocked }
        end,
      }
    end

    # Merges pprofs into one: every sample of every input, samples with the same stack and
    # labels added up (the profiler's `"process id"` label keeps the processes of a forking
    # server apart), covering the time from the earliest start to the latest end. The result
    # reads like any single profile (`go tool pprof`, the views above).
    #
    # @param pprofs [Array<String>] pprofs, raw or gzip-compressed, with the same value types
    #   (types and units, in the same order).
    # @param compression [Symbol] `:gzip` (default, the usual `.pb.gz`) or `:none`.
    # @param label [Hash{String, Symbol => String, Integer}, nil] keep only the samples with
    #   these labels (see the module's doc): e.g. one endpoint's pprof, for `go tool pprof`.
    #   Functions and locations stay, as {.filter} leaves them.
    # @param max_decompressed_bytes [Integer] see {.folded}; for each of `pprofs`.
    # @return [String] the merged pprof (binary); without samples if `label` matched none.
    # @raise [ArgumentError] if `pprofs` is empty or one of them is not a pprof (the message
    #   names it `pprofs[i]`), or as {.folded} for `label`.
    # @raise [DdprofRecorder::Error] if their value types differ, or one is over the read
    #   limits.
    def merge(pprofs, compression: :gzip, label: nil, max_decompressed_bytes: DEFAULT_MAX_DECOMPRESSED_BYTES)
      raise TypeError, "pprofs must be an Array of Strings, got #{pprofs.class}" unless pprofs.is_a?(Array)
      raise ArgumentError, "compression must be :none or :gzip, got #{compression.inspect}" unless %i[gzip none].include?(compression)

      _native_merge(pprofs, compression, label_filters(label), read_limit(max_decompressed_bytes))
    end

    private

    # The native views' limits: `[max_decompressed_bytes, max_output_bytes]`.
    def read_limit(bytes, output = nil)
      [byte_count(bytes, "max_decompressed_bytes"), output.nil? ? nil : byte_count(output, "max_output_bytes")]
    end

    def byte_count(bytes, name)
      raise TypeError, "#{name} must be an Integer, got #{bytes.class}" unless bytes.is_a?(Integer)
      raise ArgumentError, "#{name} must be positive and below 2**64, got #{bytes}" unless bytes.positive? && bytes < 2**64

      bytes
    end

    def value_name(value)
      case value
      when String then value
      when Symbol then value.to_s
      else raise TypeError, "value must be a String or Symbol, got #{value.class}"
      end
    end

    # A label key argument (`group_by:`, `by:`) as a String, or nil; `name` names it.
    def label_key(key, name)
      key = case key
            when nil, String then key
            when Symbol then key.to_s
            else raise TypeError, "#{name} must be a String, Symbol or nil, got #{key.class}"
            end
      raise ArgumentError, "#{name} must not be empty" if key&.empty?

      key
    end

    # `label:` (nil or a Hash of key => value) as the native `[[key, value], ...]`, Strings:
    # an Integer value as its decimal text, which the native side compares with a string
    # label's text or a numeric label's decimal form.
    def label_filters(label)
      return [] if label.nil?
      raise TypeError, "label must be a Hash of label key => value, got #{label.class}" unless label.is_a?(Hash)

      filters = label.map do |key, value|
        key = key.to_s if key.is_a?(Symbol)
        raise TypeError, "label keys must be Strings or Symbols, got #{key.class}" unless key.is_a?(String)
        raise ArgumentError, "label keys must not be empty" if key.empty?

        text = case value
               when String then value
               when Integer then value.to_s
               else raise TypeError, "label #{key.inspect} must be a String or an Integer, got #{value.class}"
               end
        raise ArgumentError, "label #{key.inspect} must not be empty" if text.empty?

        [key, text]
      end
      duplicate = filters.map(&:first).tally.find { |_, n| n > 1 }
      raise ArgumentError, "label #{duplicate.first.inspect} is given twice (as a String and a Symbol)" if duplicate

      filters
    end
  end
end
