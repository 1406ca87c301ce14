"""The one-token decode attention with rope_kv's work in its prologue (attention_decode.comp ROPE:
kernels.attention.AttentionRope) against numpy written here (per-head RMS norms, RoPE of ggml's
neox / normal pairs, f16 caches, softmax attention), and against the unfused path (rope_kv, then
attention) it replaces. Caches are NaN above the rows written so far: a read of an unwritten row
shows."""

from __future__ import annotations

import numpy as np
import pytest

from llamavk.kernels import KernelCache, View
from llamavk.kernels.attention import AttentionRope, attention, plan, rope_fold_ok
from llamavk.kernels.rope import RopeParams, rope_kv
from llamavk.kv_cache import KVTypes
from llamavk.vk import CommandSequence

from .test_kernels_ops import host, poisoned, ref_attention, run, set_step, step_buffer, upload

EPS = 1e-6


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def ref_norm_rope(x, w, pos, rope_dim, neox, base):
    """x [heads, hd] (float64): RMS-normed per head with weight w (None: no norm), then the first
    rope_dim dims of every head rotated for position pos; dims past rope_dim kept."""
    x = x.astype(np.float64)
    if w is not None:
        x = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * w
    half = rope_dim // 2
    theta = pos * base ** (-2.0 * np.arange(half) / rope_dim)
    c, s = np.cos(theta), np.sin(theta)
    i0 = np.arange(half) if neox else 2 * np.arange(half)
    i1 = i0 + half if neox else i0 + 1
    out = x.copy()
    out[:, i0] = x[:, i0] * c - x[:, i1] * s
    out[:, i1] = x[:, i0] * s + x[:, i1] * c
    return out


def make_case(n_head, n_head_kv, hd, n_past, n_ctx, seed):
    rng = np.random.default_rng(seed)
    width = n_head_kv * hd
    k_cache = np.full((n_ctx, width), np.nan, dtype=np.float16)
    v_cache = np.full((n_ctx, width), np.nan, dtype=np.float16)
    k_cache[:n_past] = rng.standard_normal((n_past, width)).astype(np.float16)
    v_cache[:n_past] = rng.standard_normal((n_past, width)).astype(np.float16)
    q = (rng.standard_normal((1, n_head * hd)) * 2).astype(np.float32)
    k = (rng.standard_normal((1, width)) * 2).astype(np.float32)
    v = rng.standard_normal((1, width)).astype(np.float32)
    qn = rng.uniform(0.5, 2.0, hd).astype(np.float32)
    kn = rng.uniform(0.5, 2.0, hd).astype(np.float32)
    return k_cache, v_cache, q, k, v, qn, kn


def run_attention(dev, kc, fold, case, n_head, n_head_kv, hd, n_past, n_ctx, n_splits, params, norm):
    """One step at n_past: the folded kernel (fold) or rope_kv + attention. Returns out, k / v cache."""
    k_cache, v_cache, q, k, v, qn, kn = case
    (kv, kmem), (vv, vmem) = host(dev, k_cache), host(dev, v_cache)
    qv, kr, vr = upload(dev, q), upload(dev, k), upload(dev, v)
    qnv, knv = (upload(dev, qn), upload(dev, kn)) if norm else (None, None)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, 1)

    def rec(s):
        rope = None
        if fold:
            rope = AttentionRope(kr, vr, params, qnv, knv, EPS if norm else 0.0)
        else:
            rope_kv(s, kc, qv, kr, vr, kv, vv, step, 1, n_head, n_head_kv, hd, params, n_ctx,
                    q_norm=qnv, k_norm=knv, eps=EPS if norm else 0.0)
        attention(s, kc, qv, kv, vv, out, step, 1, n_head, n_head_kv, hd, n_ctx, n_splits=n_splits, rope=rope)
    run(dev, rec)
    return mem.copy(), kmem.copy(), vmem.copy()


CASES = [
    # n_head, n_head_kv, head_dim, rope_dim, neox, norm, n_past, n_ctx, n_splits (None: the recorder's plan)
    (8, 2, 64, 64, True, True, 0, 256, None),        # the first token: the only row is the new one
    (8, 2, 64, 64, False, True, 37, 256, None),      # normal pairs
    (8, 2, 64, 64, True, True, 128, 256, 4),         # the new row alone in the last active split
    (16, 2, 128, 128, True, True, 300, 512, 4),      # 8 GQA heads: two row blocks, 4 splits
    (14, 2, 64, 64, False, True, 90, 256, 3),        # 7 GQA heads: the second row block has 3 rows
    (4, 4, 128, 128, True, True, 1200, 1280, 40),    # 38 active splits, n_gqa 1
    (32, 4, 128, 128, True, True, 1000, 4096, None),  # Qwen3-30B-A3B's heads, the default split plan
    (4, 2, 256, 64, True, False, 150, 256, 2),       # partial rotation, no norms (qwen35's shape)
    (2, 1, 32, 32, False, True, 63, 64, None),       # the last cache row
    (6, 2, 96, 96, True, True, 70, 128, None),       # head_dim 96: a thread's pairs differ between passes
]


