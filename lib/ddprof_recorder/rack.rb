# frozen_string_literal: true

require "uri"

require_relative "../ddprof_recorder"

module DdprofRecorder
  # Rack middleware that profiles one request when asked: a request whose query has
  # `ddprof=flamegraph`, `ddprof=pprof` or `ddprof=speedscope` runs under a profiler of its
  # own at a high rate (999 Hz), and the flamegraph SVG, the pprof file or the speedscope file
  # comes back instead of the page.
  #
  #   require "ddprof_recorder/rack"
  #   use DdprofRecorder::Rack, authorize: ->(env) { env["HTTP_X_PROFILE_TOKEN"] == ENV["PROFILE_TOKEN"] }
  #
  #   curl -H "X-Profile-Token: $PROFILE_TOKEN" "http://app/users?ddprof=flamegraph" > users.svg
  #
  # Safe by default: a request is profiled only if `authorize.call(env)` returns `true` itself
  # (not merely something truthy, so a lambda that returns a header by mistake authorizes
  # nobody). There is no default: `authorize:` is required. Any other request, including one
  # whose `authorize` raised (logged), is served normally with nothing in the response to
  # say that profiling exists.
  #
  # One request at a time in the process: the native trigger drives one profiler per process
  # (a second start would take it from the first). So an authorized request is served
  # normally, not profiled, while another request is being profiled or while a profiler of the
  # process runs ({Profiler.start}, `ddprof-recorder record`, or any {Profiler#start}); the
  # log says so. A process-wide profiler started *during* a profiled request takes the
  # trigger over, and that request's profile stops sampling at that point.
  #
  # What is profiled: the app's call and the iteration of the response body (a lazy body runs
  # then), the page itself being thrown away. The profiler samples every thread of the process;
  # the result keeps only the samples of the request's thread (by the profiler's `"thread id"`
  # label), unless `all_threads: true` (for an app that works in other threads for a request).
  # The flamegraph shows `wall-time` by default (where the request's time went, waiting
  # included); `ddprof_value=cpu-time` in the query picks another value type. The pprof and
  # speedscope files hold every value type.
  class Rack
    # The query parameter that asks for a profile, and its values.
    PARAM = "ddprof"
    FORMATS = %w[flamegraph pprof speedscope].freeze
    # The query parameter that picks the flamegraph's value type.
    VALUE_PARAM = "ddprof_value"
    DEFAULT_HZ = 999
    DEFAULT_VALUE = "wall-time"
    VALUE_NAMES = Profiler::VALUE_TYPES.map(&:first).freeze

    @lock = Mutex.new

    class << self
      # @return [Mutex] held while a request is being profiled, by whichever instance: one at a
      #   time in the process.
      attr_reader :lock
    end

    # @param app [#call] the Rack app.
    # @param authorize [#call] `authorize.call(env)` returns `true` for a request that may be
    #   profiled. Called only for requests that ask for a profile.
    # @param hz [Integer] the profiler's rate (see {Profiler#initialize}).
    # @param param [String] the query parameter that asks for a profile.
    # @param all_threads [Boolean] keep the samples of every thread, not only the request's.
    # @raise [ArgumentError] if `authorize` is missing or cannot be called, or `hz` is bad.
    def initialize(app, authorize:, hz: DEFAULT_HZ, param: PARAM, all_threads: false)
      unless authorize.respond_to?(:call)
        raise ArgumentError, "authorize must respond to #call (it returns true for the requests that may be profiled)"
      end
      raise ArgumentError, "hz must be an Integer in #{Profiler::HZ_RANGE}, got #{hz.inspect}" unless hz.is_a?(Integer) && Profiler::HZ_RANGE.cover?(hz)
      raise ArgumentError, "param must be a non-empty String, got #{param.inspect}" unless param.is_a?(String) && !param.empty?

      @app = app
      @authorize = authorize
      @hz = hz
      @param = param
      @all_threads = all_threads ? true : false
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

      if (why_not = acquire)
        DdprofRecorder.logger.info("rack: not profiling #{request_line(env)}: #{why_not}")
        return @app.call(env)
      end
      begin
        profile(env, kind, value)
      ensure
        self.class.lock.unlock
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

    # Takes the lock for this request; returns nil, or why the request cannot be profiled now
    # (the lock is then not held).
    def acquire
      return "another request is being profiled" unless self.class.lock.try_lock
      # Any profiler of the process, whether through Profiler.start or not, holds the trigger.
      return nil unless Profiler.running? || Profiler._native_sampling_stats[:trigger_running]

      self.class.lock.unlock
      "a profiler is already running in this process"
    end

    def profile(env, kind, value)
      thread = Thread.current
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      pprof = Profiler.new(hz: @hz).profile { run_app(env) }
      elapsed_ms = (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started) * 1000
      unless @all_threads
        pprof = DdprofRecorder.filter(pprof, labels: { Profiler::THREAD_ID_LABEL => Profiler::ThreadSampler.thread_id(thread) })
      end
      request = request_line(env)
      title = format("%<request>s: %<value>s, %<ms>.1f ms (ddprof_recorder, %<hz>d Hz)",
                     request: request, value: kind == "flamegraph" ? value : "all values", ms: elapsed_ms, hz: @hz)
      begin
        response = render(kind, pprof, value, title)
      rescue DdprofRecorder::Error => e # nothing to draw: no sample of the request's thread
        return text(500, "ddprof_recorder: #{e.message} (#{format('%.1f', elapsed_ms)} ms at #{@hz} Hz)\n")
      end
      DdprofRecorder.logger.info("rack: profiled #{request} as #{kind} (#{format('%.1f', elapsed_ms)} ms)")
      response
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
        svg = DdprofRecorder.flamegraph(pprof, value: value, title: title)
        response("image/svg+xml; charset=utf-8", svg)
      when "pprof"
        response("application/octet-stream", pprof, "ddprof-#{stamp}.pb.gz")
      when "speedscope"
        json = DdprofRecorder.speedscope(pprof, name: title)
        response("application/json", json, "ddprof-#{stamp}.speedscope.json")
      end
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
