"""Non-matmul kernels (rms_norm, rope, kv_store, attention, add, swiglu, add_bias) on a real Vulkan
device against numpy written here, independently of the shaders (and RoPE also against
llamavk.reference). Outputs are poisoned with NaN before every run."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llamavk.kernels import STEP_WORDS, KernelCache, View
from llamavk.kernels.attention import (ATTN_WG, DEC_BLOCK, MAX_SPLITS, attention, decode_form, kv_store,
                                      long_context_from, plan, split_plan)
from llamavk.kernels.selection import has_coopmat
from llamavk.kernels.elementwise import add, add_bias, swiglu
from llamavk.kernels.norm import rms_norm
from llamavk.kernels.rope import RopeParams, rope
from llamavk.models.base import ModelConfig, RopeScaling
from llamavk.reference import apply_rope, rope_cos_sin
from llamavk.vk import Buffer, CommandSequence



@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


# -- helpers -------------------------------------------------------------------------------------

def upload(dev, arr) -> View:
    arr = np.ascontiguousarray(arr)
    buf = Buffer(dev, arr.nbytes)
    buf.write(arr)
    return View(buf, 0, arr.nbytes)


def host(dev, arr) -> tuple[View, np.ndarray]:
    """A host-visible buffer holding `arr`; returns the view and a live numpy view of its memory."""
    arr = np.ascontiguousarray(arr)
    buf = Buffer(dev, arr.nbytes, host_visible=True)
    mem = buf.array(arr.dtype, arr.size).reshape(arr.shape)
    mem[...] = arr
    return View(buf, 0, arr.nbytes), mem


def poisoned(dev, shape, dtype=np.float32):
    return host(dev, np.full(shape, np.nan, dtype=dtype))


def step_buffer(dev):
    view, mem = host(dev, np.zeros(STEP_WORDS, dtype=np.uint32))
    return view, mem


def set_step(mem, n_past, n_tokens, seq_len=0):
    mem[:] = [n_past, n_tokens, n_past + n_tokens, 0, seq_len]


def record(dev, fn) -> CommandSequence:
    seq = CommandSequence(dev).begin()
    fn(seq)
    return seq.end()


def run(dev, fn) -> None:
    seq = record(dev, fn)
    seq.run()
    seq.close()


# -- rms_norm ------------------------------------------------------------------------------------

def ref_rms_norm(x, w, eps):
    x64 = x.astype(np.float64)
    y = x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


@pytest.mark.parametrize("n_rows,n_cols", [(1, 576), (3, 1000), (17, 4096), (70 * 9, 64), (5 * 4, 128), (2, 7)])
@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm(dev, kc, n_rows, n_cols, with_weight):
    rng = np.random.default_rng(n_rows * 131 + n_cols)
    x = (rng.standard_normal((n_rows, n_cols)) * rng.uniform(0.1, 10, (n_rows, 1))).astype(np.float32)
    w = rng.standard_normal(n_cols).astype(np.float32) if with_weight else None
    out, mem = poisoned(dev, x.shape)
    wv = upload(dev, w) if with_weight else None
    run(dev, lambda s: rms_norm(s, kc, upload(dev, x), out, n_rows, n_cols, 1e-5, weight=wv))
    np.testing.assert_allclose(mem, ref_rms_norm(x, w, 1e-5), rtol=2e-5, atol=2e-5)


def test_rms_norm_in_place(dev, kc):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((9, 576)).astype(np.float32)
    w = rng.standard_normal(576).astype(np.float32)
    view, mem = host(dev, x)
    run(dev, lambda s: rms_norm(s, kc, view, view, 9, 576, 1e-6, weight=upload(dev, w)))
    np.testing.assert_allclose(mem, ref_rms_norm(x, w, 1e-6), rtol=2e-5, atol=2e-5)


# -- element-wise --------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [1, 1000, 70 * 1536 + 3])
def test_add_and_swiglu(dev, kc, n):
    rng = np.random.default_rng(n)
    a = (rng.standard_normal(n) * 5).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    if n > 4:
        a[:4] = [-1000.0, -100.0, 100.0, 0.0]   # exp overflow guard, large positive
    av, bv = upload(dev, a), upload(dev, b)
    s_out, s_mem = poisoned(dev, n)
    a_out, a_mem = poisoned(dev, n)
    run(dev, lambda s: (swiglu(s, kc, av, bv, s_out, n), add(s, kc, av, bv, a_out, n)))
    a64 = a.astype(np.float64)
    with np.errstate(over="ignore"):
        silu = a64 / (1.0 + np.exp(-a64))
    np.testing.assert_allclose(s_mem, silu * b, rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(s_mem))
    np.testing.assert_array_equal(a_mem, a + b)


@pytest.mark.parametrize("op", ["swiglu", "geglu"])
def test_glu_f16_out_is_the_f32_result_converted(dev, kc, op):
    """SwiGLU / GeGLU writing f16 (the x of a prompt's down product, runtime._feeds_f16_product):
    bit for bit the f32 kernel's result converted as collective.convert converts it."""
    from llamavk.kernels import elementwise
    from llamavk.kernels.collective import convert
    n = 70 * 1536 + 3
    rng = np.random.default_rng(11)
    a = (rng.standard_normal(n) * 5).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    a[:4] = [-1000.0, -100.0, 100.0, 0.0]
    av, bv = upload(dev, a), upload(dev, b)
    f32, _ = poisoned(dev, n)
    conv, conv_mem = poisoned(dev, n, np.float16)
    direct, direct_mem = poisoned(dev, n, np.float16)
    fn = getattr(elementwise, op)
    run(dev, lambda s: (fn(s, kc, av, bv, f32, n), convert(s, kc, f32, conv, "f16", n),
                        fn(s, kc, av, bv, direct, n, out_f16=True)))
    assert np.all(np.isfinite(conv_mem))
    np.testing.assert_array_equal(direct_mem.view(np.uint16), conv_mem.view(np.uint16))


@pytest.mark.parametrize("with_weight", [True, False])
def test_rms_norm_f16_out_is_the_f32_result_converted(dev, kc, with_weight):
    """RMS norm writing f16 (the x of a prompt's Q/K/V or gate/up products,
    runtime._feeds_f16_products): bit for bit the f32 kernel's result converted."""
    from llamavk.kernels.collective import convert
    rows, cols = 37, 4096
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32) if with_weight else None
    xv, wv = upload(dev, x), (upload(dev, w) if with_weight else None)
    f32, _ = poisoned(dev, x.shape)
    conv, conv_mem = poisoned(dev, x.shape, np.float16)
    direct, direct_mem = poisoned(dev, x.shape, np.float16)
    run(dev, lambda s: (rms_norm(s, kc, xv, f32, rows, cols, 1e-6, weight=wv), convert(s, kc, f32, conv, "f16", x.size),
                        rms_norm(s, kc, xv, direct, rows, cols, 1e-6, weight=wv, out_f16=True)))
    np.testing.assert_allclose(conv_mem.astype(np.float32), ref_rms_norm(x, w, 1e-6), rtol=2e-3, atol=2e-3)
    np.testing.assert_array_equal(direct_mem.view(np.uint16), conv_mem.view(np.uint16))


