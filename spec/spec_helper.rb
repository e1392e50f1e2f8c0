# frozen_string_literal: true

# Loaded by every spec (see .rspec). Loads the gem from lib/, compiles spec/support/profile.proto
# with protoc into a temporary directory so that profiles are decoded by google-protobuf (never
# by the gem's own structs), and provides the GC_STRESS=1 mode.
require "fileutils"
require "tmpdir"

require_relative "../lib/ddprof_recorder"

module SpecSupport
  SUPPORT_DIR = File.expand_path("support", __dir__)

  # Runs protoc on spec/support/profile.proto and requires the generated Ruby classes
  # (Perftools::Profiles::*). The output goes to a temporary directory removed at exit.
  def self.load_profile_proto
    protoc = ENV.fetch("PROTOC", "protoc")
    version = begin
      IO.popen([protoc, "--version"], err: File::NULL, &:read)
    rescue SystemCallError
      nil
    end
    unless version && $?.success?
      raise LoadError, "spec/spec_helper.rb: `#{protoc}` (the protobuf compiler) was not found on PATH. " \
                       "The specs decode pprof with google-protobuf from spec/support/profile.proto and " \
                       "need protoc to generate its Ruby classes: `apt-get install protobuf-compiler " \
                       "ruby-google-protobuf` (or set PROTOC=/path/to/protoc)."
    end

    require "google/protobuf"
    out_dir = Dir.mktmpdir("ddprof_recorder_spec_proto")
    parent_pid = Process.pid
    # Forked children leave with exit!, but a child that exits normally must not delete it.
    at_exit { FileUtils.remove_entry(out_dir, true) if Process.pid == parent_pid }
    ok = system(protoc, "--proto_path=#{SUPPORT_DIR}", "--ruby_out=#{out_dir}", "profile.proto")
    raise LoadError, "spec/spec_helper.rb: `#{protoc} --ruby_out` failed on spec/support/profile.proto" unless ok

    require File.join(out_dir, "profile_pb")
  end
end

SpecSupport.load_profile_proto
Dir[File.join(SpecSupport::SUPPORT_DIR, "**/*.rb")].sort.each { |file| require file }

RSpec.configure do |config|
  config.include PprofHelpers

  config.expect_with :rspec do |expectations|
    expectations.include_chain_clauses_in_custom_matcher_descriptions = true
  end
  config.mock_with :rspec do |mocks|
    mocks.verify_partial_doubles = true
  end
  config.shared_context_metadata_behavior = :apply_to_host_groups
  config.disable_monkey_patching!
  config.warnings = false
  config.order = :random
  Kernel.srand config.seed

  # `GC_STRESS=1 rspec --tag gc_stress` (rake spec:gc_stress): the tagged examples run with
  # GC.stress, so that a Ruby object the native code forgot to keep alive (or moved under it)
  # is collected at the worst moment and the example crashes or fails instead of passing by luck.
  if ENV["GC_STRESS"] == "1"
    config.around(:example, gc_stress: true) do |example|
      GC.stress = true
      begin
        example.run
      ensure
        GC.stress = false
      end
    end
  end

  # Examples swap DdprofRecorder.logger; the next example gets the one from before.
  config.around(:example) do |example|
    logger = DdprofRecorder.instance_variable_get(:@logger)
    begin
      example.run
    ensure
      DdprofRecorder.instance_variable_set(:@logger, logger)
    end
  end
end
