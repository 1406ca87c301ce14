"""One-token attention that norms and rotates q and the new K row itself and stores K and V into the
cache (attention_decode.comp QK_FUSE, kernels/attention.py QKNormRope), against numpy: qwen3's
per-head RMS norm, NEOX RoPE (the first rope_dim dims), the cache row n_past as the cache type
holds it (f16, or q8_0 / q4_0 blocks: gguf.quants), and attention over the cache (ref_attention).

The cases put the new position in every place a split can hold it: the first token, the middle of
a split, the first row of a split of its own, two row blocks per KV head (both store the row), a
sliding window, qwen35's partial rotation of [q | gate] heads."""

from __future__ import annotations

import numpy as np
import pytest

from llamavk import kv_cache
from llamavk.kernels import KernelCache
from llamavk.kernels.attention import QKNormRope, attention, plan, qk_fuse_enabled, qk_fuse_ok
from llamavk.kernels.rope import RopeParams
from llamavk.kv_cache import KVTypes

from .test_kernels_ops import host, poisoned, ref_attention, run, set_step, step_buffer, upload
from .test_kv_quant import dequant_rows, quant_bound, quant_bytes


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def ref_norm_rope(x, w, eps, pos, rope_dim, base, stride=0):
    """x [heads * stride] (stride 0: head_dim = w.size) -> [heads, head_dim]: each head's first
    head_dim values RMS-normed with w, then NEOX pairs (i, i + rope_dim/2) turned by pos * base^(-2i/rope_dim)."""
    hd = w.size
    h = x.reshape(-1, stride or hd)[:, :hd].astype(np.float64)
    h = h / np.sqrt(np.mean(h * h, axis=1, keepdims=True) + eps) * w
    half = rope_dim // 2
    theta = pos * base ** (-2.0 * np.arange(half) / rope_dim)
    c, s = np.cos(theta), np.sin(theta)
    x0, x1 = h[:, :half].copy(), h[:, half:rope_dim].copy()
    h[:, :half], h[:, half:rope_dim] = x0 * c - x1 * s, x0 * s + x1 * c
    return h


CASES = [
    # n_past, n_head, n_head_kv, hd, rope_dim, q_stride factor, n_ctx, n_splits, min_chunk, window
    (0, 8, 2, 64, 64, 1, 128, None, None, 0),         # first token: the only row is the new one
    (150, 8, 2, 128, 128, 1, 256, None, None, 0),     # one split
    (300, 8, 2, 128, 128, 1, 512, 4, None, 0),        # split KV: the last active split stores
    (64, 8, 2, 64, 64, 1, 256, 2, 32, 0),             # the new row alone in the second split
    (200, 16, 2, 128, 128, 1, 512, 3, None, 0),       # 8 query rows per KV head: two row blocks store
    (100, 8, 2, 64, 64, 1, 256, 2, 32, 40),           # sliding window
    (70, 4, 2, 256, 64, 2, 128, 2, 32, 0),            # qwen35: [q | gate] heads, 64 of 256 dims turn
    (300, 8, 2, 128, 128, 1, 512, 2, None, 0),        # the storing split's first block loaded before the norms
    (99, 4, 2, 96, 96, 1, 256, 2, 32, 0),             # head_dim 96: V rows past the 32-row block reach n_past
]
TYPES = [("f16", "f16")] * len(CASES) + [("q8_0", "q8_0"), ("q4_0", "f16"), ("f16", "q4_0"), ("q8_0", "q4_0")]
PARAMS = [(TYPES[i],) + c for i, c in enumerate(CASES)] + \
    [(t,) + CASES[i] for t, i in zip(TYPES[len(CASES):], (2, 3, 4, 6))]


