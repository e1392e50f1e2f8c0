# frozen_string_literal: true

require "net/http"
require "open3"
require "rbconfig"
require "socket"
require "tmpdir"

# Issue 22's real server: Puma in single mode with 4 threads under wrk, on a CPU-heavy route,
# recorded with `record --timeline` on Ruby 3.3+ (GVL events). The request threads show GVL
# waits, and `top --value gvl-wait-time` names the route's code. Puma is trixie's 6.6.0, built
# for the Ruby under test by script/rubies (Debian 12's is built for Ruby 3.1 only), with
# nio4r as pure Ruby (Debian 12's ruby-nio4r, NIO4R_PURE=true).
RSpec.describe "record --timeline on Puma (single mode, 4 threads)" do
  root = File.expand_path("../..", __dir__)
  exe = File.join(root, "exe", "ddprof-recorder")
  app = File.join(root, "spec", "fixtures", "gvl_app", "config.ru")
  # script/rubies puts Puma beside the Ruby it built: <prefix>/puma/.
  puma_dir = File.join(File.expand_path("../..", RbConfig.ruby), "puma")
  nio4r = Dir["/usr/lib/x86_64-linux-gnu/rubygems-integration/3.1.0/gems/nio4r-*/lib"].first
  rack = Dir["/usr/share/rubygems-integration/all/gems/rack-2*/lib"].first

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def get(port, path)
    Net::HTTP.start("127.0.0.1", port, open_timeout: 1, read_timeout: 5) { |http| http.get(path).body }
  rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
    nil
  end

  before do
    skip "GVL waits need Ruby 3.3+ (GVL events)" unless DdprofRecorder::Profiler::GVL_EVENTS
    missing = { "Puma for #{RUBY_VERSION} (script/rubies)" => File.exist?(File.join(puma_dir, ".built")),
                "Debian's ruby-nio4r" => nio4r, "Debian's ruby-rack" => rack,
                "wrk" => Programs.available?("wrk") }.reject { |_, there| there }.keys
    next if missing.empty?
    raise "missing: #{missing.join(', ')} (CI must run this)" if ENV["CI"]

    skip "missing: #{missing.join(', ')}"
  end

  it "shows the request threads waiting for the GVL, and top --value gvl-wait-time names the route's code" do
    Dir.mktmpdir("ddprof_recorder_puma_gvl") do |dir|
      port = TCPServer.open("127.0.0.1", 0) { |s| s.addr[1] }
      pidfile = File.join(dir, "puma.pid")
      log = File.join(dir, "record.log")
      out = File.join(dir, "puma.pb.gz")
      command = [RbConfig.ruby, "-I", File.join(puma_dir, "lib"), "-I", nio4r, "-I", rack, File.join(puma_dir, "bin", "puma"),
                 "-t", "4:4", "-b", "tcp://127.0.0.1:#{port}", "--pidfile", pidfile, app]
      group = Process.spawn({ "NIO4R_PURE" => "true" }, RbConfig.ruby, exe, "record", "--timeline", "-o", out, "--",
                            *command, chdir: dir, out: log, err: log, pgroup: true)
      begin
        deadline = now + 30
        sleep 0.1 until get(port, "/pid") || now > deadline
        expect(get(port, "/pid")).to match(/\A\d+\n\z/), "Puma did not answer in 30 s:\n#{File.read(log)}"
        # 8 connections on 4 threads: the threads always have a request to compute.
        wrk, status = Open3.capture2e("wrk", "-t2", "-c8", "-d3s", "--timeout", "5s", "http://127.0.0.1:#{port}/cpu")
        expect(status).to be_success, wrk
        expect(wrk[/(\d+) requests in/, 1].to_i).to be > 20
        Process.kill("TERM", Integer(File.read(pidfile)))
        deadline = now + 30
        sleep 0.05 until Process.wait(group, Process::WNOHANG) || now > deadline
        group = nil unless now > deadline
      ensure
        if group
          Process.kill("KILL", -group)
          Process.wait(group)
        end
      end
      output = File.read(log)
      expect(File).to exist(out), output
      pprof = File.binread(out)

      # The request threads (Puma names them "puma srv tp NNN") wait for the GVL while the
      # others compute: with 4 busy threads on one lock, most of their time. A loaded machine
      # stretches the wait; only its presence is asked, with a wide margin.
      threads = DdprofRecorder.summary(pprof)[:threads].select { |t| t[:name].match?(/\Apuma srv tp \d+\z/) }
      expect(threads.size).to eq(4), DdprofRecorder.summary(pprof)[:threads].inspect
      waiting = threads.sum { |t| t[:waiting] }
      expect(waiting).to be > 0.2 * threads.sum { |t| t[:wall] }, threads.inspect
      expect(output).to match(/^ +puma srv tp \d+ +running +[\d.]+%  waiting for GVL +[\d.]+%/), output

      # Each wait is charged where the thread stands when the lock comes back: mostly on
      # its way back from IO#wait_readable (a request came while the other threads computed),
      # and in GvlApp.crunch when the timer thread took the lock from it mid-request.
      top, err, status = Open3.capture3(RbConfig.ruby, exe, "top", "--value", "gvl-wait-time", "-n", "10", out)
      expect([status.exitstatus, err]).to eq([0, ""])
      rows = top.lines.grep(/\A\s*[\d.]+m?s /)
      expect(rows.map { |l| l.split[4] }).to include("GvlApp.crunch"), top
      puts top if ENV["SHOW_TOP"]
    end
  end
end
