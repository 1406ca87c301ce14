"""Buffers sub-allocated from a few large allocations (vk/buffer.py MemoryBlocks): placement at
aligned offsets, no two buffers sharing a byte, blocks split at the block size, memory freed with
the last buffer, and a model whose weights and KV cache span several blocks computing what the
numpy reference computes."""

from __future__ import annotations

import numpy as np
import pytest

import llamavk
from llamavk.errors import LlamavkError
from llamavk.models import load_model_file
from llamavk.reference import ReferenceModel
from llamavk.vk import Buffer, MemoryBlocks
from llamavk.vk import buffer as vk_buffer

from .vk_fixtures import open_device


def _extents(blocks: MemoryBlocks, bufs):
    """(block index, start, end) of every buffer's bytes."""
    index = {id(b): i for i, b in enumerate(blocks.blocks)}
    return [(index[id(b._block)], b.offset_in_block, b.offset_in_block + b.size) for b in bufs]


def test_buffers_packed_at_aligned_offsets_split_into_blocks():
    dev = open_device()
    try:
        block = 1 << 20
        sizes = [1000, 300_000, 4, 700_001, 123_457, 3 << 20, 65_536, 999_999, 17]
        blocks = MemoryBlocks(dev, block_bytes=block)
        bufs = [blocks.buffer(s) for s in sizes]
        assert all(b.memory is None for b in bufs)           # nothing allocated before bind()
        blocks.bind()
        extents = _extents(blocks, bufs)
        # Hand placement, in order, each offset rounded up to the buffer's own alignment; a buffer that
        # would cross the block size opens a new block; the 3 MiB one (larger than a block) is alone.
        import vulkan as vk
        aligns = [vk.vkGetBufferMemoryRequirements(dev.handle, b.handle).alignment for b in bufs]
        want, blk, top = [], 0, 0
        for s, a, b in zip(sizes, aligns, bufs):
            s = max(s, 4)
            req = vk.vkGetBufferMemoryRequirements(dev.handle, b.handle).size
            off = (top + a - 1) // a * a
            if top and off + req > block:
                blk, off = blk + 1, 0
            want.append((blk, off, off + s))
            top = off + req
        assert extents == want
        assert len(blocks.blocks) == blk + 1 >= 4
        for (i, start, end), a in zip(extents, aligns):
            assert start % a == 0
            assert end <= blocks.blocks[i].size
        assert all(bl.size <= block for bl in blocks.blocks if bl.users > 1)
        assert [bl.users for bl in blocks.blocks] == [sum(w[0] == i for w in want) for i in range(blk + 1)]
        assert [bl.users for bl in blocks.blocks if bl.size > block] == [1]    # the 3 MiB buffer, alone
        # No two buffers share a byte: write a distinct pattern into each, read every one back.
        for i, b in enumerate(bufs):
            b.write(np.full(b.size, i + 1, np.uint8).tobytes())
        dev.wait_idle()
        for i, b in enumerate(bufs):
            assert set(b.read()) == {i + 1}
    finally:
        dev.close()


def test_block_memory_freed_with_its_last_buffer(monkeypatch):
    dev = open_device()
    freed = []
    real_free = vk_buffer.vk.vkFreeMemory
    monkeypatch.setattr(vk_buffer.vk, "vkFreeMemory", lambda d, m, a: (freed.append(m), real_free(d, m, a)))
    try:
        blocks = MemoryBlocks(dev, block_bytes=4096)
        a, b, c = (blocks.buffer(1024) for _ in range(3))
        lone = Buffer(dev, 100)                              # its own allocation, as before
        blocks.bind()
        assert len(blocks.blocks) == 1 and a.memory == b.memory == c.memory
        block = blocks.blocks[0]
        a.close()
        b.close()
        assert freed == [] and block.memory is not None      # c still lives in it
        c.close()
        assert freed == [a.memory] and block.memory is None
        c.close()                                            # closing twice is harmless
        lone.close()
        assert len(freed) == 2
    finally:
        dev.close()                                          # everything left: freed exactly once
    assert len(freed) == len(set(freed))


def test_failed_block_allocation_is_one_error_and_the_device_still_closes(monkeypatch):
    dev = open_device()
    blocks = MemoryBlocks(dev, block_bytes=4096)
    bufs = [blocks.buffer(3000) for _ in range(3)]
    calls = []
    real = vk_buffer._allocate

    def second_fails(device, size, mtype, pnext=vk_buffer.ffi.NULL):
        calls.append(size)
        if len(calls) == 2:
            raise LlamavkError(f"{device.name}: out of memory allocating {size / 2**20:.1f} MiB")
        return real(device, size, mtype, pnext)

    monkeypatch.setattr(vk_buffer, "_allocate", second_fails)
    with pytest.raises(LlamavkError, match="out of memory"):
        blocks.bind()
    assert bufs[0].memory is not None and bufs[1].memory is None and bufs[2].memory is None
    dev.close()                                              # bound and unbound buffers released
    assert all(b.handle is None for b in bufs)


def test_model_spanning_many_blocks_matches_reference(synthetic_model, monkeypatch):
    """Weights and KV cache in 64 KiB blocks (a tiny model then needs dozens): same logits as the
    numpy reference, through a prompt and decode steps that read the cache back."""
    monkeypatch.setattr(vk_buffer, "BLOCK_BYTES", 1 << 16)
    path = synthetic_model("llama", "q4_0", n_layer=3)
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 500, 12)]
    ref = ReferenceModel(load_model_file(path))
    with llamavk.load(path, n_ctx=512, warn=lambda m: None) as m:
        rt = m.runtime
        n_weight_buffers = sum(len(w.chunks) if hasattr(w, "chunks") else 1 for w in rt.weights.values())
        assert 1 < len(rt._weight_blocks.blocks) < n_weight_buffers
        kv_blocks = {id(b._block) for pair in rt.kv.values() for b in pair}
        assert len(kv_blocks) > 1 and None not in {b._block for pair in rt.kv.values() for b in pair}
        got = m.logits(tokens, all=True)
        out = list(m.generate(tokens, n=4, temp=0))
    want = ref.logits(tokens)
    assert np.abs(got - want).max() <= 0.003 * np.abs(want).max()
    seq = list(tokens)
    for t in out:
        assert t == int(np.argmax(ref.logits(seq)[-1]))
        seq.append(t)