@pytest.mark.parametrize("in_place,out_f16", [(False, False), (True, False), (True, True)])
def test_add_rms_norm_is_add_then_norm(dev, kc, in_place, out_f16):
    """norm.add_rms_norm (a prompt's residual add and the norm after it, one dispatch): the sum bit
    for bit elementwise.add's, in place on a too, and the norm bit for bit rms_norm's of that sum
    (f16: converted as collective.convert converts)."""
    from llamavk.kernels.collective import convert
    from llamavk.kernels.norm import add_rms_norm
    rows, cols = 37, 4096
    rng = np.random.default_rng(9)
    a = (rng.standard_normal((rows, cols)) * 3).astype(np.float32)
    b = rng.standard_normal((rows, cols)).astype(np.float32)
    w = rng.standard_normal(cols).astype(np.float32)
    av, a_mem = host(dev, a)
    bv, wv = upload(dev, b), upload(dev, w)
    h, h_mem = (av, a_mem) if in_place else poisoned(dev, a.shape)
    ref_h, ref_h_mem = poisoned(dev, a.shape)
    ref_n, ref_n_mem = poisoned(dev, a.shape)
    ref16, ref16_mem = poisoned(dev, a.shape, np.float16)
    out, out_mem = poisoned(dev, a.shape, np.float16 if out_f16 else np.float32)
    run(dev, lambda s: (add(s, kc, av, bv, ref_h, a.size), rms_norm(s, kc, ref_h, ref_n, rows, cols, 1e-6, weight=wv),
                        convert(s, kc, ref_n, ref16, "f16", a.size),
                        add_rms_norm(s, kc, av, bv, h, out, rows, cols, 1e-6, wv, out_f16=out_f16)))
    np.testing.assert_array_equal(h_mem, a + b if not in_place else ref_h_mem)
    np.testing.assert_array_equal(h_mem, ref_h_mem)
    want = ref16_mem if out_f16 else ref_n_mem
    np.testing.assert_array_equal(out_mem.view(np.uint16 if out_f16 else np.uint32), want.view(np.uint16 if out_f16 else np.uint32))
    np.testing.assert_allclose(ref_n_mem, ref_rms_norm(a + b, w, 1e-6), rtol=2e-5, atol=2e-5)


def test_add_in_place(dev, kc):
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal((17, 576)).astype(np.float32), rng.standard_normal((17, 576)).astype(np.float32)
    xv, mem = host(dev, x)
    run(dev, lambda s: add(s, kc, xv, upload(dev, y), xv, x.size))
    np.testing.assert_array_equal(mem, x + y)


