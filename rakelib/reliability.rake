# frozen_string_literal: true

# Reliability tasks (issue 4; docs/reliability.md):
#   rake fuzz          libFuzzer on the core's two targets (recorder_ops, pprof_reader), FUZZ_SECONDS
#                      (default 60) split between them, through cargo fuzz
#   rake sanitize      the core's tests under valgrind memcheck, AddressSanitizer (+ LeakSanitizer),
#                      ThreadSanitizer, and Miri for the slot protocol where nightly has it
#   rake reliability   bench/reliability: every figure of the issue in one summary
require "fileutils"
require "json"
require "open3"

FUZZ_DIR = "crates/core/fuzz"
# Each target with its share of FUZZ_SECONDS, the test file of its stable driver (which also
# replays its kept inputs) and the driver's test name; seeds are extra corpus directories.
FUZZ_TARGETS = {
  "recorder_ops" => { share: 0.5, regressions: "regressions", test: "fuzz_regressions", seeds: [] },
  "pprof_reader" => { share: 0.5, regressions: "pprof_regressions", test: "pprof_reader_fuzz",
                      seeds: ["seeds/pprof_reader"] },
}.freeze
HOST_TARGET = "x86_64-unknown-linux-gnu"

# How to run cargo with unstable flags here: nightly if rustup has it, else stable with
# RUSTC_BOOTSTRAP=1 (the machine's only toolchain is stable and no other can be fetched).
def unstable_cargo
  toolchains = `rustup toolchain list 2>/dev/null`
  return [{}, %w[cargo +nightly]] if toolchains.include?("nightly")

  [{ "RUSTC_BOOTSTRAP" => "1" }, %w[cargo]]
end

def cargo_fuzz_installed?
  system("cargo fuzz --version", out: File::NULL, err: File::NULL)
end

# Runs libFuzzer on `target` for `seconds`; keeps new crash inputs. Returns whether it passed.
def libfuzzer_run(env, cargo, target, settings, seconds)
  artifacts = File.join(FUZZ_DIR, "artifacts", target)
  before = Dir[File.join(artifacts, "*")]
  corpus = File.join(FUZZ_DIR, "corpus", target)
  FileUtils.mkdir_p(corpus)
  seeds = settings[:seeds].map { |dir| File.join("fuzz", dir) }
  ok = Dir.chdir("crates/core") do
    system(env, *cargo, "fuzz", "run", target, File.join("fuzz", "corpus", target), *seeds, "--",
           "-max_total_time=#{seconds}", "-rss_limit_mb=4096", "-print_final_stats=1")
  end
  crashes = Dir[File.join(artifacts, "*")] - before
  crashes.each do |crash|
    dir = File.join(FUZZ_DIR, settings[:regressions])
    FileUtils.mkdir_p(dir)
    kept = File.join(dir, File.basename(crash))
    cp crash, kept
    puts "kept #{kept}: it now runs in `cargo test -p ddprof_recorder_core --test #{settings[:test]}`"
  end
  return true if ok && crashes.empty?

  message = "fuzz: the #{target} target failed (#{crashes.size} new crash input(s))"
  # In CI a time-bounded random search is reported, not fatal: what it finds is kept above
  # and becomes a deterministic regression test (which does fail CI) once committed.
  abort message unless ENV["CI"]
  warn "#{message}: NOT failing CI; commit the kept input and fix it"
  false
end

desc "Fuzz the core (cargo fuzz, libFuzzer + ASan): recorder_ops and pprof_reader share FUZZ_SECONDS (60)"
task :fuzz do
  seconds = Integer(ENV.fetch("FUZZ_SECONDS", "60"))
  share = ->(settings) { [(seconds * settings[:share]).round, 1].max }
  unless cargo_fuzz_installed?
    puts "cargo-fuzz is missing: installing it from crates.io"
    system("cargo install cargo-fuzz --locked") || puts("cargo install cargo-fuzz failed")
  end
  env, cargo = unstable_cargo
  # Build both first (one build of the fuzz crate): a toolchain that cannot build them is a
  # reason to fall back, not a failure.
  built = cargo_fuzz_installed? && Dir.chdir("crates/core") { system(env, *cargo, "fuzz", "build") }
  if built
    FUZZ_TARGETS.each do |target, settings|
      passed = libfuzzer_run(env, cargo, target, settings, share.call(settings))
      puts "fuzz: libFuzzer ran #{target} #{share.call(settings)} s without a failure" if passed
    end
    next
  end
  puts "cargo fuzz could not build the targets here: falling back to the stable drivers"

  # Fallback: the same harnesses driven by a deterministic PRNG, for the same time.
  FUZZ_TARGETS.each_value do |settings|
    sh({ "FUZZ_SECONDS" => share.call(settings).to_s }, "cargo", "test", "--release", "-p", "ddprof_recorder_core",
       "--test", settings[:test], "--", "--nocapture", "pseudo_random")
  end
