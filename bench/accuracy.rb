# frozen_string_literal: true

# How well our profiler's CPU profile agrees with stackprof's, on programs whose truth is known
# and on programs of real shape.
#
#   bench/run accuracy [--seconds 3] [--hz 99] [--runs 1] [--programs sleepy,c_heavy,...]
#                      [--stackprof-interval 1000] [--draws 200] [--seed 1] [--timeout S] [--gc-apart]
#                      [--reference stackprof|rbspy]
#
# Ten workloads (bench/accuracy/*.rb, each about --seconds of work, each header says what
# it does; all by default). Three measure their own truth: `sleepy` (pure Ruby alternating
# with short sleeps and reads), `c_heavy` (C methods that do not call back into Ruby, each
# under a wrapper of its own), `threads` (a Ruby thread, a C thread and a sleeping one, the
# main thread joining); their C calls take 0.3-1 ms, too long for the safepoint bias (the
# job runs at the VM's next interrupt check) to show. Six have the shape of real programs,
# with C calls of a microsecond or less between Ruby instructions, and measure nothing:
# `micro_c` (the issue "Samples where the CPU is": a Ruby loop around `is_a?`,
# `respond_to?`, `<<`, `^`), `erb` (an HTML table rendered from an ERB template with
# helpers and ERB::Util.h, compiled into a method), `templates` (a page of three ERB
# templates rendered with ERB#result_with_hash: the template code runs eval'd, named for its
# file, `(erb)`), `json` (JSON.generate, to_json and JSON.parse of small Hashes),
# `rubocop` (Debian's rubocop linting Ruby's stdlib, about 1 s of start-up first) and
# `kramdown` (Debian's ruby-kramdown converting a Markdown document). A tenth, `rails`
# (bench/accuracy/rails.rb), is served: the test suite's Rails app on Puma in cluster mode
# under wrk, ours by `record`, stackprof restarted in each worker, the workers' files added
# up; it runs on Ruby 3.1 with stackprof only (Debian's Rails), and is left out of the default
# list elsewhere. For it, n is counted by the CPU ticks (see run_rails_ours), and the
# templates' shares are printed beside stackprof's: self (the template's frames at the leaf)
# and total (its frame anywhere in the stack; stackprof's ActionView methods named by their
# template as ours, AccuracyAnalysis.frame_name). Each of the others runs, in a fresh
# process, under `exe/ddprof-recorder record --hz N` (the public CLI) and then under stackprof
# (`ruby -r bench/accuracy/stackprof_start.rb`: `StackProf.start(mode: :cpu, interval: 1000)`
# for the whole program, results written with Marshal); `--runs N` repeats the pair, the runs
# of a program are pooled. One process at a time, never two profilers at once. Files go to
# bench/out/accuracy/ (gitignored), every process has a timeout.
#
# `--reference rbspy` puts rbspy (`rbspy record`, cargo install rbspy --locked) where
# stackprof is in what follows, for the Rubies that Debian has no stackprof for (3.3, 3.4: run
# this file with that Ruby, the extension built for it; see run_rbspy). With rbspy, both
# profiles count only the samples of the program's work (#within): those under its `run`, or,
# in `micro_c` (the issue's program, which has none), those under no `require`, `load` or
# `eval`. rbspy stops the process for each sample, which stretched the start-up (rubygems
# loading the default gems' specifications: 0.2 s alone) to about 2 s on 3.3 and 3.4, and its
# samples there (`eval`, `require`: a third of rbspy's) were compared with an ours that saw 0.2 s.
#
# Self CPU share per function (self = the leaf frame of a sample):
# - ours: the pprof's `cpu-time` at each sample's leaf over all cpu-time (the pprof is decoded
#   by bench/accuracy/analysis.rb, not by the profiler under test);
# - stackprof: each frame's `:samples` (times it was the leaf) over all samples. Its GC
#   frames, `(garbage collection)`, `(marking)` and `(sweeping)`, are left out and the rest
#   renormalized: they have no Ruby frame under them, and a profiler that reads CPU clocks
#   charges GC to the Ruby frame that was running, so no function of ours can match them.
#   Their share is printed (`GC left out`). No other frame is left out: both profilers start
#   at the first require of the program and stop at its exit, so start-up is in both.
#   stackprof's SIGPROF comes from the kernel's CPU timer, so its rate is capped by the
#   kernel tick (about 250 a second on the dev VM, whatever the interval), and it records at
#   most one sample per long C call (bench/RESULTS.md); the workloads keep their
#   C calls short so that the reference holds, which the truth columns check (and, for
#   `micro_c`, perf: bench/RESULTS.md). stackprof takes the stack in its signal handler, where
#   the CPU is, so it has no safepoint bias. Leaving GC out costs the real programs, which
#   allocate much (14-19% of stackprof's samples are GC in `erb`, `json`, `rubocop`,
#   `kramdown`). Ours does the same: a tick that comes inside the GC is a sample under a
#   `(garbage collection)` leaf, left out here: from 3.3 on the allocating code (read at the
#   GC step's end), on 3.1 on the code at the first interrupt check after the GC
#   (ext/ddprof_recorder/src/sampling/signal_sampler/gc_ticks.rs). With
#   rbspy, which charges GC to the frame that allocated, that leaf's CPU goes to the frame
#   under it instead (`to_caller`). `--gc-apart`: ours is recorded with `record --gc` (GC time on
#   `(garbage collection)` -> `(marking)`/`(sweeping)`, out of the code that triggered it) and
#   those frames are left out of ours too (`GC left out` beside ours), so both compare the CPU
#   outside GC. Not the default: `--gc` makes every allocation take the GC-event hook.
# - truth: the three workloads that have one (WITH_TRUTH) measure the CPU time of every leaf
#   call with its thread's CPU clock (bench/accuracy/truth.rb). It is printed beside each
#   profiler (`truth` columns: the truth of that profiler's own runs), as a check of the
#   reference too; the other programs print n/a there.
#
# Function identity: frames are keyed by the method name alone, so that stackprof's labels
# (`HotSpot.crunch`, `Kernel#sleep`, `Array#sort`, `block (2 levels) in Foo#bar`, `<main>`) and
# ours (docs/profiler.md, "Frame names": `HotSpot.crunch`, `Kernel#sleep`, `main`; base labels
# such as `crunch` when the native frame reader is not used) meet: `block in `,
# `block (N levels) in `, `rescue in `, `ensure in ` are stripped, then any qualifier up to the
# last `#` or `.` (`Foo::Bar#baz` -> `baz`); `<main>` and `main`, `<top (required)>` and
# `top level of PATH`, `<class:Foo>` and `class Foo` meet whole (AccuracyAnalysis.normalize_name).
# Eval'd code (the templates of `templates`), which ours names by its file, `(erb)`, is named
# so on stackprof's side too, from its frames' file (AccuracyAnalysis.frame_name; rbspy's are
# left as they are). The workloads give their functions distinct names, so this merges nothing
# that matters.
#
# Figures per program:
# - overlap = Σ_f min(ours_f, stackprof_f) (1 = the same distribution, 0 = disjoint);
# - n = our on-CPU samples: the `cpu-samples` of the pprof samples whose cpu-time is > 0.
#   A pprof sample adds up every sample of one stack and thread, so passes in which a thread
#   did not run count too when they share the stack of one in which it did (today's profiler
#   records a waiting thread's passes that way: the main thread's `join` in `threads`);
#   n is then an upper bound, which only raises the unbiased overlap below;
# - unbiased = the overlap with stackprof's distribution of n samples drawn from it (mean of
#   --draws multinomial draws, seeded): what a sampler without bias reaches with n samples;
# - ratio = overlap / unbiased; the target is >= 0.85;
# - beside it, the same with the reference's own noise: the overlap that two unbiased samplers
#   reach with each other, n samples and the reference's m, both drawn from the reference's
#   distribution (AccuracyAnalysis.two_sample_overlap). The reference is a sample too, which
#   `unbiased` leaves out; on a flat profile that matters (rubocop on 3.4.5: 0.728 against
#   0.765 with n = 785 and rbspy's m = 1,661). Printed as a second line and in the JSON
#   (`two_sample_unbiased`, `two_sample_ratio`); the target stays on `ratio`;
# - the same against the truth (`vs truth`), for ours and for stackprof (whose n is its
#   sample count).
# The top 5 functions of each profiler (and of the truth) are printed with their shares.
# The last line is one JSON object with every figure.
require "fileutils"
require "json"
require "optparse"
require "rbconfig"
require_relative "accuracy/analysis"
require_relative "accuracy/rails"

