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
