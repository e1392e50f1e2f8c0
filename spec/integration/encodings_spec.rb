# frozen_string_literal: true

require "zlib"

require "fileutils"
require "rbconfig"
require "tmpdir"

# Every file the gem writes or reads is bytes, whatever `Encoding.default_internal` and
# `default_external` say: a Rails app sets default_internal, and its puma workers wrote no
# profile ("\x8B" from ASCII-8BIT to UTF-8: the temporary file of Recording.write was opened
# with integer flags, which do not make it binary). Each example runs exe/ddprof-recorder
# with RUBYOPT set as below, which `record` passes on to the program it profiles: the CLI
# process reads and writes under it, and so does the program's autostart.
RSpec.describe "ddprof-recorder under other default encodings" do
  include CliHelpers

  # RUBYOPT for each run: none (the bytes to compare with), an internal encoding (Rails'
  # UTF-8), and an external one that is not UTF-8, under which writing text transcodes it.
  rubyopts = [nil, "-E UTF-8:UTF-8", "-E ISO-8859-1:UTF-8"].freeze
  # A thread name that ISO-8859-1 cannot hold, and a method name that it can: the views
  # below show both.
  thread_name = "wörker 日本"

  # The work of the views' profile: `seconds` of this thread's CPU, in a method whose name
  # is not ASCII.
  def self.rechne_größe(seconds)
    finish = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + seconds
    nil while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < finish
  end

  before(:context) do
    @dir = File.realpath(Dir.mktmpdir("ddprof_recorder_encodings"))
    # One profile for every view, `timeline` too: the thread name is in each sample's labels,
    # so the --by-thread views and the timeline's lanes show it whatever was sampled.
    profiler = DdprofRecorder::Profiler.new(hz: 199, timeline: true)
    profiler.start
    Thread.new do
      Thread.current.name = thread_name
      self.class.rechne_größe(0.15)
    end.join
    File.binwrite(File.join(@dir, "in.pb.gz"), profiler.stop.last)
    # The same profile raw: merge reads a gzip'd and a raw file of the same value types (a
    # second profile without the timeline had other types than this one on 3.3+).
    File.binwrite(File.join(@dir, "in.pb"), Zlib.gunzip(File.binread(File.join(@dir, "in.pb.gz"))))
  end

  after(:context) { FileUtils.remove_entry(@dir, true) }

  def rubyopt_env(rubyopt)
    { "RUBYOPT" => rubyopt }
  end

  # What each view and merge writes, by name: the file of `-o FILE` (under `out`), or
  # stdout for `-o -`, `folded` and `top`.
  def view_outputs(rubyopt, out)
    FileUtils.mkdir_p(File.join(@dir, out))
    files = { "flamegraph -o FILE" => ["flamegraph", "--by-thread", "in.pb.gz", "-o", "#{out}/f.svg"],
              "speedscope -o FILE" => ["speedscope", "--by-thread", "in.pb.gz", "-o", "#{out}/s.json"],
              "speedscope --timeline -o FILE" => ["speedscope", "--timeline", "in.pb.gz", "-o", "#{out}/st.json"],
              "timeline -o FILE.html" => ["timeline", "in.pb.gz", "-o", "#{out}/t.html"],
              "timeline -o FILE.svg" => ["timeline", "in.pb.gz", "-o", "#{out}/t.svg"],
              "merge -o FILE.pb.gz" => ["merge", "-o", "#{out}/m.pb.gz", "in.pb.gz", "in.pb"],
              "merge -o FILE.pb" => ["merge", "-o", "#{out}/m.pb", "in.pb.gz", "in.pb"] }
    stdout = { "flamegraph -o -" => ["flamegraph", "--by-thread", "in.pb.gz", "-o", "-"],
               "speedscope -o -" => ["speedscope", "--by-thread", "in.pb.gz", "-o", "-"],
               "timeline -o -" => ["timeline", "in.pb.gz", "-o", "-"],
               "merge -o -" => ["merge", "-o", "-", "in.pb.gz", "in.pb"],
               "folded" => ["folded", "--by-thread", "in.pb.gz"],
               "top" => ["top", "in.pb.gz"] }
    run = lambda do |argv|
      printed, err, status = run_exe(*argv, env: rubyopt_env(rubyopt))
      expect([err, status]).to eq(["", 0]), "`#{argv.join(' ')}` under RUBYOPT=#{rubyopt.inspect}: #{err}"
      printed.b
    end
    files.transform_values { |argv| run.call(argv) && File.binread(File.join(@dir, argv[argv.index("-o") + 1])) }
         .merge(stdout.transform_values(&run))
  end

  it "writes each view and merge as the same bytes as without RUBYOPT, -o FILE and stdout" do
    reference = view_outputs(nil, "plain")
    # What the comparison would miss if it were not there: the non-ASCII names.
    ["flamegraph -o FILE", "speedscope -o FILE", "timeline -o FILE.html", "timeline -o -", "folded"].each do |name|
      expect(reference.fetch(name)).to include(thread_name.b), name
    end
    expect(reference.fetch("top")).to include("rechne_größe".b)
    merged = samples_from(decode_pprof(reference.fetch("merge -o FILE.pb.gz")))
    expect(merged.map { |s| s[:labels]["thread name"] }).to include(thread_name)
    expect(decode_pprof(reference.fetch("merge -o -")).sample.size).to eq(decode_pprof(reference.fetch("merge -o FILE.pb")).sample.size)

    rubyopts.compact.each_with_index do |rubyopt, i|
      outputs = view_outputs(rubyopt, "encoded#{i}")
      reference.each do |name, bytes|
        expect(outputs.fetch(name) == bytes).to be(true), "#{name} under RUBYOPT=#{rubyopt}: #{outputs.fetch(name).bytesize} " \
                                                           "bytes, not the #{bytes.bytesize} bytes written without"
      end
    end
  end

  # The user's one line: a program that sets default_internal itself, without RUBYOPT.
  it "records a program that sets Encoding.default_internal, and go tool pprof reads the file" do
    out, err, status = run_exe("record", "-o", "x.pb.gz", "--", RbConfig.ruby, "-e",
                               'Encoding.default_internal = "UTF-8"; x = 0; 3_000_000.times { x += 1 }',
                               env: rubyopt_env(nil))
    expect([err, status]).to eq(["", 0])
    path = File.join(@dir, "x.pb.gz")
    expect(out).to include("  written   x.pb.gz (#{File.size(path)} bytes)")
    profile = decode_pprof(File.binread(path))
    expect(profile.sample_type.map { |t| profile.string_table[t.type] }).to include("cpu-time", "wall-time")
    expect(samples_from(profile).map { |s| s[:labels]["thread name"] }).to include("main")
    expect(go_pprof_top(path, "wall-time")).to include("main") if Programs.available?("go")
  end

  rubyopts.each do |rubyopt|
    # Each process burns 0.5 s of CPU, so that its life holds a 0.2 s window even when the
    # sampler thread waits out a whole 100 ms time slice for the GVL at the window's end (a
    # child that burnt 0.25 s exited first, with one file, on 3.3.8 and 3.4.5 in CI).
    it "records a program that sets default_internal, its forked child and their windows (RUBYOPT=#{rubyopt.inspect})" do
      program = 'Encoding.default_internal = "UTF-8"; ' \
                "def burn = (t = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.5; nil while " \
                "Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < t); pid = fork { burn }; burn; Process.wait(pid)"
      name = "r#{rubyopts.index(rubyopt)}"
      [[], ["--interval", "0.2"]].each do |interval|
        out, err, status = run_exe("record", "-o", "#{name}.pb.gz", *interval, "--", RbConfig.ruby, "-e", program,
                                   env: rubyopt_env(rubyopt))
        expect([err, status]).to eq(["", 0]), out
        files = DdprofRecorder::Recording.profile_files(File.join(@dir, "#{name}.pb.gz"))
        expect(files.keys.size).to eq(2) # the program's and its child's
        expect(out).to include("  written   #{files.values.sum(&:size)} files, ")
        files.values.flatten.each do |file|
          expect(decode_pprof(File.binread(file)).sample_type.size).to be >= 3, file
        end
        expect(files.values.map(&:size)).to all(be >= 2) unless interval.empty?
        File.delete(*files.values.flatten)
      end
    end
  end
end
