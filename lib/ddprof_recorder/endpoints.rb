# frozen_string_literal: true

require_relative "labels"

module DdprofRecorder
  # Rack middleware that puts each request's endpoint on its samples, as the label
  # `"trace endpoint"`, so that a profile tells which endpoint costs what
  # (`ddprof-recorder top --by "trace endpoint"`). With nothing configured it is in every Rails
  # app (a Railtie puts it first in the middleware stack) and every Sinatra app (first too,
  # before Sinatra's own middleware) of a profiled process (see Integrations); any other Rack app adds one
  # line to its config.ru:
  #
  #   use DdprofRecorder::Endpoints
  #
  # The endpoint, known once the app has run:
  # - what the app put in `env["ddprof_recorder.endpoint"]` (a String), if anything;
  # - Rails: `Controller#action` (`PagesController#heavy`), as dd-trace-rb names resources;
  # - Sinatra: the route's pattern (`GET /items/:id`);
  # - else the request method alone (`GET`): never the path, so that the endpoints stay few.
  #
  # How: from the app's `call` until the server closes the response's body, the thread carries
  # a label `"local root span id"` with a number of the request's own (Labels), and at the
  # close the middleware links that number to the endpoint (StackRecorder#record_endpoint),
  # which the recorder adds as `"trace endpoint"` to every sample of the request in the window,
  # recorded before or after. So the server's writing of the body, a streaming body's work and
  # what the app does at the close (Rails: its executor's completion, the log line) are the
  # request's too: a span that ended at `call`'s return left that CPU unlabelled, the same for
  # every request, which took share from the cheap endpoints (PagesController#heavy 1.4 to 3.9
  # points over its truth in bench/rails_endpoints.rb). A request that spans two windows has the
  # endpoint in the second one only. Puma and Unicorn close the body on the thread that served
  # it; a body closed elsewhere, or never, has its span taken off at that thread's next request.
  # Without Rack loaded (no Rack::BodyProxy), the span ends when `call` returns.
  #
  # A request costs the middleware a few microseconds while a profiler samples, and one Hash
  # lookup when none does.
  class Endpoints
    # Where an app names its endpoint.
    ENDPOINT_KEY = "ddprof_recorder.endpoint"
    # Set on a request the middleware labels: a second one inside (Rails in Sinatra, or a
    # config.ru line beside the Railtie) leaves it to the first.
    SPAN_KEY = "ddprof_recorder.span_id"

    def initialize(app)
      @app = app
    end

    def call(env)
      return @app.call(env) if env.key?(SPAN_KEY) || !Profiler.sampling?

      slot = Labels.slot
      # An earlier request's body that was not closed on this thread: its span ends here.
      Endpoints.end_span(slot, slot.open_body) if slot.open_body
      span = slot.next_span_id
      env[SPAN_KEY] = span
      depth = Labels.push_span(span)
      begin
        status, headers, body = @app.call(env)
      rescue Exception # the span ends, whatever ends the call
        slot.pop(depth)
        Profiler.record_endpoint(span, Endpoints.endpoint(env))
        raise
      end
      # Rack's proxy, whenever Rack is loaded (any Rails, Sinatra or config.ru app has it).
      unless defined?(::Rack::BodyProxy)
        slot.pop(depth)
        Profiler.record_endpoint(span, Endpoints.endpoint(env))
        return [status, headers, body]
      end

      # The open request: the depth its span went on at, and whether the span has ended.
      open = [depth, false]
      slot.open_body = open
      [status, headers, ::Rack::BodyProxy.new(body) { Endpoints.close(slot, open, span, env) }]
    end

    class << self
      # The close of an open request's body: its span off, if this thread still has it, and its
      # endpoint recorded.
      def close(slot, open, span, env)
        end_span(slot, open) if slot.equal?(Labels.slot_of(Thread.current))
        Profiler.record_endpoint(span, endpoint(env))
      end

      # Takes an open request's span off `slot`, its thread's, once: with what went on above it
      # (a request served inside it whose body was not closed).
      def end_span(slot, open)
        return if open[1]

        open[1] = true
        depth = open[0]
        slot.pop(depth) if slot.depth > depth
        inner = slot.open_body
        slot.open_body = nil if inner && (inner.equal?(open) || inner[0] > depth)
      end
    end

    # The endpoint's name for a request that has run (see the class doc).
    #
    # @return [String]
    def self.endpoint(env)
      named = env[ENDPOINT_KEY]
      return named if named.is_a?(String) && !named.empty?

      controller = env["action_controller.instance"]
      if controller.respond_to?(:action_name) && (action = controller.action_name)
        return "#{controller.class.name}##{action}"
      end

      route = env["sinatra.route"]
      return route if route.is_a?(String)

      env["REQUEST_METHOD"] || "(no request method)"
    end
  end
end