@pytest.mark.parametrize("n_tokens,width", [(1, 576), (3, 64 * 3), (70, 1000)])
def test_add_bias(dev, kc, n_tokens, width):
    rng = np.random.default_rng(width)
    x = rng.standard_normal((n_tokens, width)).astype(np.float32)
    bias = rng.standard_normal(width).astype(np.float32)
    # one extra poisoned row after x: add_bias must not touch it
    buf_view, mem = host(dev, np.concatenate([x, np.full((1, width), np.nan, np.float32)]))
    xv = View(buf_view.buffer, 0, x.nbytes)
    run(dev, lambda s: add_bias(s, kc, xv, upload(dev, bias), n_tokens, width))
    np.testing.assert_array_equal(mem[:n_tokens], x + bias)
    assert np.all(np.isnan(mem[n_tokens]))


# -- rope ----------------------------------------------------------------------------------------

def ref_rope(x, positions, head_dim, dim, base, neox, freq_scale=1.0, ext_factor=0.0, attn_factor=1.0,
             orig_ctx=0, beta_fast=32.0, beta_slow=1.0, freqs=None):
    """Independent numpy RoPE (float64): x = [n_tokens][n_heads * head_dim]."""
    n_tok = x.shape[0]
    xh = x.reshape(n_tok, -1, head_dim).astype(np.float64)
    i = np.arange(dim // 2)
    inv = 1.0 / base ** (2.0 * i / dim)
    if freqs is not None:
        inv = inv / freqs
    th_extrap = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    th = freq_scale * th_extrap
    msc = attn_factor
    if ext_factor:
        def cdim(n_rot):
            return dim * math.log(orig_ctx / (n_rot * 2 * math.pi)) / (2 * math.log(base))
        lo, hi = max(0, math.floor(cdim(beta_fast))), min(dim - 1, math.ceil(cdim(beta_slow)))
        ramp = (1 - np.clip((i - lo) / max(0.001, hi - lo), 0, 1)) * ext_factor
        th = th * (1 - ramp) + th_extrap * ramp
        msc *= 1 + 0.1 * math.log(1 / freq_scale)
    c, s = (np.cos(th) * msc)[:, None, :], (np.sin(th) * msc)[:, None, :]
    out = xh.copy()
    if neox:
        a, b = xh[..., : dim // 2], xh[..., dim // 2: dim]
        out[..., : dim // 2], out[..., dim // 2: dim] = a * c - b * s, a * s + b * c
    else:
        a, b = xh[..., 0:dim:2], xh[..., 1:dim:2]
        out[..., 0:dim:2], out[..., 1:dim:2] = a * c - b * s, a * s + b * c
    return out.reshape(x.shape)


def make_cfg(head_dim, n_head, rope_dim, base, neox, scaling=None):
    return ModelConfig(arch="llama", n_vocab=16, n_embd=n_head * head_dim, n_layer=1, n_head=n_head,
                       n_head_kv=n_head, head_dim=head_dim, n_ff=16, n_ctx_train=4096, rms_eps=1e-5,
                       rope_base=base, rope_dim=rope_dim, rope_neox=neox, rope_scaling=scaling,
                       qkv_bias=False, qk_norm=False, tied_output=False)


ROPE_CASES = {
    "llama": dict(head_dim=64, n_heads=9, rope_dim=64, base=10000.0, neox=False),
    "neox": dict(head_dim=128, n_heads=4, rope_dim=128, base=1000000.0, neox=True),
    "partial-neox": dict(head_dim=64, n_heads=3, rope_dim=32, base=10000.0, neox=True),
    "partial-norm": dict(head_dim=64, n_heads=2, rope_dim=48, base=10000.0, neox=False),
    "linear": dict(head_dim=64, n_heads=3, rope_dim=64, base=10000.0, neox=False,
                   scaling=RopeScaling("linear", 4.0, 2048)),
    "yarn": dict(head_dim=128, n_heads=2, rope_dim=128, base=10000.0, neox=True,
                 scaling=RopeScaling("yarn", 4.0, 4096, attn_factor=0.9, ext_factor=1.0)),
    "freqs": dict(head_dim=128, n_heads=8, rope_dim=128, base=500000.0, neox=False, freqs=True),
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
@pytest.mark.parametrize("n_tokens,n_past", [(1, 0), (3, 100), (70, 0), (17, 1000)])
def test_rope(dev, kc, case, n_tokens, n_past):
    c = dict(ROPE_CASES[case])
    use_freqs = c.pop("freqs", False)
    hd, nh = c["head_dim"], c["n_heads"]
    cfg = make_cfg(hd, nh, c["rope_dim"], c["base"], c["neox"], c.get("scaling"))
    rng = np.random.default_rng(n_tokens * 7 + n_past)
    freqs = rng.uniform(1.0, 8.0, c["rope_dim"] // 2).astype(np.float32) if use_freqs else None
    params = RopeParams.from_config(cfg, upload(dev, freqs) if use_freqs else None)
    x = rng.standard_normal((n_tokens, nh * hd)).astype(np.float32)
    xv, mem = host(dev, x)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    run(dev, lambda s: rope(s, kc, xv, step, n_tokens, nh, hd, params))

    positions = np.arange(n_past, n_past + n_tokens)
    s = cfg.rope_scaling
    kw = {}
    if s is not None:
        kw = dict(freq_scale=1 / s.factor, attn_factor=s.attn_factor, orig_ctx=s.orig_ctx,
                  ext_factor=s.ext_factor if s.type == "yarn" else 0.0, beta_fast=s.beta_fast, beta_slow=s.beta_slow)
    ref = ref_rope(x, positions, hd, c["rope_dim"], c["base"], c["neox"], freqs=freqs, **kw)
    # f32 angles at position ~1000 carry ~1e-4 absolute error
    tol = 2e-5 + 2e-7 * (n_past + n_tokens)
    np.testing.assert_allclose(mem, ref, rtol=0, atol=tol * 4)
    # and the project's numpy reference forward pass
    cos, sin = rope_cos_sin(cfg, positions, freqs)
    ref2 = apply_rope(x.reshape(n_tokens, nh, hd), cos, sin, cfg.rope_neox).reshape(x.shape)
    np.testing.assert_allclose(mem, ref2, rtol=0, atol=tol * 4)


@pytest.mark.parametrize("case", ["llama", "partial-neox", "freqs"])
@pytest.mark.parametrize("n_tokens,n_past,seq_len", [(70, 0, 32), (17, 40, 16), (5, 3, 4), (9, 0, 9)])
def test_rope_several_sequences(dev, kc, case, n_tokens, n_past, seq_len):
    """seq_len > 0: row n_past + t turns by its position in its own sequence, (n_past + t) % seq_len."""
    c = dict(ROPE_CASES[case])
    use_freqs = c.pop("freqs", False)
    hd, nh = c["head_dim"], c["n_heads"]
    rng = np.random.default_rng(n_tokens * 5 + seq_len)
    freqs = rng.uniform(1.0, 8.0, c["rope_dim"] // 2).astype(np.float32) if use_freqs else None
    params = RopeParams.from_config(make_cfg(hd, nh, c["rope_dim"], c["base"], c["neox"]),
                                    upload(dev, freqs) if use_freqs else None)
    x = rng.standard_normal((n_tokens, nh * hd)).astype(np.float32)
    xv, mem = host(dev, x)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens, seq_len)
    run(dev, lambda s: rope(s, kc, xv, step, n_tokens, nh, hd, params))
    positions = np.arange(n_past, n_past + n_tokens) % seq_len
    ref = ref_rope(x, positions, hd, c["rope_dim"], c["base"], c["neox"], freqs=freqs)
    np.testing.assert_allclose(mem, ref, rtol=0, atol=1e-4)


def test_rope_replay_reads_n_past_at_run_time(dev, kc):
    hd, nh, n_tokens = 64, 9, 5
    cfg = make_cfg(hd, nh, hd, 10000.0, False)
    params = RopeParams.from_config(cfg)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((n_tokens, nh * hd)).astype(np.float32)
    xv, mem = host(dev, x)
    step, smem = step_buffer(dev)
    seq = record(dev, lambda s: rope(s, kc, xv, step, n_tokens, nh, hd, params))
    for n_past in (0, 37, 1, 900):
        mem[...] = x
        set_step(smem, n_past, n_tokens)
        seq.run()
        ref = ref_rope(x, np.arange(n_past, n_past + n_tokens), hd, hd, 10000.0, False)
        np.testing.assert_allclose(mem, ref, rtol=0, atol=3e-4)
    seq.close()


# -- kv_store ------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_tokens,n_past", [(1, 0), (3, 5), (17, 100)])
def test_kv_store(dev, kc, n_tokens, n_past):
    n_ctx, width = 128, 3 * 64
    rng = np.random.default_rng(n_past)
    src = rng.standard_normal((n_tokens, width)).astype(np.float32) * 10
    sentinel = np.full((n_ctx, width), 7.0, dtype=np.float16)
    cv, cache = host(dev, sentinel)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    run(dev, lambda s: kv_store(s, kc, upload(dev, src), cv, step, n_tokens, width))
    expect = sentinel.copy()
    expect[n_past:n_past + n_tokens] = src.astype(np.float16)
    np.testing.assert_array_equal(cache, expect)


# -- attention -----------------------------------------------------------------------------------

def ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, seq_len=0, window=0, scale=0.0):
    """Causal GQA softmax attention in float64 over the (already f16) cache rows 0..n_past+n_tokens.
    seq_len > 0: row p sees only rows p // seq_len * seq_len .. p (its own sequence); window > 0: only
    rows after p - window; scale: the q.k scale (0: 1/sqrt(hd)). Rows nobody sees may hold NaN."""
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


def attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_kv_filled, seed, q_scale=1.0):
    """Caches with random f16 rows below n_kv_filled and NaN above (must never be read)."""
    rng = np.random.default_rng(seed)
    width = n_head_kv * hd
    kc_ = np.full((n_ctx, width), np.nan, dtype=np.float16)
    vc_ = np.full((n_ctx, width), np.nan, dtype=np.float16)
    kc_[:n_kv_filled] = rng.standard_normal((n_kv_filled, width)).astype(np.float16)
    vc_[:n_kv_filled] = rng.standard_normal((n_kv_filled, width)).astype(np.float16)
    return kc_, vc_, rng


def attn_tol(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits) -> dict:
    """Tolerance against ref_attention: f32 kernels 1e-4; the cooperative-matrix kernel rounds the
    scaled q and the probabilities to f16 (sums in f32): 4e-3 of these O(1) outputs."""
    coop = plan(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits).kernel.startswith("attention_coop")
    return dict(rtol=4e-3, atol=4e-3) if coop else dict(rtol=1e-4, atol=5e-5)


ATTN_CASES = [
    # n_tokens, n_past, n_head, n_head_kv, head_dim, n_ctx, n_splits (None: recorder's choice)
    (1, 0, 9, 3, 64, 256, None),
    (1, 100, 9, 3, 64, 256, None),
    (1, 100, 9, 3, 64, 256, 1),
    (1, 300, 8, 2, 128, 512, 4),
    (1, 257, 4, 4, 128, 512, 3),
    (3, 0, 4, 4, 128, 128, None),
    (3, 50, 8, 2, 128, 128, 2),
    (17, 5, 8, 2, 128, 256, None),
    (17, 0, 9, 3, 64, 128, 1),
    (70, 0, 9, 3, 64, 128, None),
    (70, 30, 8, 2, 64, 256, 1),
    (5, 200, 4, 2, 256, 256, None),
    # the decode kernel (one token, or <= 4 rows per KV head; head_dim % 32 == 0 up to 256), its fallback
    (2, 37, 4, 2, 96, 256, 2),     # 2 tokens x 2 GQA heads; head_dim 96: some V lanes idle
    (1, 150, 2, 1, 32, 256, 3),    # head_dim 32: one K load per lane and row
    (1, 60, 4, 2, 80, 128, None),  # head_dim 80: generic BR 4 kernel
    (1, 200, 4, 2, 256, 512, 2),   # head_dim 256: 8 K loads per lane, 4 V row groups
    (1, 150, 16, 2, 64, 256, None),   # 8 GQA heads: two row blocks of 4
    (1, 90, 14, 2, 64, 256, 3),    # 7 GQA heads: the second row block has 3 rows
    (1, 33, 14, 2, 64, 256, 1),
]


@pytest.mark.parametrize("n_tokens,n_past,n_head,n_head_kv,hd,n_ctx,n_splits", ATTN_CASES + [
    # many active splits (n_splits given: chunks of one 32-position block), merged 4 splits' loads at a time
    (1, 1200, 8, 2, 128, 1280, 40),   # 38 active splits: 4 batches and a tail
    (3, 1000, 4, 4, 64, 1024, 64),    # 3 tokens, n_splits capped at n_ctx / 32: 32 active splits
    (1, 3000, 8, 2, 64, 4096, 128)])   # 94 active splits (128 recorded, the most a merge takes)
def test_attention(dev, kc, attention_form, n_tokens, n_past, n_head, n_head_kv, hd, n_ctx, n_splits):
    n_kv = n_past + n_tokens
    k_cache, v_cache, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_kv, seed=n_kv * 13 + hd)
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)   # fairly peaked softmax
    kv, vv = upload(dev, k_cache), upload(dev, v_cache)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens)
    run(dev, lambda s: attention(s, kc, upload(dev, q), kv, vv, out, step, n_tokens, n_head, n_head_kv, hd,
                                 n_ctx, n_splits=n_splits))
    ref = ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd)
    np.testing.assert_allclose(mem, ref, **attn_tol(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits))
    kernel = plan(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits).kernel
    assert kernel.startswith("attention_cpu") == (attention_form == "cpu" and not kernel.startswith("attention_dec"))


