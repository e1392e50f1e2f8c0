# frozen_string_literal: true

# Loaded into a program by `ddprof-recorder record` (RUBYOPT=-r.../autostart): profiles it
# until it exits if the environment asks for it (see DdprofRecorder::Recording).
require_relative "recording"

DdprofRecorder::Recording.start
