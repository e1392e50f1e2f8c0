# frozen_string_literal: true

require "etc"
require "fileutils"
require "rbconfig"
require "tmpdir"

# `record` when the program's processes cannot write their files: each lost file or window
# is in the summary (how many, and why: the errno's text) and makes the exit status 1; the
# process's own message names the file and why. It was an ERROR line per lost window, a
# summary of "written 5 windows" and exit status 0 (issue 41: 18 of 23 windows lost with
# 20 KiB free); without --interval, a message that blamed "a program that is not Ruby".
#
# The writes fail for real, in Recording.write: on a full tmpfs (ENOSPC), mounted in a mount
# namespace of the run's own (unshare), which skips where mounting is not permitted; and past
# the program's own RLIMIT_FSIZE (EFBIG), which runs everywhere.
RSpec.describe "record when the profile files cannot be written" do
  include CliHelpers

  around do |example|
    Dir.mktmpdir("ddw") do |dir|
      @dir = File.realpath(dir)
      example.run
    end
  end

  # The window numbers of `paths` (`w.0003.pb.gz` → 3).
  def numbers(paths)
    paths.map { |path| Integer(path[/\.(\d{4,})\.pb(?:\.gz)?\z/, 1], 10) }
  end

  # The summary's `lost` line: how many windows, why, and the first names.
  def expect_lost_line(out, count, why)
    expect(out).to match(/^  lost      #{count} windows? not written \(#{why}\)/), out
  end

  # The records of one run's processes, checked against what is on disk: the files that are
  # there decode, every window number up to the last is either written or lost, once.
  def expect_windows(out, err, written, why)
    lost = err.scan(/could not write (\S+): #{why}$/).flatten
    expect(lost).not_to be_empty, err
    expect(written).not_to be_empty, out
    expect(numbers(written) + numbers(lost)).to contain_exactly(*1..(numbers(written) + numbers(lost)).max)
    written.each { |path| expect(decode_pprof(File.binread(path)).sample_type.size).to be >= 3 }
    # One window is shown as a file: "written   w.0001.pb (445 bytes)".
    expect(out).to match(/^  written   #{written.size == 1 ? '\S+\.0001\.pb' : "#{written.size} windows of 0\\.2 s: "}/), out
    expect_lost_line(out, lost.size, why)
    expect(out[/^  lost .*$/]).to match(/\): #{Regexp.escape(lost.first.delete_prefix("#{@dir}/"))}(, |\z)/)
    lost
  end

  describe "past RLIMIT_FSIZE (EFBIG)" do
    # The program lowers its file size limit once its first window is written, below any
    # window's size (a window of a sleeping program is 397 to 440 bytes: 400 let 3.3.8's be
    # written) but above what the
    # records of its lost windows take in record's report file (some 50 bytes each: the
    # example's directory has a short name). It ignores SIGXFSZ,
    # which would kill it at the first write past the limit.
    it "counts the windows written after it in the summary and exits with 1" do
      program = <<~RUBY
        first = ENV.fetch("DDPROF_RECORDER_OUT").sub(/\\.pb\\z/, ".0001.pb")
        sleep 0.01 until File.exist?(first)
        trap(:XFSZ, "IGNORE")
        Process.setrlimit(:FSIZE, 300)
        sleep 0.3
      RUBY
      out, err, status = run_exe("record", "-o", "w.pb", "--interval", "0.2", "--", RbConfig.ruby, "-e", program,
                                 env: { "RUBYOPT" => nil })
      expect(status).to eq(1), err
      written = DdprofRecorder::Recording.profile_files(File.join(@dir, "w.pb")).fetch(nil)
      lost = expect_windows(out, err, written, "File too large")
      expect(lost).to include(File.join(@dir, "w.%04d.pb" % numbers(lost).max)) # the last one, at exit
      expect(Dir.children(@dir).grep(/\.tmp/)).to be_empty
    end
  end

  # The program makes each write 0.3 s slower than the interval, 0.1 s: the writing thread's
  # queue (4 windows here; a minute of them by default) fills, and the oldest waiting windows
  # are dropped, never written.
  it "counts the windows dropped unwritten when the writes fall behind the interval, and exits with 1" do
    program = "DdprofRecorder::Recording.singleton_class.prepend(Module.new { def write(*) = (sleep 0.3; super) }); sleep 1.5"
    out, err, status = run_exe("record", "-o", "w.pb", "--interval", "0.1", "--", RbConfig.ruby, "-e", program,
                               env: { "RUBYOPT" => nil, "DDPROF_RECORDER_MAX_QUEUED_WINDOWS" => "4" })
    expect(status).to eq(1), err
    dropped = err.scan(/(\d+) dropped so far$/).flatten.map(&:to_i).max
    expect(dropped).to be_positive, err
    written = DdprofRecorder::Recording.profile_files(File.join(@dir, "w.pb")).fetch(nil)
    expect(numbers(written)).to eq((1..written.size).to_a) # a dropped window has no number
    expect_lost_line(out, dropped, "dropped: the writes fell behind the interval")
    expect(out[/^  lost .*$/]).to end_with("interval)") # no file to name
  end

  describe "on a full disk (ENOSPC)" do
    # The command that runs `command` in a mount namespace of its own, where a tmpfs of 64 KiB
    # is mounted on @dir/disk: an `old` file there if given, then a filler that leaves
    # `free_pages` pages free; when the command ends, what is on the tmpfs but the filler is
    # copied to @dir/after (the mount goes with the namespace). Root needs no user
    # namespace; elsewhere one may be allowed. Skips if neither can mount.
    def on_full_disk(free_pages, old: "")
      disk = File.join(@dir, "disk")
      after = File.join(@dir, "after")
      FileUtils.mkdir_p([disk, after])
      page = Etc.sysconf(Etc::SC_PAGESIZE)
      fill = (64 * 1024) - ((free_pages + (old.empty? ? 0 : 1)) * page)
      script = 'mnt=$1 fill=$2 old=$3 after=$4; shift 4; mount -t tmpfs -o size=64k ddprof_full "$mnt" || exit 99; ' \
               '{ [ -z "$old" ] || echo old > "$mnt/$old"; } && head -c "$fill" /dev/zero > "$mnt/filler" || exit 99; ' \
               '"$@"; status=$?; rm "$mnt/filler"; cp -a "$mnt/." "$after/"; exit $status'
      shell = ["sh", "-c", script, "sh", disk, fill.to_s, old, after]
      [["unshare", "--mount", "--propagation", "private"],
       ["unshare", "--user", "--map-root-user", "--mount", "--propagation", "private"]].each do |unshare|
        return unshare + shell if system(*unshare, *shell, "true", err: File::NULL)
      end
      skip "cannot mount a tmpfs in a mount namespace here (unshare --mount, as root or in a user namespace)"
    end

    it "with --interval: writes the windows that fit, counts the others in the summary and exits with 1" do
      wrapper = on_full_disk(2) # a small window takes one page
      out, err, status = run_exe("record", "-o", "disk/w.pb.gz", "--interval", "0.2", "--", RbConfig.ruby, "-e", "sleep 1",
                                 env: { "RUBYOPT" => nil }, wrapper: wrapper)
      expect(status).to eq(1), err
      written = Dir[File.join(@dir, "after", "w.*.pb.gz")].sort
      expect(written.size).to eq(2)
      lost = expect_windows(out, err, written, "No space left on device")
      expect(lost.size).to be >= 3 # 1 s in windows of 0.2 s
      expect(Dir.children(File.join(@dir, "after")).grep(/\.tmp/)).to be_empty
    end

    it "without --interval: keeps the old file and says why there is no profile" do
      wrapper = on_full_disk(0, old: "old.pb.gz")
      out, err, status = run_exe("record", "-o", "disk/old.pb.gz", "--", RbConfig.ruby, "-e", "sleep 0.1",
                                 env: { "RUBYOPT" => nil }, wrapper: wrapper)
      expect([out, status]).to eq(["", 1])
      expect(err.lines).to eq(["ddprof-recorder: could not write #{@dir}/disk/old.pb.gz: No space left on device\n",
                               "ddprof-recorder: record: no profile: could not write disk/old.pb.gz: No space left on device\n"])
      expect(Dir.children(File.join(@dir, "after"))).to eq(["old.pb.gz"])
      expect(File.read(File.join(@dir, "after", "old.pb.gz"))).to eq("old\n")
    end
  end
end
