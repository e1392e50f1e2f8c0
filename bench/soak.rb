#!/usr/bin/env ruby
# frozen_string_literal: true

# Soak test (issue 4): many serialize cycles of one workload of bench/gen_workload.rb, watching
# memory. Each cycle records every sample of the workload (Array stacks, values and label pairs,
# the fast path) and its endpoints, then serializes.
#
#   ruby bench/soak.rb [--size small|medium|large] [--cycles N] [--json]
#
# Reports:
# - RSS (VmRSS) after cycle 10 and after the last cycle, and the growth between them (the issue's
#   bound: within 10%);
# - glibc malloc's in-use bytes (mallinfo2) after cycle 50 and after the last: what a leak of
#   native memory grows, where RSS also moves with how glibc keeps freed memory (on Ruby 3.3.8
#   RSS went from 38 to 92 MiB between cycles 50 and 100 of `small`, then stayed about 115 MiB
#   up to cycle 300, with the recorder's memory flat); and the Ruby heap's live slots then
#   (GC.stat(:heap_live_slots), after a GC): what a leak of Ruby objects grows;
# - ObjectSpace.memsize_of(recorder) against the native memory the recorder really holds,
#   measured as what glibc malloc gets back when the recorder is freed (mallinfo2's in-use bytes,
#   through a Testing hook), with the recorder full (last cycle recorded, not yet serialized).
# The last line of output is one JSON object (with --json, only that line).
require "json"
require "objspace"
require_relative "../lib/ddprof_recorder"

module Soak
  ROOT = File.expand_path("..", __dir__)

  # The workload JSON for `size`, generated once into tmp/ (bench/gen_workload.rb, or
  # ../shared/bench/gen_workload.rb if the repository's copy is missing).
  def self.workload(size)
    path = File.join(ROOT, "tmp", "workload-#{size}.json")
    unless File.exist?(path)
      generator = [File.join(ROOT, "bench/gen_workload.rb"), File.join(ROOT, "../shared/bench/gen_workload.rb")]
                  .find { |g| File.exist?(g) } or abort "bench/gen_workload.rb not found"
      Dir.mkdir(File.dirname(path)) unless Dir.exist?(File.dirname(path))
      json = IO.popen([RbConfig.ruby, generator, size], &:read)
      abort "gen_workload.rb #{size} failed" unless $?.success?
      File.write("#{path}.tmp", json)
      File.rename("#{path}.tmp", path)
    end
    data = JSON.parse(File.read(path))
    frames = data.fetch("frames").map { |name, file, line| [name.freeze, file.freeze, line].freeze }
    stacks = data.fetch("stacks").map { |ids| ids.map { |i| frames[i] }.freeze }
    samples = data.fetch("samples").map do |stack, values, labels|
      [stacks[stack], values.freeze, labels.map { |k, s, n| [k.freeze, s ? s.freeze : n].freeze }.freeze].freeze
    end
    endpoints = data.fetch("endpoints").map { |id, name| [id, name.freeze].freeze }
    { value_types: data.fetch("value_types"), samples: samples, endpoints: endpoints }
  end

  def self.rss_bytes
    File.read("/proc/self/status")[/^VmRSS:\s+(\d+) kB/, 1].to_i * 1024
  end

  def self.malloc_in_use
    testing = DdprofRecorder::StackRecorder::Testing
    testing.respond_to?(:_native_malloc_in_use) ? testing._native_malloc_in_use : nil
  end

  def self.record_cycle(recorder, workload)
    workload[:samples].each { |stack, values, labels| recorder.record_sample(stack, values, labels) }
    workload[:endpoints].each { |id, name| recorder.record_endpoint(id, name) }
  end

  # Runs the soak; returns a Hash of figures.
  # RSS is read after a GC at cycle `early` (the issue's reference), at cycle `warm` and at
  # the last. glibc raises its mmap and trim thresholds the first times a large block (here the
  # per-cycle pprof buffers, 18 MB on medium) is freed, so the first cycles' RSS is lower than
  # the steady state's for reasons that have nothing to do with the recorder: `warm` shows it.
  def self.run(size:, cycles:, early: 10, warm: 50, progress: nil)
    workload = workload(size)
    # Held only in this Array, never in a local, so that the final measurement can drop it.
    box = []
    rss = {}
    in_use = {}
    live_slots = {}
    memsize = {}
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    bytes_out = 0
    stats = seconds = nil
    # In a thread of its own, whose machine stack is gone when the recorder is measured: a
    # stale copy of the recorder's VALUE left in a live frame of the measuring thread would keep
    # it alive for the conservative GC (it did in RSpec's thread, and in a thread of its own
    # measuring itself).
    Thread.new do
      box << DdprofRecorder::StackRecorder.new(value_types: workload[:value_types])
      cycles.times do |i|
        cycle = i + 1
        record_cycle(box[0], workload)
        bytes_out += box[0].serialize!.bytesize
        if cycle == early || cycle == warm || cycle == cycles
          GC.start
          rss[cycle] = rss_bytes
          in_use[cycle] = malloc_in_use
          live_slots[cycle] = GC.stat(:heap_live_slots)
          memsize[cycle] = ObjectSpace.memsize_of(box[0])
        end
        progress&.call(cycle, rss_bytes, ObjectSpace.memsize_of(box[0])) if (cycle % 50).zero?
      end
      seconds = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      stats = box[0].stats
      # The soak's recorder, full once more (a window recorded, not serialized), is then measured
      # by dropping it.
      record_cycle(box[0], workload)
    end.join
    held = measure_and_drop(box)
    growth = rss[early] && rss[cycles] ? (rss[cycles] - rss[early]).fdiv(rss[early]) * 100 : nil
    {
      size: size, cycles: cycles, samples_per_cycle: workload[:samples].size, seconds: seconds.round(1),
      rss_early_cycle: early, rss_early: rss[early], rss_last: rss[cycles], rss_growth_percent: growth&.round(2),
      rss_warm_cycle: warm, rss_warm: rss[warm],
      malloc_in_use_warm: in_use[warm], malloc_in_use_last: in_use[cycles],
      malloc_growth_after_warm_percent: in_use[warm] && in_use[cycles] && cycles > warm ? ((in_use[cycles] - in_use[warm]).fdiv(in_use[warm]) * 100).round(2) : nil,
      live_slots_warm: live_slots[warm], live_slots_last: live_slots[cycles],
      rss_growth_after_warm_percent: rss[warm] && rss[cycles] && cycles > warm ? ((rss[cycles] - rss[warm]).fdiv(rss[warm]) * 100).round(2) : nil,
      memsize_early: memsize[early], memsize_last: memsize[cycles],
      memsize_full: held[:memsize], native_bytes_freed: held[:freed],
      memsize_error_percent: held[:freed]&.positive? ? ((held[:memsize] - held[:freed]).fdiv(held[:freed]) * 100).round(2) : nil,
      samples_recorded: stats[:samples_recorded], samples_lost: stats[:samples_lost],
      samples_dropped: stats[:samples_dropped], serializations: stats[:serializations],
      serialized_mib: (bytes_out / 1024.0 / 1024).round(1)
    }
  end

  # ObjectSpace.memsize_of of the recorder in `box` against the memory really held: how much
  # glibc malloc's in-use bytes (mallinfo2, through a Testing hook) fall when it is collected.
  # `box` must hold the only reference; it is emptied. Includes one Ruby object and its ivars: a
  # few hundred bytes of noise. `freed` is nil without the hook, or if a stale machine-stack
  # slot kept the object alive.
  def self.measure_and_drop(box)
    size = ObjectSpace.memsize_of(box[0])
    return { memsize: size, freed: nil } unless malloc_in_use

    weak = ObjectSpace::WeakMap.new
    weak[box[0]] = box[0]
    3.times { GC.start(full_mark: true, immediate_sweep: true) }
    with = malloc_in_use
    box.clear
    without = nil
    5.times do
      3.times { GC.start(full_mark: true, immediate_sweep: true) }
      without = malloc_in_use
      break if weak.size.zero?
    end
    { memsize: size, freed: weak.size.zero? ? with - without : nil }
  end
