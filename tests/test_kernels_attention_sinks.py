"""Attention sinks (gpt-oss: a learned logit per query head that joins the softmax as one more key of
value 0, not multiplied by the q.k scale) in every attention kernel (the *_sinks variants, shader
define SINKS), against numpy that appends the sink as an explicit column of the score matrix.

Every case mixes heads whose sink is comparable to their scores, one whose sink dominates (+40: out
~ 0) and one whose sink is negligible (-200: plain attention); each checks too that the kernel's output
is not what a wrong formula gives (no sink, the sink multiplied by the scale, the sink counted once
per split where several splits are merged), so the reference can tell them apart."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llamavk import kv_cache
from llamavk.kernels import KernelCache
from llamavk.kernels.attention import attention, plan
from llamavk.kernels.chain import ChainCounters
from llamavk.kernels.selection import has_coopmat
from llamavk.kv_cache import KVTypes
from llamavk.vk import CommandSequence

from .test_kernels_ops import attn_setup, attn_tol, poisoned, run, set_step, step_buffer, upload
from .test_kv_quant import dequant_rows, quant_bytes
from .test_shaders_coopmat import build


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def ref_attention_sinks(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, sinks, window=0, scale=0.0):
    """Causal GQA attention in float64 whose softmax has one more column per row, the row's head's sink
    (unscaled), with value 0. sinks None: no such column. window > 0: row p sees rows p - window + 1 ..
    p only (rows nobody sees may hold NaN)."""
    n_tok = q.shape[0]
    n_kv = n_past + n_tok
    qh = q.reshape(n_tok, n_head, hd).astype(np.float64)
    kh = np.nan_to_num(k_cache[:n_kv].astype(np.float64)).reshape(n_kv, n_head_kv, hd)
    vh = np.nan_to_num(v_cache[:n_kv].astype(np.float64)).reshape(n_kv, n_head_kv, hd)
    rows = n_past + np.arange(n_tok)
    first = np.maximum(0, rows - window + 1) if window else np.zeros_like(rows)
    cols = np.arange(n_kv)[None, :]
    hidden = (cols > rows[:, None]) | (cols < first[:, None])
    out = np.empty((n_tok, n_head, hd))
    for h in range(n_head):
        g = h // (n_head // n_head_kv)
        sc = qh[:, h] @ kh[:, g].T * (scale or 1.0 / math.sqrt(hd))
        sc[hidden] = -np.inf
        if sinks is not None:
            sc = np.concatenate([sc, np.full((n_tok, 1), float(sinks[h]))], axis=1)
        p = np.exp(sc - sc.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        out[:, h] = p[:, :n_kv] @ vh[:, g]
    return out.reshape(n_tok, n_head * hd)


def make_sinks(n_head: int, seed: int) -> np.ndarray:
    """Sinks about as large as the scores (q ~ 3 N(0, 1): scaled scores ~ 3 N(0, 1)), head 1's
    dominant, head 2's negligible."""
    sinks = np.random.default_rng(seed).uniform(-2.0, 8.0, n_head).astype(np.float32)
    sinks[1], sinks[2] = 40.0, -200.0
    return sinks


def check(mem, q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, sinks, tol, window=0, merged=False):
    """mem against the reference, and unlike the wrong formulas' results."""
    args = (q, k_cache, v_cache, n_past, n_head, n_head_kv, hd)
    ref = ref_attention_sinks(*args, sinks, window)
    np.testing.assert_allclose(mem, ref, **tol)
    head = mem.reshape(mem.shape[0], n_head, hd)
    assert np.abs(head[:, 1]).max() < 1e-6          # the dominant sink takes (almost) all the weight
    wrong = {"no sink": None, "sink x scale": sinks / math.sqrt(hd)}
    if merged:    # counted by each of (at least) 2 merged splits: as if the sink were larger by log 2
        wrong["sink per split"] = sinks + math.log(2.0)
    for what, s in wrong.items():
        assert not np.allclose(mem, ref_attention_sinks(*args, s, window), **tol), f"indistinguishable from {what}"


