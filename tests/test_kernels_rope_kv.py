"""rope_kv (one dispatch: rotate q, rotate + store k, store v) equals rope + rope + kv_store + kv_store,
the separately tested path (tests/test_kernels_ops.py checks those against numpy)."""

import numpy as np
import pytest

from llamavk.kernels import KernelCache, View
from llamavk.kernels.attention import kv_store
from llamavk.kernels.rope import RopeParams, rope, rope_kv
from llamavk.vk import Buffer, CommandSequence


def host(dev, a):
    buf = Buffer(dev, max(4, a.nbytes), host_visible=True)
    buf.array(a.dtype, a.size)[:] = a.reshape(-1)
    return buf


@pytest.mark.parametrize("neox,rope_dim,freqs", [(False, 64, False), (True, 64, False), (False, 32, False),
                                                  (True, 48, True)])
@pytest.mark.parametrize("n_tokens,n_past,seq_len", [(1, 7, 0), (5, 0, 0), (3, 60, 0), (7, 0, 3), (5, 30, 16)])
def test_rope_kv_equals_separate_ops(dev, neox, rope_dim, freqs, n_tokens, n_past, seq_len):
    """seq_len > 0 (several sequences in one batch): angles by position in the sequence, rows as ever."""
    n_heads, n_kv, hd, n_ctx = 6, 2, 64, 64
    rng = np.random.default_rng(n_tokens * 100 + n_past + rope_dim)
    q = rng.standard_normal((n_tokens, n_heads * hd)).astype(np.float32)
    k = rng.standard_normal((n_tokens, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((n_tokens, n_kv * hd)).astype(np.float32)
    fr = host(dev, rng.uniform(1, 4, rope_dim // 2).astype(np.float32)) if freqs else None
    params = RopeParams(dim=rope_dim, base=10000.0, neox=neox, freqs=View.whole(fr) if fr else None)
    kc = KernelCache(dev)
    step = host(dev, np.array([n_past, n_tokens, n_past + n_tokens, 0, seq_len], np.uint32))
    outs = []
    for fused in (True, False):
        Q, K, V = host(dev, q), host(dev, k), host(dev, v)
        kcache = host(dev, np.full(n_ctx * n_kv * hd, np.nan, np.float16))
        vcache = host(dev, np.full(n_ctx * n_kv * hd, np.nan, np.float16))
        seq = CommandSequence(dev).begin()
        S = View.whole(step)
        if fused:
            rope_kv(seq, kc, View.whole(Q), View.whole(K), View.whole(V), View.whole(kcache), View.whole(vcache),
                    S, n_tokens, n_heads, n_kv, hd, params, n_ctx)
        else:
            rope(seq, kc, View.whole(Q), S, n_tokens, n_heads, hd, params)
            rope(seq, kc, View.whole(K), S, n_tokens, n_kv, hd, params)
            kv_store(seq, kc, View.whole(K), View.whole(kcache), S, n_tokens, n_kv * hd)
            kv_store(seq, kc, View.whole(V), View.whole(vcache), S, n_tokens, n_kv * hd)
        seq.end().run()
        outs.append((Q.array(np.float32).copy(), kcache.array(np.float16).copy(), vcache.array(np.float16).copy()))
    (q1, k1, v1), (q2, k2, v2) = outs
    rows = slice(n_past * n_kv * hd, (n_past + n_tokens) * n_kv * hd)
    assert np.isfinite(k1[rows]).all() and np.isfinite(v1[rows]).all()      # every cache row written
    assert np.isnan(np.delete(k1, np.arange(rows.start, rows.stop))).all()   # and nothing else
    np.testing.assert_allclose(q1, q2, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.nan_to_num(k1), np.nan_to_num(k2))
    np.testing.assert_array_equal(np.nan_to_num(v1), np.nan_to_num(v2))


@pytest.mark.parametrize("rope_dim,seq_len", [(32, 0), (16, 0), (32, 3)])
@pytest.mark.parametrize("kernel", ["stream", "stream_dp"])
def test_rope_in_qkv_products_equals_product_then_rope_kv(dev, monkeypatch, kernel, rope_dim, seq_len):
    """One-token Q/K/V products that rotate q, k and store k, v themselves (matvec_stream.comp ROPE)
    write what the plain products followed by rope_kv write; chunked weights (pairs never straddle);
    the dp form with 3 row blocks per workgroup (STEPS)."""
    from gguf import GGMLQuantizationType as T

    from llamavk.kernels import matmul as mm
    from llamavk.kernels import upload_qweight
    from llamavk.kernels.rope import RopeOut

    from .test_kernels_matmul import make_weight

    kc = KernelCache(dev)
    if kernel == "stream_dp" and not dev.features.get("int_dot"):
        pytest.skip("no integer dot products")
    steps = 3 if kernel == "stream_dp" else 1
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": mm.MatvecConfig(64, 2, 1, 1, kernel, steps=steps)})
    n_heads, n_kv, hd, n_ctx, n_past, cols = 2, 1, 32, 8, 5, 416
    rng = np.random.default_rng(rope_dim + seq_len)
    weights = []
    for rows, seed in ((n_heads * hd, 1), (n_kv * hd, 2), (n_kv * hd, 3)):
        raw, _ = make_weight(T.Q4_0, rows, cols, seed=seed)
        weights.append(upload_qweight(dev, raw, T.Q4_0, rows, cols, max_chunk_bytes=raw.shape[1] * 8))
    assert all(mm.matvec_rope_ok(kc, w, RopeParams(dim=rope_dim), hd) for w in weights)
    x = View.whole(host(dev, rng.standard_normal(cols).astype(np.float32)))
    params = RopeParams(dim=rope_dim, base=10000.0)
    step = View.whole(host(dev, np.array([n_past, 1, n_past + 1, 0, seq_len], np.uint32)))
    outs = []
    for fused in (True, False):
        Q, K, V = (host(dev, np.zeros(w.rows, np.float32)) for w in weights)
        caches = [host(dev, np.full(n_ctx * n_kv * hd, np.nan, np.float16)) for _ in range(2)]
        seq = CommandSequence(dev).begin()
        for w, out, kind, cache in zip(weights, (Q, K, V), "qkv", [None] + caches):
            rope_out = RopeOut(kind, params, step, hd, View.whole(cache) if cache else None, n_ctx) if fused else None
            mm.matmul(seq, kc, w, x, View.whole(out), 1, rope=rope_out)
        if not fused:
            rope_kv(seq, kc, View.whole(Q), View.whole(K), View.whole(V), View.whole(caches[0]),
                    View.whole(caches[1]), step, 1, n_heads, n_kv, hd, params, n_ctx)
        seq.end().run()
        outs.append([Q.array(np.float32).copy()] + [c.array(np.float16).copy() for c in caches])
    (q1, k1, v1), (q2, k2, v2) = outs
    row = slice(n_past * n_kv * hd, (n_past + 1) * n_kv * hd)
    assert np.isfinite(k1[row]).all() and np.isfinite(v1[row]).all()
    assert np.isnan(np.delete(k1, np.arange(row.start, row.stop))).all()   # that row only
    np.testing.assert_allclose(q1, q2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k1[row].astype(np.float32), k2[row].astype(np.float32), rtol=2e-3, atol=1e-3)
    np.testing.assert_array_equal(v1[row], v2[row])


@pytest.mark.parametrize("neox,hd,freqs", [(True, 128, False), (False, 64, True), (True, 16, False)])
@pytest.mark.parametrize("n_tokens,n_past,seq_len", [(1, 9, 0), (6, 0, 0), (6, 2, 3)])
def test_rope_kv_with_head_norms_equals_norm_then_rope_kv(dev, neox, hd, freqs, n_tokens, n_past, seq_len):
    """qwen3's per-head Q/K RMS norms folded into rope_kv (one workgroup per head) write what
    rms_norm per head (tested against numpy) followed by the plain rope_kv writes."""
    from llamavk.kernels.norm import rms_norm

    n_heads, n_kv, n_ctx, eps = 4, 2, 16, 1e-6
    rng = np.random.default_rng(hd + n_tokens + n_past)
    q = (rng.standard_normal((n_tokens, n_heads * hd)) * 3).astype(np.float32)
    k = rng.standard_normal((n_tokens, n_kv * hd)).astype(np.float32)
    v = rng.standard_normal((n_tokens, n_kv * hd)).astype(np.float32)
    qn, kn = (rng.uniform(0.5, 1.5, hd).astype(np.float32) for _ in range(2))
    fr = host(dev, rng.uniform(1, 4, hd // 2).astype(np.float32)) if freqs else None
    params = RopeParams(dim=hd, base=10000.0, neox=neox, freqs=View.whole(fr) if fr else None)
    kc = KernelCache(dev)
    step = View.whole(host(dev, np.array([n_past, n_tokens, n_past + n_tokens, 0, seq_len], np.uint32)))
    QN, KN = View.whole(host(dev, qn)), View.whole(host(dev, kn))
    outs = []
    for fused in (True, False):
        Q, K, V = host(dev, q), host(dev, k), host(dev, v)
        caches = [host(dev, np.full(n_ctx * n_kv * hd, np.nan, np.float16)) for _ in range(2)]
        seq = CommandSequence(dev).begin()
        if fused:
            rope_kv(seq, kc, View.whole(Q), View.whole(K), View.whole(V), View.whole(caches[0]), View.whole(caches[1]),
                    step, n_tokens, n_heads, n_kv, hd, params, n_ctx, q_norm=QN, k_norm=KN, eps=eps)
        else:
            rms_norm(seq, kc, View.whole(Q), View.whole(Q), n_tokens * n_heads, hd, eps, QN)
            rms_norm(seq, kc, View.whole(K), View.whole(K), n_tokens * n_kv, hd, eps, KN)
            rope_kv(seq, kc, View.whole(Q), View.whole(K), View.whole(V), View.whole(caches[0]), View.whole(caches[1]),
                    step, n_tokens, n_heads, n_kv, hd, params, n_ctx)
        seq.end().run()
        outs.append([Q.array(np.float32).copy()] + [c.array(np.float16).copy() for c in caches])
    (q1, k1, v1), (q2, k2, v2) = outs
    rows = slice(n_past * n_kv * hd, (n_past + n_tokens) * n_kv * hd)
    assert np.isfinite(k1[rows]).all() and np.isfinite(v1[rows]).all()
    assert np.isnan(np.delete(k1, np.arange(rows.start, rows.stop))).all()
    np.testing.assert_allclose(q1, q2, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(k1[rows].astype(np.float32), k2[rows].astype(np.float32), rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(v1[rows], v2[rows])


@pytest.mark.parametrize("kv", [("f16", "f16"), ("q8_0", "q4_0")])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("n_past,n_head,n_head_kv,hd,n_splits,attn_signals", [
    (5, 8, 2, 64, None, False),      # the first block holds row n_past: its loads after the wait
    (90, 16, 2, 128, 3, True),       # 8 GQA heads (two row blocks), splits, early first-block loads
    (40, 4, 4, 64, 1, True),
])
def test_attention_waiting_for_rope_kv_equals_the_barrier(dev, portable_attention, kv, norm, n_past, n_head, n_head_kv,
                                                          hd, n_splits, attn_signals):
    """The decode attention recorded without a barrier after a signalling rope_kv, waiting for its
    count in the shader (edge k: rope_kv.comp CHAIN, attention_decode.comp WAIT), writes what the
    two with a barrier between them write, over f16 or quantized caches; every rope_kv workgroup
    counts (llvmpipe runs dispatches one after another, so there the wait is met at once: the GPU
    runs check the overlap)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    from llamavk import kv_cache
    from llamavk.kernels.attention import attention
    from llamavk.kernels.chain import ChainCounters
    from llamavk.kv_cache import KVTypes

    n_ctx, eps = 256, 1e-6
    kc = KernelCache(dev)
    rng = np.random.default_rng(n_past + hd)
    q = (rng.standard_normal(n_head * hd) * 3).astype(np.float32)
    k = rng.standard_normal(n_head_kv * hd).astype(np.float32)
    v = rng.standard_normal(n_head_kv * hd).astype(np.float32)
    width, kvt = n_head_kv * hd, KVTypes(*kv)

    def old_cache(name):   # rows before n_past filled, the rest NaN (f16) or 0xA5 bytes (blocks)
        rows = rng.standard_normal((n_past, width)).astype(np.float32)
        if name == "f16":
            old = np.full((n_ctx, width), np.nan, np.float16)
            old[:n_past] = rows
            return old
        old = np.full(kv_cache.cache_bytes(name, n_ctx, width), 0xA5, np.uint8)
        packed = quantize(rows, GGMLQuantizationType[name.upper()]).reshape(-1)
        old[:packed.size] = packed
        return old
    olds = [old_cache(name) for name in kv]
    QN, KN = (View.whole(host(dev, rng.uniform(0.5, 1.5, hd).astype(np.float32))) if norm else None for _ in range(2))
    params = RopeParams(dim=hd, base=10000.0, neox=True)
    step = View.whole(host(dev, np.array([n_past, 1, n_past + 1, 0, 0], np.uint32)))
    outs = []
    for chained in (True, False):
        Q, K, V = host(dev, q), host(dev, k), host(dev, v)
        caches = [host(dev, old) for old in olds]
        out = host(dev, np.full(n_head * hd, np.nan, np.float32))
        counters = ChainCounters(kc, 2)
        seq = CommandSequence(dev).begin()
        counters.begin(seq)
        sig = counters.signal() if chained else None
        n = rope_kv(seq, kc, View.whole(Q), View.whole(K), View.whole(V), View.whole(caches[0]), View.whole(caches[1]),
                    step, 1, n_head, n_head_kv, hd, params, n_ctx, q_norm=QN, k_norm=KN, eps=eps, kv_types=kvt,
                    signal=sig)
        assert (n > 0) == chained
        attention(seq, kc, View.whole(Q), View.whole(caches[0]), View.whole(caches[1]), View.whole(out), step, 1,
                  n_head, n_head_kv, hd, n_ctx, n_splits=n_splits,
                  signal=counters.signal() if attn_signals else None, kv_types=kvt,
                  wait=ChainCounters.wait(sig, n) if chained else None)
        seq.end().run()
        if chained:   # every rope_kv workgroup counted (a GPU would otherwise wait for ever)
            buf, offset, _ = counters.range
            assert np.frombuffer(buf.read(4, offset + 4 * sig.slot), np.uint32)[0] == n
        outs.append([out.array(np.float32).copy()] + [c.array(old.dtype).copy() for c, old in zip(caches, olds)])
    (o1, k1, v1), (o2, k2, v2) = outs
    assert np.isfinite(o1).all()
    np.testing.assert_array_equal(o1, o2)
    np.testing.assert_array_equal(k1, k2)
    np.testing.assert_array_equal(v1, v2)
