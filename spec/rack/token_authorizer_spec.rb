# frozen_string_literal: true

require "logger"
require "open3"
require "rack"
require "rack/builder"
require "rack/lint"
require "rack/mock"
require "rbconfig"
require "stringio"

require_relative "../../lib/ddprof_recorder/rack"

# DdprofRecorder::Rack.token_authorizer, the `authorize:` of every example: it refuses at boot
# a token that is not set, empty or that no request could send, and lets in only the requests
# whose header carries the token (compared in constant time). Through real Rack: Rack::Builder
# as a config.ru builds its app, Rack::MockRequest makes the requests, Rack::Lint checks both
# sides.
RSpec.describe DdprofRecorder::Rack, ".token_authorizer" do
  root = File.expand_path("../..", __dir__)

  let(:page) { [200, { "content-type" => "text/plain" }, ["the page\n"]] }
  let(:app) { ->(_env) { page } }

  before { DdprofRecorder.logger = Logger.new(StringIO.new) }

  after { expect(described_class.slot).not_to be_held }

  # The app a config.ru with the line `use DdprofRecorder::Rack, ...` builds, linted; or with
  # `authorize` (an object) when no line is given.
  def build(use_line = nil, authorize: nil)
    inner = app
    Rack::Builder.new do
      use Rack::Lint
      use_line ? instance_eval(use_line) : use(DdprofRecorder::Rack, authorize: authorize)
      run inner
    end.to_app
  end

  # What a GET with the query (and the header, unless nil) gets: profiled or the page.
  def request(app, query: "ddprof=pprof", headers: {})
    response = Rack::MockRequest.new(app).get("/checkout?#{query}", headers)
    response["content-type"] == "application/octet-stream" ? :profiled : response.body
  end

  # ENV with PROFILE_TOKEN as given (nil: unset), for the block.
  def with_profile_token(value)
    saved = ENV.fetch("PROFILE_TOKEN", nil)
    value.nil? ? ENV.delete("PROFILE_TOKEN") : ENV["PROFILE_TOKEN"] = value
    yield
  ensure
    saved.nil? ? ENV.delete("PROFILE_TOKEN") : ENV["PROFILE_TOKEN"] = saved
  end

  it "lets in only the requests whose X-Profile-Token header is the token" do
    with_profile_token("3f9c-long-random-secret") do
      mw = build("use DdprofRecorder::Rack, authorize: DdprofRecorder::Rack.token_authorizer(ENV)")
      expect(request(mw, headers: { "HTTP_X_PROFILE_TOKEN" => "3f9c-long-random-secret" })).to eq(:profiled)
      expect(request(mw)).to eq("the page\n") # no header
      expect(request(mw, headers: { "HTTP_X_PROFILE_TOKEN" => "" })).to eq("the page\n")
      expect(request(mw, headers: { "HTTP_X_PROFILE_TOKEN" => "3f9c-long-random-secreT" })).to eq("the page\n")
      expect(request(mw, headers: { "HTTP_X_PROFILE_TOKEN" => "3f9c-long-random-secret " * 2 })).to eq("the page\n")
      expect(request(mw, headers: { "HTTP_X_PROFILE_TOKEN" => "3f9c" })).to eq("the page\n")
      expect(request(mw, headers: { "HTTP_X_OTHER" => "3f9c-long-random-secret" })).to eq("the page\n")
    end
  end

  it "refuses at boot a token that is not set, empty or that no request could send" do
    expect { described_class.token_authorizer({}) }
      .to raise_error(ArgumentError, /PROFILE_TOKEN is not set/)
    expect { described_class.token_authorizer({ "PROFILE_TOKEN" => "" }) }
      .to raise_error(ArgumentError, /PROFILE_TOKEN is empty/)
    expect { described_class.token_authorizer({ "PROFILE_TOKEN" => "  \t" }) }
      .to raise_error(ArgumentError, /PROFILE_TOKEN is blank/)
    expect { described_class.token_authorizer({ "PROFILE_TOKEN" => "secret\n" }) }
      .to raise_error(ArgumentError, /PROFILE_TOKEN starts or ends with whitespace/)
    expect { described_class.token_authorizer({ "PROFILE_TOKEN" => "sec\u0000ret" }) }
      .to raise_error(ArgumentError, /PROFILE_TOKEN holds a control character/)
    expect { described_class.token_authorizer({}, "MY_TOKEN") }.to raise_error(ArgumentError, /MY_TOKEN is not set/)
    # Bad arguments.
    expect { described_class.token_authorizer("s3cret") }.to raise_error(ArgumentError, /not the token itself/)
    expect { described_class.token_authorizer(nil) }.to raise_error(ArgumentError, /environment/)
    expect { described_class.token_authorizer({}, "") }.to raise_error(ArgumentError, /variable/)
    expect { described_class.token_authorizer({ "T" => "x" }, :T) }.to raise_error(ArgumentError, /variable/)
    expect { described_class.token_authorizer({ "T" => "x" }, "T", header: "X Token") }
      .to raise_error(ArgumentError, /header/)
    expect { described_class.token_authorizer({ "T" => 5 }, "T") }.to raise_error(ArgumentError, /T is not a String/)
  end

  it "reads another variable and another header when told" do
    authorize = described_class.token_authorizer({ "OPS_TOKEN" => "ops-secret" }, "OPS_TOKEN", header: "X-Ops-Auth")
    mw = build(authorize: authorize)
    expect(request(mw, headers: { "HTTP_X_OPS_AUTH" => "ops-secret" })).to eq(:profiled)
    expect(request(mw, headers: { "HTTP_X_PROFILE_TOKEN" => "ops-secret" })).to eq("the page\n")
    expect(authorize.call("HTTP_X_OPS_AUTH" => "ops-secret")).to be(true)
    expect(authorize.call("HTTP_X_OPS_AUTH" => ["ops-secret"])).to be(false)
    expect(authorize.call({})).to be(false)
  end

  it "keeps the token's digest only, not the token nor where it was read" do
    env = { "PROFILE_TOKEN" => "visible-secret" }
    authorize = described_class.token_authorizer(env)
    expect(authorize.inspect).not_to include("visible-secret")
    held = authorize.binding.local_variables.map { |v| authorize.binding.local_variable_get(v) }
    expect(held).not_to include("visible-secret", env)
    expect(held.grep(String).join).not_to include("visible-secret")
  end

  it "compares in constant time without Rack loaded, too" do
    program = <<~'RUBY'
      require "ddprof_recorder/rack"
      abort "rack is loaded" if defined?(::Rack::Utils)
      authorize = DdprofRecorder::Rack.token_authorizer({ "PROFILE_TOKEN" => "s3cret-token" })
      p [authorize.call("HTTP_X_PROFILE_TOKEN" => "s3cret-token"), authorize.call("HTTP_X_PROFILE_TOKEN" => "s3cret-tokeN"),
         authorize.call("HTTP_X_PROFILE_TOKEN" => "s3cret"), authorize.call({}), defined?(::Rack::Utils).inspect]
    RUBY
    out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(root, "lib"), "-e", program)
    expect(status).to be_success, err
    expect(out).to eq("[true, false, false, false, \"nil\"]\n")
  end

  describe "the examples" do
    # Every `use DdprofRecorder::Rack, ...` line of the README, of rack.rb's doc and of docs/.
    examples = (["README.md", "lib/ddprof_recorder/rack.rb"] + Dir.glob("docs/*.md", base: root)).flat_map do |file|
      File.readlines(File.join(root, file)).grep(/^\s*(#\s*)?use DdprofRecorder::Rack\b/).map do |line|
        [file, line.sub(/^\s*(#\s*)?/, "").strip]
      end
    end

    it "are in the README and rack.rb" do
      expect(examples.map(&:first)).to include("README.md", "lib/ddprof_recorder/rack.rb")
    end

    examples.each do |file, line|
      it "#{file}: `#{line}` refuses to boot without a token, and lets in only the token" do
        with_profile_token(nil) do
          expect { build(line) }.to raise_error(ArgumentError, /PROFILE_TOKEN is not set/)
        end
        with_profile_token("") do
          expect { build(line) }.to raise_error(ArgumentError, /PROFILE_TOKEN is empty/)
        end
        with_profile_token("example-token-0123456789") do
          mw = build(line)
          expect(request(mw)).to eq("the page\n")
          expect(request(mw, headers: { "HTTP_X_PROFILE_TOKEN" => "" })).to eq("the page\n")
          expect(request(mw, headers: { "HTTP_X_PROFILE_TOKEN" => "example-token-0123456789" })).to eq(:profiled)
        end
      end
    end
  end
end
