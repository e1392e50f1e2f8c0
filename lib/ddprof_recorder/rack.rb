# frozen_string_literal: true

require "digest"
require "json"
require "uri"

require_relative "../ddprof_recorder"

module DdprofRecorder
  # Rack middleware that profiles one request when asked: a request whose query has
  # `ddprof=flamegraph`, `ddprof=pprof` or `ddprof=speedscope` runs under a profiler of its
  # own at a high rate (999 Hz), and the flamegraph SVG, the pprof file or the speedscope file
  # comes back instead of the page.
  #
  #   require "ddprof_recorder/rack"
  #   use DdprofRecorder::Rack, authorize: DdprofRecorder::Rack.token_authorizer(ENV)
  #
  #   curl -H "X-Profile-Token: $PROFILE_TOKEN" "http://app/users?ddprof=flamegraph" > users.svg
  #
  # Safe by default: a request is profiled only if `authorize.call(env)` returns `true` itself
  # (not merely something truthy, so a lambda that returns a header by mistake authorizes
  # nobody). There is no default: `authorize:` is required. Any other request, including one
  # whose `authorize` raised (logged), is served normally with nothing in the response to
  # say that profiling exists. {.token_authorizer} is the usual `authorize`: the request's
  # `X-Profile-Token` header against `ENV["PROFILE_TOKEN"]`, compared in constant time, and a
  # token that is not set or empty is refused at boot (a hand-written
  # `env["HTTP_X_PROFILE_TOKEN"] == ENV["PROFILE_TOKEN"]` lets every request in when the
  # variable is unset: nil == nil).
  #
  # One request at a time in the process: the native trigger drives one profiler per process
  # (a second start would take it from the first). So while another request is being
  # profiled, or while a profiler of the process runs ({Profiler.start}, `ddprof-recorder
  # record`, or any {Profiler#start}), an authorized request gets 503 with an
  # `x-ddprof-busy` header that says which (and `retry-after`, the seconds until the other
  # request's cap at most), not the page: the app is not called. The other way round, the
  # request's profiler holds the trigger: a profiler that the app starts *during* a profiled
  # request ({Profiler.start}, or any {Profiler#start}) raises {DdprofRecorder::Error}
  # ("another DdprofRecorder::Profiler is already sampling in this process") into the app, and
  # the request's profile goes on.
  #
  # The cap: a request is profiled for `max_seconds` at most (default {DEFAULT_MAX_SECONDS}).
  # A longer one is still served to its end, but the profiler stops at the cap and the slot
  # is free from then on; its profile covers the first `max_seconds`, and says so in an
  # `x-ddprof-capped` header. The profiler cuts a window at the cap (`interval:`), and its
  # exporter, which runs in the profiler's exporter thread (not sampled), stops it there.
  #
  # A request too short to get a sample (at 999 Hz, one sample about every millisecond)
  # gets `200` with an `x-ddprof-empty` header that says so, and: for a flamegraph, an SVG
  # that shows the same note; for speedscope, a file with one empty profile named with the
  # note; for pprof, the profile as it is.
  #
  # What is profiled: the app's call and the iteration of the response body (a lazy body runs
  # then), the page itself being thrown away. The profiler samples every thread of the process;
  # the result keeps only the samples of the request's thread (by the profiler's `"thread id"`
  # label), unless `all_threads: true` (for an app that works in other threads for a request).
  # The flamegraph shows `wall-time` by default (where the request's time went, waiting
  # included); `ddprof_value=cpu-time` in the query picks another value type. The pprof and
  # speedscope files hold every value type.
  #
  # Logged at INFO on {DdprofRecorder.logger} (whose default shows WARN and above): each
  # profiled request, and each refused because profiling was busy; an `authorize` that
  # raised is a WARN.
  class Rack
    # The query parameter that asks for a profile, and its values.
    PARAM = "ddprof"
    FORMATS = %w[flamegraph pprof speedscope].freeze
    # The query parameter that picks the flamegraph's value type.
    VALUE_PARAM = "ddprof_value"
    DEFAULT_HZ = 999
    DEFAULT_VALUE = "wall-time"
    VALUE_NAMES = Profiler::VALUE_TYPES.map(&:first).freeze
    # Long enough for a slow page, short enough that a stuck request does not keep the
    # process's one profiling slot (and 999 Hz sampling) for long: about 10,000 samples of
    # the request's thread.
    DEFAULT_MAX_SECONDS = 10
    # The response headers that say what happened to a profile, for an authorized request.
    BUSY_HEADER = "x-ddprof-busy"
    CAPPED_HEADER = "x-ddprof-capped"
    EMPTY_HEADER = "x-ddprof-empty"
    PROFILER_RUNNING = "a profiler is already running in this process"
    private_constant :PROFILER_RUNNING

    # The one profiling slot of the process, taken by whichever instance profiles a request,
    # with the time at which its holder's cap frees it at the latest. Not a Mutex: at the cap,
    # the profiler's exporter thread gives it back for the request's thread.
    class Slot
      def initialize
        @lock = Mutex.new
        @holder = nil
        @deadline = nil
      end

      # @param seconds [Numeric] how long it may be held at most (the holder's cap).
      # @return [Object, nil] a token for {#release}, or nil if it is held.
      def claim(seconds)
        @lock.synchronize do
          next nil if @holder

          @deadline = now + seconds
          @holder = Object.new
        end
      end

      # Frees it if `token` holds it (a second release, or a stale token's, does nothing).
      def release(token)
        @lock.synchronize { @holder = nil if @holder.equal?(token) }
      end

      # @return [Boolean]
      def held?
        @lock.synchronize { !@holder.nil? }
      end

      # @return [Integer] whole seconds until the holder's cap frees it, at least 1.
      def retry_after
        @lock.synchronize { @holder ? [(@deadline - now).ceil, 1].max : 1 }
      end

      private

      def now
        Process.clock_gettime(Process::CLOCK_MONOTONIC)
      end
    end

    # One request's profile: stopped at the cap by the exporter, in the profiler's exporter
    # thread, if the request still runs then; else by the request's thread at its end.
    class RequestProfile
      # @param on_cap [#call] called in the exporter thread once the cap stopped the profiler.
      def initialize(hz, max_seconds, on_cap)
        @on_cap = on_cap
        @guard = Mutex.new
        @windows = []
        @state = :running
        @cap_done = Queue.new
        @profiler = Profiler.new(hz: hz, interval: max_seconds, exporter: method(:window))
      end

      # @raise [DdprofRecorder::Error] if another profiler samples in this process.
      def start
        @profiler.start
        self
      end

      # At the request's end: stops the profiler, or waits until the cap's stop is done.
      def finish
        capped = @guard.synchronize do
          next true if @state == :capped

          @state = :stopping
          false
        end
        capped ? @cap_done.pop : @profiler.stop
        nil
      end

      # After {#finish}: the window up to the cap if one was cut (the profiler hands over the
      # rest too), else the one window.
      #
      # @return [Array(String, Float, nil)] the pprof, and the seconds it covers when capped.
      # @raise [DdprofRecorder::Error] if the profile could not be serialized.
      def result
        start, finish, pprof = @windows.first
        raise Error, "could not serialize the profile (see the log)" unless pprof

        [pprof, @windows.size > 1 ? finish - start : nil]
      end

      private

      # The exporter: each window, in the exporter thread (a cut, at the cap) or in the
      # thread that stops the profiler (the last one). The first cut while the request runs
      # stops the profiler, which hands this the last window (again, here) and returns.
      def window(start, finish, pprof)
        cut = @guard.synchronize do
          @windows << [start, finish, pprof]
          @state == :running && (@state = :capped)
        end
        return unless cut

        begin
          @profiler.stop
          @on_cap.call
        ensure
          @cap_done << true
        end
      end
    end

    @slot = Slot.new

    # The environment variable {.token_authorizer} reads the token from by default.
    TOKEN_VARIABLE = "PROFILE_TOKEN"
    # The request header that carries the token by default.
    TOKEN_HEADER = "X-Profile-Token"

    class << self
      # @return [Slot] the process's one profiling slot, shared by every instance.
      attr_reader :slot

      # An `authorize:` that lets in the requests whose `header` carries the token found in
      # `env[variable]`, read once, now (at boot):
      #
      #   use DdprofRecorder::Rack, authorize: DdprofRecorder::Rack.token_authorizer(ENV)
      #
      # A token that is not set, empty, blank, or that no request could send (whitespace at
      # either end, which HTTP strips from a header's value; a control character) is refused
      # here, with an ArgumentError, rather than letting in every request (`nil == nil`) or
      # every empty header. The request's header is compared in constant time: the SHA-256
      # digests of both are compared with `Rack::Utils.secure_compare` when Rack is loaded,
      # else with a constant-time comparison of the same kind, so that neither the time taken
      # nor its length tells anything of the token. Only the token's digest is kept.
      #
      # @param env [#[]] where the token is read: ENV, or a Hash.
      # @param variable [String] the name it is read under.
      # @param header [String] the request header that must carry it (`X-Profile-Token`: the
      #   Rack env's `HTTP_X_PROFILE_TOKEN`).
      # @return [Proc] `call(env)` returns true or false.
      # @raise [ArgumentError] if the token is missing or unusable, or an argument is bad.
      def token_authorizer(env = ENV, variable = TOKEN_VARIABLE, header: TOKEN_HEADER)
        if env.is_a?(String)
          raise ArgumentError, "token_authorizer reads the token from an environment (ENV, or a Hash), not the token " \
                               "itself: pass ENV and the variable's name"
        end
        unless env.respond_to?(:[])
          raise ArgumentError, "token_authorizer reads the token from an environment (ENV, or a Hash), got #{env.inspect}"
        end
        raise ArgumentError, "variable must be a non-empty String, got #{variable.inspect}" unless variable.is_a?(String) && !variable.empty?
        unless header.is_a?(String) && header.match?(/\A[A-Za-z0-9]+(-[A-Za-z0-9]+)*\z/)
          raise ArgumentError, "header must be a header name such as #{TOKEN_HEADER.inspect}, got #{header.inspect}"
        end

        digest = Digest::SHA256.digest(check_token(env[variable], variable))
        token_lambda("HTTP_#{header.upcase.tr('-', '_')}", digest.freeze)
      end

      private

      # The authorizer, made here so that it holds the digest and the key only (not the
      # environment the token was read from).
      def token_lambda(key, digest)
        lambda do |request_env|
          given = request_env[key]
          given.is_a?(String) && !given.empty? && secure_equal?(Digest::SHA256.digest(given), digest)
        end
      end

      # The token, if a request can send it; raises otherwise.
      def check_token(token, variable)
        how = "set #{variable} to a long random secret (`openssl rand -hex 32`), which the requests to profile send"
        raise ArgumentError, "#{variable} is not set: #{how}" if token.nil?
        raise ArgumentError, "#{variable} is not a String (#{token.class}): #{how}" unless token.is_a?(String)
        raise ArgumentError, "#{variable} is empty: #{how}" if token.empty?
        raise ArgumentError, "#{variable} is blank: #{how}" if token.strip.empty?
        if token.strip != token
          raise ArgumentError, "#{variable} starts or ends with whitespace, which HTTP strips from a header's value: " \
                               "no request could send it"
        end
        raise ArgumentError, "#{variable} holds a control character, which no header can carry" if token.match?(/[[:cntrl:]]/)

        token
      end

      # Whether two Strings of the same length (digests) are equal, in a time that does not
      # depend on where they differ.
      def secure_equal?(a, b)
        return ::Rack::Utils.secure_compare(a, b) if defined?(::Rack::Utils) && ::Rack::Utils.respond_to?(:secure_compare)
        return false unless a.bytesize == b.bytesize

        diff = 0
        b_bytes = b.bytes
        a.each_byte.with_index { |byte, i| diff |= byte ^ b_bytes[i] }
        diff.zero?
      end
    end

    # @param app [#call] the Rack app.
    # @param authorize [#call] `authorize.call(env)` returns `true` for a request that may be
    #   profiled. Called only for requests that ask for a profile.
    # @param hz [Integer] the profiler's rate (see {Profiler#initialize}).
    # @param param [String] the query parameter that asks for a profile.
    # @param all_threads [Boolean] keep the samples of every thread, not only the request's.
    # @param max_seconds [Numeric] profile a request for this long at most (see the class doc).
    # @raise [ArgumentError] if `authorize` is missing or cannot be called, or `hz`, `param`
    #   or `max_seconds` is bad.
    def initialize(app, authorize:, hz: DEFAULT_HZ, param: PARAM, all_threads: false,
                   max_seconds: DEFAULT_MAX_SECONDS)
      unless authorize.respond_to?(:call)
        raise ArgumentError, "authorize must respond to #call (it returns true for the requests that may be profiled)"
      end
      Profiler.check_hz(hz)
      raise ArgumentError, "param must be a non-empty String, got #{param.inspect}" unless param.is_a?(String) && !param.empty?
      unless max_seconds.is_a?(Numeric) && max_seconds.real? && max_seconds.positive? && max_seconds.finite?
        raise ArgumentError, "max_seconds must be a positive number of seconds, got #{max_seconds.inspect}"
      end

      @app = app
      @authorize = authorize
      @hz = hz
      @param = param
      @all_threads = all_threads ? true : false
      @max_seconds = max_seconds
    end

    def call(env)
      query = profiling_query(env)
      return @app.call(env) unless query && authorized?(env)

      kind = query[@param]
      value = query[VALUE_PARAM] || DEFAULT_VALUE
      return text(400, "ddprof_recorder: #{@param}= takes #{FORMATS.join(', ')}; got #{kind.inspect}\n") unless FORMATS.include?(kind)
      unless VALUE_NAMES.include?(value)
        return text(400, "ddprof_recorder: #{VALUE_PARAM}= takes #{VALUE_NAMES.join(', ')}; got #{value.inspect}\n")
      end

      token = self.class.slot.claim(@max_seconds)
      return busy(env, "another request is being profiled", self.class.slot.retry_after) unless token

      begin
        # Any profiler of the process, whether through Profiler.start or not, holds the trigger.
        if Profiler.running? || Profiler._native_sampling_stats[:trigger_running]
          return busy(env, PROFILER_RUNNING)
        end

        profile(env, kind, value, token)
      ensure
        self.class.slot.release(token)
      end
    end

    private

    # The query's parameters if it asks for a profile, else nil (cheap for the requests that
    # do not: no parsing unless the parameter's name is in the query).
    def profiling_query(env)
      query = env["QUERY_STRING"]
      return nil if query.nil? || !query.include?(@param)

      params = URI.decode_www_form(query).to_h
      params.key?(@param) ? params : nil
    rescue ArgumentError # a malformed query: not ours to judge
      nil
    end

    def authorized?(env)
      @authorize.call(env) == true
    rescue StandardError => e
      DdprofRecorder.logger.warn("rack: authorize raised #{e.class}: #{e.message}; serving #{request_line(env)} unprofiled")
      false
    end

    # 503 for an authorized request that cannot be profiled now; `retry_after` when the
    # slot frees itself by then at the latest.
    def busy(env, why, retry_after = nil)
      DdprofRecorder.logger.info("rack: not profiling #{request_line(env)}: #{why}")
      message = "ddprof_recorder: profiling is busy: #{why}"
      message += "; retry in #{retry_after} s" if retry_after
      status, headers, body = text(503, "#{message}\n")
      headers[BUSY_HEADER] = why
      headers["retry-after"] = retry_after.to_s if retry_after
      [status, headers, body]
    end

    def profile(env, kind, value, token)
      thread = Thread.current
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      run = RequestProfile.new(@hz, @max_seconds, -> { self.class.slot.release(token) })
      begin
        run.start
      rescue DdprofRecorder::Error # another profiler started since the check
        return busy(env, PROFILER_RUNNING)
      end
      begin
        run_app(env)
      ensure
        run.finish
      end
      elapsed = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      pprof, capped = run.result
      unless @all_threads
        pprof = DdprofRecorder.filter(pprof, labels: { Profiler::THREAD_ID_LABEL => Profiler::ThreadSampler.thread_id(thread) })
      end
      respond(env, kind, value, pprof, elapsed, capped)
    end

    # The response for the profile, with the headers that say what it covers; logged.
    def respond(env, kind, value, pprof, elapsed, capped)
      request = request_line(env)
      took = capped ? format("the first %.1f ms of %.1f ms", capped * 1000, elapsed * 1000) : format("%.1f ms", elapsed * 1000)
      title = format("%<request>s: %<value>s, %<took>s (ddprof_recorder, %<hz>d Hz%<cap>s)",
                     request: request, value: kind == "flamegraph" ? value : "all values", took: took, hz: @hz,
                     cap: capped ? ", max_seconds: #{@max_seconds}" : "")
      note = nothing_sampled(pprof, elapsed)
      status, headers, body = note ? render_empty(kind, pprof, title, note) : render(kind, pprof, value, title)
      if capped
        headers[CAPPED_HEADER] = format("profiled the first %.2f s of %.2f s (max_seconds: %s)", capped, elapsed, @max_seconds)
      end
      DdprofRecorder.logger.info("rack: profiled #{request} as #{kind} (#{took}#{headers[EMPTY_HEADER] ? '; nothing to draw' : ''})")
      [status, headers, body]
    end

    # Why there is nothing to draw, if the profile has no sample: nil when it has some.
    def nothing_sampled(pprof, elapsed)
      return nil if DdprofRecorder.summary(pprof)[:totals].fetch("cpu-samples", 0).positive?

      format("nothing to draw: the profiler took no sample in the request's %<ms>.1f ms (at %<hz>d Hz, about one " \
             "every %<period>.1f ms; a request this short can get none)", ms: elapsed * 1000, hz: @hz, period: 1000.0 / @hz)
    end

    # The app's response, body iterated (and closed) inside the profile; the page is dropped.
    def run_app(env)
      _status, _headers, body = @app.call(env)
      begin
        body.each { |_chunk| nil }
      ensure
        body.close if body.respond_to?(:close)
      end
    end

    def render(kind, pprof, value, title)
      stamp = Time.now.utc.strftime("%Y%m%dT%H%M%SZ")
      case kind
      when "flamegraph"
        begin
          svg = DdprofRecorder.flamegraph(pprof, value: value, title: title)
        rescue DdprofRecorder::Error => e # samples, but none with this value (a cpu-time of 0)
          return render_empty(kind, pprof, title, e.message)
        end
        response("image/svg+xml; charset=utf-8", svg)
      when "pprof"
        response("application/octet-stream", pprof, "ddprof-#{stamp}.pb.gz")
      when "speedscope"
        json = DdprofRecorder.speedscope(pprof, name: title)
        response("application/json", json, "ddprof-#{stamp}.speedscope.json")
      end
    end

    # What an authorized request gets when there is nothing to draw: a valid file of its
    # kind that says so (the pprof as it is), with the note in EMPTY_HEADER.
    def render_empty(kind, pprof, title, note)
      status, headers, body =
        case kind
        when "flamegraph" then response("image/svg+xml; charset=utf-8", note_svg(title, note))
        when "speedscope" then response("application/json", note_speedscope(title, note), "ddprof-empty.speedscope.json")
        else render(kind, pprof, nil, title)
        end
      headers[EMPTY_HEADER] = note
      [status, headers, body]
    end

    # An SVG that shows the title and the note, in place of a flamegraph.
    def note_svg(title, note)
      lines = [title, note].each_with_index.map do |line, i|
        %(<text x="10" y="#{24 * (i + 1)}" font-family="Verdana, sans-serif" font-size="14">#{xml(line)}</text>)
      end
      %(<?xml version="1.0" standalone="no"?>\n<svg version="1.1" width="1200" height="64" ) +
        %(xmlns="http://www.w3.org/2000/svg">#{lines.join}</svg>\n)
    end

    # A speedscope file with one empty profile, named with the note.
    def note_speedscope(title, note)
      profile = { type: "sampled", name: note, unit: "none", startValue: 0, endValue: 0, samples: [], weights: [] }
      JSON.generate("$schema" => "https://www.speedscope.app/file-format-schema.json", "shared" => { "frames" => [] },
                    "profiles" => [profile], "name" => title, "activeProfileIndex" => 0,
                    "exporter" => "ddprof_recorder #{VERSION}")
    end

    def xml(text)
      text.gsub(/[&<>"]/, "&" => "&amp;", "<" => "&lt;", ">" => "&gt;", '"' => "&quot;")
    end

    def response(type, body, attachment = nil)
      headers = { "content-type" => type, "content-length" => body.bytesize.to_s, "cache-control" => "no-store" }
      headers["content-disposition"] = "attachment; filename=\"#{attachment}\"" if attachment
      [200, headers, [body]]
    end

    def text(status, message)
      [status, { "content-type" => "text/plain; charset=utf-8", "content-length" => message.bytesize.to_s,
                 "cache-control" => "no-store" }, [message]]
    end

    # `GET /path`, without the query (it may hold secrets).
    def request_line(env)
      "#{env['REQUEST_METHOD']} #{env['SCRIPT_NAME']}#{env['PATH_INFO']}"
    end
  end
end