SEQ_CASES = [
    # n_tokens, n_past, seq_len, n_head, n_head_kv, head_dim, n_ctx, n_splits
    (20, 0, 5, 9, 3, 64, 128, 1),      # BR 8 rows = 2.67 tokens: boundaries inside row blocks
    (24, 0, 5, 4, 4, 64, 128, 1),      # n_gqa 1: a block is 8 tokens, boundaries at 5, 10, 15, 20
    (24, 0, 5, 4, 4, 64, 128, 2),      # the same through the split-KV path
    (300, 0, 100, 8, 2, 64, 384, None),   # sequences start inside 128-position KV blocks
    (64, 64, 48, 8, 2, 64, 256, None),  # a later micro-batch: sequences started before n_past
    (64, 64, 48, 8, 2, 64, 256, 3),
    (1, 200, 150, 8, 2, 128, 512, 4),   # split 0 lies wholly before the sequence: nothing to add
    (6, 250, 64, 4, 2, 64, 384, 3),
    (7, 0, 7, 9, 3, 64, 128, None),     # one whole sequence: the same as seq_len 0
]


@pytest.mark.parametrize("n_tokens,n_past,seq_len,n_head,n_head_kv,hd,n_ctx,n_splits", SEQ_CASES)
def test_attention_several_sequences(dev, kc, attention_form, n_tokens, n_past, seq_len, n_head, n_head_kv, hd,
                                     n_ctx, n_splits):
    n_kv = n_past + n_tokens
    k_cache, v_cache, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_kv, seed=n_kv * 7 + seq_len)
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)
    kv, vv = upload(dev, k_cache), upload(dev, v_cache)
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens, seq_len)
    run(dev, lambda s: attention(s, kc, upload(dev, q), kv, vv, out, step, n_tokens, n_head, n_head_kv, hd,
                                 n_ctx, n_splits=n_splits))
    ref = ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, seq_len)
    np.testing.assert_allclose(mem, ref, **attn_tol(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits))
    if seq_len < n_kv:   # and it differs from attention over everything before each row
        assert not np.allclose(mem, ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd), atol=1e-3)


