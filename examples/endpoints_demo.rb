# frozen_string_literal: true

# A web server's profile by endpoint, made with DdprofRecorder::StackRecorder: a "puma" thread
# serves requests of three endpoints for two seconds, each request a span of its own. Each
# request is one sample, recorded by the server thread as the request ends: the stack where
# its action did its work, its own CPU time (the thread's CPU clock) and wall time, and its
# span's id as the "local root span id" label; then it links the span to its endpoint
# (record_endpoint), as a tracer does, and the recorder labels the samples "trace endpoint".
# (A sampler in another Ruby thread would see the server mostly when it blocks: it waits for
# the GVL while the server computes. The profiler samples from a signal handler instead.)
#
#   ruby -Ilib examples/endpoints_demo.rb [OUT=endpoints.pb.gz]
#   exe/ddprof-recorder top --by "trace endpoint" endpoints.pb.gz
#   exe/ddprof-recorder top --label "trace endpoint=PagesController#heavy" endpoints.pb.gz
#   exe/ddprof-recorder flamegraph --group-by "trace endpoint" endpoints.pb.gz
require "ddprof_recorder"

out = ARGV.fetch(0, "endpoints.pb.gz")
RECORDER = DdprofRecorder::StackRecorder.new(compression: :gzip)

# The app: heavy crunches numbers, index renders a little, search waits on its "database".
class PagesController
  # The stack the action ran on, its method at the leaf: the request's sample's.
  attr_reader :stack

  def heavy = work { 40_000.times.sum { |i| Math.sqrt(i) * Math.sin(i) } }
  def index = work { 2_000.times.map(&:to_s).join(",").size }
  def search = work { sleep(0.003) }

  private

  def work
    @stack = caller_locations(1)
    yield
  end
end

def serve(id, action)
  cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond)
  wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  controller = PagesController.new
  controller.public_send(action)
  cpu = Process.clock_gettime(Process::CLOCK_THREAD_CPUTIME_ID, :nanosecond) - cpu
  wall = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond) - wall
  RECORDER.record_sample(controller.stack, [cpu, 1, wall], { "local root span id" => id, "thread name" => "puma 001" })
  RECORDER.record_endpoint(id, "PagesController##{action}")
end

ACTIONS = %i[heavy index index index search search].freeze
requests = 0
Thread.new do
  Thread.current.name = "puma 001"
  deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 2.0
  while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
    requests += 1
    serve(requests, ACTIONS[requests % ACTIONS.size])
  end
end.join

File.binwrite(out, RECORDER.serialize!)
puts "served #{requests} requests; wrote #{out}"
