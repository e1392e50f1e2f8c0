# frozen_string_literal: true

require "json"
require "open3"
require "rbconfig"
require "tmpdir"
require "zlib"

# Issue 10, item 4: a pprof given to the views is untrusted input. Hostile pprofs (a gzip bomb,
# a bomb of empty samples, a stack of a location with thousands of inline lines, a huge name
# repeated down a stack, ids that point nowhere) must raise a clear DdprofRecorder::Error (or
# ArgumentError for what is not a pprof), never exhaust memory; `max_decompressed_bytes:` moves
# the limit. Hostile pprofs are built with google-protobuf's classes (spec/support), and memory
# is checked as the growth of VmHWM (/proc/self/status) in a child process.
RSpec.describe "Reading pprofs as untrusted input" do
  gib = 1 << 30
  views = {
    folded: ->(pprof, **kw) { DdprofRecorder.folded(pprof, **kw) },
    flamegraph: ->(pprof, **kw) { DdprofRecorder.flamegraph(pprof, **kw) },
    top: ->(pprof, **kw) { DdprofRecorder.top(pprof, **kw) },
    summary: ->(pprof, **kw) { DdprofRecorder.summary(pprof, **kw) },
    speedscope: ->(pprof, **kw) { DdprofRecorder.speedscope(pprof, **kw) },
    merge: ->(pprof, **kw) { DdprofRecorder.merge([pprof], **kw) },
    filter: ->(pprof, **kw) { DdprofRecorder.filter(pprof, labels: {}, **kw) },
  }.freeze

  def pb = Perftools::Profiles

  # A pprof of cpu-time with functions `names` (one location each, ids from 1) and `samples`
  # `[location ids leaf first, value, labels]`; `tweak` may change the message before encoding.
  def pprof(names: %w[main work], samples: [[[2, 1], 5]], strings: [])
    table = ["", "cpu-time", "nanoseconds", "a.rb", *names, *strings]
    profile = pb::Profile.new(
      sample_type: [pb::ValueType.new(type: 1, unit: 2)],
      string_table: table,
      function: names.each_with_index.map { |_, i| pb::Function.new(id: i + 1, name: 4 + i, filename: 3) },
      location: names.each_index.map { |i| pb::Location.new(id: i + 1, line: [pb::Line.new(function_id: i + 1, line: 1)]) },
      sample: samples.map { |ids, value| pb::Sample.new(location_id: ids, value: [value]) },
    )
    yield profile if block_given?
    pb::Profile.encode(profile)
  end

  # The gzip of `chunks` MiB of zeros, built without compressing them all: deflate blocks
  # ended by a full flush do not refer to what came before, so one block of a MiB of zeros
  # repeats, and the CRC of the whole is combined from the chunk's (zlib's crc32_combine).
  def zeros_gzip(chunks)
    chunk = "\0".b * (1 << 20)
    deflate = Zlib::Deflate.new(Zlib::BEST_COMPRESSION, -Zlib::MAX_WBITS)
    block = deflate.deflate(chunk, Zlib::FULL_FLUSH)
    tail = deflate.finish
    crc = (1...chunks).reduce(Zlib.crc32(chunk)) { |c, _| Zlib.crc32_combine(c, Zlib.crc32(chunk), chunk.bytesize) }
    header = [0x1f, 0x8b, 8, 0, 0, 3].pack("C4VxC")
    header + (block * chunks) + tail + [crc, (chunks << 20) & 0xffff_ffff].pack("VV")
  end

  # Runs `DdprofRecorder.<method>(File.binread(path), **kw)` in a child and returns its JSON
  # report: `error` (class), `message`, `growth` (VmHWM growth during the call, bytes).
  def in_child(path, method, **kw)
    script = <<~RUBY
      require "ddprof_recorder"
      require "json"
      hwm = -> { File.read("/proc/self/status")[/VmHWM:\\s+(\\d+) kB/, 1].to_i * 1024 }
      pprof = File.binread(ARGV[0])
      kw = JSON.parse(ARGV[2], symbolize_names: true)
      before = hwm.call
      begin
        DdprofRecorder.public_send(ARGV[1].to_sym, pprof, **kw)
        error = nil
      rescue StandardError => e
        error = e
      end
      puts JSON.generate(error: error&.class&.name, message: error&.message, growth: hwm.call - before)
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.expand_path("../../lib", __dir__), "-e", script, path, method.to_s, JSON.generate(kw))
    expect(status).to be_success, "child failed: #{err}"
    JSON.parse(out, symbolize_names: true)
  end

  around do |example|
    Dir.mktmpdir("ddprof_read_limits") do |dir|
      @dir = dir
      example.run
    end
  end

  it "builds a gzip of zeros that zlib reads back (the bomb below is what it says)" do
    gz = zeros_gzip(3)
    expect(Zlib.gunzip(gz)).to eq("\0".b * (3 << 20))
  end

  it "refuses a 2 GiB gzip bomb with the default limit, without its memory" do
    path = File.join(@dir, "bomb.pb.gz")
    File.binwrite(path, zeros_gzip(2048))
    expect(File.size(path)).to be < 3 << 20
    report = in_child(path, :folded)
    expect(report[:error]).to eq("DdprofRecorder::Error")
    expect(report[:message]).to eq("the pprof is more than #{gib} bytes once decompressed " \
                                   "(max_decompressed_bytes: #{gib}); raise max_decompressed_bytes to read it")
    # The first pass keeps 64 MiB (IN_ONE_PASS in crates/core/src/views/reader.rs); the rest is
    # counted, not kept. Reading the whole bomb would take 2 GiB.
    expect(report[:growth]).to be < 160 << 20
  end

  it "refuses the bomb under a lower limit before it fills the first pass" do
    path = File.join(@dir, "bomb.pb.gz")
    File.binwrite(path, zeros_gzip(256))
    report = in_child(path, :top, max_decompressed_bytes: 8 << 20)
    expect(report[:error]).to eq("DdprofRecorder::Error")
    expect(report[:message]).to include("more than #{8 << 20} bytes once decompressed")
    expect(report[:growth]).to be < 64 << 20
  end

  it "refuses a small pprof that decodes to many times its size, without decoding it" do
    # 62 MiB of empty samples (2 bytes each) in a small gzip: 2.2 GiB once decoded.
    path = File.join(@dir, "samples.pb.gz")
    File.binwrite(path, Zlib.gzip(pprof + ("\x12\x00".b * (31 << 20)), level: 9))
    expect(File.size(path)).to be < 1 << 20
    report = in_child(path, :summary, max_decompressed_bytes: 64 << 20)
    expect(report[:error]).to eq("DdprofRecorder::Error")
    expect(report[:message]).to eq("decoding the pprof would take more memory than 16 x " \
                                   "max_decompressed_bytes (#{64 << 20}) per pprof; raise " \
                                   "max_decompressed_bytes to read it")
    expect(report[:growth]).to be < 256 << 20
  end

  it "refuses raw input over the limit, in every view" do
    bytes = pprof
    views.each do |name, view|
      expect { view.call(bytes, max_decompressed_bytes: bytes.bytesize - 1) }
        .to raise_error(DdprofRecorder::Error, /more than #{bytes.bytesize - 1} bytes \(max_decompressed_bytes/), name.to_s
      expect { view.call(Zlib.gzip(bytes), max_decompressed_bytes: bytes.bytesize - 1) }
        .to raise_error(DdprofRecorder::Error, /once decompressed/), name.to_s
      expect { view.call(bytes, max_decompressed_bytes: bytes.bytesize) }.not_to raise_error
    end
  end

  it "names the pprof of an Array that is over the limit" do
    small = pprof
    large = pprof(names: %w[main work] + (1..50).map { |i| "f#{i}" })
    expect { DdprofRecorder.folded([small, large], max_decompressed_bytes: small.bytesize) }
      .to raise_error(DdprofRecorder::Error, /\Approfs\[1\]: the pprof is more than/)
    expect { DdprofRecorder.merge([small, large], max_decompressed_bytes: small.bytesize) }
      .to raise_error(DdprofRecorder::Error, /\Approfs\[1\]: /)
  end

  it "refuses a sample whose stack is deeper than the views read" do
    # One location of 2,000 inline lines, 40 times in a sample: 80,000 frames from 25 KB.
    deep = pprof(samples: [[[1] * 40, 1]]) do |p|
      p.location[0].line.replace(Array.new(2000) { pb::Line.new(function_id: 2, line: 1) })
    end
    # merge and filter copy stacks as they are (no expansion), so only the resolving views.
    views.slice(:folded, :flamegraph, :top, :summary, :speedscope).each_value do |view|
      expect { view.call(deep) }.to raise_error(DdprofRecorder::Error, /a sample's stack has 80000 frames, more than the 65536/)
    end
  end

  # The output bound was 16 x max_decompressed_bytes, 16 GiB by default: a 2,978-byte pprof
  # (one 256 KiB name 400 frames deep) made folded write 1.05 GB, and flamegraph 105 MB.
  it "bounds what a view writes by what it read, and cuts the names a view draws" do
    # A 1 MiB name 1,000 times down one stack: 1 GB of folded text from a 1 MiB pprof.
    huge = pprof(names: ["m" * (1 << 20)], samples: [[[1] * 1000, 1]])
    bound = DdprofRecorder::DEFAULT_OUTPUT_PER_BYTE * huge.bytesize
    expect(bound).to be > DdprofRecorder::MIN_DEFAULT_OUTPUT_BYTES
    expect { DdprofRecorder.folded(huge) }
      .to raise_error(DdprofRecorder::Error, "the folded stacks would be more than #{bound} bytes (max_output_bytes: by " \
                                             "default 64 x the pprof's protobuf bytes, at least 64 MiB); raise " \
                                             "max_output_bytes to write them")
    expect { DdprofRecorder.folded(huge, max_output_bytes: 1000) }
      .to raise_error(DdprofRecorder::Error, "the folded stacks would be more than 1000 bytes (max_output_bytes: 1000); " \
                                             "raise max_output_bytes to write them")
    expect { DdprofRecorder.speedscope(huge, max_output_bytes: 1000) }.to raise_error(DdprofRecorder::Error, /max_output_bytes: 1000/)
    expect { DdprofRecorder.folded(huge, max_output_bytes: 0) }.to raise_error(ArgumentError, /\Amax_output_bytes must be positive/)
    expect { DdprofRecorder.folded(huge, max_output_bytes: "1") }.to raise_error(TypeError, /\Amax_output_bytes must be an Integer/)
    # The flamegraph draws the name cut: a few hundred KB, not a GB.
    svg = DdprofRecorder.flamegraph(huge)
    cut = "#{'m' * (DdprofRecorder::MAX_DRAWN_NAME_CHARS - 1)}…"
    expect(svg).to include(cut)
    expect(svg).not_to include("m" * DdprofRecorder::MAX_DRAWN_NAME_CHARS)
    expect(svg.bytesize).to be < 2 << 20
    # Raised, the folded text is written whole (a 64 KiB name: 66 MB of it, which the default
    # bound refuses, held twice).
    long = pprof(names: ["m" * (64 << 10)], samples: [[[1] * 1000, 1]])
    expect { DdprofRecorder.folded(long) }.to raise_error(DdprofRecorder::Error, /more than 67108864 bytes/)
    expect(DdprofRecorder.folded(long, max_output_bytes: 256 << 20).bytesize).to eq((1000 * (64 << 10)) + 999 + 3)
    expect(DdprofRecorder.top(huge)[:rows].size).to eq(1)
  end

  it "refuses labels that repeat a huge string" do
    labels = pprof(strings: ["k" * (1 << 20)]) do |p|
      huge = p.string_table.size - 1
      p.sample[0].label.replace(Array.new(100) { pb::Label.new(key: huge, str: huge) })
    end
    expect { DdprofRecorder.summary(labels, max_decompressed_bytes: 2 << 20) }
      .to raise_error(DdprofRecorder::Error, /\Athe samples' labels would take more memory/)
  end

  it "gives an ArgumentError for ids that point nowhere, and reads recursion as a stack" do
    dangling = pprof(samples: [[[2, 99], 1]])
    expect { DdprofRecorder.folded(dangling) }.to raise_error(ArgumentError, /location 99, which does not exist/)
    no_function = pprof { |p| p.location[1].line[0].function_id = 1 }
    expect(DdprofRecorder.folded(no_function)).to eq("main;main 5\n")
    missing = pprof { |p| p.location[1].line[0].function_id = 7 }
    expect { DdprofRecorder.folded(missing) }.to raise_error(ArgumentError, /location 2 refers to function 7/)
    recursive = pprof(samples: [[[1, 2, 1, 2, 1], 3]])
    expect(DdprofRecorder.top(recursive)[:rows].map { |r| [r[:name], r[:self], r[:total]] })
      .to eq([["main", 3, 3], ["work", 0, 3]])
  end

  it "checks the keyword" do
    bytes = pprof
    views.each do |name, view|
      expect { view.call(bytes, max_decompressed_bytes: "1") }.to raise_error(TypeError, /max_decompressed_bytes must be an Integer/), name.to_s
      expect { view.call(bytes, max_decompressed_bytes: 0) }.to raise_error(ArgumentError, /must be positive/), name.to_s
      expect { view.call(bytes, max_decompressed_bytes: 2**64) }.to raise_error(ArgumentError, /below 2\*\*64/), name.to_s
    end
    expect(DdprofRecorder::DEFAULT_MAX_DECOMPRESSED_BYTES).to eq(gib)
  end
end
