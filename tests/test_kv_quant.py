"""Quantized KV cache (q8_0, q4_0, q4_1, q5_0, q5_1: llamavk/kv_cache.py): what the store kernels write against
gguf.quants' quantization, and attention over a quantized cache against numpy attention over the
dequantized cache. The model-level checks (logits, split modes, perplexity) are in
tests/test_kv_quant_model.py."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

from llamavk import kv_cache
from llamavk.kernels import KernelCache, View
from llamavk.kernels.attention import attention, coop_over_f16_copies, kv_store, plan
from llamavk.kernels.selection import has_coopmat
from llamavk.kernels.rope import RopeParams, rope_kv
from llamavk.kv_cache import KVTypes

from .test_kernels_ops import host, poisoned, ref_attention, run, set_step, step_buffer, upload

QTYPES = {"q8_0": T.Q8_0, "q4_0": T.Q4_0, "q4_1": T.Q4_1, "q5_0": T.Q5_0, "q5_1": T.Q5_1}


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def quant_bytes(x: np.ndarray, name: str) -> np.ndarray:
    """x (rows, width) as the cache's bytes: gguf.quants blocks, rows back to back."""
    if name == "f16":
        return np.ascontiguousarray(x, dtype=np.float16).view(np.uint8).reshape(-1)
    return quantize(np.ascontiguousarray(x, dtype=np.float32), QTYPES[name]).reshape(-1)


def dequant_rows(raw: np.ndarray, name: str, rows: int, width: int) -> np.ndarray:
    """The first `rows` rows of a cache's bytes as float32 (rows, width)."""
    nbytes = rows * kv_cache.row_bytes(name, width)
    data = np.ascontiguousarray(raw[:nbytes])
    if name == "f16":
        return data.view(np.float16).astype(np.float32).reshape(rows, width)
    return dequantize(data.reshape(rows, -1), QTYPES[name]).reshape(rows, width)


def cache_buffer(dev, name: str, n_ctx: int, width: int, fill: int = 0xA5):
    """A host-visible cache of n_ctx rows, every byte `fill` (a row never written stays so)."""
    return host(dev, np.full(kv_cache.cache_bytes(name, n_ctx, width), fill, dtype=np.uint8))


def special_rows(width: int, rng) -> np.ndarray:
    """Blocks that test the rounding rules: all zero; halves exactly between two q8_0 steps (127 x
    k/2 with amax 127: d = 1); a q4_0 block whose largest magnitudes are equal with opposite signs
    (the first one sets the sign of d); tiny and large values."""
    rows = rng.standard_normal((4, width)).astype(np.float32)
    rows[0, :32] = 0.0
    rows[1, :32] = np.arange(32, dtype=np.float32) / 2 - 8
    rows[1, 0] = 127.0
    rows[2, 32:64] = rng.uniform(-1, 1, 32)
    rows[2, 35], rows[2, 40] = -3.0, 3.0
    rows[3, :32] *= 1e-6
    rows[3, 32:64] *= 1e4
    return rows


@pytest.mark.parametrize("name", list(QTYPES))
@pytest.mark.parametrize("n_tokens,n_past", [(1, 0), (4, 5), (17, 40)])
def test_kv_store_quantized_is_gguf_quantize(dev, kc, name, n_tokens, n_past):
    """kv_store into a quantized cache writes exactly gguf.quants' blocks (bit for bit), at rows
    n_past.., and nothing else."""
    n_ctx, width = 64, 3 * 64
    rng = np.random.default_rng(n_tokens + n_past)
    src = (rng.standard_normal((n_tokens, width)) * rng.uniform(0.1, 10, (n_tokens, 1))).astype(np.float32)
    src[:min(4, n_tokens)] = special_rows(width, rng)[:min(4, n_tokens)]
    cv, cache = cache_buffer(dev, name, n_ctx, width)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    run(dev, lambda s: kv_store(s, kc, upload(dev, src), cv, step, n_tokens, width, name))
    rb = kv_cache.row_bytes(name, width)
    expect = np.full_like(cache, 0xA5)
    expect[n_past * rb:(n_past + n_tokens) * rb] = quant_bytes(src, name)
    np.testing.assert_array_equal(cache, expect)


