# frozen_string_literal: true

require_relative "ddprof_recorder/version"
require_relative "ddprof_recorder/error"
require_relative "ddprof_recorder/logger"

# The native extension, ddprof_recorder.<DLEXT>: next to this file in a checkout after
# `rake compile` (and where RubyGems 3 copies it at install), else in the gem's extension
# directory, which RubyGems puts on the load path. Missing from a source tree (a checkout, or
# Bundler's `path:`, which builds no extension), it is built on this first require
# (lib/ddprof_recorder/source_build.rb).
begin
  require_relative "ddprof_recorder/ddprof_recorder"
rescue LoadError
  begin
    require "ddprof_recorder/ddprof_recorder"
  rescue LoadError => e
    require_relative "ddprof_recorder/source_build"
    DdprofRecorder::SourceBuild.build_or_raise(e)
    require_relative "ddprof_recorder/ddprof_recorder"
  end
end

require_relative "ddprof_recorder/stack_recorder"
require_relative "ddprof_recorder/pprof_views"
require_relative "ddprof_recorder/labels"
require_relative "ddprof_recorder/profiler"
require_relative "ddprof_recorder/fork_hook"
require_relative "ddprof_recorder/signal_guard"
require_relative "ddprof_recorder/endpoints"
require_relative "ddprof_recorder/integrations"

DdprofRecorder::ForkHook.install
DdprofRecorder::SignalGuard.install
DdprofRecorder::Integrations.install

# The frame reader's self-check (Ruby 3.1, 3.3, 3.4; Profiler::FrameNames.check), now rather than at the
# first Profiler#start: it parks a thread of its own for a moment, and at a start amid busy
# threads each switch to it and back waits for their 100 ms time slices (0.6 s with two).
DdprofRecorder::Profiler::FrameNames.check