COOP_CASES = [
    # n_tokens, n_past, seq_len, n_head, n_head_kv, head_dim, n_ctx: 64 query rows per workgroup
    (70, 0, 0, 9, 3, 64, 128),       # 210 rows: the last workgroup has 18; n_kv not a multiple of 32
    (130, 40, 0, 8, 2, 128, 256),    # a later micro-batch: rows start at position 40
    (80, 0, 0, 4, 4, 128, 96),       # one query head per KV head
    (64, 64, 48, 8, 2, 64, 256),     # several sequences, started before n_past
    (300, 0, 100, 8, 2, 64, 384),    # sequence starts inside 32-position blocks
]


@pytest.mark.parametrize("n_tokens,n_past,seq_len,n_head,n_head_kv,hd,n_ctx", COOP_CASES)
def test_attention_coop(dev, kc, n_tokens, n_past, seq_len, n_head, n_head_kv, hd, n_ctx):
    """Prompt attention on cooperative matrices (attention_coop.comp; one KV split, as prompts with
    enough rows get) against the float64 reference; the cache above n_kv is NaN (never read).
    Devices without the tiles skip."""
    if not has_coopmat(kc):
        pytest.skip(f"{dev.info.name} has no cooperative matrices of shape 16x8x16 f16->f32")
    assert plan(kc, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=1).kernel == f"attention_coop_f16_hd{hd}"
    assert plan(kc, 512, 32, 8, hd, 1024).kernel == f"attention_coop_f16_hd{hd}"   # a 512-token prompt
    n_kv = n_past + n_tokens
    k_cache, v_cache, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_kv, seed=n_kv * 5 + hd)
    q = (rng.standard_normal((n_tokens, n_head * hd)) * 3).astype(np.float32)   # fairly peaked softmax
    out, mem = poisoned(dev, q.shape)
    step, smem = step_buffer(dev)
    set_step(smem, n_past, n_tokens, seq_len)
    out16, mem16 = poisoned(dev, q.shape, np.float16)
    args = (upload(dev, q), upload(dev, k_cache), upload(dev, v_cache))
    run(dev, lambda s: (attention(s, kc, *args, out, step, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=1),
                        attention(s, kc, *args, out16, step, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=1,
                                  out_f16=True)))
    ref = ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd, seq_len)
    np.testing.assert_allclose(mem, ref, rtol=4e-3, atol=4e-3)
    # out_f16 (an output projection reading its x as f16): the same values rounded to f16
    np.testing.assert_array_equal(mem16.view(np.uint16), mem.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("n_splits", [None, 1, 5])
def test_attention_replay_decode(dev, kc, attention_form, n_splits):
    """One recording (kv_store + attention, decode), replayed as the cache grows."""
    n_head, n_head_kv, hd, n_ctx = 8, 2, 64, 640
    width = n_head_kv * hd
    k_full, v_full, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_ctx, seed=5)
    kcache, kmem = host(dev, np.full((n_ctx, width), np.nan, np.float16))
    vcache, vmem = host(dev, np.full((n_ctx, width), np.nan, np.float16))
    q_view, q_mem = host(dev, np.zeros((1, n_head * hd), np.float32))
    k_new, k_mem = host(dev, np.zeros((1, width), np.float32))
    v_new, v_mem = host(dev, np.zeros((1, width), np.float32))
    out, omem = poisoned(dev, (1, n_head * hd))
    step, smem = step_buffer(dev)

    def rec(s):
        kv_store(s, kc, k_new, kcache, step, 1, width)
        kv_store(s, kc, v_new, vcache, step, 1, width)
        attention(s, kc, q_view, kcache, vcache, out, step, 1, n_head, n_head_kv, hd, n_ctx, n_splits=n_splits)

    seq = record(dev, rec)
    for n_past in (0, 1, 127, 128, 129, 300, 639):
        kmem[:n_past] = k_full[:n_past]
        vmem[:n_past] = v_full[:n_past]
        kmem[n_past:] = np.nan
        vmem[n_past:] = np.nan
        k_mem[...] = k_full[n_past].astype(np.float32)
        v_mem[...] = v_full[n_past].astype(np.float32)
        q = (rng.standard_normal((1, n_head * hd)) * 2).astype(np.float32)
        q_mem[...] = q
        omem[...] = np.nan
        set_step(smem, n_past, 1)
        seq.run()
        ref = ref_attention(q, k_full, v_full, n_past, n_head, n_head_kv, hd)
        np.testing.assert_allclose(omem, ref, rtol=1e-4, atol=5e-5, err_msg=f"n_past={n_past}")
    seq.close()