@pytest.mark.parametrize("types,n_past,n_head,n_head_kv,hd,rope_dim,qsf,n_ctx,n_splits,min_chunk,window", PARAMS)
def test_fused_norm_rope_store_and_attention_equal_numpy(dev, kc, types, n_past, n_head, n_head_kv, hd, rope_dim,
                                                         qsf, n_ctx, n_splits, min_chunk, window):
    kvt = KVTypes(*types)
    eps, base = 1e-6, 10000.0
    width = n_head_kv * hd
    rng = np.random.default_rng(n_past * 7 + hd + rope_dim + len(types[0]) + len(types[1]))
    q = (rng.standard_normal(n_head * hd * qsf) * 3).astype(np.float32)   # raw Q product (with gate halves)
    k = (rng.standard_normal(width) * 2 + 0.5).astype(np.float32)
    v = rng.standard_normal(width).astype(np.float32)
    qn, kn = (rng.uniform(0.5, 1.5, hd).astype(np.float32) for _ in range(2))
    # earlier rows as the cache holds them; rows from n_past on: NaN (0xFF bytes: row n_past must be
    # stored before any load of it, even one whose probability is 0)
    caches, mems = [], []
    for name in (kvt.k, kvt.v):
        raw = np.full(kv_cache.cache_bytes(name, n_ctx, width), 0xFF, dtype=np.uint8)
        if n_past:
            data = quant_bytes(rng.standard_normal((n_past, width)).astype(np.float32), name)
            raw[:data.size] = data
        view, mem = host(dev, raw)
        caches.append(view)
        mems.append(mem)
    before = [m.copy() for m in mems]
    out, omem = poisoned(dev, (1, n_head * hd))
    step, smem = step_buffer(dev)
    set_step(smem, n_past, 1)
    rope = RopeParams(dim=rope_dim, base=base, neox=True)
    assert qk_fuse_ok(kc, n_head, n_head_kv, hd, rope, kvt)
    qk = QKNormRope(upload(dev, k), upload(dev, v), upload(dev, qn), upload(dev, kn), eps, rope, hd * qsf)
    run(dev, lambda s: attention(s, kc, upload(dev, q), caches[0], caches[1], out, step, 1, n_head, n_head_kv, hd,
                                 n_ctx, n_splits=n_splits, min_chunk=min_chunk, window=window, kv_types=kvt, qk=qk))
    pl = plan(kc, 1, n_head, n_head_kv, hd, min(n_ctx, window) if window else n_ctx, n_splits, min_chunk,
              window, kvt)
    assert pl.kernel.startswith("attention_dec") and (pl.n_splits > 1) == (n_splits is not None)

    # the cache: row n_past is the normed, rotated k and the v, as the cache type holds them; no other row changed
    k_want = ref_norm_rope(k, kn, eps, n_past, rope_dim, base).reshape(-1)
    for name, mem, old, want in ((kvt.k, mems[0], before[0], k_want), (kvt.v, mems[1], before[1], v)):
        rb = kv_cache.row_bytes(name, width)
        row = slice(n_past * rb, (n_past + 1) * rb)
        np.testing.assert_array_equal(np.delete(mem, np.arange(row.start, row.stop)),
                                      np.delete(old, np.arange(row.start, row.stop)))
        got = dequant_rows(mem[row], name, 1, width)[0]
        if want is v:     # nothing computed: exactly the cache type's conversion of v
            np.testing.assert_array_equal(mem[row], quant_bytes(v[None], name))
        elif name == "f16":
            np.testing.assert_allclose(got, want, rtol=2e-3, atol=1e-3)
        else:
            ref16 = want.astype(np.float16).astype(np.float64)
            assert (np.abs(got - ref16) <= quant_bound(ref16, name) + 1e-3 * np.abs(ref16).max()).all()

    # attention of the normed, rotated queries over the cache as written (the decode kernel holds
    # dequantized values as f16)
    q_want = ref_norm_rope(q, qn, eps, n_past, rope_dim, base, stride=hd * qsf).reshape(1, -1)
    kref = dequant_rows(mems[0], kvt.k, n_past + 1, width)
    vref = dequant_rows(mems[1], kvt.v, n_past + 1, width)
    if kvt.quantized:
        kref, vref = kref.astype(np.float16), vref.astype(np.float16)
    want = ref_attention(q_want, kref, vref, n_past, n_head, n_head_kv, hd, window=window)
    np.testing.assert_allclose(omem, want, rtol=1e-4, atol=1e-4)