CASES = [
    # n_tokens, n_past, n_head, n_head_kv, head_dim, n_ctx, window, n_splits (n_head = 2 n_head_kv: GQA)
    # attention.comp: 8 or more query rows per KV head
    (12, 0, 8, 4, 64, 128, 0, 1),        # a prompt from position 0, one split
    (6, 300, 8, 4, 64, 512, 0, 3),       # a later micro-batch, 3 active splits merged
    (20, 100, 8, 4, 64, 256, 37, 1),     # sliding window
    (20, 200, 8, 4, 64, 512, 150, 3),    # sliding window, its 169 positions over 2 merged splits
    # attention_decode.comp: one token (or <= 4 rows per KV head), f16 cache
    (1, 0, 8, 4, 64, 256, 0, None),      # the first token: its own position and the sink
    (1, 150, 8, 4, 128, 256, 0, 1),
    (1, 200, 8, 4, 64, 512, 0, 4),       # 4 active splits merged
    (1, 300, 8, 4, 64, 512, 100, 3),     # sliding window, split
    (2, 40, 4, 2, 64, 128, 0, 2),        # 2 tokens x 2 GQA heads, split
]


@pytest.mark.parametrize("n_tokens,n_past,n_head,n_head_kv,hd,n_ctx,window,n_splits", CASES)
def test_attention_sinks(dev, kc, attention_form, n_tokens, n_past, n_head, n_head_kv, hd, n_ctx, window, n_splits):
    n_kv = n_past + n_tokens
    k_cache, v_cache, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_kv, seed=n_kv * 11 + hd + window)
    if window:   # rows before the batch's first window are never read
        k_cache[:max(0, n_past + 1 - window)] = np.nan
        v_cache[:max(0, n_past + 1 - window)] = np.nan
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)
    sinks = make_sinks(n_head, seed=n_kv)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    span = min(n_ctx, window + n_tokens - 1) if window else n_ctx
    pl = plan(kc, n_tokens, n_head, n_head_kv, hd, span, n_splits, window=window)
    run(dev, lambda s: attention(s, kc, upload(dev, q), upload(dev, k_cache), upload(dev, v_cache), out, step,
                                 n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=n_splits, window=window,
                                 sinks=upload(dev, sinks)))
    assert any(name == pl.kernel + "_sinks" for name, *_ in kc.entries())
    check(mem, q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, sinks,
          attn_tol(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits), window, merged=pl.n_splits > 1)


def test_attention_sinks_quantized_cache(dev, kc):
    """A q8_0 cache (the _kvq variants), one token over 4 merged splits; the decode kernel holds the
    dequantized values as f16, so the reference rounds them so (tests/test_kv_quant.py)."""
    n_tokens, n_past, n_head, n_head_kv, hd, n_ctx, n_splits = 1, 200, 8, 4, 64, 512, 4
    kvt = KVTypes("q8_0", "q8_0")
    n_kv, width = n_past + n_tokens, n_head_kv * hd
    rng = np.random.default_rng(3)
    caches = []
    for _ in range(2):
        raw = np.full(kv_cache.cache_bytes("q8_0", n_ctx, width), 0xFF, dtype=np.uint8)   # NaN halves past n_kv
        data = quant_bytes(rng.standard_normal((n_kv, width)).astype(np.float32), "q8_0")
        raw[:data.size] = data
        caches.append((upload(dev, raw), dequant_rows(raw, "q8_0", n_kv, width).astype(np.float16)))
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)
    sinks = make_sinks(n_head, seed=4)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    pl = plan(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits, kv_types=kvt)
    assert "kvq" in pl.kernel and pl.n_splits > 1
    run(dev, lambda s: attention(s, kc, upload(dev, q), caches[0][0], caches[1][0], out, step, n_tokens, n_head,
                                 n_head_kv, hd, n_ctx, n_splits=n_splits, kv_types=kvt, sinks=upload(dev, sinks)))
    assert any(name == pl.kernel + "_sinks" for name, *_ in kc.entries())
    check(mem, q, caches[0][1], caches[1][1], n_past, n_head, n_head_kv, hd, sinks, dict(rtol=1e-4, atol=5e-5),
          merged=True)