end

if $PROGRAM_NAME == __FILE__
  size = "medium"
  cycles = 1_000
  json_only = false
  args = ARGV.dup
  until args.empty?
    case (arg = args.shift)
    when "--size" then size = args.shift
    when "--cycles" then cycles = Integer(args.shift)
    when "--json" then json_only = true
    else abort "usage: #{$PROGRAM_NAME} [--size small|medium|large] [--cycles N] [--json]; unknown #{arg}"
    end
  end
  progress = json_only ? nil : ->(cycle, rss, memsize) { warn format("cycle %5d  rss %8.1f MiB  memsize %8.1f MiB", cycle, rss / 1048576.0, memsize / 1048576.0) }
  figures = Soak.run(size: size, cycles: cycles, progress: progress)
  unless json_only
    puts "soak: #{cycles} serialize cycles of the #{size} workload (#{figures[:samples_per_cycle]} samples each), #{figures[:seconds]} s"
    puts format("  RSS after cycle %d: %.1f MiB, after cycle %d: %.1f MiB, growth %+.2f%%",
                figures[:rss_early_cycle], figures[:rss_early] / 1048576.0, cycles, figures[:rss_last] / 1048576.0,
                figures[:rss_growth_percent])
    if figures[:rss_growth_after_warm_percent]
      puts format("  RSS after cycle %d: %.1f MiB: growth from there %+.2f%%", figures[:rss_warm_cycle],
                  figures[:rss_warm] / 1048576.0, figures[:rss_growth_after_warm_percent])
    end
    if figures[:native_bytes_freed]
      puts format("  memsize_of(full recorder) %d bytes vs native bytes freed with it %d (%+.2f%%)",
                  figures[:memsize_full], figures[:native_bytes_freed], figures[:memsize_error_percent])
    end
  end
  puts JSON.generate(figures)
end
