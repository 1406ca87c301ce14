"""gemma3 (Gemma 3): its kernels, its config, tiny synthetic models against the numpy reference and
against llama.cpp's CPU build, and the real Gemma 3 270M against llama.cpp.

Kernels: sliding-window attention (every attention kernel this device runs: the decode kernel, the
generic one, their split-KV forms, several sequences per batch) and a non-default q.k scale against
float64 numpy; K/V rows before the window are NaN, so a kernel that read them would return NaN (the
window's work does not grow with the context), and the number of splits that run is that of the
window. GeGLU, scale and soft-capping against numpy. Outputs are poisoned with NaN before each run.

Models: tiny gemma3 files (head_dim = 2 n_embd / n_head as in Gemma 3; local layers see 24 positions,
every other layer is global; prompts of 40-70 tokens) against reference.ReferenceModel, and scored by
llama-perplexity on the CPU (../shared/ref-llamacpp) against llamavk perplexity.
"""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import llamavk
from llamavk.errors import LlamavkError
from llamavk.kernels import KernelCache
from llamavk.kernels.attention import DEC_BLOCK, attention, plan
from llamavk.kernels.elementwise import geglu, scale, softcap
from llamavk.models import config_from_metadata, load_model_file
from llamavk.reference import ReferenceModel, gelu_tanh
from llamavk.synthetic import write_synthetic_model

from .test_kernels_ops import host, poisoned, record, run, set_step, step_buffer, upload


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


# -- kernels -------------------------------------------------------------------------------------

def ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, window=0, seq_len=0, scale=0.0):
    """Causal GQA attention in float64: row p sees rows max(its sequence's start, p - window + 1) .. p."""
    n_tok = q.shape[0]
    n_kv = n_past + n_tok
    qh = q.reshape(n_tok, n_head, hd).astype(np.float64)
    kh = k_cache[:n_kv].astype(np.float64).reshape(n_kv, n_head_kv, hd)
    vh = v_cache[:n_kv].astype(np.float64).reshape(n_kv, n_head_kv, hd)
    rows = n_past + np.arange(n_tok)
    first = rows // seq_len * seq_len if seq_len else np.zeros_like(rows)
    if window:
        first = np.maximum(first, rows - window + 1)
    cols = np.arange(n_kv)[None, :]
    hidden = (cols > rows[:, None]) | (cols < first[:, None])
    out = np.empty((n_tok, n_head, hd))
    for h in range(n_head):
        g = h // (n_head // n_head_kv)
        sc = qh[:, h] @ np.nan_to_num(kh[:, g]).T * (scale or 1.0 / math.sqrt(hd))
        sc[hidden] = -np.inf
        p = np.exp(sc - sc.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ np.nan_to_num(vh[:, g])
    return out.reshape(n_tok, n_head * hd)


def window_caches(n_ctx, width, n_kv, before, seed):
    """Random f16 K/V rows in [before, n_kv); NaN elsewhere: rows a windowed kernel must not read."""
    rng = np.random.default_rng(seed)
    k = np.full((n_ctx, width), np.nan, np.float16)
    v = np.full((n_ctx, width), np.nan, np.float16)
    k[before:n_kv] = rng.standard_normal((n_kv - before, width)).astype(np.float16)
    v[before:n_kv] = rng.standard_normal((n_kv - before, width)).astype(np.float16)
    return k, v, rng


WINDOW_CASES = [
    # n_tokens, n_past, n_head, n_head_kv, head_dim, n_ctx, window, n_splits (None: the recorder's)
    (1, 1500, 8, 2, 128, 2048, 200, None),   # decode deep in the context
    (1, 1500, 8, 2, 128, 2048, 200, 1),
    (1, 1500, 8, 2, 128, 2048, 200, 8),      # split-KV over the window's positions only
    (1, 700, 4, 1, 256, 1024, 512, 3),       # Gemma 3 270M's shape: head_dim 256, one KV head, W 512
    (1, 30, 4, 1, 256, 1024, 512, 3),        # window longer than the context so far: everything
    (3, 400, 4, 4, 64, 512, 37, 2),          # 3 tokens: each its own window, starting off block edges
    (17, 300, 9, 3, 64, 512, 50, None),      # a prompt micro-batch: rows start 50 positions back
    (70, 130, 8, 2, 64, 256, 24, 1),         # 70 tokens, a window shorter than the batch
    (70, 130, 8, 2, 64, 256, 24, 3),
    (40, 0, 8, 2, 32, 128, 24, None),        # the tiny models' shape
]


@pytest.mark.parametrize("decode", ["1", "0"])
@pytest.mark.parametrize("n_tokens,n_past,n_head,n_head_kv,hd,n_ctx,window,n_splits", WINDOW_CASES)
def test_sliding_window_attention(dev, kc, monkeypatch, decode, n_tokens, n_past, n_head, n_head_kv, hd, n_ctx,
                                  window, n_splits):
    """Every row sees the last `window` positions only; rows before the batch's first window are NaN
    (never read: the work is the window's, not the context's). decode "0": attention.comp even where
    the decode kernel applies."""
    monkeypatch.setenv("LLAMAVK_ATTN_DECODE", decode)
    n_kv = n_past + n_tokens
    before = max(0, n_past + 1 - window)
    k_cache, v_cache, rng = window_caches(n_ctx, n_head_kv * hd, n_kv, before, seed=n_kv + window)
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    run(dev, lambda s: attention(s, kc, upload(dev, q), upload(dev, k_cache), upload(dev, v_cache), out, step,
                                 n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=n_splits, window=window))
    want = ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, window)
    np.testing.assert_allclose(mem, want, rtol=1e-4, atol=5e-5)
    if before > 0:     # and it is not attention over everything before each row
        full = ref_attention(q, np.nan_to_num(k_cache), np.nan_to_num(v_cache), n_past, n_head, n_head_kv, hd)
        assert not np.allclose(mem, full, atol=1e-3)