module AccuracyBench
  ROOT = File.expand_path("..", __dir__)
  DIR = File.join(ROOT, "bench", "accuracy")
  OUT = File.join(ROOT, "bench", "out", "accuracy")
  PROGRAMS = %w[sleepy c_heavy threads micro_c erb templates json rubocop kramdown rails].freeze
  # Programs served by a forking server (bench/accuracy/rails.rb), whose truth is none and
  # whose reference is stackprof only (rbspy would have to follow each worker): Debian's Rails
  # is for its Ruby, 3.1, where Debian has stackprof.
  SERVED = %w[rails].freeze
  # The programs that measure their own truth (bench/accuracy/truth.rb); the others print n/a.
  WITH_TRUTH = %w[sleepy c_heavy threads].freeze
  TARGET = 0.85
  TOP = 5

  Options = Struct.new(:seconds, :hz, :runs, :programs, :stackprof_interval, :draws, :seed, :timeout, :gc_apart,
                       :reference, keyword_init: true)

  # One profiled process: what it left behind.
  # `templates`: AccuracyAnalysis.template_weights of its stacks, for a served program (nil for the others).
  Run = Struct.new(:weights, :on_cpu_samples, :truth, :process_cpu_ns, :wall_s, :extra, :templates, keyword_init: true)

  module_function

  def parse(argv)
    o = Options.new(seconds: 3.0, hz: 99, runs: 1, programs: nil, stackprof_interval: nil, draws: 200, seed: 1,
                    gc_apart: false, reference: "stackprof")
    OptionParser.new do |p|
      p.banner = "Usage: bench/run accuracy [options]   (ruby bench/accuracy.rb [options])"
      p.on("--seconds S", Float, "work per program run (default 3)") { |v| o.seconds = v }
      p.on("--hz N", Integer, "our profiler's rate, `record --hz` (default 99)") { |v| o.hz = v }
      p.on("--runs N", Integer, "runs of each profiler per program, pooled (default 1)") { |v| o.runs = v }
      p.on("--programs LIST", Array, "some of #{PROGRAMS.join(',')} (default: all that run with this Ruby and " \
                                     "reference)") { |v| o.programs = v }
      p.on("--stackprof-interval US", Integer,
           "the reference's interval in µs (default 1000; rbspy: see RBSPY_INTERVAL_US)") do |v|
        o.stackprof_interval = v
      end
      p.on("--reference NAME", %w[stackprof rbspy], "stackprof (default) or rbspy --on-cpu") { |v| o.reference = v }
      p.on("--draws N", Integer, "multinomial draws for the unbiased overlap (default 200)") { |v| o.draws = v }
      p.on("--seed N", Integer, "of those draws (default 1)") { |v| o.seed = v }
      p.on("--timeout S", Float, "per process (default 5 x seconds + 30)") { |v| o.timeout = v }
      p.on("--gc-apart", "record ours with --gc and leave its GC frames out too, as stackprof's are") do
        o.gc_apart = true
      end
    end.parse!(argv)
    o.programs ||= PROGRAMS.reject { |program| SERVED.include?(program) && !served?(o.reference) }
    unknown = o.programs - PROGRAMS
    raise OptionParser::InvalidArgument, "--programs: unknown #{unknown.join(', ')}" unless unknown.empty?
    if (o.programs & SERVED).any? && !served?(o.reference)
      raise OptionParser::InvalidArgument, "--programs: #{(o.programs & SERVED).join(', ')} needs Ruby 3.1 (Debian's " \
                                           "Rails) and --reference stackprof"
    end
    raise OptionParser::InvalidArgument, "--seconds, --runs, --draws must be positive" unless
      o.seconds.positive? && o.runs.positive? && o.draws.positive?

    o.timeout ||= (o.seconds * 5) + 30
    o.stackprof_interval ||= 1000 unless o.reference == "rbspy"
    o
  end

  # Whether the served programs (SERVED) run here, with `reference`.
  def served?(reference)
    reference == "stackprof" && RUBY_VERSION.start_with?("3.1")
  end

  # rbspy's interval unless --stackprof-interval says: 200 Hz. rbspy stops the process for each
  # sample, and at 1000 Hz that made kramdown run 8 conversions in 3 s instead of about 176:
  # rbspy then profiled the program's warm-up (with YJIT, 42% compiling in perf's first 0.35 s
  # of a run), not its work, and gave StringScanner's C methods 5-10% where perf measured 24%
  # under YJIT on 3.4.5; at 200 Hz for 8 s it gave 24% (bench/RESULTS.md, "Accuracy on each
  # Ruby"). Except for RBSPY_BLOCKING.
  RBSPY_INTERVAL_US = 5000
  # The programs whose threads block (sleep, I/O, join): rbspy samples only their threads on a
  # CPU (`--on-cpu`), and at 1000 Hz, since rbspy 0.55 with `--on-cpu` below 500 Hz never
  # exits after `sleepy` ends (10 of 10 runs at 99-250 Hz, none of 3 at 500-1000). The others
  # never block, so all of rbspy's samples of them are on-CPU without it.
  RBSPY_BLOCKING = { "sleepy" => 1000, "threads" => 1000 }.freeze

  # The reference's interval for `program`, in µs.
  def reference_interval(program, options)
    options.stackprof_interval || RBSPY_BLOCKING.fetch(program, RBSPY_INTERVAL_US)
  end

  # The Debian packages of the programs that are not ours: feature to require => package.
  PROGRAM_PACKAGES = { "rubocop" => %w[rubocop rubocop], "kramdown" => %w[kramdown ruby-kramdown] }.freeze

  # Fails early, with the fix, if a tool or a program's package is missing.
  def check_tools(programs, reference)
    if reference == "rbspy"
      abort "bench/accuracy: rbspy is missing: cargo install rbspy --locked" unless rbspy
    else
      begin
        require "stackprof"
      rescue LoadError
        abort "bench/accuracy: stackprof is missing: apt-get install ruby-stackprof (or --reference rbspy)"
      end
    end
    if programs.intersect?(SERVED)
      BenchServer.need_programs("bench/accuracy", %w[puma wrk])
      rails = system(RbConfig.ruby, "-e", 'require "rails"; require "sqlite3"', out: File::NULL, err: File::NULL)
      abort "bench/accuracy: rails needs Debian's ruby-rails and ruby-sqlite3 (script/setup)" unless rails
    end
    programs.filter_map { |program| PROGRAM_PACKAGES[program] }.each do |feature, package|
      # Found, not required: this process need not load the program's library.
      next unless Gem.find_files("#{feature}.rb").empty?

      abort "bench/accuracy: #{feature} is missing: apt-get install #{package} (or leave it out of --programs)"
    end
    return unless Dir.glob(File.join(ROOT, "lib", "ddprof_recorder", "ddprof_recorder.{so,bundle}")).empty?

    abort "bench/accuracy: the native extension is not built: run `rake compile` first"
  end

  # Runs argv with a timeout; its output goes to `log`. Kills its process group on timeout.
  def spawn(argv, env, log, timeout)
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    pid = Process.spawn(env, *argv, out: log, err: %i[child out], pgroup: true, chdir: ROOT)
    waiter = Process.detach(pid)
    unless waiter.join(timeout)
      %w[TERM KILL].each do |signal|
        begin
          Process.kill(signal, -pid)
        rescue Errno::ESRCH
          break
        end
        break if waiter.join(2)
      end
      raise "#{argv.join(' ')} took more than #{timeout} s (killed; see #{log})"
    end
    status = waiter.value
    raise "#{argv.join(' ')} failed (#{status}); see #{log}:\n#{File.read(log).lines.last(10).join}" unless status.success?

    Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
  end

  def program_argv(program, seconds)
    [RbConfig.ruby, File.join(DIR, "#{program}.rb"), seconds.to_s]
  end

  # @return [Array(Hash, Integer)] the truth and the process CPU; [nil, nil] for a program
  #   without truth.
  def read_truth(program, path)
    return [nil, nil] unless WITH_TRUTH.include?(program)

    truth = JSON.parse(File.read(path))
    [truth.fetch("measured_ns"), truth.fetch("process_cpu_ns")]
  end

  def truth_env(program, base)
    WITH_TRUTH.include?(program) ? { "ACCURACY_TRUTH_OUT" => "#{base}.truth.json" } : {}
  end

  def run_ours(program, index, options)
    return run_rails_ours(index, options) if program == "rails"

    base = File.join(OUT, "#{program}.#{index}.ours")
    pprof = "#{base}.pb"
    argv = [RbConfig.ruby, File.join(ROOT, "exe", "ddprof-recorder"), "record", "-o", pprof, "--hz", options.hz.to_s,
            *("--gc" if options.gc_apart), "--", *program_argv(program, options.seconds)]
    wall = spawn(argv, truth_env(program, base), "#{base}.log", options.timeout)
    rbspy = options.reference == "rbspy" && !options.gc_apart
    leave_out = rbspy ? [] : AccuracyAnalysis::GC_FRAMES
    to_caller = rbspy ? [AccuracyAnalysis::GC_FRAMES.first] : []
    self_cpu = AccuracyAnalysis.pprof_self(File.binread(pprof), leave_out: leave_out, to_caller: to_caller,
                                           within: within(program, options))
    truth, process_cpu = read_truth(program, "#{base}.truth.json")
    Run.new(weights: self_cpu[:weights], on_cpu_samples: self_cpu[:on_cpu_samples], truth: truth,
            process_cpu_ns: process_cpu, wall_s: wall, extra: { cpu_ns: self_cpu[:total], gc_ns: self_cpu[:left_out] })
  end

  def run_stackprof(program, index, options)
    return run_rails_stackprof(index, options) if program == "rails"

    base = File.join(OUT, "#{program}.#{index}.stackprof")
    env = truth_env(program, base).merge("ACCURACY_STACKPROF_OUT" => "#{base}.dump",
                                         "ACCURACY_STACKPROF_INTERVAL" => options.stackprof_interval.to_s)
    argv = program_argv(program, options.seconds).insert(1, "-r", File.join(DIR, "stackprof_start.rb"))
    wall = spawn(argv, env, "#{base}.log", options.timeout)
    dump = Marshal.load(File.binread("#{base}.dump")) # our own file
    self_samples = AccuracyAnalysis.stackprof_self(dump)
    truth, process_cpu = read_truth(program, "#{base}.truth.json")
    Run.new(weights: self_samples[:weights], on_cpu_samples: self_samples[:weights].values.sum, truth: truth,
            process_cpu_ns: process_cpu, wall_s: wall,
            extra: { gc_samples: self_samples[:gc_samples], missed_samples: dump[:missed_samples] || 0 })
  end

  # `rails` (bench/accuracy/rails.rb) under ours: the workers' pprofs, added up. `--gc-apart`
  # does not apply (record's default: on 3.1 no GC frame, its CPU on the code it interrupted).
  def run_rails_ours(index, options)
    started = BenchServer.now
    files = AccuracyRails.run(:ours, File.join(OUT, "rails.#{index}.ours"), options).map { |file| File.binread(file) }
    wall = BenchServer.now - started
    # n as the CPU ticks counted it (AccuracyAnalysis.pprof_self's `hz`): Puma's idle threads
    # made the cpu-samples of the samples with cpu-time 20 times the CPU's ticks (6,486 for
    # 3.36 s at 99 Hz), and so the unbiased overlap that of a sampler with 20 times the samples.
    parts = files.map { |pprof| AccuracyAnalysis.pprof_self(pprof, leave_out: AccuracyAnalysis::GC_FRAMES, hz: options.hz) }
    stacks = files.flat_map { |pprof| AccuracyAnalysis.pprof_stacks(pprof, leave_out: AccuracyAnalysis::GC_FRAMES) }
    Run.new(weights: add_up(parts.map { |part| part[:weights] }), on_cpu_samples: parts.sum { |part| part[:on_cpu_samples] },
            wall_s: wall, extra: { cpu_ns: parts.sum { |part| part[:total] }, gc_ns: parts.sum { |part| part[:left_out] } },
            templates: AccuracyAnalysis.template_weights(stacks))
  end

  # `rails` under stackprof, restarted in each worker: the workers' results, added up.
  def run_rails_stackprof(index, options)
    started = BenchServer.now
    dumps = AccuracyRails.run(:stackprof, File.join(OUT, "rails.#{index}.stackprof"), options)
                         .map { |file| Marshal.load(File.binread(file)) } # our own files
    wall = BenchServer.now - started
    parts = dumps.map { |dump| AccuracyAnalysis.stackprof_self(dump) }
    weights = add_up(parts.map { |part| part[:weights] })
    Run.new(weights: weights, on_cpu_samples: weights.values.sum, wall_s: wall,
            extra: { gc_samples: parts.sum { |part| part[:gc_samples] },
                     missed_samples: dumps.sum { |dump| dump[:missed_samples] || 0 } },
            templates: AccuracyAnalysis.template_weights(dumps.flat_map { |dump| AccuracyAnalysis.stackprof_stacks(dump) }))
  end

  # rbspy's binary: on PATH, else where `cargo install` puts it; nil if neither.
  def rbspy
    [*ENV.fetch("PATH", "").split(File::PATH_SEPARATOR), File.join(Dir.home, ".cargo", "bin")]
      .map { |dir| File.join(dir, "rbspy") }.find { |path| File.executable?(path) }
  end

  # The reference where stackprof is not built for the Ruby at hand (Debian has it for 3.1
  # only): rbspy reads the stacks from outside, pausing the process for each (its blocking
  # mode), at the rate of #reference_interval, and only of threads on a CPU (`--on-cpu`, for
  # the programs that block, RBSPY_BLOCKING; the others' threads always are), so it has no
  # safepoint bias either. Its pprof gives each sample's on-CPU time (`wall`, 1/rate
  # a sample). It sees no GC frames (GC time stays on the frame that allocated, as ours) and
  # names frames by their bare label, C functions with ` [c function]` after it. Samples whose
  # leaf it could not name, `(unknown)` or `(unknown) [c function]` (3-6% on Ruby 3.3), are left out and the rest
  # renormalized, as stackprof's GC frames are; their share is printed in that place.
  def run_rbspy(program, index, options)
    base = File.join(OUT, "#{program}.#{index}.rbspy")
    rate = 1_000_000 / reference_interval(program, options)
    on_cpu = RBSPY_BLOCKING.key?(program) ? ["--on-cpu"] : []
    argv = [rbspy, "record", *on_cpu, "--rate", rate.to_s, "--format", "pprof", "--file", "#{base}.pb", "--silent",
            "--", *program_argv(program, options.seconds)]
    # rbspy 0.55 on Ruby 3.3 at times stops sampling and never exits, or gives up on a stack
    # ("stack base and cfp address out of sync"): one more try, then the failure stands.
    wall = begin
      spawn(argv, truth_env(program, base), "#{base}.log", options.timeout)
    rescue RuntimeError => e
      warn "bench/accuracy: rbspy run failed, trying once more: #{e.message.lines.first.strip}"
      spawn(argv, truth_env(program, base), "#{base}.log", options.timeout)
    end
    self_time = AccuracyAnalysis.pprof_self(File.binread("#{base}.pb"), value: "wall", count: "wall",
                                            leave_out: [RBSPY_UNKNOWN, "#{RBSPY_UNKNOWN} [c function]"],
                                            within: within(program, options))
    truth, process_cpu = read_truth(program, "#{base}.truth.json")
    samples = ->(ns) { (ns * rate / 1e9).round }
    Run.new(weights: self_time[:weights], on_cpu_samples: samples.call(self_time[:total]), truth: truth,
            process_cpu_ns: process_cpu, wall_s: wall,
            extra: { gc_samples: samples.call(self_time[:left_out]), missed_samples: 0 })
  end
  RBSPY_UNKNOWN = "(unknown)"
  # Each program's `run(seconds)` and its blocks, as ours (`Sleepy.run`) and rbspy
  # (`#<Class:0x...>#run`, `block in run`) name them.
  RUN_FRAME = /(\A|[#. ])run\z/
  # Loading code: `Kernel#require`, `require_relative`, `load`, `eval` (rbspy adds ` [c function]`).
  LOADING_FRAME = /\A(Kernel#)?(require|require_relative|load|eval)( \[c function\])?\z/

  # Which samples count, given their frames' names (see the header): nil (all) for stackprof.
  def within(program, options)
    return unless options.reference == "rbspy"
    return ->(names) { names.none? { |name| LOADING_FRAME.match?(name) } } if program == "micro_c"

    ->(names) { names.any? { |name| RUN_FRAME.match?(name) } }
  end

  # What the reference's left-out samples are (`stackprof_gc_share` in the JSON).
  def left_out_name(options)
    options.reference == "rbspy" ? RBSPY_UNKNOWN : "GC"
  end

  def run_reference(program, index, options)
    options.reference == "rbspy" ? run_rbspy(program, index, options) : run_stackprof(program, index, options)
  end

  def add_up(hashes)
    hashes.each_with_object(Hash.new(0)) { |h, sum| h.each { |k, v| sum[k] += v } }
  end

  # The runs of one profiler on one program, added up (truth and process CPU nil without truth).
  def pool(runs)
    truth = runs.all?(&:truth)
    templates = runs.all?(&:templates) && {
      self: add_up(runs.map { |run| run.templates[:self] }), total: add_up(runs.map { |run| run.templates[:total] }),
      all: runs.sum { |run| run.templates[:all] }
    }
    { weights: add_up(runs.map(&:weights)), n: runs.sum(&:on_cpu_samples),
      truth: truth ? add_up(runs.map(&:truth)) : nil, process_cpu_ns: truth ? runs.sum(&:process_cpu_ns) : nil,
      extra: add_up(runs.map(&:extra)), templates: templates || nil }
  end

  # Every figure of one program, from its pooled runs.
  def figures(ours_runs, stackprof_runs, options)
    ours = pool(ours_runs)
    sp = pool(stackprof_runs)
    ours_dist = AccuracyAnalysis.shares(ours[:weights])
    sp_dist = AccuracyAnalysis.shares(sp[:weights])
    # nil for a program without truth: every figure against it is then nil (printed n/a).
    ours_truth = ours[:truth] && AccuracyAnalysis.shares(ours[:truth])
    sp_truth = sp[:truth] && AccuracyAnalysis.shares(sp[:truth])
    unbiased = lambda do |dist, n|
      dist && AccuracyAnalysis.unbiased_overlap(dist, n, draws: options.draws, seed: options.seed)
    end
    against = ->(dist, truth) { truth && AccuracyAnalysis.overlap(dist, truth) }
    ratio = ->(a, b) { a && b&.positive? ? a / b : nil }

    overlap = AccuracyAnalysis.overlap(ours_dist, sp_dist)
    reference = unbiased.call(sp_dist, ours[:n])
    both_noisy = AccuracyAnalysis.two_sample_overlap(sp_dist, ours[:n], sp[:n], draws: options.draws, seed: options.seed)
    ours_vs_truth = against.call(ours_dist, ours_truth)
    ours_truth_reference = unbiased.call(ours_truth, ours[:n])
    sp_vs_truth = against.call(sp_dist, sp_truth)
    sp_truth_reference = unbiased.call(sp_truth, sp[:n])
    sp_all = sp[:n] + sp[:extra][:gc_samples]
    {
      overlap: overlap,
      n: ours[:n],
      unbiased_overlap: reference,
      ratio: ratio.call(overlap, reference),
      two_sample_unbiased: both_noisy,
      two_sample_ratio: ratio.call(overlap, both_noisy),
      ours_vs_truth: ours_vs_truth,
      ours_vs_truth_unbiased: ours_truth_reference,
      ours_vs_truth_ratio: ratio.call(ours_vs_truth, ours_truth_reference),
      stackprof_vs_truth: sp_vs_truth,
      stackprof_vs_truth_unbiased: sp_truth_reference,
      stackprof_vs_truth_ratio: ratio.call(sp_vs_truth, sp_truth_reference),
      ours_cpu_s: ours[:extra][:cpu_ns] / 1e9,
      ours_gc_share: ours[:extra][:gc_ns].fdiv(ours[:extra][:cpu_ns] + ours[:extra][:gc_ns]),
      stackprof_samples: sp[:n],
      stackprof_gc_share: sp_all.positive? ? sp[:extra][:gc_samples].fdiv(sp_all) : 0.0,
      stackprof_missed_samples: sp[:extra][:missed_samples],
      truth_coverage: ours[:truth] && { ours: ours[:truth].values.sum.fdiv(ours[:process_cpu_ns]),
                                        stackprof: sp[:truth].values.sum.fdiv(sp[:process_cpu_ns]) },
      ours_top: AccuracyAnalysis.top(ours_dist, TOP),
      stackprof_top: AccuracyAnalysis.top(sp_dist, TOP),
      truth_top: sp_truth && AccuracyAnalysis.top(sp_truth, TOP),
      overlap_by_run: ours_runs.zip(stackprof_runs).map do |o, s|
        AccuracyAnalysis.overlap(AccuracyAnalysis.shares(o.weights), AccuracyAnalysis.shares(s.weights))
      end,
      templates: ours[:templates] && template_shares(ours[:templates], sp[:templates]),
      dists: { ours: ours_dist, ours_truth: ours_truth, stackprof: sp_dist, stackprof_truth: sp_truth },
    }
  end

  # Each template's share of the CPU in ours and stackprof's (template_weights pooled):
  # {template => {ours_self:, ours_total:, stackprof_self:, stackprof_total:}}, by stackprof's
  # total, largest first.
  def template_shares(ours, stackprof)
    share = ->(weights, side, template) { side[:all].positive? ? weights.fetch(template, 0).fdiv(side[:all]) : 0.0 }
    templates = (ours[:total].keys | stackprof[:total].keys)
    templates.sort_by { |t| [-share.call(stackprof[:total], stackprof, t), t] }.to_h do |t|
      [t, { ours_self: share.call(ours[:self], ours, t), ours_total: share.call(ours[:total], ours, t),
            stackprof_self: share.call(stackprof[:self], stackprof, t),
            stackprof_total: share.call(stackprof[:total], stackprof, t) }]
    end
  end

  NA = "n/a"

  def pct(share)
    share ? format("%5.1f%%", share * 100) : "    -"
  end

  def num(value, digits = 3)
    value ? format("%.#{digits}f", value) : "-"
  end

  # A share in a truth column: n/a when the program has no truth at all.
  def truth_pct(dist, name)
    dist ? pct(dist[name]) : NA
  end

  def print_program(io, program, f, options)
    io.puts
    ref = options.reference
    io.puts format("%s: overlap %s with #{ref}, n = %d on-CPU samples, an unbiased sampler with n: %s " \
                   "-> ratio %s (target >= %.2f)",
                   program, num(f[:overlap]), f[:n], num(f[:unbiased_overlap]), num(f[:ratio], 2), TARGET)
    io.puts format("  with #{ref}'s own noise (its %d samples drawn too): unbiased %s -> ratio %s",
                   f[:stackprof_samples], num(f[:two_sample_unbiased]), num(f[:two_sample_ratio], 2))
    if f[:truth_coverage]
      io.puts format("  vs truth: ours %s (unbiased with n: %s, ratio %s), #{ref} %s (with its %d samples: %s, ratio %s)",
                     num(f[:ours_vs_truth]), num(f[:ours_vs_truth_unbiased]), num(f[:ours_vs_truth_ratio], 2),
                     num(f[:stackprof_vs_truth]), f[:stackprof_samples], num(f[:stackprof_vs_truth_unbiased]),
                     num(f[:stackprof_vs_truth_ratio], 2))
    else
      io.puts "  vs truth: #{NA} (the program does not measure its own CPU)"
    end
    coverage = f[:truth_coverage] ? "#{pct(f[:truth_coverage][:ours]).strip} / #{pct(f[:truth_coverage][:stackprof]).strip}" : NA
    io.puts format("  ours: %.2f s cpu-time%s; #{ref}: %d samples (%s #{left_out_name(options)} left out, %d signals missed); " \
                   "truth measured %s of the process CPU",
                   f[:ours_cpu_s], options.gc_apart ? " (#{pct(f[:ours_gc_share]).strip} GC left out)" : "",
                   f[:stackprof_samples], pct(f[:stackprof_gc_share]).strip, f[:stackprof_missed_samples], coverage)
    d = f[:dists]
    names = (f[:ours_top] + f[:stackprof_top] + (f[:truth_top] || [])).map(&:first).uniq
    names.sort_by! { |name| [-d[:stackprof].fetch(name, 0), -d[:ours].fetch(name, 0), name] }
    width = [names.map(&:size).max || 0, 8].max
    io.puts format("  %-#{width}s  %6s  %6s   %9s  %6s", "function", "ours", "truth", ref, "truth")
    names.each do |name|
      io.puts format("  %-#{width}s  %6s  %6s   %9s  %6s", name, pct(d[:ours][name]), truth_pct(d[:ours_truth], name),
                     pct(d[:stackprof][name]), truth_pct(d[:stackprof_truth], name))
    end
    print_templates(io, f[:templates], ref) if f[:templates]
  end

  # The templates' shares of the CPU, ours beside the reference's: self (the template's own
  # frames at the leaf) and total (its frame anywhere in the stack).
  def print_templates(io, templates, ref)
    width = [templates.keys.map(&:size).max || 0, 8].max
    io.puts format("  %-#{width}s  %11s  %11s   %13s  %13s", "template", "ours self", "ours total", "#{ref} self",
                   "#{ref} total")
    templates.each do |template, s|
      io.puts format("  %-#{width}s  %11s  %11s   %13s  %13s", template, pct(s[:ours_self]), pct(s[:ours_total]),
                     pct(s[:stackprof_self]), pct(s[:stackprof_total]))
    end
  end

  def print_summary(io, results, reference)
    io.puts
    io.puts format("%-8s  %7s  %5s  %8s  %5s   %-16s  %-16s", "program", "overlap", "n", "unbiased", "ratio",
                   "ours~truth ratio", "#{reference}~truth")
    results.each do |program, f|
      vs_truth = lambda do |overlap, ratio|
        f[:truth_coverage] ? "#{num(f[overlap])} #{num(f[ratio], 2)}" : NA
      end
      io.puts format("%-8s  %7s  %5d  %8s  %5s   %-16s  %-16s", program, num(f[:overlap]), f[:n], num(f[:unbiased_overlap]),
                     num(f[:ratio], 2), vs_truth.call(:ours_vs_truth, :ours_vs_truth_ratio),
                     vs_truth.call(:stackprof_vs_truth, :stackprof_vs_truth_ratio))
    end
  end

  def rounded(value)
    case value
    when Float then value.round(4)
    when Array then value.map { |v| rounded(v) }
    when Hash then value.transform_values { |v| rounded(v) }
    else value
    end
  end

  def main(argv)
    options = parse(argv)
    check_tools(options.programs, options.reference)
    FileUtils.mkdir_p(OUT)
    load = File.read("/proc/loadavg").split.first if File.readable?("/proc/loadavg")
    intervals = options.programs.map { |program| reference_interval(program, options) }.uniq
    puts format("accuracy: %s, %.1f s each, ours at %d Hz%s vs %s %s µs, Ruby %s%s, %d run(s) each%s",
                options.programs.join(", "), options.seconds, options.hz, options.gc_apart ? " (--gc, GC left out)" : "",
                options.reference == "rbspy" ? "rbspy (--on-cpu for #{RBSPY_BLOCKING.keys.join(', ')})" : "stackprof cpu",
                intervals.join("/"),
                RUBY_VERSION, ENV["RUBYOPT"].to_s.include?("--yjit") ? " (RUBYOPT --yjit)" : "", options.runs, load ? ", load average #{load}" : "")
    runs = Hash.new { |h, k| h[k] = { ours: [], stackprof: [] } }
    options.runs.times do |i|
      options.programs.each do |program|
        ours = run_ours(program, i + 1, options)
        begin
          sp = run_reference(program, i + 1, options)
        rescue RuntimeError => e
          # rbspy 0.55 hangs now and then (sleepy on 3.3.8 with YJIT: twice in a row): the
          # pair is left out and the other programs go on.
          puts format("run %d %-8s %s failed (pair left out): %s", i + 1, program, options.reference, e.message.lines.first.strip)
          next
        end
        runs[program][:ours] << ours
        runs[program][:stackprof] << sp
        puts format("run %d %-8s ours %.1f s (%d on-CPU samples, %.2f s cpu-time), #{options.reference} %.1f s (%d samples)",
                    i + 1, program, ours.wall_s, ours.on_cpu_samples, ours.extra[:cpu_ns] / 1e9, sp.wall_s,
                    sp.on_cpu_samples + sp.extra[:gc_samples])
      end
    end

    measured = options.programs.select { |program| runs.key?(program) }
    puts "no pair of #{(options.programs - measured).join(', ')} completed: left out" if measured != options.programs
    results = measured.to_h { |program| [program, figures(runs[program][:ours], runs[program][:stackprof], options)] }
    results.each { |program, f| print_program($stdout, program, f, options) }
    print_summary($stdout, results, options.reference)
    ratios = results.values.map { |f| f[:ratio] }
    summary = {
      bench: "accuracy", ruby: RUBY_VERSION, reference: options.reference, seconds: options.seconds, hz: options.hz, runs: options.runs, gc_apart: options.gc_apart,
      stackprof_interval_us: options.stackprof_interval,
      reference_interval_us: measured.to_h { |program| [program, reference_interval(program, options)] }, draws: options.draws, seed: options.seed, target: TARGET,
      failed: options.programs - measured,
      load_average: load&.to_f, min_ratio: ratios.compact.min,
      programs: results.transform_values { |f| f.except(:dists) }
    }
    puts JSON.generate(rounded(summary))
  rescue OptionParser::ParseError => e
    warn "bench/accuracy: #{e.message}"
    exit 2
  end
end

AccuracyBench.main(ARGV) if $PROGRAM_NAME == __FILE__
