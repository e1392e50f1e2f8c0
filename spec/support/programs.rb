# frozen_string_literal: true

require "rbconfig"

# Programs on PATH that specs run: whether one is there, and whether a Ruby program (Debian's
# `puma`, `unicorn`) runs on the Ruby under test. Debian's server gems have C extensions built
# for its own Ruby 3.1 only, and their executables start that Ruby (`#!/usr/bin/ruby`), which
# cannot load a ddprof_recorder library built for another Ruby.
module Programs
  module_function

  # @return [String, nil] the program's path on PATH.
  def find(program)
    ENV.fetch("PATH", "").split(File::PATH_SEPARATOR).reject(&:empty?)
       .map { |dir| File.join(dir, program) }.find { |path| File.file?(path) && File.executable?(path) }
  end

  # @return [Boolean] whether the program is on PATH.
  def available?(program)
    !find(program).nil?
  end

  # Why a Ruby program on PATH cannot run with this Ruby's ddprof_recorder: its `#!` line
  # names another Ruby than the one running the specs (RbConfig.ruby).
  #
  # @return [String, nil] the reason, nil if it runs on this Ruby (or is not on PATH).
  def other_ruby(program)
    path = find(program)
    return nil unless path

    interpreter = File.open(path, &:gets).to_s[/\A#!\s*(\S+)/, 1]
    interpreter = find("ruby") if interpreter&.end_with?("/env") # `#!/usr/bin/env ruby`
    return nil if interpreter.nil? || File.realpath(interpreter) == File.realpath(RbConfig.ruby)

    "#{path} runs on #{File.realpath(interpreter)}, not on the Ruby under test (#{RbConfig.ruby}, #{RUBY_VERSION}): " \
      "Debian's #{program} and its C extensions are built for Debian's Ruby only"
  rescue SystemCallError
    nil
  end
end