@pytest.mark.parametrize("n_tokens,n_past,seq_len,window,n_splits", [
    (24, 0, 8, 5, 1), (64, 64, 48, 20, 3), (6, 250, 64, 30, 3), (300, 0, 100, 150, None)])
def test_sliding_window_with_several_sequences(dev, kc, n_tokens, n_past, seq_len, window, n_splits):
    """Perplexity's parallel sequences: a row sees its own sequence and its window, whichever is shorter."""
    n_head, n_head_kv, hd, n_ctx = 8, 2, 64, 384
    n_kv = n_past + n_tokens
    k_cache, v_cache, rng = window_caches(n_ctx, n_head_kv * hd, n_kv, 0, seed=n_kv + seq_len)
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens, seq_len)
    run(dev, lambda s: attention(s, kc, upload(dev, q), upload(dev, k_cache), upload(dev, v_cache), out, step,
                                 n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=n_splits, window=window))
    want = ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, window, seq_len)
    np.testing.assert_allclose(mem, want, rtol=1e-4, atol=5e-5)


def test_windowed_decode_runs_the_windows_splits_only(dev, kc):
    """One decode recording replayed as the cache grows from 0 to 2000 positions: the split grid is
    sized for the window (200 positions: 4 splits of at least 64, not the 8 asked for), the splits
    that run cover the window only (their partial results counted in the scratch), rows before the
    window are NaN, and every output matches the reference."""
    n_head, n_head_kv, hd, n_ctx, window, min_chunk = 8, 2, 128, 2048, 200, 64
    pl = plan(kc, 1, n_head, n_head_kv, hd, window, 8, min_chunk)
    assert pl.n_splits == 4 and pl.kernel.startswith("attention_dec")
    rng = np.random.default_rng(31)
    width = n_head_kv * hd
    k_all = rng.standard_normal((n_ctx, width)).astype(np.float16)
    v_all = rng.standard_normal((n_ctx, width)).astype(np.float16)
    kv, kmem = host(dev, k_all)
    vv, vmem = host(dev, v_all)
    q_view, q_mem = host(dev, np.zeros((1, n_head * hd), np.float32))
    out, omem = poisoned(dev, (1, n_head * hd))
    step, smem = step_buffer(dev)
    seq = record(dev, lambda s: attention(s, kc, q_view, kv, vv, out, step, 1, n_head, n_head_kv, hd, n_ctx,
                                          n_splits=8, min_chunk=min_chunk, window=window))
    ml = kc._attention_scratch[(pl.n_splits, n_head, hd, n_head_kv)][1]
    for n_past in (0, 63, 100, 199, 200, 201, 640, 1999, 300):
        before = max(0, n_past + 1 - window)
        kmem[:] = k_all
        vmem[:] = v_all
        kmem[:before] = np.nan
        vmem[:before] = np.nan
        q = (rng.standard_normal((1, n_head * hd)) * 2).astype(np.float32)
        q_mem[...] = q
        omem[...] = np.nan
        ml.write(np.full(pl.n_splits * n_head * 2, np.nan, np.float32))
        set_step(smem, n_past, 1)
        seq.run()
        want = ref_attention(q, kmem, vmem, n_past, n_head, n_head_kv, hd, window)
        np.testing.assert_allclose(omem, want, rtol=1e-4, atol=5e-5, err_msg=f"n_past={n_past}")
        span = n_past + 1 - before
        chunk = max(math.ceil(math.ceil(span / pl.n_splits) / DEC_BLOCK) * DEC_BLOCK, min_chunk)
        active = math.ceil(span / chunk)
        # each split's softmax state (m, l) per query row: NaN where it wrote none, m = -1e30 where it
        # saw no position; every split that runs must see positions of the window
        m = np.frombuffer(ml.read(), np.float32).reshape(pl.n_splits, -1, 2)[..., 0]
        busy = (m > -1e29).all(axis=1)
        assert busy.tolist() == [active > 1 and sp < active for sp in range(pl.n_splits)], f"n_past={n_past}"
    seq.close()