def quant_bound(ref: np.ndarray, name: str) -> np.ndarray:
    """Per value: how far a quantization of `ref` (f16 rounded already) may be from it: half a step
    of its block for q8_0 (amax/127); a whole step for q4_0 / q5_0 (amax/8, amax/16: their levels
    -8..7 / -16..15 leave the value opposite the block's largest one a step short); half a step of
    (max - min) / 15 or 31 for q4_1 / q5_1, plus f16 rounding of their offset and steps; 1.01 of it
    for the f16 scale, plus f16 rounding."""
    blocks = ref.reshape(-1, 32)
    amax = np.abs(blocks).max(axis=1, keepdims=True)
    extra = 0.0
    if name in ("q4_1", "q5_1"):
        lo, hi = blocks.min(axis=1, keepdims=True), blocks.max(axis=1, keepdims=True)
        step = (hi - lo) / (15.0 if name == "q4_1" else 31.0) * 0.5
        extra = np.broadcast_to((np.abs(lo) + (hi - lo)) * 2.0 ** -10, blocks.shape).reshape(ref.shape)
    else:
        step = {"f16": 0.0 * amax, "q8_0": amax / 127.0 * 0.5, "q4_0": amax / 8.0, "q5_0": amax / 16.0}[name]
    return (np.broadcast_to(step, blocks.shape).reshape(ref.shape) * 1.01 + extra
            + np.abs(ref) * 2.0 ** -10 + 1e-7)


ROPE_VARIANTS = [(False, 64, False, False), (True, 64, False, False), (True, 48, True, False),
                 (False, 32, False, False), (False, 64, False, True), (True, 64, True, True)]


@pytest.mark.parametrize("types,neox,rope_dim,freqs,norm",
                         [(t,) + v for t in (("q8_0", "q8_0"), ("q4_0", "q4_0")) for v in ROPE_VARIANTS]
                         + [(t,) + v for t in (("q8_0", "f16"), ("f16", "q4_0"), ("q4_1", "q5_1"), ("q5_0", "q4_1"))
                            for v in ROPE_VARIANTS[::4]])
