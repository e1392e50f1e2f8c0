# frozen_string_literal: true

# A serialization parked in its flip: a thread holds the active slot as a sampler inside
# record_sample does (StackRecorder::Testing._native_hold_active_slot, without the GVL) and
# another thread serializes, so that the flip releases the inactive slot (step 1) and waits
# for the held one (step 2).
module SlotHolding
  # Starts the holder and the serializer (which runs `serialize`, the recorder's by default),
  # waits until the serializer waits for the held slot, yields, then releases the slot. Returns
  # [what the holder returned (true: released through the pipe), what the serializer returned].
  # Every wait is bounded: the holder lets go by itself after `hold_seconds`.
  def with_parked_serializer(recorder, hold_seconds: 30, serialize: -> { recorder.serialize })
    testing = DdprofRecorder::StackRecorder::Testing
    locks = -> { [testing._native_slot_one_mutex_locked?(recorder), testing._native_slot_two_mutex_locked?(recorder)] }
    reader, writer = IO.pipe
    holder = Thread.new { testing._native_hold_active_slot(recorder, reader.fileno, hold_seconds) }
    wait_until("the holder holds the active slot") { locks.call == [true, true] }
    serializer = Thread.new(&serialize)
    wait_until("the flip released the inactive slot and waits for the held one") { locks.call.count(true) == 1 }
    # parking_lot spins for a few microseconds before it parks the thread.
    sleep 0.002
    begin
      yield
    ensure
      writer.write("x")
      writer.close
      held = holder.join(hold_seconds + 30)&.value
      serialized = serializer.join(60)&.value
      reader.close
    end
    [held, serialized]
  end
end

RSpec.configure { |config| config.include SlotHolding }