@pytest.mark.parametrize("decode", ["1", "0"])
def test_attention_scale(dev, kc, monkeypatch, decode):
    """q.k scaled by a given factor (gemma3's query_pre_attn_scalar) instead of 1/sqrt(head_dim)."""
    monkeypatch.setenv("LLAMAVK_ATTN_DECODE", decode)
    n_tokens, n_past, n_head, n_head_kv, hd, n_ctx = 1, 90, 4, 2, 64, 128
    k_cache, v_cache, rng = window_caches(n_ctx, n_head_kv * hd, n_past + n_tokens, 0, seed=3)
    q = rng.standard_normal((n_tokens, n_head * hd)).astype(np.float32)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    run(dev, lambda s: attention(s, kc, upload(dev, q), upload(dev, k_cache), upload(dev, v_cache), out, step,
                                 n_tokens, n_head, n_head_kv, hd, n_ctx, scale=0.4))
    np.testing.assert_allclose(mem, ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, scale=0.4),
                               rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("n", [1, 1000, 70001])
def test_geglu_scale_softcap(dev, kc, n):
    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n) * 4).astype(np.float32)
    g[:min(n, 4)] = [-200.0, 200.0, 0.0, -5.0][:min(n, 4)]          # e^(2u) past f32 range: no NaN
    u = rng.standard_normal(n).astype(np.float32)
    want = gelu_tanh(g).astype(np.float64) * u
    out, mem = poisoned(dev, n)
    run(dev, lambda s: geglu(s, kc, upload(dev, g), upload(dev, u), out, n))
    np.testing.assert_allclose(mem, want, rtol=2e-5, atol=2e-6)
    out, mem = poisoned(dev, n)
    run(dev, lambda s: scale(s, kc, upload(dev, g), out, n, 25.3))
    np.testing.assert_allclose(mem, g.astype(np.float64) * 25.3, rtol=1e-6)
    x = (rng.standard_normal(n) * 40).astype(np.float32)
    view, mem = host(dev, x)
    run(dev, lambda s: softcap(s, kc, view, view, n, 30.0))          # in place, as on the logits
    np.testing.assert_allclose(mem, 30.0 * np.tanh(x.astype(np.float64) / 30.0), rtol=1e-5, atol=1e-5)