def test_rope_kv_quantized(dev, kc, types, neox, rope_dim, freqs, norm):
    """rope_kv with quantized caches (K and V types chosen separately; the qwen3 norm variant too)
    rotates q as the f16 path does and writes caches whose dequantized rows lie within half a
    quantization step of the f16 path's rows, v's blocks exactly gguf.quants'; the rows around stay
    untouched."""
    n_heads, n_kv, hd, n_ctx, n_tokens, n_past, seq_len = 6, 2, 64, 32, 5, 9, 0
    if norm and rope_dim != hd:
        pytest.skip("the norm variant rotates whole heads")
    rng = np.random.default_rng(rope_dim + 2 * neox + 3 * norm)
    q = rng.standard_normal((n_tokens, n_heads * hd)).astype(np.float32)
    k = (rng.standard_normal((n_tokens, n_kv * hd)) * 2).astype(np.float32)
    v = rng.standard_normal((n_tokens, n_kv * hd)).astype(np.float32)
    v[1:4] = special_rows(n_kv * hd, rng)[:3]   # not the tiny block: its f16 scale is 0, no half step
    fr = upload(dev, rng.uniform(1, 4, rope_dim // 2).astype(np.float32)) if freqs else None
    params = RopeParams(dim=rope_dim, base=10000.0, neox=neox, freqs=fr)
    norms = {}
    if norm:
        norms = dict(q_norm=upload(dev, rng.uniform(0.5, 1.5, hd).astype(np.float32)),
                     k_norm=upload(dev, rng.uniform(0.5, 1.5, hd).astype(np.float32)), eps=1e-6)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens, seq_len)
    width = n_kv * hd
    results = {}
    for kv in (KVTypes(), KVTypes(*types)):
        qv, qmem = host(dev, q)
        kcv, kcm = cache_buffer(dev, kv.k, n_ctx, width)
        vcv, vcm = cache_buffer(dev, kv.v, n_ctx, width)
        run(dev, lambda s: rope_kv(s, kc, qv, upload(dev, k), upload(dev, v), kcv, vcv, step, n_tokens, n_heads,
                                   n_kv, hd, params, n_ctx, kv_types=kv, **norms))
        results[kv.quantized] = (qmem.copy(), kcm.copy(), vcm.copy())
    (q16, k16, v16), (qq, kq, vq) = results[False], results[True]
    np.testing.assert_array_equal(qq, q16)
    for name, raw16, rawq in ((types[0], k16, kq), (types[1], v16, vq)):
        rb = kv_cache.row_bytes(name, width)
        ref = dequant_rows(raw16[n_past * 2 * width:], "f16", n_tokens, width)
        got = dequant_rows(rawq[n_past * rb:], name, n_tokens, width)
        err = np.abs(got - ref)
        assert (err <= quant_bound(ref, name)).all(), f"{name}: max error {err.max()}"
        if name != "f16":   # a real quantization: coarser than f16, and no finer than its step
            assert err.max() > 0
        untouched = np.concatenate([rawq[:n_past * rb], rawq[(n_past + n_tokens) * rb:]])
        assert (untouched == 0xA5).all()
    # v is stored as it comes: its blocks are gguf.quants' bit for bit (the rounding rules' rows too)
    if types[1] != "f16":
        rb = kv_cache.row_bytes(types[1], width)
        np.testing.assert_array_equal(vq[n_past * rb:(n_past + n_tokens) * rb], quant_bytes(v, types[1]))


ATTN_CASES = [
    # n_tokens, n_past, n_head, n_head_kv, head_dim, n_ctx, n_splits (None: the recorder's choice)
    (1, 0, 8, 2, 64, 128, None),       # decode kernel, first token
    (1, 150, 8, 2, 128, 256, None),    # decode kernel
    (1, 300, 8, 2, 128, 512, 4),       # decode kernel, split KV
    (1, 200, 4, 2, 256, 512, 2),       # head_dim 256
    (1, 90, 4, 1, 32, 256, 3),         # head_dim 32: one block per head
    (3, 50, 8, 2, 64, 128, 2),         # flash kernel (rows > 4), split
    (17, 5, 8, 2, 128, 256, None),     # prompt, flash kernel
    (70, 30, 9, 3, 64, 256, 1),        # prompt, one split
    (40, 0, 4, 4, 96, 128, None),      # head_dim 96: three blocks per head
]


# Every case with q8_0 K and V; every type mix on a decode, a split decode and a prompt case (each
# mix is a pipeline of its own: on llvmpipe compiling them costs more than running them).
TYPE_MIXES = [("q4_0", "q4_0"), ("q8_0", "f16"), ("f16", "q4_0"), ("q5_0", "q5_1"), ("q4_1", "q5_0")]
ATTN_PARAMS = [(("q8_0", "q8_0"),) + c for c in ATTN_CASES] + \
    [(t,) + ATTN_CASES[i] for t in TYPE_MIXES for i in (1, 2, 6)]


@pytest.mark.parametrize("types,n_tokens,n_past,n_head,n_head_kv,hd,n_ctx,n_splits", ATTN_PARAMS)
def test_attention_quantized_cache(dev, kc, types, n_tokens, n_past, n_head, n_head_kv, hd, n_ctx, n_splits):
    """Attention reading quantized caches directly equals numpy attention over the dequantized
    caches (the decode kernel holds dequantized values as f16, so its reference rounds them so); on
    devices with cooperative matrices, a prompt an f16 cache would run there runs the cooperative-
    matrix kernel over f16 copies of the rows (rounded so; that kernel's f16 tolerance)."""
    kvt = KVTypes(*types)
    n_kv = n_past + n_tokens
    width = n_head_kv * hd
    rng = np.random.default_rng(n_kv * 13 + hd + len(types[0]))
    k = rng.standard_normal((n_kv, width)).astype(np.float32)
    v = rng.standard_normal((n_kv, width)).astype(np.float32)
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)
    caches = []
    for name, x in ((kvt.k, k), (kvt.v, v)):
        raw = np.full(kv_cache.cache_bytes(name, n_ctx, width), 0xFF, dtype=np.uint8)   # NaN halves past n_kv
        data = quant_bytes(x, name)
        raw[:data.size] = data
        caches.append((upload(dev, raw), dequant_rows(raw, name, n_kv, width)))
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    run(dev, lambda s: attention(s, kc, upload(dev, q), caches[0][0], caches[1][0], out, step, n_tokens, n_head,
                                 n_head_kv, hd, n_ctx, n_splits=n_splits, kv_types=kvt))
    kref, vref = caches[0][1], caches[1][1]
    pl = plan(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits, kv_types=kvt)
    assert "kvq" in pl.kernel
    copies = coop_over_f16_copies(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits, kv_types=kvt)
    # where an f16 cache would take the cooperative-matrix kernel (none on llvmpipe)
    assert copies == plan(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits).kernel.startswith("attention_coop")
    assert not copies or has_coopmat(kc)
    if pl.kernel.startswith("attention_dec") or copies:
        kref, vref = kref.astype(np.float16), vref.astype(np.float16)
    ref = ref_attention(q, kref, vref, n_past, n_head, n_head_kv, hd)
    tol = dict(rtol=4e-3, atol=4e-3) if copies else dict(rtol=1e-4, atol=5e-5)   # tests/test_kernels_ops.py attn_tol
    np.testing.assert_allclose(mem, ref, **tol)


