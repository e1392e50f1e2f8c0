# frozen_string_literal: true

# StackRecorder#comments= and #comments: the pprof `comment` field (docs/design.md, section 4),
# decoded with google-protobuf.
RSpec.describe DdprofRecorder::StackRecorder, "comments" do
  subject(:stack_recorder) { described_class.new }

  it "has none by default: no comment field, and #comments is []" do
    expect(stack_recorder.comments).to eq []
    expect(decode_pprof(stack_recorder.serialize!).comment.to_a).to eq []
  end

  it "writes them, in order, into every pprof serialized after they are set, raw and gzip", gc_stress: true do
    gzip_recorder = described_class.new(compression: :gzip)
    comments = ["sampling: at each thread's CPU tick", "made by a spec", "résumé"]
    [stack_recorder, gzip_recorder].each do |recorder|
      recorder.record_sample([["leaf", "/app/a.rb", 1]], [1, 1, 1])
      before = recorder.serialize!
      recorder.comments = comments
      recorder.record_sample([["leaf", "/app/a.rb", 1]], [2, 2, 2])
      first = recorder.serialize!
      second = recorder.serialize!

      expect(pprof_comments(before)).to eq []
      expect(pprof_comments(first)).to eq comments
      expect(pprof_comments(second)).to eq comments
      expect(value_totals(samples_from(decode_pprof(first)))).to eq("cpu-time" => 2, "cpu-samples" => 2, "wall-time" => 2)
    end
  end

  it "keeps every string of the table once, a comment equal to another string included" do
    stack_recorder.comments = ["leaf", "cpu-time", "leaf"]
    stack_recorder.record_sample([["leaf", "/app/a.rb", 1]], [1, 1, 1])
    profile = decode_pprof(stack_recorder.serialize!)

    expect(profile.string_table.to_a.uniq).to eq profile.string_table.to_a
    expect(profile.comment.map { |i| profile.string_table[i] }).to eq ["leaf", "cpu-time", "leaf"]
  end

  it "replaces them whole, and [] removes them" do
    stack_recorder.comments = ["one", "two"]
    stack_recorder.comments = ["three"]
    expect(pprof_comments(stack_recorder.serialize!)).to eq ["three"]
    stack_recorder.comments = []
    expect(stack_recorder.comments).to eq []
    expect(decode_pprof(stack_recorder.serialize!).comment.to_a).to eq []
  end

  it "copies the Strings: changing them later changes nothing, and #comments returns new ones" do
    text = +"sampling: safepoints"
    stack_recorder.comments = [text]
    text << " (changed)"
    returned = stack_recorder.comments
    returned.first << " (changed too)"

    expect(stack_recorder.comments).to eq ["sampling: safepoints"]
    expect(stack_recorder.comments.first.encoding).to eq Encoding::UTF_8
    expect(pprof_comments(stack_recorder.serialize!)).to eq ["sampling: safepoints"]
  end

  it "keeps valid UTF-8 bytes whatever the encoding tag and replaces invalid ones with U+FFFD" do
    stack_recorder.comments = ["caf\xC3\xA9".b, "bad \xFF byte".b]
    expect(stack_recorder.comments).to eq ["café", "bad \uFFFD byte"]
    expect(pprof_comments(stack_recorder.serialize!)).to eq ["café", "bad \uFFFD byte"]
  end

  it "keeps them across reset_after_fork and in a forked child" do
    stack_recorder.comments = ["sampling: kept"]
    stack_recorder.reset_after_fork
    expect(stack_recorder.comments).to eq ["sampling: kept"]
    expect(pprof_comments(stack_recorder.serialize!)).to eq ["sampling: kept"]

    reader, writer = IO.pipe
    pid = fork do
      reader.close
      writer.puts(stack_recorder.comments, pprof_comments(stack_recorder.serialize!))
      writer.close
      exit!(0)
    end
    writer.close
    child = reader.read
    reader.close
    expect(Process.wait2(pid).last).to be_success
    expect(child).to eq "sampling: kept\nsampling: kept\n"
  end

  describe "bad input" do
    not_a_string = Object.new.tap { |o| o.define_singleton_method(:to_str) { raise "to_str must not be called" } }
    cases = [
      ["nil", nil, TypeError, /\Acomments must be an Array, got NilClass\z/],
      ["a String", "sampling: x", TypeError, /\Acomments must be an Array, got String\z/],
      ["a Symbol entry", ["ok", :sym], TypeError, /\Acomments\[1\] must be a String, got Symbol\z/],
      ["an object with to_str", [not_a_string], TypeError, /\Acomments\[0\] must be a String, got Object\z/],
      ["an empty String", ["ok", ""], ArgumentError, /\Acomments\[1\] is empty\z/],
      ["a String too long", ["x" * (described_class::MAX_COMMENT_BYTES + 1)], ArgumentError,
       /\Acomments\[0\] is 4097 bytes long, more than 4096\z/],
      ["too many", Array.new(described_class::MAX_COMMENTS + 1, "c"), ArgumentError,
       /\Acomments must have at most 64 entries, got 65\z/],
    ]

    cases.each do |description, argument, error, message|
      it "raises #{error} naming the argument for #{description}, and changes nothing" do
        stack_recorder.comments = ["before"]
        expect { stack_recorder.comments = argument }.to raise_error(error, message)
        expect(stack_recorder.comments).to eq ["before"]
        expect(pprof_comments(stack_recorder.serialize!)).to eq ["before"]
      end
    end

    it "takes the most and the longest comments" do
      longest = "y" * described_class::MAX_COMMENT_BYTES
      stack_recorder.comments = Array.new(described_class::MAX_COMMENTS, longest)
      expect(pprof_comments(stack_recorder.serialize!)).to eq Array.new(64, longest)
    end
  end

  it "counts them in ObjectSpace.memsize_of" do
    require "objspace"
    before = ObjectSpace.memsize_of(stack_recorder)
    stack_recorder.comments = ["z" * 4000] * 10
    expect(ObjectSpace.memsize_of(stack_recorder)).to be >= before + 40_000
  end
end