def test_attention_replay_prefill(dev, kc):
    """A prefill recording (n_tokens = 6) replayed at several n_past, split path included."""
    n_tokens, n_head, n_head_kv, hd, n_ctx = 6, 9, 3, 64, 384
    k_cache, v_cache, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_ctx, seed=9)
    kv, vv = upload(dev, k_cache), upload(dev, v_cache)
    q_view, q_mem = host(dev, np.zeros((n_tokens, n_head * hd), np.float32))
    outs = [poisoned(dev, (n_tokens, n_head * hd)) for _ in range(2)]
    step, smem = step_buffer(dev)

    def rec(s):
        attention(s, kc, q_view, kv, vv, outs[0][0], step, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=1)
        attention(s, kc, q_view, kv, vv, outs[1][0], step, n_tokens, n_head, n_head_kv, hd, n_ctx, n_splits=3)

    seq = record(dev, rec)
    for n_past in (0, 10, 200, n_ctx - n_tokens):
        q = rng.standard_normal((n_tokens, n_head * hd)).astype(np.float32)
        q_mem[...] = q
        for _, m in outs:
            m[...] = np.nan
        set_step(smem, n_past, n_tokens)
        seq.run()
        ref = ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd)
        for _, m in outs:
            np.testing.assert_allclose(m, ref, rtol=1e-4, atol=5e-5, err_msg=f"n_past={n_past}")
    seq.close()


