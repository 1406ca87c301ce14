"""Two virtual devices on one physical device exchange data through one imported host allocation.

Device A computes into the shared memory; a host thread relays A's timeline signal to B's timeline
(two devices cannot share a semaphore); B's submission waits on it, then reads the shared memory.
"""

import struct
import threading

import numpy as np
import pytest

from llamavk.vk import Buffer, CommandSequence, Kernel, SharedHostMemory, TimelineSemaphore

from .vk_fixtures import first_device_info, open_device


@pytest.fixture(scope="module")
def pair():
    info = first_device_info()
    if not info.external_memory_host:
        pytest.skip("device cannot import host memory")
    a, b = open_device("A"), open_device("B")
    yield a, b
    b.close()
    a.close()


def test_shared_host_memory_is_one_allocation(pair):
    a, b = pair
    shared = SharedHostMemory(1 << 16, [a, b])
    shared.array(np.uint32)[:] = 7
    # Written by a copy on device A...
    src = Buffer(a, 64, host_visible=True)
    src.array(np.uint32)[:] = np.arange(16)
    seq = CommandSequence(a).begin()
    seq.copy(src, shared.buffer(a), 64)
    seq.end().run()
    # ...seen by the host and by device B without any copy between them.
    assert np.array_equal(shared.array(np.uint32, 16), np.arange(16))
    dst = Buffer(b, 64, host_visible=True)
    seq_b = CommandSequence(b).begin()
    seq_b.copy(shared.buffer(b), dst, 64)
    seq_b.end().run()
    assert np.array_equal(dst.array(np.uint32), np.arange(16))
    shared.close()


