# frozen_string_literal: true

require_relative "ddprof_recorder/version"
require_relative "ddprof_recorder/error"
require_relative "ddprof_recorder/logger"

begin
  require_relative "ddprof_recorder/ddprof_recorder"
rescue LoadError => e
  raise LoadError, "ddprof_recorder's native extension is not built (run `rake compile`): #{e.message}"
end

require_relative "ddprof_recorder/stack_recorder"
require_relative "ddprof_recorder/pprof_views"
require_relative "ddprof_recorder/profiler"
require_relative "ddprof_recorder/fork_hook"

DdprofRecorder::ForkHook.install