def test_split_plan(monkeypatch):
    """Grid from n_ctx (~ the target workgroup count), min_chunk positions per active split; env overrides."""
    monkeypatch.delenv("LLAMAVK_ATTN_SPLITS", raising=False)
    monkeypatch.delenv("LLAMAVK_ATTN_MIN_CHUNK", raising=False)

    class Info:
        is_cpu = False

    class KC:
        info = Info()

    gpu = KC()
    assert split_plan(gpu, 4224, 8, 1) == (33, 128)          # 7.2B decode: up to 33 splits of 128
    assert split_plan(gpu, 65536, 8, 1) == (64, 128)         # 512 workgroups
    assert split_plan(gpu, 65536, 2, 1) == (MAX_SPLITS, 128)
    assert split_plan(gpu, 200, 8, 1) == (2, 128)
    assert split_plan(gpu, 4224, 8, 64) == (1, 128)          # prefill: enough row blocks
    assert split_plan(gpu, 4224, 8, 1, block=32) == (33, 128)   # the decode kernel, same plan
    monkeypatch.setenv("LLAMAVK_ATTN_MIN_CHUNK", "1000")
    assert split_plan(gpu, 4224, 8, 1) == (5, 1024)          # rounded up to a multiple of ATTN_WG
    monkeypatch.setenv("LLAMAVK_ATTN_MIN_CHUNK", "1")
    monkeypatch.setenv("LLAMAVK_ATTN_SPLITS", "40")
    assert split_plan(gpu, 4224, 8, 1) == (33, ATTN_WG)      # no more splits than n_ctx can use
    assert split_plan(gpu, 4224, 8, 1, block=32) == (40, 32)
    Info.is_cpu = True
    monkeypatch.delenv("LLAMAVK_ATTN_SPLITS")
    monkeypatch.delenv("LLAMAVK_ATTN_MIN_CHUNK")
    assert split_plan(gpu, 4224, 2, 1) == (4, 1024)


def replay_decode(dev, kc, n_head, n_head_kv, hd, n_ctx, n_pasts, seed, active=None, **kw):
    """One decode recording (attention only, caches filled up front), replayed at each n_past.
    active(n_kv): the number of splits expected to write partial results (checked in the scratch)."""
    k_cache, v_cache, rng = attn_setup(dev, n_ctx, n_head, n_head_kv, hd, n_ctx, seed=seed)
    kv, vv = upload(dev, k_cache), upload(dev, v_cache)
    q_view, q_mem = host(dev, np.zeros((1, n_head * hd), np.float32))
    out, omem = poisoned(dev, (1, n_head * hd))
    step, smem = step_buffer(dev)
    seq = record(dev, lambda s: attention(s, kc, q_view, kv, vv, out, step, 1, n_head, n_head_kv, hd, n_ctx, **kw))
    for n_past in n_pasts:
        q = (rng.standard_normal((1, n_head * hd)) * 2).astype(np.float32)
        q_mem[...] = q
        omem[...] = np.nan
        set_step(smem, n_past, 1)
        if active:
            ml = kc._shared["attention splits"][(kw["n_splits"], n_head, hd, n_head_kv)][1]
            ml.write(np.full(kw["n_splits"] * n_head * 2, np.nan, np.float32))
        seq.run()
        ref = ref_attention(q, k_cache, v_cache, n_past, n_head, n_head_kv, hd)
        np.testing.assert_allclose(omem, ref, rtol=1e-4, atol=5e-5, err_msg=f"n_past={n_past} {kw}")
        if active:
            written = ~np.isnan(np.frombuffer(ml.read(), np.float32).reshape(kw["n_splits"], -1)).all(axis=1)
            n = active(n_past + 1)
            assert written.tolist() == [n > 1 and sp < n for sp in range(kw["n_splits"])], f"n_past={n_past}"
    seq.close()