def test_timeline_ordered_exchange_with_host_relay(pair):
    a, b = pair
    n = 5000
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    shared = SharedHostMemory(4 * n, [a, b])
    shared.array(np.float32)[:] = np.nan

    XA, YA = Buffer(a, x.nbytes), Buffer(a, y.nbytes)
    XA.write(x)
    YA.write(y)
    add_a = Kernel(a, "add_f32", "rrw", push_size=4)
    produce = CommandSequence(a).begin()
    produce.dispatch(add_a, [XA, YA, shared.buffer(a)], ((n + 255) // 256,), struct.pack("<I", n))
    produce.end()

    out = Buffer(b, 4 * n, host_visible=True)
    add_b = Kernel(b, "add_f32", "rrw", push_size=4)
    consume = CommandSequence(b).begin()
    consume.dispatch(add_b, [shared.buffer(b), shared.buffer(b), out], ((n + 255) // 256,), struct.pack("<I", n))
    consume.end()

    done_a, ready_b = TimelineSemaphore(a), TimelineSemaphore(b)
    for step in (1, 2, 3):
        # B is queued first and must wait for the relayed signal: ordering, not luck.
        consume.submit(waits=[(ready_b, step)])
        relay = threading.Thread(target=lambda s=step: (done_a.wait(s), ready_b.signal(s)))
        relay.start()
        produce.submit(signals=[(done_a, step)])
        relay.join()
        b.wait_idle()
        np.testing.assert_allclose(out.array(np.float32), 2 * (x + y), rtol=1e-6)
        out.array(np.float32)[:] = 0
    done_a.close()
    ready_b.close()
    shared.close()


@pytest.mark.parametrize("n_lines,hold", [(256, False), (2048, False), (2048, True)])
def test_exchange_point_through_shared_host_memory(pair, n_lines, hold):
    """The split modes' exchange point (kernels/collective.py, shaders/exchange_sync.comp): a device
    publishes its counter into every one of its lines in shared host memory, and waits by reading a
    peer's lines until one holds the step's value. Here the host plays the peer: late on a GPU (the
    wait must really wait and see a write from outside the device), published before the dispatch
    on llvmpipe (which ends any shader's loops after ~65k iterations in all, about a millisecond).
    Bounded: a peer that never comes ends in status 2 naming the exchange, never a hang. Both line
    counts the split modes use (layer mode's long waits get more lines). Holding (layer mode's finished
    devices): the other workgroups poll a device word until the waiter writes the exchange's value
    there, also when it gives up, so they never outlive the wait."""
    from llamavk.kernels import KernelCache, View, collective

    a, _ = pair
    n_dev, exchange = 2, 3
    shared = SharedHostMemory(collective.flag_bytes(8, n_dev, n_lines), [a])
    flags = shared.array(np.uint32)
    flags[:] = 0
    status = Buffer(a, 16, host_visible=True)
    step = Buffer(a, 256, host_visible=True)
    step.array(np.uint32)[:] = 0
    step.array(np.uint32)[3] = 10                       # counter base: values are base + exchange + 1
    words = collective.FLAG_LINE_BYTES // 4

    def lines(device):
        first = (exchange * n_dev + device) * n_lines
        return flags[first * words:(first + n_lines) * words:words]

    hold_word = Buffer(a, 256, host_visible=True) if hold else None

    def record():
        status.array(np.uint32)[:] = 0
        if hold:
            hold_word.array(np.uint32)[:] = 0
        seq = CommandSequence(a).begin()
        collective.exchange_sync(seq, KernelCache(a), View.whole(shared.buffer(a)), View.whole(status),
                                 View.whole(step), 0, exchange, True, 0b10, n_dev, 3, n_lines,
                                 hold=View.whole(hold_word) if hold else None)
        return seq.end()

    publish = lambda: lines(1).__setitem__(slice(None), 14)   # noqa: E731  the peer's counter: 10 + 3 + 1
    seq = record()
    if a.info.is_cpu:
        publish()
    value = seq.submit()
    if not a.info.is_cpu:
        threading.Timer(0.002, publish).start()
    a.timeline.wait(value)
    assert int(status.array(np.uint32)[0]) == 0                        # waited, no time-out
    assert (lines(0) == 14).all()                                      # published on every line
    if hold:
        assert int(hold_word.array(np.uint32)[0]) == 14                # the holders released

    flags[:] = 0                                                       # peer never comes
    record().run()
    assert list(status.array(np.uint32)[:2]) == [2, exchange]
    if hold:
        assert int(hold_word.array(np.uint32)[0]) == 14
        hold_word.close()
    shared.close()


def test_exchange_point_and_sum_in_one_dispatch(pair):
    """A matrix-vector step's all-reduce as one dispatch (shaders/exchange_reduce.comp): publish my
    counter, wait for the producers', then out = base + the partials of the devices in the mask, read
    from shared host memory. Against numpy; the peers played by the host as in the test above. A
    chained consumer's counter is counted once, also when the wait gives up (a consumer must never
    wait for ever); the sum is then not written."""
    from llamavk.kernels import KernelCache, View, collective
    from llamavk.kernels.chain import ChainCounters

    a, _ = pair
    kc = KernelCache(a)
    n_dev, me, exchange, n_tokens, n_cols = 3, 1, 2, 2, 700
    stride = 1536                                            # part p starts at element p * stride
    lines_n = collective.FLAG_LINES
    flags_mem = SharedHostMemory(collective.flag_bytes(4, n_dev, lines_n), [a])
    flags = flags_mem.array(np.uint32)
    parts_mem = SharedHostMemory(4 * n_dev * stride, [a])
    rng = np.random.default_rng(7)
    parts = rng.standard_normal((n_dev, stride), dtype=np.float32)
    parts_mem.array(np.float32)[:n_dev * stride] = parts.reshape(-1)
    base = Buffer(a, 4 * n_tokens * n_cols)
    base_np = rng.standard_normal(n_tokens * n_cols, dtype=np.float32)
    base.write(base_np)
    out = Buffer(a, 4 * n_tokens * n_cols, host_visible=True)
    status = Buffer(a, 16, host_visible=True)
    step = Buffer(a, 256, host_visible=True)
    step.array(np.uint32)[:] = 0
    step.array(np.uint32)[3] = 40
    value = 40 + exchange + 1
    words = collective.FLAG_LINE_BYTES // 4

    def lines(device):
        first = (exchange * n_dev + device) * lines_n
        return flags[first * words:(first + lines_n) * words:words]

    def record(mask, chain):
        status.array(np.uint32)[:] = 0
        out.array(np.float32)[:] = np.nan
        seq = CommandSequence(a).begin()
        chain.begin(seq)
        signal = chain.signal()
        n = collective.exchange_reduce(seq, kc, View.whole(flags_mem.buffer(a)), View.whole(status), View.whole(step),
                                       me, exchange, True, mask & ~(1 << me), n_dev, 3, View.whole(parts_mem.buffer(a)),
                                       mask, stride, View.whole(out), n_tokens, n_cols, base=View.whole(base),
                                       chain=signal)
        assert n == 1
        return seq.end(), signal

    chain = ChainCounters(kc, 2)
    flags[:] = 0
    mask = 0b111
    seq, signal = record(mask, chain)
    publish = lambda: [lines(d).__setitem__(slice(None), value) for d in (0, 2)]   # noqa: E731
    if a.info.is_cpu:
        publish()
    done = seq.submit()
    if not a.info.is_cpu:
        threading.Timer(0.002, publish).start()
    a.timeline.wait(done)
    assert int(status.array(np.uint32)[0]) == 0
    assert (lines(me) == value).all()
    want = base_np + sum(parts[d, :n_tokens * n_cols] for d in range(n_dev))
    np.testing.assert_allclose(out.array(np.float32), want, rtol=1e-6, atol=1e-6)

    # device 2 holds no part of this product: it is neither waited for nor summed
    flags[:] = 0
    seq, signal = record(0b011, ChainCounters(kc, 2))
    lines(0)[:] = value
    seq.run()
    np.testing.assert_allclose(out.array(np.float32), base_np + parts[0, :n_tokens * n_cols]
                               + parts[1, :n_tokens * n_cols], rtol=1e-6, atol=1e-6)

    # chained to the product that wrote my partial (-sm graph): the shader waits for its count first
    # (here already reached: a fill stands for the product's workgroups), then publishes and sums
    flags[:] = 0
    chain = ChainCounters(kc, 2)
    status.array(np.uint32)[:] = 0
    out.array(np.float32)[:] = np.nan
    seq = CommandSequence(a).begin()
    chain.begin(seq)
    producer = chain.signal()
    buf, off, _ = producer.counters
    seq.barrier()
    seq.fill(buf, 5, 4, off + 4 * producer.slot)
    seq.barrier()
    collective.exchange_reduce(seq, kc, View.whole(flags_mem.buffer(a)), View.whole(status), View.whole(step),
                               me, exchange, True, 0b101, n_dev, 3, View.whole(parts_mem.buffer(a)), mask, stride,
                               View.whole(out), n_tokens, n_cols, base=View.whole(base), chain=chain.signal(),
                               wait=ChainCounters.wait(producer, 5))
    seq = seq.end()
    lines(0)[:] = value
    lines(2)[:] = value
    seq.run()
    assert int(status.array(np.uint32)[0]) == 0
    np.testing.assert_allclose(out.array(np.float32), want, rtol=1e-6, atol=1e-6)

    # a peer that never comes: status names the exchange, the sum is not written, the chain is counted
    flags[:] = 0
    chain = ChainCounters(kc, 2)
    seq, signal = record(mask, chain)
    seq.run()
    assert list(status.array(np.uint32)[:2]) == [2, exchange]
    assert np.isnan(out.array(np.float32)).all()
    counters = Buffer(a, signal.counters[2], host_visible=True)
    copy = CommandSequence(a).begin()
    copy.copy(signal.counters[0], counters, signal.counters[2], signal.counters[1])
    copy.end().run()
    assert int(counters.array(np.uint32)[signal.slot]) == 1
    flags_mem.close()
    parts_mem.close()


def test_exchange_wait_gaps(monkeypatch):
    """Layer mode's long waits poll with the small back-off cap, the short ones with the large;
    LLAMAVK_EXCHANGE_GAP / _LINES_LONG override them, and a malformed value is a one-line error."""
    from llamavk.errors import LlamavkError
    from llamavk.kernels import collective
    monkeypatch.delenv("LLAMAVK_EXCHANGE_GAP", raising=False)
    monkeypatch.delenv("LLAMAVK_EXCHANGE_LINES_LONG", raising=False)
    assert collective.max_gap(collective.FLAG_LINES) == collective.MAX_GAP
    assert collective.max_gap(collective.long_lines()) == collective.MAX_GAP_LONG < collective.MAX_GAP
    monkeypatch.setenv("LLAMAVK_EXCHANGE_LINES_LONG", "4096")
    assert collective.long_lines() == 4096 and collective.max_gap(4096) == collective.MAX_GAP_LONG
    monkeypatch.setenv("LLAMAVK_EXCHANGE_GAP", "0")
    assert collective.max_gap(collective.FLAG_LINES) == 0
    monkeypatch.setenv("LLAMAVK_EXCHANGE_GAP", "fast")
    with pytest.raises(LlamavkError, match="LLAMAVK_EXCHANGE_GAP"):
        collective.max_gap(collective.FLAG_LINES)