@pytest.mark.parametrize("n_head,n_head_kv,hd,rope_dim,neox,norm,n_past,n_ctx,n_splits", CASES)
def test_attention_rope_against_numpy_and_unfused(dev, kc, n_head, n_head_kv, hd, rope_dim, neox, norm, n_past,
                                                 n_ctx, n_splits):
    base = 1e6 if neox else 1e4
    params = RopeParams(dim=rope_dim, base=base, neox=neox)
    assert rope_fold_ok(kc, 1, n_head, n_head_kv, hd, params)
    pl = plan(kc, 1, n_head, n_head_kv, hd, n_ctx, n_splits)
    assert pl.kernel.startswith("attention_dec")
    case = make_case(n_head, n_head_kv, hd, n_past, n_ctx, seed=n_past * 31 + hd + n_head)
    k_cache, v_cache, q, k, v, qn, kn = case
    out, kmem, vmem = run_attention(dev, kc, True, case, n_head, n_head_kv, hd, n_past, n_ctx, n_splits, params,
                                    norm)

    # numpy: norms, rotation, the new row into f16 caches, attention
    qr = ref_norm_rope(q.reshape(n_head, hd), qn if norm else None, n_past, rope_dim, neox, base)
    kr = ref_norm_rope(k.reshape(n_head_kv, hd), kn if norm else None, n_past, rope_dim, neox, base)
    k_ref, v_ref = k_cache.copy(), v_cache.copy()
    k_ref[n_past] = kr.reshape(-1).astype(np.float16)
    v_ref[n_past] = v.reshape(-1).astype(np.float16)
    # the cache: row n_past written (within an f16 rounding of numpy's), every other row untouched
    others = np.arange(n_ctx) != n_past
    np.testing.assert_array_equal(kmem[others].view(np.uint16), k_cache[others].view(np.uint16))
    np.testing.assert_array_equal(vmem[others].view(np.uint16), v_cache[others].view(np.uint16))
    np.testing.assert_allclose(kmem[n_past].astype(np.float64), kr.reshape(-1), rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(vmem[n_past], v_ref[n_past])
    ref = ref_attention(qr.reshape(1, -1), kmem, vmem, n_past, n_head, n_head_kv, hd)
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=5e-5)
    if n_past:   # (one row: out = v, whatever q) and the raw q's attention differs
        assert not np.allclose(out, ref_attention(q, kmem, vmem, n_past, n_head, n_head_kv, hd), atol=1e-2)

    # the unfused path it replaces: the same caches, the same output up to float rounding
    out2, kmem2, vmem2 = run_attention(dev, kc, False, case, n_head, n_head_kv, hd, n_past, n_ctx, n_splits,
                                       params, norm)
    np.testing.assert_allclose(kmem.astype(np.float32), kmem2.astype(np.float32), rtol=1e-3, atol=1e-3)
    np.testing.assert_array_equal(vmem, vmem2)
    np.testing.assert_allclose(out, out2, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n_splits", [1, 3])
def test_attention_rope_replayed_decode(dev, kc, n_splits):
    """One recording replayed for 6 tokens at growing n_past (the decode loop): each step's new row,
    stored by the kernel, is read from the cache by the later steps."""
    n_head, n_head_kv, hd, n_ctx, n0 = 6, 2, 64, 128, 60
    params = RopeParams(dim=hd, base=1e6, neox=True)
    rng = np.random.default_rng(7)
    width = n_head_kv * hd
    k_cache = np.full((n_ctx, width), np.nan, dtype=np.float16)
    v_cache = np.full((n_ctx, width), np.nan, dtype=np.float16)
    k_cache[:n0] = rng.standard_normal((n0, width)).astype(np.float16)
    v_cache[:n0] = rng.standard_normal((n0, width)).astype(np.float16)
    (kv, kmem), (vv, vmem) = host(dev, k_cache), host(dev, v_cache)
    (qv, qmem), (kr, krmem), (vr, vrmem) = (host(dev, np.zeros((1, n), np.float32))
                                             for n in (n_head * hd, width, width))
    (qnv, qnmem), (knv, knmem) = (host(dev, rng.uniform(0.5, 2, hd).astype(np.float32)) for _ in range(2))
    out, mem = poisoned(dev, (1, n_head * hd))
    step, smem = step_buffer(dev)
    seq = CommandSequence(dev).begin()
    attention(seq, kc, qv, kv, vv, out, step, 1, n_head, n_head_kv, hd, n_ctx, n_splits=n_splits,
              rope=AttentionRope(kr, vr, params, qnv, knv, EPS))
    seq.end()
    try:
        k_ref, v_ref = k_cache.astype(np.float64), v_cache.astype(np.float64)
        for n_past in range(n0, n0 + 6):
            q, k, v = (rng.standard_normal((1, n)).astype(np.float32) for n in (n_head * hd, width, width))
            qmem[...], krmem[...], vrmem[...] = q, k, v
            set_step(smem, n_past, 1)
            seq.run()
            qr = ref_norm_rope(q.reshape(n_head, hd), qnmem, n_past, hd, True, 1e6)
            k_ref[n_past] = ref_norm_rope(k.reshape(n_head_kv, hd), knmem, n_past, hd, True, 1e6).reshape(-1)
            v_ref[n_past] = v.reshape(-1).astype(np.float16)
            ref = ref_attention(qr.reshape(1, -1), k_ref, v_ref, n_past, n_head, n_head_kv, hd)
            np.testing.assert_allclose(mem, ref, rtol=2e-3, atol=2e-3)   # numpy's k unrounded: f16 apart
            np.testing.assert_allclose(kmem[:n_past + 1].astype(np.float64), k_ref[:n_past + 1], rtol=2e-3, atol=2e-3)
        assert np.isnan(kmem[n0 + 6:].astype(np.float32)).all() and np.isnan(vmem[n0 + 6:].astype(np.float32)).all()
    finally:
        seq.close()


def test_rope_fold_ok_falls_back(dev, kc, monkeypatch):
    """Where the kernel cannot (prompts, quantized caches, rope_freqs, head dims the decode kernel
    does not take, one norm without the other) or the knob is off, rope_kv stays."""
    params = RopeParams(dim=128, base=1e6, neox=True)
    assert rope_fold_ok(kc, 1, 32, 4, 128, params)
    assert not rope_fold_ok(kc, 2, 32, 4, 128, params)
    assert not rope_fold_ok(kc, 1, 32, 4, 128, params, KVTypes("q8_0", "f16"))
    assert not rope_fold_ok(kc, 1, 32, 4, 128, RopeParams(dim=128, freqs=object()))
    assert not rope_fold_ok(kc, 1, 4, 2, 80, RopeParams(dim=80))       # head_dim 80: the generic kernel
    assert not rope_fold_ok(kc, 1, 32, 4, 128, params, q_norm=object())
    monkeypatch.setenv("LLAMAVK_ATTN_ROPE", "0")
    assert not rope_fold_ok(kc, 1, 32, 4, 128, params)
    monkeypatch.setenv("LLAMAVK_ATTN_ROPE", "1")
    monkeypatch.setenv("LLAMAVK_ATTN_DECODE", "0")
    assert not rope_fold_ok(kc, 1, 32, 4, 128, params)


def test_attention_rope_refuses_prompts(dev, kc):
    params = RopeParams(dim=64, neox=True)
    q = upload(dev, np.zeros((2, 4 * 64), np.float32))
    kv = upload(dev, np.zeros((16, 2 * 64), np.float16))
    step, _ = step_buffer(dev)
    with pytest.raises(ValueError, match="one-token"):
        run(dev, lambda s: attention(s, kc, q, kv, kv, q, step, 2, 4, 2, 64, 16, rope=AttentionRope(kv, kv, params)))


# -- whole models -----------------------------------------------------------------------------------

MODEL_CASES = [
    # arch, qtype, env: KV splits / chained stages (the kernel's split and chain variants)
    ("qwen3", "q8_0", {}),
    ("qwen3", "q4_0", {"LLAMAVK_ATTN_SPLITS": "3", "LLAMAVK_ATTN_MIN_CHUNK": "32"}),
    ("qwen3", "q4_0", {"chain": "1"}),
    ("qwen3moe", "q4_0", {}),
    ("qwen3moe", "q8_0", {"LLAMAVK_ATTN_SPLITS": "3", "LLAMAVK_ATTN_MIN_CHUNK": "32"}),
    ("qwen35moe", "q8_0", {}),    # gated attention: rope_kv without the norms (q's is strided), rope_dim 8 of 32
]


@pytest.mark.parametrize("arch,qtype,env", MODEL_CASES,
                         ids=[f"{a}-{q}" + "".join(f"-{k}" for k in e) for a, q, e in MODEL_CASES])
def test_decode_with_rope_in_attention(synthetic_model, monkeypatch, arch, qtype, env):
    """Tiny models decoded token by token through the one-token step: with the fold (the default)
    every attention layer's rope_kv dispatch is gone, the logits equal the numpy reference forward
    pass and, tightly, those of the same step with LLAMAVK_ATTN_ROPE=0 (rope_kv, then attention)."""
    import llamavk
    from llamavk.models import load_model_file
    from llamavk.reference import ReferenceModel

    from .vk_fixtures import chainable_stream_kernel, one_token_rows

    for k, v in env.items():
        if k == "chain":
            chainable_stream_kernel(monkeypatch)
            monkeypatch.setenv("LLAMAVK_CHAIN", v)
        else:
            monkeypatch.setenv(k, v)
    path = synthetic_model(arch, qtype)
    n_tok = 40 if "LLAMAVK_ATTN_SPLITS" in env else 10      # 40: two active splits of 32 positions
    tokens = [int(t) for t in np.random.default_rng(11).integers(3, 500, n_tok)]
    want = ReferenceModel(load_model_file(path)).logits(tokens)
    got, dispatches, kernels = {}, {}, {}
    for knob in ("1", "0"):
        monkeypatch.setenv("LLAMAVK_ATTN_ROPE", knob)
        with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
            rt = m.runtime
            got[knob] = one_token_rows(rt, tokens)
            dispatches[knob] = sum(seq.n_dispatches for seq in rt.recordings[("last", 1, 0)])
            kernels[knob] = {name for name, _ in rt.kc._kernels}
            n_attn = sum(op.kind == "attention" for op in rt.fused_one["last"].ops)
            assert all(op.attrs.get("rope") for op in rt.fused_one["last"].ops if op.kind == "attention")
    assert dispatches["1"] == dispatches["0"] - n_attn and n_attn > 0
    assert not any(k.startswith("rope_kv") for k in kernels["1"])
    assert any("_rope_" in k for k in kernels["1"]) and not any("_rope_" in k for k in kernels["0"])
    if "chain" in env:
        assert "attention_dec_rope_chain_f16" in kernels["1"]
    if "LLAMAVK_ATTN_SPLITS" in env:
        assert any(k.startswith("attention_dec_split_rope") for k in kernels["1"])
    scale = np.abs(want).max()
    assert np.abs(got["1"] - want).max() < 3e-3 * scale
    assert np.abs(got["1"] - got["0"]).max() < 1e-4 * scale


@pytest.mark.parametrize("arch,mode", [("qwen3", "tensor"), ("qwen3moe", "graph"), ("qwen3", "layer")])
def test_split_modes_fold_per_device(synthetic_model, monkeypatch, arch, mode):
    """Split modes: every device's one-token attention takes rope_kv's work over the heads it holds
    (3 virtual devices; tensor / graph split attention by KV heads or mirror it), and the one-token
    logits equal those of the same split with LLAMAVK_ATTN_ROPE=0 and of -sm none."""
    import llamavk

    from .vk_fixtures import one_token_rows

    path = synthetic_model(arch, "q8_0", n_layer=3)
    tokens = [int(t) for t in np.random.default_rng(2).integers(3, 500, 8)]
    got = {}
    for knob, sm, devs in (("1", mode, 3), ("0", mode, 3), ("1", "none", 1)):
        monkeypatch.setenv("LLAMAVK_ATTN_ROPE", knob)
        with llamavk.load(path, n_ctx=64, devices=",".join(["Vulkan0"] * devs), split_mode=sm,
                          warn=lambda m: None) as m:
            rts = getattr(m.runtime, "runtimes", [m.runtime])
            got[(knob, sm)] = one_token_rows(m.runtime, tokens)
            names = [{name for name, _ in rt.kc._kernels} for rt in rts]
            with_attention = [n for n in names if any(k.startswith("attention") for k in n)]
            assert with_attention
            folded = all(any("_rope_" in k for k in n) and not any(k.startswith("rope_kv") for k in n)
                         for n in with_attention)
            assert folded == (knob == "1"), (knob, sm, names)
    scale = np.abs(got[("1", "none")]).max()
    assert np.abs(got[("1", mode)] - got[("0", mode)]).max() < 1e-4 * scale
    assert np.abs(got[("1", mode)] - got[("1", "none")]).max() < 2e-3 * scale
