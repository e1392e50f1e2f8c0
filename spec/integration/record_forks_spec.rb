# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"

# `ddprof-recorder record` on programs that fork: one profile per process, whichever way the
# process ends; and the commands that take several profiles (top, folded, flamegraph, merge).
# Profiles are decoded with google-protobuf (spec/support).
RSpec.describe "exe/ddprof-recorder and forked processes" do
  root = File.expand_path("../..", __dir__)
  exe = File.join(root, "exe", "ddprof-recorder")

  define_method(:cli) do |*args, env: {}, chdir: @dir|
    out, err, status = Open3.capture3(env, RbConfig.ruby, exe, *args, chdir: chdir)
    [out, err, status.exitstatus]
  end

  # The shared part of the programs below: `burn(s)` uses s seconds of this thread's CPU. Each
  # child burns at least 0.4 s, so that the sampler (a Ruby thread, see Profiler) gets the GVL
  # from it a few times.
  prelude = <<~RUBY
    def burn(seconds)
      start = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID)
      x = 0
      x += 1 while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) - start < seconds
      x
    end
  RUBY

  # Two children, each with its own work; prints their pids.
  two_children = prelude + <<~RUBY
    def child_one_work = burn(0.4)
    def child_two_work = burn(0.4)
    pids = [fork { child_one_work }, fork { child_two_work }]
    pids.each { |pid| Process.wait(pid) }
    puts pids.join(" ")
  RUBY

  # Children that end through Process.exit!, through Kernel#exit! in a TERM handler (as
  # Unicorn's workers do), and through the SIGTERM that Ruby turns into an exception; prints
  # their pids.
  endings = prelude + <<~RUBY
    def exit_bang_work = burn(0.4)
    def trap_exit_bang_work = burn(0.4)
    def sigterm_work = burn(0.4)
    ready, ready_w = IO.pipe
    bang = fork { exit_bang_work; Process.exit!(0) }
    trapped = fork do
      trap("TERM") { exit!(0) }
      trap_exit_bang_work
      ready_w.puts("trapped")
      sleep
    end
    termed = fork do
      sigterm_work
      ready_w.puts("termed")
      sleep
    end
    2.times { ready.gets }
    Process.kill("TERM", trapped)
    Process.kill("TERM", termed)
    [bang, trapped, termed].each { |pid| Process.wait(pid) }
    puts [bang, trapped, termed].join(" ")
  RUBY

  # The decoded samples of a file.
  def samples_of(file)
    samples_from(decode_pprof(File.binread(File.join(@dir, file))))
  end

  def pids_of(file)
    samples_of(file).map { |s| s[:labels]["process id"] }.uniq
  end

  # cpu-time of the samples of `file` with `method` (a method the programs define at the top
  # level: a private method of Object, `Object#method`) in their stack.
  def cpu_in(file, method)
    value_totals(samples_of(file).select { |s| s[:frames].any? { |f| f.first == "Object##{method}" } })["cpu-time"]
  end

  def write_program(name, source)
    File.write(File.join(@dir, name), source)
    name
  end

  # One recording of the two-children program for the whole file.
  before(:context) do
    @dir = Dir.mktmpdir("ddprof_recorder_forks")
    program = write_program("two_children.rb", two_children)
    # A stale child profile of an earlier run with the same name: record leaves it as it is
    # (it removed it, with the user's files of such names), and says so.
    File.write(File.join(@dir, "two.pid1.pb.gz"), "stale")
    @out, @err, @status = cli("record", "-o", "two.pb.gz", "--", RbConfig.ruby, program)
    @children = @out.lines.first.split.map(&:to_i)
    @files = ["two.pb.gz"] + @children.map { |pid| "two.pid#{pid}.pb.gz" }
  end

  after(:context) { FileUtils.remove_entry(@dir, true) }

  describe "record" do
    it "writes one profile per process: the command's to -o FILE, each forked child's to FILE.pid<PID>" do
      expect(@status).to eq(0), @err
      expect(@err).to eq("")
      expect(@children.size).to eq(2)
      expect(Dir.children(@dir).grep(/\Atwo(\..*)?\.pb\.gz\z/).sort).to eq((@files + ["two.pid1.pb.gz"]).sort)
      expect(File.read(File.join(@dir, "two.pid1.pb.gz"))).to eq("stale")
      one, two = @children
      expect(pids_of("two.pid#{one}.pb.gz")).to eq([one])
      expect(pids_of("two.pid#{two}.pb.gz")).to eq([two])
      parent = pids_of("two.pb.gz")
      expect(parent.size).to eq(1)
      expect(@children).not_to include(parent.first)

      expect(cpu_in("two.pid#{one}.pb.gz", "child_one_work")).to be > 0.1e9
      expect(cpu_in("two.pid#{one}.pb.gz", "child_two_work")).to eq(0)
      expect(cpu_in("two.pid#{two}.pb.gz", "child_two_work")).to be > 0.1e9
      expect(cpu_in("two.pid#{two}.pb.gz", "child_one_work")).to eq(0)
      frames = samples_of("two.pb.gz").flat_map { |s| s[:frames].map(&:first) }
      expect(frames).not_to include("Object#child_one_work", "Object#child_two_work")
    end

    it "lists every process in the summary, with its samples, cpu-time and file" do
      summary = @out.lines.drop_while { |l| !l.start_with?("ddprof-recorder:") }.join
      expect(summary.lines.size).to be <= 24
      expect(summary).to match(/processes 3: the command's and 2 forked/)
      [[nil, "two.pb.gz"], *@children.map { |pid| [pid, "two.pid#{pid}.pb.gz"] }].each do |pid, file|
        totals = value_totals(samples_of(file))
        line = summary.lines.find { |l| l.include?(" #{file} (") }
        expect(line).not_to be_nil, summary
        expect(line).to match(/\A\s+#{pid || pids_of(file).first}\s+samples #{totals['cpu-samples']}\s+cpu-time\s+#{format('%.2f', totals['cpu-time'] / 1e9)} s  #{Regexp.escape(file)} \(#{File.size(File.join(@dir, file))} bytes\)$/)
      end
      expect(summary).to match(/written\s+3 files, \d+ bytes in all/)
      # The stale file: named, and the files of this run named too, since two.pid*.pb.gz
      # would read it.
      expect(summary).to include("  untouched two.pid1.pb.gz: not from this run (a name of the same form)\n")
      files = (["two.pb.gz"] + @children.sort.map { |pid| "two.pid#{pid}.pb.gz" }).join(" ")
      expect(summary).to include("ddprof-recorder top #{files}\n",
                                 "ddprof-recorder flamegraph --by-process #{files} -o two.svg\n",
                                 "go tool pprof -top #{files}\n")
      all = @files.sum { |f| value_totals(samples_of(f))["cpu-time"] }
      expect(summary).to match(/cpu-time\s+#{format('%.2f', all / 1e9)} s/)
    end

    it "writes the profile of a child that ends through exit!, exit! in a TERM handler, or SIGTERM" do
      program = write_program("endings.rb", endings)
      out, err, status = cli("record", "-o", "end.pb.gz", "--", RbConfig.ruby, program)
      expect(status).to eq(0), err
      bang, trapped, termed = out.lines.first.split.map(&:to_i)
      { bang => "exit_bang_work", trapped => "trap_exit_bang_work", termed => "sigterm_work" }.each do |pid, work|
        file = "end.pid#{pid}.pb.gz"
        expect(File.file?(File.join(@dir, file))).to be(true), "#{work}: no #{file}\n#{out}"
        expect(pids_of(file)).to eq([pid])
        expect(cpu_in(file, work)).to be > 0.1e9
      end
      expect(out).to match(/processes 4: the command's and 3 forked/)
    end

    it "does not profile Ruby programs that a forked child runs (spawn, exec)" do
      check = "p(defined?(DdprofRecorder::Profiler) ? DdprofRecorder::Profiler.running? : nil)"
      program = write_program("spawner.rb", <<~RUBY)
        Process.wait(fork { system(#{RbConfig.ruby.dump}, "-e", #{check.dump}) })
        Process.wait(fork { exec(#{RbConfig.ruby.dump}, "-e", #{check.dump}) })
      RUBY
      out, err, status = cli("record", "-o", "spawner.pb.gz", "--", RbConfig.ruby, program)
      expect(status).to eq(0), err
      expect(out.lines.first(2).map(&:chomp)).to eq(%w[nil nil])
      # The parent and the child that ran system; the one that exec'ed wrote nothing.
      expect(Dir.children(@dir).grep(/\Aspawner(\..*)?\.pb\.gz\z/).size).to eq(2)
    end

    it "with --interval numbers each process's windows after its pid" do
      program = write_program("windows.rb", "Process.wait(fork { sleep 0.5 }); sleep 0.1\n")
      out, err, status = cli("record", "-o", "win.pb.gz", "--interval", "0.2", "--hz", "200", "--",
                             RbConfig.ruby, program)
      expect(status).to eq(0), err
      names = Dir.children(@dir).grep(/\Awin\./).sort
      parent = names.grep(/\Awin\.\d{4}\.pb\.gz\z/)
      child = names.grep(/\Awin\.pid\d+\.\d{4}\.pb\.gz\z/)
      expect(names.size).to eq(parent.size + child.size)
      expect(parent.first).to eq("win.0001.pb.gz")
      expect(child.first).to match(/\Awin\.pid\d+\.0001\.pb\.gz\z/)
      expect(child.size).to be_between(2, 4)
      pid = child.first[/pid(\d+)/, 1].to_i
      child.each { |f| expect(pids_of(f)).to eq([pid]) }
      expect(out).to match(/processes 2: the command's and 1 forked/)
      expect(out).to match(/^\s+#{pid}\s+samples \d+\s+cpu-time .* #{Regexp.escape(child.first)} \.\.\. #{Regexp.escape(child.last)} /)
      expect(out).to include("ddprof-recorder top win.[0-9]*.pb.gz win.pid*.pb.gz")
    end
  end

  describe "views of several files" do
    it "top merges them: their total is the sum, every process's work is ranked" do
      out, err, status = cli("top", *@files, "-n", "5")
      expect(status).to eq(0), err
      lines = out.lines(chomp: true)
      expect(lines[0]).to start_with("3 profiles (#{@files.join(', ')}): cpu-time, ")
      ranked = lines.drop(2).map { |l| l.split[4] }
      expect(ranked).to include("Process.clock_gettime") # what burn spends its time in
      total = @files.sum { |f| value_totals(samples_of(f))["cpu-time"] }
      expect(DdprofRecorder.top(@files.map { |f| File.binread(File.join(@dir, f)) })[:total]).to eq(total)
      _, err, status = cli("top", *@files, "missing.pb.gz")
      expect(status).to eq(1)
      expect(err).to eq("ddprof-recorder: missing.pb.gz: no such file\n")
    end

    it "folded and flamegraph draw one tower per process with --by-process" do
      out, err, status = cli("folded", "--by-process", *@files)
      expect(status).to eq(0), err
      towers = out.lines.map { |l| l[/\Aprocess id=(\d+);/, 1]&.to_i }
      expect(towers).to all(be_a(Integer))
      expect(towers.uniq).to include(*@children)
      expect(out).to match(/^process id=#{@children.first};.*Object#child_one_work;Object#burn;Process.clock_gettime \d+$/)

      out, err, status = cli("flamegraph", "--by-process", *@files)
      expect(status).to eq(0), err
      expect(out).to include("wrote two.svg (cpu-time")
      svg = File.read(File.join(@dir, "two.svg"))
      @children.each { |pid| expect(svg).to include("process id=#{pid}") }

      _, err, status = cli("folded", "--by-thread", "--by-process", *@files)
      expect(status).to eq(2)
      expect(err).to eq("ddprof-recorder: give one of --by-thread, --by-process and --group-by (--by-process)\n")
    end
  end

  describe "merge" do
    it "writes one pprof (gzip for .gz) whose totals are the sum of its inputs'" do
      out, err, status = cli("merge", "-o", "all.pb.gz", *@files)
      expect(status).to eq(0), err
      expect(out).to match(/\Addprof-recorder: merged 3 profiles into all\.pb\.gz \(\d+ bytes\)\n\z/)
      expect(File.binread(File.join(@dir, "all.pb.gz"), 2).b).to eq("\x1f\x8b".b)
      merged = samples_of("all.pb.gz")
      expect(value_totals(merged)).to eq(@files.map { |f| value_totals(samples_of(f)) }.reduce { |a, b| a.merge(b) { |_, x, y| x + y } })
      expect(merged.map { |s| s[:labels]["process id"] }.uniq).to contain_exactly(*@files.flat_map { |f| pids_of(f) })
      profile = decode_pprof(File.binread(File.join(@dir, "all.pb.gz")))
      starts = @files.map { |f| decode_pprof(File.binread(File.join(@dir, f))).time_nanos }
      expect(profile.time_nanos).to eq(starts.min)

      _, err, status = cli("merge", "-o", "all.pb", *@files)
      expect(status).to eq(0), err
      expect(File.binread(File.join(@dir, "all.pb"), 2).b).not_to eq("\x1f\x8b".b)
      expect(value_totals(samples_of("all.pb"))).to eq(value_totals(merged))
    end

    it "refuses profiles of other value types, and what is not a pprof, in one line" do
      other = DdprofRecorder::StackRecorder.new(value_types: [%w[alloc-samples count]], compression: :gzip)
      other.record_sample([["allocate", "a.rb", 1]], [3])
      File.binwrite(File.join(@dir, "alloc.pb.gz"), other.serialize!)
      _, err, status = cli("merge", "-o", "bad.pb.gz", "two.pb.gz", "alloc.pb.gz")
      expect(status).to eq(1)
      expect(err).to eq("ddprof-recorder: two.pb.gz has the value types cpu-time/nanoseconds, cpu-samples/count, " \
                        "wall-time/nanoseconds and alloc.pb.gz has alloc-samples/count: only profiles of the same " \
                        "value types merge\n")
      expect(File.exist?(File.join(@dir, "bad.pb.gz"))).to be(false)
      _, err, status = cli("top", "two.pb.gz", "alloc.pb.gz")
      expect(status).to eq(1)
      expect(err).to include("alloc.pb.gz has alloc-samples/count")

      File.write(File.join(@dir, "notes.txt"), "not a profile\n" * 10)
      _, err, status = cli("merge", "-o", "bad.pb.gz", "two.pb.gz", "notes.txt")
      expect(status).to eq(1)
      expect(err).to match(/\Addprof-recorder: notes\.txt: not a pprof profile: [^\n]+\n\z/)

      _, err, status = cli("merge", "two.pb.gz")
      expect(status).to eq(2)
      expect(err).to eq("ddprof-recorder: merge: give the output file with -o OUT\n")
      _, err, status = cli("merge", "-o", "x.pb.gz")
      expect(status).to eq(2)
      expect(err).to start_with("ddprof-recorder: merge: give a pprof FILE")
    end
  end
end
