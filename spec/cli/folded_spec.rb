# frozen_string_literal: true

# `ddprof-recorder folded` in process (lib/ddprof_recorder/cli/folded.rb).
RSpec.describe "ddprof-recorder folded" do
  before { write_profile("hot.pb.gz", CliHelpers::HOT_SAMPLES) }

  it "prints one line per stack, root first" do
    expect(run_cli("folded", "hot.pb.gz")).to eq(["run;work 100000000\nrun;work;crunch 900000000\n", "", 0])
  end

  it "puts the thread or process at the root, names files, and reads another value type" do
    out, = run_cli("folded", "hot.pb.gz", "--by-thread", "--value", "wall-time")
    expect(out.lines).to include("thread name=sleeper;run;sleep 2000000000\n", "thread name=cruncher;run;work;crunch 1000000000\n")
    out, = run_cli("folded", "hot.pb.gz", "--by-process", "--filenames")
    expect(out).to eq("process id=11;run (app.rb);work (app.rb) 100000000\n" \
                      "process id=11;run (app.rb);work (app.rb);crunch (app.rb) 900000000\n")
  end

  it "takes one of --by-thread, --by-process and --group-by" do
    [%w[--by-thread --by-process], ["--by-thread", "--group-by", "trace endpoint"]].each do |args|
      out, err, status = run_cli("folded", "hot.pb.gz", *args)
      expect([out, status]).to eq(["", 2])
      expect_one_line(err, /\Addprof-recorder: give one of --by-thread, --by-process and --group-by \(#{args[1]}\)$/)
    end
    # The same label twice is no conflict.
    expect(run_cli("folded", "hot.pb.gz", "--by-thread", "--group-by", "thread name")).to eq(run_cli("folded", "hot.pb.gz", "--by-thread"))
  end

  it "folds the samples of --label under the roots of --group-by" do
    File.binwrite(File.join(@dir, "web.pb"), endpoint_pprof)
    out, err, status = run_cli("folded", "web.pb", "--group-by", "thread name", "--label", "trace endpoint=PagesController#heavy")
    expect([err, status]).to eq(["", 0])
    expect(out).to eq("thread name=puma 1;dispatch;heavy;render_json 700000000\nthread name=puma 2;dispatch;heavy 50000000\n")
    expect(run_cli("folded", "web.pb", "--label", "trace endpoint=nope")).to eq(["", "", 0])
  end
end
