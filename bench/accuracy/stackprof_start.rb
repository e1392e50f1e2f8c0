# frozen_string_literal: true

# Loaded with `ruby -r` into an accuracy workload by bench/accuracy.rb: profiles the whole
# program with stackprof in CPU mode, as `ddprof-recorder record` does with our profiler
# (from the first require to exit), and writes StackProf.results with Marshal at exit.
#
#   ACCURACY_STACKPROF_OUT=FILE [ACCURACY_STACKPROF_INTERVAL=1000] ruby -r ./stackprof_start.rb PROGRAM
begin
  require "stackprof"
rescue LoadError
  warn "bench/accuracy: stackprof is missing: apt-get install ruby-stackprof"
  exit 3
end

out = ENV.fetch("ACCURACY_STACKPROF_OUT")
StackProf.start(mode: :cpu, interval: Integer(ENV.fetch("ACCURACY_STACKPROF_INTERVAL", "1000")), raw: false)
# Registered first, so it runs last: after the program's own at_exit blocks.
at_exit do
  StackProf.stop
  File.binwrite(out, Marshal.dump(StackProf.results))
end