@pytest.mark.parametrize("mode", ["1", "0"])
def test_attention_min_chunk(dev, kc, monkeypatch, portable_attention, mode):
    """8 splits recorded, at least 256 positions each: 1 active split up to n_kv 256 (written
    directly), then 2, 3, ... 8 (merged), back to 1: the counters stay consistent. Both one-token
    kernels: LLAMAVK_ATTN_DECODE 1 (attention_decode.comp, chunks in blocks of 32), 0 (attention.comp,
    blocks of 128)."""
    monkeypatch.setenv("LLAMAVK_ATTN_DECODE", mode)
    monkeypatch.setenv("LLAMAVK_ATTN_ROWS", "4")   # the scratch looked at is the 4-row form's
    block = DEC_BLOCK if mode == "1" else ATTN_WG

    def active(n_kv):
        chunk = max(math.ceil(math.ceil(n_kv / 8) / block) * block, 256)
        return math.ceil(n_kv / chunk)

    replay_decode(dev, kc, 8, 2, 128, 2048, (0, 5, 255, 256, 300, 511, 513, 1000, 2047, 100, 1500),
                  seed=21, active=active, n_splits=8, min_chunk=256)


@pytest.mark.parametrize("rows", ["1", "2", "4", "1:100", "2:40"])
@pytest.mark.parametrize("long_context", [False, True])
def test_attention_decode_rows_per_workgroup(dev, kc, monkeypatch, portable_attention, rows, long_context):
    """The one-token decode kernel with 1, 2 or 4 query rows per workgroup (attention_decode.comp BR,
    LLAMAVK_ATTN_ROWS), alone or up to an n_kv and the 4-row form beyond it: a step recorded for either
    side (long_context) takes its form and is right at every n_kv, on both sides of the limit (a
    recording's form is a speed choice). 8 GQA rows of one KV head (8 / 4 / 2 row blocks), 3 rows per
    KV head (the last block part-filled at BR 2 and 4), merged splits, head dims 64 / 128 / 256,
    against numpy."""
    monkeypatch.setenv("LLAMAVK_ATTN_ROWS", rows)
    br, _, limit = rows.partition(":")
    two = br != "4" and bool(limit)
    assert long_context_from(kc, 1, 8, 1, 64, 512) == (int(limit) if two else None)
    # the short form's split grid planned for the positions up to the limit, the long form's for the span
    assert decode_form(kc, 1, 8, 1, 64, 512, long_context) == ((4, 512) if long_context and two else
                                                               (int(br), min(512, int(limit or 512))))
    assert decode_form(kc, 1, 8, 1, 64, 30, long_context) == (int(br), 30)   # a span within the limit
    assert decode_form(kc, 2, 8, 1, 64, 512, long_context) == (4, 512)
    pl = plan(kc, 1, 8, 1, 64, 512, decode_rows=int(br))
    assert pl.kernel.startswith("attention_dec") and pl.grid[0] == 8 // int(br) and pl.spec[-1] == int(br)
    assert plan(kc, 1, 8, 1, 64, 4224, decode_rows=int(br)).n_splits == plan(kc, 1, 8, 1, 64, 4224).n_splits
    kw = dict(long_context=long_context)
    replay_decode(dev, kc, 8, 1, 64, 512, (0, 31, 32, 99, 100, 200, 511, 40), seed=31, n_splits=1, **kw)
    replay_decode(dev, kc, 6, 2, 128, 1024, (5, 39, 40, 99, 300, 700, 20), seed=32, n_splits=4, min_chunk=64, **kw)
    replay_decode(dev, kc, 4, 4, 256, 300, (100, 299), seed=33, n_splits=1, **kw)


def test_attention_many_splits(dev, kc, portable_attention):
    """n_kv ~4096 over 33 splits of 128 positions (the merge's batches of 4 splits and a batch of
    one), odd n_kv included, and MAX_SPLITS active splits."""
    replay_decode(dev, kc, 8, 2, 128, 4224, (4000, 4095, 4223), seed=22, n_splits=33)
    replay_decode(dev, kc, 4, 1, 64, MAX_SPLITS * ATTN_WG, (MAX_SPLITS * ATTN_WG - 1, 5000), seed=23,
                  n_splits=MAX_SPLITS)


def test_attention_default_plan_long(dev, kc, monkeypatch, portable_attention):
    """The recorder's own plan at a long context, with a GPU-like minimum chunk."""
    monkeypatch.setenv("LLAMAVK_ATTN_MIN_CHUNK", "256")
    monkeypatch.setenv("LLAMAVK_ATTN_SPLITS", "16")
    replay_decode(dev, kc, 8, 2, 128, 4224, (3, 700, 4001), seed=24)
