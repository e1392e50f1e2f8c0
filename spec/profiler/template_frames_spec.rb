# frozen_string_literal: true

require "fileutils"
require "open3"
require "rbconfig"
require "tmpdir"

# Frames of template code (docs/profiler.md, "Frame names", "Templates"): ERB's eval'd code is
# named for the template's file, not Kernel#eval nor the method that rendered it, and an
# ActionView template's method is named alike in every process, so that two workers' profiles
# merge into one name. Each program runs in a process of its own, profiled with
# Profiler.profile; profiles are decoded with google-protobuf.
RSpec.describe "Profiler template frames" do
  root = File.expand_path("../..", __dir__)
  exe = File.join(root, "exe", "ddprof-recorder")

  # Nearly all of a render's CPU is the template's own loop (Integer#times, Integer#to_s and
  # the output buffer's String#<< under it); ERB#result's Kernel#eval, which parses and
  # compiles the template's Ruby at each render, took 5% of the CPU on Debian's 3.1.2.
  template = <<~'ERB'
    <ul>
    <% 2000.times do |i| %><li><%= (i * 7919) % 1000 %></li><% end %>
    </ul>
  ERB

  # Three ways to render, a third of the renders each: from a method's binding (which
  # rb_profile_frames, and stackprof, name the template's code after), from a define_method
  # method's (a Sinatra route's) and from the top level's (ERB#result's default), with ERB's
  # default file, `(erb)`, and with one set by ERB#filename=. For 0.6 s of the thread's CPU,
  # not of the wall clock: on a loaded machine a wall-clock bound got 199 ms of CPU, too few
  # samples for the shares checked.
  erb_program = <<~RUBY
    require "ddprof_recorder"
    require "erb"
    SOURCE = #{template.dump}
    DEFAULT = ERB.new(SOURCE)
    NAMED = ERB.new(SOURCE).tap { |erb| erb.filename = "views/list.erb" }
    class Page
      def render(erb) = erb.result(binding)
    end
    Route = Class.new { define_method(:call) { |erb| erb.result(binding) } }
    pprof = DdprofRecorder::Profiler.profile(hz: 499) do
      deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.6
      while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
        Page.new.render(DEFAULT)
        Route.new.call(NAMED)
        NAMED.result
      end
    end
    print [pprof].pack("m0")
  RUBY

  # ActionView as Rails renders a view: the template compiled once into a method of an
  # anonymous ActionView::Base subclass, named from the template's path less Rails.root, the
  # path's String#hash (seeded per process) and the Template's __id__. Rails.root is an
  # application's; this program has none, so it says where its root is, as Rails would.
  # Debian's ActionView loads on Debian's Ruby only (its gems' dependencies are installed for
  # that Ruby): elsewhere ("compiled") the template is compiled as ActionView 6.1's
  # Template#compile does it, its name made by the same rule (Template#method_name), into a
  # method of an anonymous class with `module_eval(source, path, 0)`.
  actionview_program = <<~'RUBY'
    require "ddprof_recorder"
    require "pathname"
    file, how = ARGV
    if how == "actionview"
      require "action_view"
      module Rails
        def self.root = Pathname(Dir.pwd)
      end
      view = ActionView::Base.with_empty_template_cache.with_view_paths([File.join(Dir.pwd, "app/views")])
      render = -> { view.render(template: "pages/index") }
      method = view.class.instance_methods(false).grep(/index_html_erb/).first
    else
      require "erb"
      path = File.join(Dir.pwd, "app/views/pages/index.html.erb")
      short = path.delete_prefix("#{Dir.pwd}/")
      method = "_#{short.tr("^a-z_", "_")}__#{path.hash}_#{Object.new.__id__}".tr("-", "_")
      klass = Class.new
      klass.module_eval("def #{method}(local_assigns, output_buffer)
#{ERB.new(File.read(path)).src}
end", path, 0)
      view = klass.new
      render = -> { view.public_send(method, {}, nil) }
    end
    pprof = DdprofRecorder::Profiler.profile(hz: 499) do
      deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.6
      render.call while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
    end
    File.binwrite(file, pprof)
    print method || view.class.instance_methods(false).grep(/index_html_erb/).join(",")
  RUBY

  def cpu(samples)
    samples.sum { |sample| sample[:values].fetch("cpu-time") }
  end

  # The cpu-time of the samples that have a frame for which the block is true.
  def cpu_under(samples, &frame_test)
    cpu(samples.select { |sample| sample[:frames].any?(&frame_test) })
  end

  define_method(:run_program) do |args, chdir|
    Open3.capture3(RbConfig.ruby, "-I", File.join(root, "lib"), *args, chdir: chdir)
  end

  before(:context) do
    @dir = Dir.mktmpdir("ddprof_recorder_templates")
  end

  after(:context) { FileUtils.remove_entry(@dir, true) }

  describe "ERB" do
    before(:context) do
      out, @err, @status = run_program(["-e", erb_program], @dir)
      @samples = @status.success? ? samples_from(decode_pprof(out.unpack1("m0"))) : []
    end

    it "names the template's code for the template's file, with its lines" do
      expect(@status).to be_success, @err
      frames = @samples.flat_map { |sample| sample[:frames] }.uniq
      # The loop is on the template's line 2, in the eval'd code and in the block it runs.
      expect(frames).to include(["(erb)", "(erb)", 2], ["views/list.erb", "views/list.erb", 2])
      # Every frame of a template's file is named for it, or is a C method it calls, which
      # takes its caller's file and line (Integer#times on 3.1; 3.3 writes it in Ruby).
      names = frames.select { |_, file, _| ["(erb)", "views/list.erb"].include?(file) }.map(&:first).uniq
      expect(names - ["(erb)", "views/list.erb"]).to all(match(/\A[A-Z][\w:]*[#.]/))
    end

    it "charges the CPU inside the template to its frames, little to Kernel#eval and none to the renderer" do
      total = cpu(@samples)
      expect(total).to be > 0, "no cpu-time recorded"
      default = cpu_under(@samples) { |name, _, _| name == "(erb)" }
      named = cpu_under(@samples) { |name, _, _| name == "views/list.erb" }
      leaf = ->(test) { cpu(@samples.select { |sample| test.call(sample[:frames].first.first) }).fdiv(total) }
      summary = format("(erb) %.2f, views/list.erb %.2f, Kernel#eval as leaf %.2f, Page#render as leaf %.2f of %d ms",
                       default.fdiv(total), named.fdiv(total), leaf.call(->(n) { n == "Kernel#eval" }),
                       leaf.call(->(n) { n == "Page#render" }), total / 1_000_000)
      # One render in three has the default file, two in three the named one.
      expect(default.fdiv(total)).to be_between(0.15, 0.6), summary
      expect(named.fdiv(total)).to be_between(0.35, 0.85), summary
      expect((default + named).fdiv(total)).to be > 0.7, summary
      expect(leaf.call(->(n) { n == "Kernel#eval" })).to be < 0.25, summary
      # Before, Page#render and the define_method route held the template's own code (70%).
      expect(leaf.call(->(n) { n == "Page#render" || n.end_with?("#call") })).to be < 0.05, summary
    end
  end

  # Methods defined by eval'd code (`class_eval` of a String, as ActiveSupport's `delegate`
  # and ERB#def_method do) are methods: they keep their names, a `define_method` one too.
  eval_methods_program = <<~'RUBY'
    require "ddprof_recorder"
    class Widget
      class_eval <<~SRC, "widget_methods.rb", 1
        def spin(n) = n.times { |i| i.to_s }
        define_method(:whirl) { |n| n.times { |i| i.to_s } }
      SRC
    end
    widget = Widget.new
    pprof = DdprofRecorder::Profiler.profile(hz: 499) do
      deadline = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) + 0.4
      while Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID) < deadline
        widget.spin(20_000)
        widget.whirl(20_000)
      end
    end
    print [pprof].pack("m0")
  RUBY

  it "keeps the names of methods that eval'd code defines, define_method ones too" do
    out, err, status = run_program(["-e", eval_methods_program], @dir)
    expect(status).to be_success, err
    frames = samples_from(decode_pprof(out.unpack1("m0"))).flat_map { |sample| sample[:frames] }.uniq
    names = frames.select { |_, file, _| file == "widget_methods.rb" }.map(&:first).uniq
    expect(names).to include("Widget#spin", "Widget#whirl")
    expect(names.grep_v(/\A[A-Z][\w:]*[#.]/)).to eq([])
  end

  describe "ActionView" do
    before(:context) do
      views = File.join(@dir, "app", "views", "pages")
      FileUtils.mkdir_p(views)
      File.write(File.join(views, "index.html.erb"), template)
      @how = system(RbConfig.ruby, "-e", 'require "action_view"', out: File::NULL, err: File::NULL) ? "actionview" : "compiled"
      @runs = %w[a b].map do |worker|
        file = File.join(@dir, "#{worker}.pb.gz")
        out, err, status = run_program(["-e", actionview_program, file, @how], @dir)
        { file: file, method: out, err: err, status: status }
      end
      @merged = File.join(@dir, "merged.pb.gz")
      if @runs.all? { |run| run[:status].success? }
        @merge_out, @merge_status = Open3.capture2e(RbConfig.ruby, exe, "merge", "-o", @merged, *@runs.map { |run| run[:file] })
      end
    end

    let(:name) { "app/views/pages/index.html.erb" }
    let(:path) { File.join(File.realpath(@dir), name) }

    def samples_of(file)
      samples_from(decode_pprof(File.binread(file)))
    end

    it "compiles the template into a method of another name in each process" do
      warn "template_frames_spec: ActionView does not load on Ruby #{RUBY_VERSION}: compiled as it compiles" if @how == "compiled"
      @runs.each { |run| expect(run[:status]).to be_success, run[:err] }
      methods = @runs.map { |run| run[:method] }
      expect(methods).to all(match(/\A_app_views_pages_index_html_erb___?\d+_\d+\z/))
      expect(methods.uniq.size).to eq(2), methods.inspect
    end

    it "names the template's frames by its path less Rails.root, one name in the two workers' merge" do
      expect(@merge_status).to be_success, @merge_out
      merged = samples_of(@merged)
      frames = merged.flat_map { |sample| sample[:frames] }.uniq
      own = frames.select { |_, file, _| file == path }.map(&:first).uniq.grep_v(/\A[A-Z][\w:]*[#.]/)
      expect(own).to eq([name])
      expect(frames.map(&:first).grep(/index_html_erb/)).to eq([])
      # The merge adds the two workers' CPU in the template up under that one name.
      in_template = ->(samples) { cpu_under(samples) { |frame_name, _, _| frame_name == name } }
      workers = @runs.map { |run| samples_of(run[:file]) }
      expect(in_template.call(merged)).to eq(workers.sum { |samples| in_template.call(samples) })
      workers.each { |samples| expect(in_template.call(samples).fdiv(cpu(samples))).to be > 0.5 }
    end
  end

  it "names a compiled template's method so on the weaker path too, from a Location's label and path" do
    name = ->(label, path) { DdprofRecorder::Profiler._native_frame_name(label, path) }
    path = "/srv/app/app/views/pages/index.html.erb"
    expect(name.call("_app_views_pages_index_html_erb___2930487_60120", path)).to eq("app/views/pages/index.html.erb")
    expect(name.call("_app_views_pages_index_html_erb__2930487_60120", path)).to eq("app/views/pages/index.html.erb")
    expect(name.call("__tilt_47000", "/srv/app/views/list.erb")).to eq("/srv/app/views/list.erb")
    expect(name.call("_app_views_pages_index_html_erb___2930487_60120", "/srv/app/other.erb"))
      .to eq("_app_views_pages_index_html_erb___2930487_60120")
    expect(name.call("render", path)).to eq("render")
  end
end