@pytest.mark.parametrize("name", list(QTYPES))
def test_f16_copies_of_a_quantized_cache(dev, kc, monkeypatch, name):
    """kv_dequant.comp: rows 0 .. n_kv of a quantized cache as f16 (gguf.quants' values rounded to f16),
    by one workgroup looping over them (the grid's cap)."""
    from llamavk.kernels import attention as attn
    from llamavk.kernels.attention import _f16_copies

    monkeypatch.setattr(attn, "KV_COPY_GROUPS", 1)

    n_ctx, width, n_kv = 64, 96, 41
    rng = np.random.default_rng(len(name))
    x = rng.standard_normal((n_kv, width)).astype(np.float32) * 3
    raw = np.full(kv_cache.cache_bytes(name, n_ctx, width), 0xA5, dtype=np.uint8)
    data = quant_bytes(x, name)
    raw[:data.size] = data
    step, smem = step_buffer(dev)
    set_step(smem, n_kv - 5, 5)
    got = {}
    run(dev, lambda s: got.setdefault("ranges", _f16_copies(s, kc, upload(dev, raw), upload(dev, raw), step, width,
                                                           n_ctx, KVTypes(name, name))))
    want = dequant_rows(raw, name, n_kv, width).astype(np.float16)
    for buf, offset, nbytes in got["ranges"]:
        assert nbytes == n_ctx * width * 2
        rows = np.frombuffer(buf.read(n_kv * width * 2, offset), np.float16).reshape(n_kv, width)
        np.testing.assert_allclose(rows.astype(np.float32), want.astype(np.float32), rtol=2.0 ** -10, atol=0)


def test_quantized_cache_needs_whole_blocks_per_head(dev, kc):
    """head_dim 80 cannot hold q8_0 blocks of one head: a one-line error, f16 still runs."""
    with pytest.raises(Exception, match="head_dim 80 is not a multiple of 32"):
        plan(kc, 1, 4, 2, 80, 128, kv_types=KVTypes("q8_0", "f16"))
    assert "f16" in plan(kc, 1, 4, 2, 80, 128).kernel


def test_cache_bytes():
    """q8_0 is 34/64 of f16, q4_0 18/64 (ggml's block sizes), rounded up to 16 bytes."""
    assert kv_cache.cache_bytes("f16", 100, 256) == 100 * 256 * 2
    assert kv_cache.cache_bytes("q8_0", 100, 256) == 100 * 8 * 34
    assert kv_cache.cache_bytes("q4_0", 3, 32) == 64     # 54 bytes, rounded up
    assert KVTypes("q8_0", "q4_0").layer_bytes(10, 64) == 688 + 368   # 680 and 360, rounded up
    # q4_1 20, q5_0 22, q5_1 24 bytes a block
    assert [kv_cache.row_bytes(t, 64) for t in ("q4_1", "q5_0", "q5_1")] == [40, 44, 48]
