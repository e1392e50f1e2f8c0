# frozen_string_literal: true

require_relative "endpoints"

module DdprofRecorder
  # Puts Endpoints into Rails and Sinatra apps with nothing configured: under
  # `ddprof-recorder record`, after `Profiler.start`, or with the gem in a Gemfile.
  #
  # - Rails: a Railtie whose initializer puts Endpoints first in the app's middleware stack.
  #   It must exist before `Rails.application.initialize!`, which collects the Railties.
  # - Sinatra: `Sinatra::Base.use(Endpoints)`, which every Sinatra app inherits.
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
        ::Sinatra::Base.use(Endpoints)
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
