# frozen_string_literal: true

require_relative "endpoints"

module DdprofRecorder
  # Puts Endpoints into Rails and Sinatra apps with nothing configured: under
  # `ddprof-recorder record`, after `Profiler.start`, or with the gem in a Gemfile.
  #
  # - Rails: a Railtie whose initializer puts Endpoints first in the app's middleware stack.
  #   It must exist before `Rails.application.initialize!`, which collects the Railties.
  # - Sinatra: Endpoints first in every Sinatra app's middleware, before Sinatra's own
  #   (Rack::Protection, Rack::Head, the logger, sessions): `setup_default_middleware`, which
  #   `Sinatra::Base.build` calls first, puts it on the builder (SinatraMiddleware). After
  #   Sinatra's own (`Sinatra::Base.use`, as it was), their CPU was outside every request's
  #   span, the same for every request, which took share from the cheap routes: `GET /report`
  #   was 4.1 points over its truth in bench/sinatra_endpoints.rb, the ERB route under it.
  #
  # When this file loads before Rails or Sinatra (`record` requires the gem before the
  # program, and a Gemfile may list it first), a hook on `Kernel#require` installs each one
  # once a `require` of it returns: the frameworks are complete then. The hook costs each later
  # `require` two constant checks.
  module Integrations
    @rails = @sinatra = false

    class << self
      # Installs what can be now, and the require hook for the rest.
      def install
        check
        return if done?

        Kernel.prepend(RequireHook) unless Kernel.ancestors.include?(RequireHook)
      end

      # @return [Boolean] whether both frameworks are seen to.
      def done?
        @rails && @sinatra
      end

      # Installs the integration of each framework loaded since the last look.
      def check
        rails if !@rails && defined?(::Rails::Railtie) && defined?(::Rails::Application)
        sinatra if !@sinatra && defined?(::Sinatra::Base) && ::Sinatra::Base.respond_to?(:use)
      end

      # @return [Boolean] whether the Railtie is defined.
      def rails?
        @rails
      end

      # @return [Boolean] whether Sinatra::Base uses Endpoints.
      def sinatra?
        @sinatra
      end

      private

      def rails
        @rails = true
        require_relative "railtie"
      end

      def sinatra
        @sinatra = true
        base = ::Sinatra::Base
        if base.respond_to?(:setup_default_middleware, true)
          base.singleton_class.prepend(SinatraMiddleware)
        else
          base.use(Endpoints)
        end
      end
    end

    # Sinatra's default middleware, with Endpoints in front of it (see Integrations).
    module SinatraMiddleware
      private

      def setup_default_middleware(builder)
        builder.use(Endpoints)
        super
      end
    end

    # Kernel#require, then a look for the frameworks (see Integrations).
    module RequireHook
      private

      def require(name)
        loaded = super
        Integrations.check if loaded && !Integrations.done?
        loaded
      end
    end
  end
end
