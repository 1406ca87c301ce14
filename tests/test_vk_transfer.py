"""Uploads through the staging ring (vk/transfer.py): pieces of any element size, split across many
slots, land byte for byte where they belong; planar weights' pieces make the kernels' layout."""

import numpy as np
from gguf import GGMLQuantizationType as T

from llamavk.kernels import PLANAR, device_pieces
from llamavk.vk import Buffer
from llamavk.vk import transfer


def test_pieces_across_slots(dev, monkeypatch):
    monkeypatch.setattr(transfer, "SLOT_BYTES", 1000)    # tiny slots: pieces split at every boundary
    rng = np.random.default_rng(0)
    for n_blocks in (5000, 333, 1):
        raw = rng.integers(0, 256, n_blocks * 18, dtype=np.uint8)
        pieces = device_pieces(T.Q4_0, raw) + [rng.integers(0, 256, 2777, dtype=np.uint8)]
        blocks = raw.reshape(n_blocks, 18)
        want = np.concatenate([blocks[:, 2:].reshape(-1), blocks[:, :2].reshape(-1), pieces[-1]])
        t = transfer.Transfer(dev)
        buf = Buffer(dev, want.size + 64)
        t.upload_pieces(buf, pieces, 64)       # returns with copies in flight
        t.flush()
        assert np.frombuffer(buf.read(want.size, 64), np.uint8).tobytes() == want.tobytes()
        t.close()


def test_planar_pieces_per_type():
    rng = np.random.default_rng(1)
    for name, (head, size) in PLANAR.items():
        raw = rng.integers(0, 256, 7 * size, dtype=np.uint8)
        quants, scales = (np.ascontiguousarray(p).view(np.uint8) for p in device_pieces(T[name], raw))
        assert quants.tobytes() == raw.reshape(7, size)[:, head:].tobytes()
        assert scales.tobytes() == raw.reshape(7, size)[:, :head].tobytes()
    assert device_pieces(T.Q4_K, raw)[0] is raw


def test_large_pieces_copied_by_several_threads(dev):
    """Pieces above PARALLEL_BYTES are cut among the copy threads; slots fill and wrap."""
    rng = np.random.default_rng(2)
    n_blocks = 700_000                                # 23.8 MB of Q8_0 blocks: slot boundaries inside pieces
    raw = rng.integers(0, 256, n_blocks * 34, dtype=np.uint8)
    pieces = device_pieces(T.Q8_0, raw) + [raw]
    blocks = raw.reshape(n_blocks, 34)
    want = np.concatenate([blocks[:, 2:].reshape(-1), blocks[:, :2].reshape(-1), raw])
    assert transfer.COPY_THREADS < 2 or pieces[0].nbytes > transfer.PARALLEL_BYTES
    buf = Buffer(dev, want.size)
    dev.transfer.upload_pieces(buf, pieces)
    dev.transfer.flush()
    assert np.frombuffer(buf.read(want.size), np.uint8).tobytes() == want.tobytes()


def test_uploads_from_two_threads_while_another_records(dev, monkeypatch):
    """A load's worker thread uploads while the main thread writes small buffers through the same
    transfer and records command buffers from the device's pool: every byte lands, nothing races."""
    import threading

    from llamavk.vk import CommandSequence

    monkeypatch.setattr(transfer, "SLOT_BYTES", 4096)   # many slot turns: the lock is taken often
    rng = np.random.default_rng(3)
    big = [rng.integers(0, 256, 50_000 + i, dtype=np.uint8) for i in range(6)]
    small = [rng.integers(0, 256, 300 + i, dtype=np.uint8) for i in range(40)]
    t = transfer.Transfer(dev)
    monkeypatch.setattr(dev, "_transfer", t)
    big_bufs = [Buffer(dev, a.size) for a in big]
    small_bufs = [Buffer(dev, a.size) for a in small]
    errors = []

    def worker():
        try:
            for b, a in zip(big_bufs, big):
                t.upload_pieces(b, [a])
            t.flush()
        except BaseException as exc:   # pragma: no cover - reported below
            errors.append(exc)

    th = threading.Thread(target=worker)
    th.start()
    for b, a in zip(small_bufs, small):
        b.write(a)                                       # device-local: through the same transfer
        seq = CommandSequence(dev, "record").begin()     # the device's pool, on this thread
        seq.fill(b, 0, 4, 0)
        seq.end()
    th.join()
    assert not errors
    for b, a in zip(big_bufs + small_bufs, big + small):
        assert np.frombuffer(b.read(a.size), np.uint8).tobytes() == a.tobytes()
    t.close()