def test_fuse_needs_one_token_neox_and_no_freqs(dev, kc, monkeypatch):
    """Where the kernel cannot (adjacent pairs, a rope_freqs table, a rope_dim not a multiple of 8,
    several tokens), qk_fuse_ok says so and attention refuses a QKNormRope; the runtime uses it on
    GPUs, LLAMAVK_QKNORM_FUSE=0 / 1 never / everywhere."""
    neox = RopeParams(dim=64, neox=True)
    assert qk_fuse_ok(kc, 8, 2, 64, neox)
    assert not qk_fuse_ok(kc, 8, 2, 64, RopeParams(dim=64, neox=False))
    assert not qk_fuse_ok(kc, 8, 2, 64, RopeParams(dim=60, neox=True))
    assert not qk_fuse_ok(kc, 8, 2, 64, RopeParams(dim=64, neox=True, freqs=object()))
    assert not qk_fuse_ok(kc, 8, 2, 80, RopeParams(dim=80, neox=True))        # no decode kernel for 80
    monkeypatch.delenv("LLAMAVK_QKNORM_FUSE", raising=False)
    assert qk_fuse_enabled(kc) == (not kc.info.is_cpu)                          # GPUs only by default
    for env, want in (("0", False), ("1", True)):
        monkeypatch.setenv("LLAMAVK_QKNORM_FUSE", env)
        assert qk_fuse_enabled(kc) == want
    x = upload(dev, np.zeros(2 * 8 * 64, np.float32))
    qk = QKNormRope(x, x, x, x, 1e-6, neox, 64)
    step, _ = step_buffer(dev)
    with pytest.raises(ValueError, match="one-token"):
        run(dev, lambda s: attention(s, kc, x, x, x, x, step, 2, 8, 2, 64, 128, qk=qk))


# -- models ---------------------------------------------------------------------------------------

MODELS = [
    # arch, weight type, overrides, (K, V cache types)
    ("qwen3", "q4_0", {"head_dim": 32}, ("f16", "f16")),
    ("qwen3moe", "q4_0", {"head_dim": 32}, ("f16", "f16")),
    ("qwen3", "q8_0", {"head_dim": 32}, ("q8_0", "q4_0")),
    ("qwen35", "q8_0", {}, ("f16", "f16")),          # gated attention: [q | gate] heads, RoPE on 8 of 32 dims
    ("gemma3", "q8_0", {}, ("f16", "f16")),          # sliding-window layers (24 positions)
]


def decode_rows(path, prompt, n_prompt, types):
    """Logits of tokens n_prompt.. of `prompt` as one-token steps after a prompt batch of n_prompt, the
    one-token step's graph, and its recording's dispatch and barrier counts."""
    import llamavk

    with llamavk.load(path, n_ctx=128, n_ubatch=16, type_k=types[0], type_v=types[1], warn=lambda m: None) as m:
        rt = m.runtime
        m.logits(prompt[:n_prompt])
        rows = []
        for i in range(n_prompt, len(prompt)):
            rt.run_batch("last", [prompt[i]], i)
            rows.append(rt.logits(1)[0].copy())
        segs = rt.recordings[("last", 1, 0)]
        counts = (sum(s.n_dispatches for s in segs), sum(s.n_barriers for s in segs))
        return np.array(rows), rt.fused_one["last"], counts


@pytest.mark.parametrize("arch,qtype,overrides,types", MODELS, ids=[f"{m[0]}-{m[3][0]}" for m in MODELS])
def test_models_decode_with_fused_qk_norm(synthetic_model, monkeypatch, arch, qtype, overrides, types):
    """Tiny models' one-token steps with the Q/K norms, RoPE and KV store in the attention: logits of
    8 decode tokens at positions 28..35 (splits of 32 positions: the new row moves into a new split
    at 32) equal the numpy reference's (same cache types) and LLAMAVK_QKNORM_FUSE=0's; the step has
    no norm or RoPE op left around the attention, one dispatch fewer per attention layer (qwen35: its
    two head norms and rope_kv) and one barrier (stage) fewer (qwen35: two)."""
    from llamavk.models import load_model_file
    from llamavk.reference import ReferenceModel

    monkeypatch.setenv("LLAMAVK_QKNORM_FUSE", "1")      # (GPUs only by default)
    monkeypatch.setenv("LLAMAVK_ATTN_SPLITS", "4")
    monkeypatch.setenv("LLAMAVK_ATTN_MIN_CHUNK", "32")
    path = synthetic_model(arch, qtype, seed=5, **overrides)
    prompt = [int(t) for t in np.random.default_rng(21).integers(3, 500, 36)]
    ref = ReferenceModel(load_model_file(path), type_k=types[0], type_v=types[1]).logits(prompt)[28:]
    got, graph, (n_disp, n_bar) = decode_rows(path, prompt, 28, types)
    monkeypatch.setenv("LLAMAVK_QKNORM_FUSE", "0")
    plain, plain_graph, (p_disp, p_bar) = decode_rows(path, prompt, 28, types)

    attn = [op for op in graph.ops if op.kind == "attention"]
    assert attn and all(op.attrs.get("qk_fused") and op.attrs["kv_stored"] and not op.attrs["rope"] for op in attn)
    assert not any(op.kind in ("head_norm", "rope") for op in graph.ops)
    assert not any(op.attrs.get("qk_fused") for op in plain_graph.ops)
    per_layer = 3 if arch == "qwen35" else 1
    assert p_disp - n_disp == per_layer * len(attn)
    assert p_bar - n_bar == (2 if arch == "qwen35" else 1) * len(attn)

    scale = np.abs(ref).max()
    assert np.abs(got - ref).max() <= 3e-3 * scale
    assert np.abs(got - plain).max() <= 1e-4 * scale


