# frozen_string_literal: true

require_relative "endpoints"

module DdprofRecorder
  # Puts Endpoints first in a Rails app's middleware stack, so that a request's samples carry
  # its `Controller#action` (loaded by Integrations once Rails is).
  class Railtie < ::Rails::Railtie
    initializer "ddprof_recorder.endpoints" do |app|
      app.middleware.insert(0, DdprofRecorder::Endpoints)
    end
  end
end
