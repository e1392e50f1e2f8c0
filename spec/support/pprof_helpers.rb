# frozen_string_literal: true

require "open3"
require "zlib"

# Decoding the gem's pprof output with the classes protoc generated from spec/support/profile.proto.
module PprofHelpers
  GZIP_MAGIC = "\x1f\x8b".b

  # @param bytes [String] a pprof, raw or gzip-compressed
  # @return [Perftools::Profiles::Profile]
  def decode_pprof(bytes)
    without_gc_stress do
      bytes = Zlib.gunzip(bytes) if bytes.b.start_with?(GZIP_MAGIC)
      Perftools::Profiles::Profile.decode(bytes)
    end
  end

  # @param bytes [String] a pprof, raw or gzip-compressed
  # @return [Array<String>] its comments, in order
  def pprof_comments(bytes)
    profile = decode_pprof(bytes)
    profile.comment.map { |index| profile.string_table[index] }
  end

  # Runs the block with GC.stress off. Decoding a profile allocates thousands of objects, and
  # under GC.stress each allocation is a full GC: the decoder is not what GC_STRESS=1 tests.
  def without_gc_stress
    stress = GC.stress
    GC.stress = false
    yield
  ensure
    GC.stress = stress
  end

  # The samples of a decoded profile as plain Ruby data, strings resolved:
  # `{frames: [[name, filename, line], ...] (leaf first), values: {type => value}, labels: {key => value}}`.
  # A label whose `str` is 0 is read as numeric (a string label never points at "" here).
  def samples_from(profile)
    without_gc_stress { plain_samples(profile) }
  end

  # Serializes `recorder` and returns its samples (see #samples_from).
  def serialized_samples(recorder)
    samples_from(decode_pprof(recorder.serialize.fetch(2)))
  end

  # Per value type sums over `samples` (see #samples_from).
  def value_totals(samples)
    samples.each_with_object(Hash.new(0)) do |sample, totals|
      sample[:values].each { |type, value| totals[type] += value }
    end
  end

  # The function names of `go tool pprof -top` rows for `file`, in order (most `sample_index`
  # first). go keeps its settings and cache under `home`.
  #
  # @raise [RuntimeError] if go tool pprof fails.
  def go_pprof_top(file, sample_index, home: @dir)
    out, err, status = Open3.capture3({ "HOME" => home }, "go", "tool", "pprof", "-top", "-symbolize=none",
                                      "-sample_index=#{sample_index}", file)
    raise "go tool pprof failed: #{err}" unless status.success?

    out.lines.drop_while { |l| !l.include?("flat%") }.drop(1).map { |l| l.split.last }
  end

  # Unix nanoseconds of a Time.
  def unix_ns(time)
    (time.to_i * 1_000_000_000) + time.nsec
  end

  private

  def plain_samples(profile)
    strings = profile.string_table
    functions = profile.function.to_h { |function| [function.id, function] }
    locations = profile.location.to_h { |location| [location.id, location] }
    types = profile.sample_type.map { |type| strings[type.type] }

    profile.sample.map do |sample|
      frames = sample.location_id.map do |id|
        line = locations.fetch(id).line.first
        function = functions.fetch(line.function_id)
        [strings[function.name], strings[function.filename], line.line]
      end
      labels = sample.label.to_h do |label|
        [strings[label.key], label.str.zero? ? label.num : strings[label.str]]
      end
      { frames: frames, values: types.zip(sample.value.to_a).to_h, labels: labels }
    end
  end
end
