# frozen_string_literal: true

# Loaded by every spec (see .rspec). Loads the gem from lib/, compiles spec/support/profile.proto
# with protoc into a temporary directory so that profiles are decoded by google-protobuf (never
# by the gem's own structs), and provides the GC_STRESS=1 mode.
require "fileutils"
require "tmpdir"

require_relative "../lib/ddprof_recorder"

# The specs run on the checkout's build, `rake compile`, which turns on the cargo features they
# need (DdprofRecorderBuild::TEST_FEATURES). A library built without them (the gem's build, or
# the build at the first require) lacks the deliberate panics of panic_spec.rb: say so once,
# rather than fail or skip those examples one by one.
unless DdprofRecorder::StackRecorder::Testing.respond_to?(:_native_panic)
  raise LoadError, "spec/spec_helper.rb: the native extension was built without the test-panics feature " \
                   "(the gem's build): build with `rake compile`"
end

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

  # GC_STRESS=1 support. In the examples tagged `gc_stress: true`, GC.stress is switched on
  # *inside* every method of the native extension (each `_native_*` method of DdprofRecorder and
  # the classes and modules under it) and inside the StackRecorder's public methods, rather than
  # around the whole example: the code under test is the same, and RSpec's matchers and the
  # protobuf decoder, which are not under test, would otherwise make each example take minutes
  # (a full GC of the spec process' heap at every allocation).
  module GcStress
    # The Ruby wrappers around the native methods.
    STACK_RECORDER_METHODS = %i[record_sample record_endpoint serialize serialize! clear reset_after_fork stats].freeze

    @active = false
    @depth = 0

    class << self
      # Runs the block (an example) with the stressing wrappers turned on.
      def during
        @active = true
        yield
      ensure
        @active = false
      end

      # Runs the block under GC.stress if an example asked for it. Calls nest (serialize calls
      # _native_serialize) and may come from several threads: GC.stress is global, so it is on
      # while at least one call is inside. No Mutex: the profiler's sampling jobs call native
      # methods with Ruby's trap interrupt masked, where Mutex#lock raises ThreadError ("can't
      # be called from trap context"); with the GVL, each count's update is one step (no
      # interrupt check between reading and writing it).
      def stressed
        return yield unless @active

        GC.stress = true if (@depth += 1) == 1
        begin
          yield
        ensure
          GC.stress = false if (@depth -= 1).zero?
        end
      end

      def install
        each_module(DdprofRecorder) do |mod|
          [mod, mod.singleton_class].each do |owner|
            names = (owner.instance_methods(false) + owner.private_instance_methods(false))
                    .select { |name| name.start_with?("_native_") }
            names |= STACK_RECORDER_METHODS + %i[new] if mod == DdprofRecorder::StackRecorder
            owner.prepend(wrapper(names, owner.private_instance_methods(false))) unless names.empty?
          end
        end
      end

      private

      def each_module(mod, seen = {}, &block)
        return if seen[mod]

        seen[mod] = true
        yield mod
        mod.constants(false).each do |name|
          value = mod.const_get(name, false)
          each_module(value, seen, &block) if value.is_a?(Module) && value.name&.start_with?("DdprofRecorder")
        end
      end

      def wrapper(names, private_names)
        Module.new do
          names.each do |name|
            define_method(name) do |*args, **kwargs, &block|
              SpecSupport::GcStress.stressed { super(*args, **kwargs, &block) }
            end
            private name if private_names.include?(name)
          end
        end
      end
    end
  end
end

SpecSupport.load_profile_proto
Dir[File.join(SpecSupport::SUPPORT_DIR, "**/*.rb")].sort.each { |file| require file }

RSpec.configure do |config|
  config.include PprofHelpers
  config.include WaitHelpers

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

  # `GC_STRESS=1 rspec --tag gc_stress` (rake spec:gc_stress): in the tagged examples, every
  # call into the recorder runs under GC.stress (a full GC at each allocation), so that a Ruby
  # object the native code forgot to keep alive, or one it kept without marking, is collected at
  # the worst moment and the example crashes or fails instead of passing by luck.
  if ENV["GC_STRESS"] == "1"
    SpecSupport::GcStress.install
    config.around(:example, gc_stress: true) do |example|
      SpecSupport::GcStress.during { example.run }
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
