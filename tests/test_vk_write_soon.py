"""Device.write_soon: a recording's small device-local writes (counters at rest) are queued without a
host wait (during a load the queue holds the weights' copies, which a wait would include); the next
step submitted waits for them, so it reads what was written."""

from __future__ import annotations

import numpy as np

from llamavk.kernels import filled_buffer
from llamavk.vk import Buffer, CommandSequence

from .vk_fixtures import open_device


def test_write_soon_does_not_wait_and_the_next_step_reads_it(monkeypatch):
    dev = open_device()
    try:
        waits = []
        real_wait = dev.timeline.wait_any_thread
        monkeypatch.setattr(dev.timeline, "wait_any_thread", lambda v, *a: (waits.append(v), real_wait(v, *a)))
        data = np.arange(1000, dtype=np.uint32) * 7 + 3
        src = filled_buffer(dev, data)
        assert waits == [] and dev.writes_pending > 0          # queued, not waited for
        out = Buffer(dev, data.nbytes, host_visible=True)
        seq = CommandSequence(dev, "read back").begin()
        seq.copy(src, out, data.nbytes)
        seq.end()
        pending = dev.writes_pending
        dev.timeline.wait(seq.submit())
        assert waits == [pending] and dev.writes_pending == 0   # the step waited for the write first
        assert np.array_equal(out.array(np.uint32, data.size), data)
        dev.timeline.wait(seq.submit())                         # later steps do not wait again
        assert waits == [pending]
    finally:
        dev.close()