end

namespace :sanitize do
  # Paths of the core's test executables (built with `extra` cargo arguments and `env`).
  def core_test_binaries(env = {}, extra = [])
    out, status = Open3.capture2(env, "cargo", *extra, "test", "-p", "ddprof_recorder_core", "--no-run",
                                 "--message-format=json")
    abort "building the core's tests failed" unless status.success?
    out.lines.filter_map do |line|
      msg = JSON.parse(line)
      msg["executable"] if msg["reason"] == "compiler-artifact" && msg.dig("profile", "test") && msg["executable"]
    rescue JSON::ParserError
      nil
    end
  end

  desc "The core's tests under valgrind memcheck (errors and definite leaks fail)"
  task :valgrind do
    core_test_binaries.each do |exe|
      # 50x slower under valgrind: fewer pseudo-random fuzz inputs (the kept ones all replay).
      # No fork in tests/fork.rs: in a forked child, what only the parent's other threads
      # referenced (their stacks are gone) is "definitely lost" to valgrind, which then fails
      # the child.
      sh({ "FUZZ_ITERATIONS" => "150", "FORK_TEST_FORKS" => "0" }, "valgrind", "--error-exitcode=99", "--leak-check=full",
         "--errors-for-leak-kinds=definite", "--quiet", exe, "--test-threads=1")
    end
  end

  desc "The core's tests under AddressSanitizer + LeakSanitizer (-Zsanitizer=address)"
  task :address do
    env, cargo = unstable_cargo
    env = env.merge("RUSTFLAGS" => "-Zsanitizer=address", "CARGO_TARGET_DIR" => "target/asan",
                    "ASAN_OPTIONS" => "detect_leaks=1")
    sh env, *cargo, "test", "-p", "ddprof_recorder_core", "--target", HOST_TARGET
  end

  desc "The core's recorder (two-slot protocol) tests under ThreadSanitizer"
  task :thread do
    env, cargo = unstable_cargo
    # std and the test harness are not instrumented (no -Zbuild-std without rust-src, which
    # cannot be fetched here): their internal synchronization shows up as races. Suppress
    # exactly those; a race in the core or parking_lot is still reported.
    supp = File.expand_path("crates/core/tests/tsan.supp")
    env = env.merge("RUSTFLAGS" => "-Zsanitizer=thread -Cunsafe-allow-abi-mismatch=sanitizer",
                    "CARGO_TARGET_DIR" => "target/tsan", "TSAN_OPTIONS" => "suppressions=#{supp} halt_on_error=1")
    sh env, *cargo, "test", "-p", "ddprof_recorder_core", "--target", HOST_TARGET, "--test", "recorder"
  end
end

namespace :sanitize do
  desc "The two-slot protocol under Miri (needs nightly with the miri component; skipped without)"
  task :miri do
    unless system("cargo +nightly miri --version", out: File::NULL, err: File::NULL)
      puts "sanitize:miri skipped: no nightly toolchain with the miri component here"
      next
    end
    # Isolation off: the recorder reads the wall clock. Only the Miri-sized protocol tests: the
    # other suites' thousands of samples would take hours in the interpreter.
    sh({ "MIRIFLAGS" => "-Zmiri-disable-isolation" }, "cargo", "+nightly", "miri", "test", "-p",
       "ddprof_recorder_core", "--test", "slot_protocol_small")
  end
end

desc "The core's tests under valgrind memcheck, ASan/LSan, TSan and (where available) Miri"
task sanitize: %w[sanitize:valgrind sanitize:address sanitize:thread sanitize:miri]

desc "bench/reliability: inputs tried, crashes, samples lost, forks survived, soak RSS growth"
task reliability: :compile do
  sh RbConfig.ruby, "bench/reliability"
end
