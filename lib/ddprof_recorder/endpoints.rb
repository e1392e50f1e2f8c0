# frozen_string_literal: true

require_relative "labels"

module DdprofRecorder
  # Rack middleware that puts each request's endpoint on its samples, as the label
  # `"trace endpoint"`, so that a profile tells which endpoint costs what
  # (`ddprof-recorder top --by "trace endpoint"`). With nothing configured it is in every Rails
  # app (a Railtie puts it first in the middleware stack) and every Sinatra app
  # (`Sinatra::Base.use`) of a profiled process (see Integrations); any other Rack app adds one
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
  # How: while the app's `call` runs, the thread carries a label `"local root span id"` with a
  # number of the request's own (Labels), and at its end the middleware links that number to
  # the endpoint (StackRecorder#record_endpoint), which the recorder adds as `"trace endpoint"`
  # to every sample of the request in the window, recorded before or after. A request that
  # spans two windows has the endpoint in the second one only. A body that does its work
  # while the server iterates it (streaming) is not labelled there.
  #
  # A request costs the middleware about a microsecond while a profiler samples, and one
  # Hash lookup when none does.
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

      span = Labels.next_span_id
      env[SPAN_KEY] = span
      depth = Labels.push_span(span)
      begin
        @app.call(env)
      ensure
        Labels.pop(depth)
        Profiler.record_endpoint(span, Endpoints.endpoint(env))
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
