# frozen_string_literal: true

# One String an iteration (the literals are frozen; their sum is new): 10x more in #ten than
# in #one. allocations_spec.rb profiles it in the spec process, and in fresh Ruby processes for
# the GC.stress examples.
module AllocationShape
  module_function

  def ten(rounds)
    rounds.times { "a" + "b" } # rubocop:disable Style/StringConcatenation
  end

  def one(rounds)
    rounds.times { "a" + "b" } # rubocop:disable Style/StringConcatenation
  end

  def run(iterations, per_call)
    iterations.times do
      ten(per_call * 10)
      one(per_call)
    end
  end
end