@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0")])
def test_chained_fused_attention_equals_unchained(synthetic_model, monkeypatch, types):
    """The fused attention in its chained form (attention_decode.comp CHAIN: it counts its workgroups
    for the output projection, which waits in its shader) on the stream kernel: bit for bit the
    unchained logits, the attention's counter at its workgroup count, split KV."""
    import llamavk
    from llamavk.kernels import matmul as mm

    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": mm.MatvecConfig(64, 2, 1, 1, "stream", steps=2, xfirst=1,
                                                                   chained_steps=1)})
    monkeypatch.setenv("LLAMAVK_QKNORM_FUSE", "1")
    monkeypatch.setenv("LLAMAVK_ATTN_SPLITS", "4")
    monkeypatch.setenv("LLAMAVK_ATTN_MIN_CHUNK", "32")
    path = synthetic_model("qwen3", "q4_0", seed=5, head_dim=32)
    tokens = [int(t) for t in np.random.default_rng(9).integers(3, 500, 36)]
    got = {}
    for chain in ("0", "1"):
        monkeypatch.setenv("LLAMAVK_CHAIN", chain)
        with llamavk.load(path, n_ctx=128, type_k=types[0], type_v=types[1], warn=lambda m: None) as m:
            rt = m.runtime
            rows = []
            for i, t in enumerate(tokens):
                rt.run_batch("last", [t], i)
                rows.append(rt.logits(1)[0].copy())
            got[chain] = np.array(rows)
            chains = rt.chains[("last", 1, 0)]
            names = {name for name, _ in rt.kc._kernels}
            kind = "kvq" if types[0] != "f16" else "f16"
            if chain == "1":
                attn = [w for op, w in chains if op.kind == "attention"]
                assert len(attn) == rt.cfg.n_layer and f"attention_dec_split_qk_chain_{kind}" in names
                words = np.frombuffer(chains[0][1].counters[0].read(), dtype=np.uint32)
                assert all(words[w.slot] == w.n > 0 for w in attn)
            else:
                assert f"attention_dec_split_qk_{kind}" in names
    assert np.array_equal(got["0"], got["1"])


@pytest.mark.parametrize("mode", ["tensor", "graph", "layer"])
def test_split_modes_with_fused_attention_match_none(synthetic_model, monkeypatch, mode):
    """Split over 2 virtual devices (tensor / graph: each device norms, rotates and stores its own KV
    heads): the greedy tokens of -sm none, and each device's one-token step fused."""
    import llamavk

    monkeypatch.setenv("LLAMAVK_QKNORM_FUSE", "1")
    path = synthetic_model("qwen3moe", "q4_0", seed=5, head_dim=32)
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, 500, 20)]
    got = {}
    for m_ in ("none", mode):
        kw = dict(devices="Vulkan0,Vulkan0") if m_ != "none" else {}
        with llamavk.load(path, n_ctx=64, split_mode=m_, warn=lambda m: None, **kw) as m:
            got[m_] = list(m.generate(prompt, n=6, temp=0))
            runtimes = getattr(m.runtime, "runtimes", [m.runtime])
            per_device = [sum(bool(op.attrs.get("qk_fused")) for op in r.fused_one["last"].ops) for r in runtimes]
        layers = 2 if mode == "layer" or m_ == "none" else 4
        assert sum(per_device) == layers and all(per_device)
    assert got[mode] == got["none"]