@pytest.mark.parametrize("n_splits,signal,wait", [(1, True, False), (3, True, True), (1, False, True)])
def test_attention_sinks_chained(dev, kc, n_splits, signal, wait):
    """The decode kernel's CHAIN / WAIT variants, whose sinks binding comes after the chain counters
    (6 alone, 9 after the split scratch): a wait for a count of 0 is met at once."""
    n_head, n_head_kv, hd, n_ctx, n_past = 8, 4, 64, 256, 150
    k_cache, v_cache, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_past + 1, seed=n_splits)
    q = (rng.standard_normal((1, n_head * hd)) * 3).astype(np.float32)
    sinks = make_sinks(n_head, seed=n_splits)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, 1)
    counters = ChainCounters(kc, 2)
    args = (upload(dev, q), upload(dev, k_cache), upload(dev, v_cache), out, step, 1, n_head, n_head_kv, hd, n_ctx)
    seq = CommandSequence(dev).begin()
    counters.begin(seq)
    sig = counters.signal()
    counted = attention(seq, kc, *args, n_splits=n_splits, signal=counters.signal() if signal else None,
                        wait=ChainCounters.wait(sig, 0) if wait else None, sinks=upload(dev, sinks))
    seq.end().run()
    seq.close()
    assert (counted > 0) == signal
    names = {name: bindings for name, bindings, *_ in kc.entries() if name.endswith("_sinks")}
    want = ("attention_dec" + ("_split" if n_splits > 1 else "") + ("_chain" if signal else "")
            + ("_wait" if wait else "") + "_f16_sinks")
    assert len(names[want]) == (10 if n_splits > 1 else 7)
    check(mem, q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, sinks, dict(rtol=1e-4, atol=5e-5),
          merged=n_splits > 1)


@pytest.mark.parametrize("n_tokens,n_past,n_head,n_head_kv,hd,n_ctx", [
    (70, 0, 8, 4, 64, 128),       # 140 rows: the last workgroup part-filled
    (130, 40, 8, 4, 128, 256),    # a later micro-batch
])
def test_attention_sinks_coop(dev, kc, n_tokens, n_past, n_head, n_head_kv, hd, n_ctx):
    """The cooperative-matrix prompt kernel (attention_coop.comp SINKS), f32 and f16 outputs.
    Devices without the tiles skip (llvmpipe)."""
    if not has_coopmat(kc):
        pytest.skip(f"{dev.info.name} has no cooperative matrices of shape 16x8x16 f16->f32")
    assert plan(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=1).kernel == f"attention_coop_f16_hd{hd}"
    n_kv = n_past + n_tokens
    k_cache, v_cache, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_kv, seed=n_kv * 5 + hd)
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)
    sinks = make_sinks(n_head, seed=n_kv)
    out, mem = poisoned(dev, q.shape)
    out16, mem16 = poisoned(dev, q.shape, np.float16)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    args = (upload(dev, q), upload(dev, k_cache), upload(dev, v_cache))
    sv = upload(dev, sinks)
    run(dev, lambda s: (
        attention(s, kc, *args, out, step, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=1, sinks=sv),
        attention(s, kc, *args, out16, step, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=1, sinks=sv,
                  out_f16=True)))
    names = {name for name, *_ in kc.entries()}
    assert {f"attention_coop_f16_hd{hd}_sinks", f"attention_coop_f16_hd{hd}_to_f16_sinks"} <= names
    check(mem, q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, sinks, dict(rtol=4e-3, atol=4e-3))
    np.testing.assert_array_equal(mem16.view(np.uint16), mem.astype(np.float16).view(np.uint16))


def test_every_attention_kernel_has_a_sinks_variant():
    """Each attention variant X has X_sinks: the same source and defines plus SINKS, the same compiler."""
    names = [n for n, (src, _) in build.VARIANTS.items() if src.startswith("attention") and "SINKS" not in _]
    assert len(names) >= 24
    for n in names:
        src, defs = build.VARIANTS[n]
        assert build.VARIANTS[n + "_sinks"] == (src, {**defs, "SINKS": "1"})
        assert build.compiler_of(n + "_sinks") == build.compiler_of(n)
    assert build.compiler_of("attention_coop_f16_hd64_to_f16_sinks") == "glslc-trixie-vulkan1.2"


def test_sinks_must_cover_the_heads(dev, kc):
    step, _ = step_buffer(dev)
    x = upload(dev, np.zeros(64, np.float32))
    with pytest.raises(ValueError, match="sinks"):
        attention(None, kc, x, x, x, x, step, 1, 8, 4, 64, 128, sinks=upload(dev, np.zeros(4, np.float32)))
