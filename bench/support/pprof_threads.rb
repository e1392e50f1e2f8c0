# frozen_string_literal: true

require "fileutils"
require "tmpdir"
require "zlib"

# Decodes a profile with google-protobuf (spec/support/profile.proto, compiled by protoc at
# first use) and sums it per `thread name` (bench/profiler_rate.rb, bench/server_throughput.rb)
# or per a label's value (bench/rails_endpoints.rb).
module BenchPprofThreads
  ROOT = File.expand_path("../..", __dir__)

  module_function

  def load_profile_proto
    return if defined?(Perftools::Profiles::Profile)

    require "google/protobuf"
    dir = Dir.mktmpdir("ddprof_bench_proto")
    at_exit { FileUtils.remove_entry(dir, true) }
    ok = system("protoc", "--proto_path=#{File.join(ROOT, 'spec', 'support')}", "--ruby_out=#{dir}", "profile.proto")
    raise "protoc failed on spec/support/profile.proto (apt-get install protobuf-compiler ruby-google-protobuf)" unless ok

    require File.join(dir, "profile_pb")
  rescue LoadError => e
    raise "google-protobuf is needed to decode the pprof (apt-get install ruby-google-protobuf): #{e.message}"
  end

  # cpu-time per value of the string label `key` (nil: samples without it), of pprof bytes.
  def by_label(pprof, key)
    load_profile_proto
    pprof = Zlib.gunzip(pprof) if pprof.start_with?("\x1f\x8b".b)
    profile = Perftools::Profiles::Profile.decode(pprof)
    strings = profile.string_table
    cpu_i = profile.sample_type.map { |t| strings[t.type] }.index("cpu-time") or raise "no cpu-time"
    key_i = strings.index(key)
    profile.sample.each_with_object(Hash.new(0)) do |sample, by|
      label = key_i && sample.label.find { |l| l.key == key_i }
      by[label ? strings[label.str] : nil] += sample.value[cpu_i]
    end
  end

  # Per `thread name`: {wall_samples:, cpu_samples: (cpu-samples where cpu-time > 0), cpu_ns:}.
  def per_thread(path)
    load_profile_proto
    data = File.binread(path)
    data = Zlib.gunzip(data) if data.start_with?("\x1f\x8b".b)
    profile = Perftools::Profiles::Profile.decode(data)
    strings = profile.string_table
    types = profile.sample_type.map { |t| strings[t.type] }
    cpu_i = types.index("cpu-time") or raise "no cpu-time in #{path}"
    count_i = types.index("cpu-samples") or raise "no cpu-samples in #{path}"
    name_key = strings.index("thread name")
    out = Hash.new { |h, k| h[k] = { wall_samples: 0, cpu_samples: 0, cpu_ns: 0 } }
    profile.sample.each do |sample|
      label = sample.label.find { |l| l.key == name_key }
      row = out[label ? strings[label.str] : "?"]
      values = sample.value.to_a
      row[:wall_samples] += values[count_i]
      row[:cpu_ns] += values[cpu_i]
      row[:cpu_samples] += values[count_i] if values[cpu_i].positive?
    end
    out
  end
end
