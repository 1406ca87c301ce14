"""The matrix-vector kernel's fused forms (decode): RMS norm of the input, residual add, chunks."""

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from llamavk.kernels import KernelCache, View, upload_qweight
from llamavk.kernels.matmul import matmul
from llamavk.quant import quant_info
from llamavk.vk import Buffer, CommandSequence

from .test_kernels_matmul import make_weight


def f32(dev, a):
    buf = Buffer(dev, max(4, a.nbytes), host_visible=True)
    buf.array(np.float32, a.size)[:] = a.reshape(-1)
    return buf


@pytest.mark.parametrize("qtype,cols", [(T.Q4_0, 96), (T.Q8_0, 160), (T.Q4_K, 256), (T.F16, 100), (T.Q6_K, 512),
                                        (T.IQ4_NL, 96), (T.IQ4_XS, 256), (T.MXFP4, 160)])
@pytest.mark.parametrize("n_tokens", [1, 3])
@pytest.mark.parametrize("chunked", [False, True])
def test_norm_and_residual_fused(dev, qtype, cols, n_tokens, chunked, matvec_form):
    rows, eps = 37, 1e-5
    rng = np.random.default_rng(cols + n_tokens)
    raw, w = make_weight(qtype, rows, cols, seed=cols)
    x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
    nw = rng.uniform(0.5, 1.5, cols).astype(np.float32)
    res = rng.standard_normal((n_tokens, rows)).astype(np.float32)
    bias = rng.standard_normal(rows).astype(np.float32)
    kc = KernelCache(dev)
    qw = upload_qweight(dev, raw, qtype, rows, cols, max_chunk_bytes=raw.shape[1] * 5 if chunked else None)
    X, N, R, B = f32(dev, x), f32(dev, nw), f32(dev, res), f32(dev, bias)
    Y = f32(dev, np.full((n_tokens, rows), np.nan, np.float32))
    seq = CommandSequence(dev).begin()
    matmul(seq, kc, qw, View.whole(X), View.whole(Y), n_tokens, bias=View.whole(B), norm=View.whole(N), eps=eps,
           residual=View.whole(R))
    seq.end().run()
    xd = x.astype(np.float64)
    xn = xd / np.sqrt((xd ** 2).mean(axis=1, keepdims=True) + eps) * nw
    want = res + bias + xn @ w.T
    got = Y.array(np.float32, n_tokens * rows).reshape(n_tokens, rows)
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()


@pytest.mark.parametrize("qtype,cols", [(T.Q4_0, 96), (T.Q6_K, 256), (T.F32, 50)])
def test_glu_input_fused(dev, qtype, cols, matvec_form):
    """x' = silu(gate) * up (the SwiGLU feeding the FFN down product), with a residual; large negative
    gates must give 0, not NaN."""
    rows, n_tokens = 21, 2
    rng = np.random.default_rng(cols)
    raw, w = make_weight(qtype, rows, cols, seed=cols + 7)
    gate = (rng.standard_normal((n_tokens, cols)) * 4).astype(np.float32)
    gate[0, :3] = [-200.0, -1e4, 90.0]
    up = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    res = rng.standard_normal((n_tokens, rows)).astype(np.float32)
    kc = KernelCache(dev)
    qw = upload_qweight(dev, raw, qtype, rows, cols)
    G, Up, R = f32(dev, gate), f32(dev, up), f32(dev, res)
    Y = f32(dev, np.full((n_tokens, rows), np.nan, np.float32))
    seq = CommandSequence(dev).begin()
    matmul(seq, kc, qw, View.whole(G), View.whole(Y), n_tokens, residual=View.whole(R), glu=View.whole(Up))
    seq.end().run()
    g64 = gate.astype(np.float64)
    xin = g64 / (1.0 + np.exp(np.minimum(-g64, 700))) * up
    want = res + xin @ w.T
    got = Y.array(np.float32, n_tokens * rows).reshape(n_tokens, rows)
    assert np.isfinite(got).all()
    assert np.abs(got - want).max() <= 1e-3 * np.abs(want).max()


# --- matrix-vector kernel variants (llamavk/kernels/matmul.py MATVEC_KERNELS), forced through the
# LLAMAVK_MATVEC override: every fused input, 1..8 tokens, rows not a multiple of a workgroup's rows,
# units per row not a multiple of a step's, chunked weights.
from llamavk.kernels import matmul as mm  # noqa: E402
from llamavk.errors import LlamavkError  # noqa: E402
from llamavk.kernels.matmul import MatvecConfig, matvec_config, parse_matvec_env  # noqa: E402

# name -> (config, token counts): every count through the smallest unrolling; llvmpipe compiles the
# larger ones (NR x U x NT unrolled) slowly, so those take a few.
# xs: x staged in shared memory (not for Q4_K at 5 tokens: over MATVEC_XS_BYTES) or read directly.
VARIANTS = {
    "wide-dq0": (MatvecConfig(64, 2, 1, 1, "wide", 0, 1), range(1, 9)),
    "wide-dq1-ks2": (MatvecConfig(64, 3, 2, 2, "wide", 1, 0), (1, 2)),   # llvmpipe: 8 subgroups, 4 row groups
    "wide-dq1-ks2-xs": (MatvecConfig(64, 3, 2, 2, "wide", 1, 1), (1, 2)),
    "wide-dq2-u3": (MatvecConfig(32, 2, 1, 3, "wide", 2, 1), (1, 5)),
}
# cols: units per row not a multiple of S * U (13 Q4_0/Q8_0 blocks, 12 Q4_K quarters)
VARIANT_TYPES = [(T.Q4_0, 416), (T.Q8_0, 416), (T.Q4_K, 768)]


def dot8_levels(x, group=32):
    """x as the stream kernel's DOT8 form stages it (matvec_stream.comp header): per 32 values (Q6_K:
    16) s = max|x| / 127, h = round(x / s), l = round((x - s h) / (s / 254)); x ~ s (h + l / 254)."""
    xb = x.reshape(-1, group).astype(np.float32)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    s, inv = amax / 127, np.where(amax > 0, 127 / np.where(amax > 0, amax, 1), 0)
    h = np.round(xb * inv)
    lo = np.clip(np.round((xb - h * s) * (254 * inv)), -127, 127)
    return (s.astype(np.float64) * (h + lo / 254)).reshape(x.shape)


# DOT8 takes these types' quants as they are and the offset (Q6_K's -32 per weight) through the f32
# sums of x, not of x as rounded: the block's quant bytes (Q6_K: ql and qh), zeroed, leave that offset.
OFFSET_BYTES = {T.Q6_K: 192}


def run_fused(dev, kc, qtype, rows, cols, n_tokens, seed, chunked=False, bias=False, norm=False, resid=False,
              glu=False, pair=False, tol=1e-3, x_levels=False, per_term=False):
    """x_levels: the reference takes x as the DOT8 form rounds it (no fused input; an int: per that
    many values instead of 32): the kernel's own arithmetic, apart from the rounding it is built on
    (for a type whose offset DOT8 takes through the exact sums of x, OFFSET_BYTES: that part of w
    against x as it is).
    per_term: the error relative to the largest row sum of |w| |x'| (what bounds a sum's f32
    rounding, whatever its terms cancel to) rather than to the largest result."""
    eps = 1e-5
    rng = np.random.default_rng(seed)
    raw, w = make_weight(qtype, rows, cols, seed=seed)
    x = (rng.standard_normal((n_tokens, cols)) * 3).astype(np.float32)
    xd = dot8_levels(x, 32 if x_levels is True else x_levels) if x_levels else x.astype(np.float64)
    qw = upload_qweight(dev, raw, qtype, rows, cols, max_chunk_bytes=raw.shape[1] * 5 if chunked else None)
    assert (len(qw.chunks) > 1) == chunked
    X = f32(dev, x)
    Y = f32(dev, np.full((n_tokens, rows), np.nan, np.float32))
    kw, want = {}, np.zeros((n_tokens, rows))
    if norm:
        nw = rng.uniform(0.5, 1.5, cols).astype(np.float32)
        xd = xd / np.sqrt((xd ** 2).mean(axis=1, keepdims=True) + eps) * nw
        kw.update(norm=View.whole(f32(dev, nw)), eps=eps)
    if glu:
        x[0, :2] = [-200.0, -1e4]
        up = rng.standard_normal((n_tokens, cols)).astype(np.float32)
        X = f32(dev, x)
        g64 = x.astype(np.float64)
        xd = g64 / (1.0 + np.exp(np.minimum(-g64, 700))) * up
        kw.update(glu=View.whole(f32(dev, up)))
    if resid:
        res = rng.standard_normal((n_tokens, rows)).astype(np.float32)
        want = want + res
        kw.update(residual=View.whole(f32(dev, res)))
    if bias:
        b = rng.standard_normal(rows).astype(np.float32)
        want = want + b
        kw.update(bias=View.whole(f32(dev, b)))
    if x_levels and qtype in OFFSET_BYTES:
        blocks = raw.reshape(rows, -1, quant_info(qtype).type_size).copy()
        blocks[:, :, :OFFSET_BYTES[qtype]] = 0   # every quant 0: each weight's offset term alone
        w_off = np.asarray(quants.dequantize(blocks.reshape(rows, -1), qtype), np.float64).reshape(rows, cols)
        want = want + xd @ (w - w_off).T + x.astype(np.float64) @ w_off.T
    else:
        want = want + xd @ w.T
    scale = (np.abs(xd) @ np.abs(w).T).max() if per_term else np.abs(want).max()
    if pair:   # y = silu(W x') * (P x'), P of W's type, shape and chunking; errors of both products
        raw_p, wp = make_weight(qtype, rows, cols, seed=seed + 100)
        kw.update(pair=upload_qweight(dev, raw_p, qtype, rows, cols,
                                      max_chunk_bytes=raw.shape[1] * 5 if chunked else None))
        silu, up = want / (1.0 + np.exp(np.minimum(-want, 700))), xd @ wp.T
        want, scale = silu * up, np.abs(silu).max() * np.abs(up).max()
    seq = CommandSequence(dev).begin()
    matmul(seq, kc, qw, View.whole(X), View.whole(Y), n_tokens, **kw)
    seq.end().run()
    got = Y.array(np.float32, n_tokens * rows).reshape(n_tokens, rows)
    assert np.isfinite(got).all(), "some outputs were not written"
    err = np.abs(got - want).max() / scale
    assert err <= tol, f"{qtype.name} {rows}x{cols} nt={n_tokens}: relative error {err:.2e}"


@pytest.fixture(scope="module")
def kc_variants(dev):
    return KernelCache(dev)


@pytest.mark.parametrize("qtype,cols", VARIANT_TYPES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_matvec_variant(dev, kc_variants, monkeypatch, qtype, cols, variant):
    cfg, token_counts = VARIANTS[variant]
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    assert matvec_config(kc_variants, qtype, 37, cols).kernel == cfg.kernel
    if qtype == T.Q4_K:   # the slowest to compile; its dequantisation does not depend on DQ
        token_counts = [nt for nt in token_counts if nt in (1, 8)]
    for nt in token_counts:   # plain products, bias and chunks on alternate token counts
        run_fused(dev, kc_variants, qtype, 37 if nt % 2 else 1, cols, nt, seed=nt, chunked=nt % 2 == 1,
                  bias=nt % 4 == 1)
    run_fused(dev, kc_variants, qtype, 37, cols, 3, seed=11, chunked=True, bias=True, norm=True, resid=True)
    run_fused(dev, kc_variants, qtype, 21, cols, 2, seed=12, resid=True, glu=True)


# matvec_cpu.comp (software devices' few-token kernel; test_kernels_matmul.py test_matvec runs every type
# through it) with every fused input, 1 to 8 tokens, rows past the last workgroup's (37, 70) and fewer
# than its lanes (a weight in chunks of 5 rows), a bias; at 8 lanes and at 4 (two vec4 of x a lane, run
# on an 8-lane llvmpipe as half a vector). A planar, a K-quant and a float type.
@pytest.mark.parametrize("lanes", [8, 4])
@pytest.mark.parametrize("qtype,cols", [(T.Q4_0, 320), (T.Q6_K, 512), (T.F16, 96)], ids=lambda v: getattr(v, "name", v))
def test_matvec_cpu(dev, kc_variants, monkeypatch, qtype, cols, lanes):
    if not dev.info.is_cpu or dev.info.subgroup_size < lanes:
        pytest.skip("software devices of at least 4 lanes only")
    from llamavk.kernels import selection
    monkeypatch.setattr(selection, "cpu_product_lanes", lambda kc: lanes)
    assert matvec_config(kc_variants, qtype, 37, cols, 8).kernel == "cpu"
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=1, chunked=True, bias=True, norm=True, resid=True)
    run_fused(dev, kc_variants, qtype, 70, cols, 8, seed=2, resid=True, glu=True)
    run_fused(dev, kc_variants, qtype, 70, cols, 3, seed=3, bias=True)
    assert matvec_config(kc_variants, T.F16, 37, 100).kernel == "base"   # rows not whole 32-weight units


def test_matvec_env_and_fallback(dev, monkeypatch):
    env = parse_matvec_env("q4_0=wide:128,4,1,2 ; q8_0=wide:128,2,1,2,0,0 256,4,2,2")
    assert env["q4_0"] == MatvecConfig(128, 4, 1, 2, "wide", 1, 1)
    assert env["q8_0"] == MatvecConfig(128, 2, 1, 2, "wide", 0, 0)
    assert env["*"] == MatvecConfig(256, 4, 2, 2, "base")
    assert parse_matvec_env(MatvecConfig(64, 2, 1, 1, "wide", 2, 0).spec())["*"] == MatvecConfig(64, 2, 1, 1, "wide", 2, 0)
    for cfg in (MatvecConfig(64, 2, 32, 1, "stream_dp", steps=3), MatvecConfig(64, 2, 32, 1, "stream_dp", xfirst=1),
                MatvecConfig(64, 2, 1, 1, "stream_dp", steps=2, chained_steps=1)):
        assert parse_matvec_env(cfg.spec())["*"] == cfg
    for bad in ("bogus:1,2,3,4", "stream_dp:512,x,1,1", "1,2,3", "stream_dp:1,2,3,4,5,6,7,8", "wide:1,2,3,4,5,6,7"):
        with pytest.raises(LlamavkError):
            parse_matvec_env(bad)
    kc = KernelCache(dev)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {})
    table = matvec_config(kc, T.Q6_K, 8, 256)   # the selection table's (a GPU's: the stream kernel)
    monkeypatch.setattr(mm, "_MATVEC_ENV", parse_matvec_env("wide:64,2,1,1"))
    assert matvec_config(kc, T.Q4_0, 8, 64).kernel == "wide"
    assert matvec_config(kc, T.Q6_K, 8, 256) == table   # no wide Q6_K: the table's config
    # a shape-qualified entry overrides the type's for that shape only
    monkeypatch.setattr(mm, "_MATVEC_ENV", parse_matvec_env("q4_0@8x64=wide:64,2,1,1 q4_0=base:64,4,1,1"))
    assert matvec_config(kc, T.Q4_0, 8, 64).kernel == "wide"
    assert matvec_config(kc, T.Q4_0, 16, 64) == MatvecConfig(64, 4, 1, 1, "base")
    with pytest.raises(LlamavkError):
        parse_matvec_env("q4_0@8by64=wide:64,2,1,1")


# The one-token stream kernel (matvec_stream.comp): lanes per row from the row's units (13 Q4_0/Q8_0
# blocks, 12 Q4_K quarters: idle lanes; 100 blocks at 64 threads: two x chunks, the second partial;
# 4 blocks: 4 lanes per row, fewer than a subgroup's, their sums by a butterfly),
# rows per lane shrunk until the loads fit, every fused input.
# Q6_K (planar, quarter super-blocks: x staged as runs of 16 per unit): 8 units, 8 lanes per row;
# 52 units (idle lanes); 68 units (two x chunks at 64 threads, the second partial).
STREAM_CASES = [(T.Q4_0, 416, 4), (T.Q4_0, 3200, 4), (T.Q4_0, 1024, 8), (T.Q8_0, 416, 2), (T.Q8_0, 3200, 8), (T.Q4_K, 768, 2),
                (T.Q4_K, 4608, 4), (T.Q4_0, 128, 4), (T.Q6_K, 512, 2), (T.Q6_K, 3328, 2), (T.Q6_K, 4352, 4)]


@pytest.mark.parametrize("qtype,cols,rj", STREAM_CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("kernel", ["stream", "stream_dp"])
def test_matvec_stream(dev, kc_variants, monkeypatch, qtype, cols, rj, kernel):
    if kernel == "stream_dp" and not kc_variants.device.features.get("int_dot"):
        pytest.skip("no integer dot products")
    cfg = MatvecConfig(64, rj, 1, 1, kernel)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    assert matvec_config(kc_variants, qtype, 37, cols).kernel == kernel
    assert not matvec_config(kc_variants, qtype, 37, cols, n_tokens=2).kernel.startswith("stream")   # one token
    sg = kc_variants.info.subgroup_size or 32
    tpr, c, rj_used = mm.stream_split(64, sg, mm.type_suffix(qtype), cols, rj, kc_variants.info.max_shared_memory,
                                      dp=kernel == "stream_dp")
    assert tpr * (c - 1) < cols // mm.MATVEC_WIDE_UNIT[mm.type_suffix(qtype)] <= tpr * c
    assert c * rj_used * mm.MATVEC_STREAM_NQ[mm.type_suffix(qtype)] <= mm.MATVEC_STREAM_MAX_LOADS
    # f32 sums: as exact as the other kernels; two int8 levels: x within 1/64516 of its block's largest
    # value (measured 4e-6 .. 3e-5 of the largest output here; one level alone gives ~1e-2)
    tol = 1e-4 if kernel == "stream_dp" else 1e-5
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=1, chunked=True, bias=True, tol=tol)
    if kernel == "stream_dp" and qtype == T.Q6_K:
        # one row's value may be far under the largest output (seed 2, 4352 columns: -269 where the
        # same x gives up to 8000 over 37 rows) while the rounding of x does not shrink with it
        # (relative error 5e-4 of that row); against x rounded as the kernel rounds it, the sums are
        # exact to f32 (4e-7)
        # (x rounded per 16 values: one run of the quarter unit)
        run_fused(dev, kc_variants, qtype, 1, cols, 1, seed=2, tol=1e-5, x_levels=16)
        run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=3, chunked=True, tol=1e-5, x_levels=16)
    else:
        run_fused(dev, kc_variants, qtype, 1, cols, 1, seed=2, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=11, bias=True, norm=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 21, cols, 1, seed=12, resid=True, glu=True, tol=tol)
    # gate and up as one product (the FFN's first half), with and without the norm, chunked weights;
    # not where a lane has room for one row only (its loads of two rows over MATVEC_STREAM_MAX_LOADS)
    pairable = c * 2 * mm.MATVEC_STREAM_NQ[mm.type_suffix(qtype)] <= mm.MATVEC_STREAM_MAX_LOADS
    assert mm.matvec_pairs(kc_variants, *(upload_qweight(dev, make_weight(qtype, 37, cols, seed=s)[0], qtype, 37, cols)
                                          for s in (1, 2))) == pairable
    if pairable:
        # DOT8 takes Q6_K's quants 0..63 against x as rounded, the -32 through x's exact sums: x's
        # rounding weighs up to 63 times a weight's scale instead of 32 (1.1e-4 measured for seed 14's
        # product of two products at 3328 columns)
        tol_pair = 2e-4 if kernel == "stream_dp" and qtype in OFFSET_BYTES else tol
        run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=13, chunked=True, norm=True, pair=True, tol=tol_pair)
        run_fused(dev, kc_variants, qtype, 5, cols, 1, seed=14, pair=True, tol=tol_pair)
    if cols in (3200, 4608, 4352):   # x loaded before the weights (XFIRST): its first chunk of two, every input
        monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": replace(cfg, xfirst=1)})
        run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=15, chunked=True, bias=True, norm=True, resid=True, tol=tol)
        run_fused(dev, kc_variants, qtype, 21, cols, 1, seed=16, glu=True, tol=tol)
        if pairable:
            run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=17, norm=True, pair=True, tol=tol)


@pytest.mark.parametrize("qtype,cols,ks", [(T.Q4_0, 1024, 1), (T.Q8_0, 416, 1), (T.Q4_K, 768, 1), (T.Q4_0, 4096, 32),
                                           (T.Q6_K, 4096, 1), (T.Q6_K, 8192, 16)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_matvec_stream_steps(dev, kc_variants, monkeypatch, qtype, cols, ks):
    """STEPS: each workgroup takes several row blocks (x staged once, the next block's loads issued
    before this one's reduction): a last workgroup with fewer blocks, partial row blocks, chunked
    weights, every fused input, pairs, column parts (the merge per row block)."""
    kernel = "stream_dp" if kc_variants.device.features.get("int_dot") else "stream"
    cfg = MatvecConfig(64, 2, ks, 1, kernel, steps=3, xfirst=int(ks > 1))   # x loaded first: with parts
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    name = mm.type_suffix(qtype)
    spec, rows_per_wg, parts, steps = mm._matvec_spec(kc_variants, cfg, name, cols, 1, False, False, False)
    assert steps == 3 and spec[10] == 3 and 37 > 3 * rows_per_wg   # several workgroups, the last one short
    two_chunks = 2 * 64 * mm.MATVEC_WIDE_UNIT[name]   # 64 lanes per row, 2 units each: x staged in 2 chunks
    assert mm._matvec_spec(kc_variants, replace(cfg, ks=1), name, two_chunks, 1, False, False, False)[3] == 1
    tol = 1e-4 if kernel == "stream_dp" else 1e-5
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=31, chunked=True, bias=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=32, norm=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=33, glu=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=34, chunked=True, norm=True, pair=True, tol=tol)


def test_matvec_stream_wave(dev, kc_variants, monkeypatch):
    """WAVE: the steps follow from the product's rows (its row blocks / wave, rounded up), not the
    config; chunked weights take the largest chunk's; a chained product keeps its chained_steps."""
    kernel = "stream_dp" if kc_variants.device.features.get("int_dot") else "stream"
    cfg = MatvecConfig(64, 2, 1, 1, kernel, wave=4)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    spec, rows_per_wg, _, steps = mm._matvec_spec(kc_variants, cfg, "q4_0", 1024, 1, False, False, False, rows=37)
    assert steps == -(-(-(-37 // rows_per_wg)) // 4) and spec[10] == steps and steps > 1
    assert mm._matvec_spec(kc_variants, cfg, "q4_0", 1024, 1, False, False, False, rows=rows_per_wg)[3] == 1
    tol = 1e-4 if kernel == "stream_dp" else 1e-5
    run_fused(dev, kc_variants, T.Q4_0, 37, 1024, 1, seed=35, chunked=True, bias=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, T.Q4_0, 37, 1024, 1, seed=36, norm=True, pair=True, tol=tol)


@pytest.mark.parametrize("qtype,cols,parts", [(T.Q4_0, 4096, 4), (T.Q8_0, 4096, 4), (T.Q4_K, 4608, 9), (T.Q6_K, 8192, 4)],
                         ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("kernel", ["stream", "stream_dp", "stream_dp+xfirst"])
def test_matvec_stream_column_parts(dev, kc_variants, monkeypatch, qtype, cols, parts, kernel):
    """KSPLIT: parts of up to 32 units, one workgroup each per row block; the last part waits for the
    others' sums and adds them. Every slot must hold the sentinel again after each dispatch (the later
    products reuse them); chunked weights; the norm's sum of squares spans the whole row; pairs add
    both matrices' parts before the silu. XFIRST: x loaded before the weights."""
    kernel, _, xfirst = kernel.partition("+")
    if kernel == "stream_dp" and not kc_variants.device.features.get("int_dot"):
        pytest.skip("no integer dot products")
    cfg = MatvecConfig(64, 2, 32, 1, kernel, xfirst=int(bool(xfirst)))
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    name = mm.type_suffix(qtype)
    assert mm._matvec_spec(kc_variants, cfg, name, cols, 1, False, True, False)[2] == parts
    longer = cols + mm.MATVEC_WIDE_UNIT[name]   # no part size divides it: whole rows (where they fit:
    if mm._stream_layout(kc_variants, cfg, name, longer, cfg.nr) is not None:   # not Q6_K's f32 form here)
        assert mm._matvec_spec(kc_variants, cfg, name, longer, 1, False, True, False)[2] == 1
    tol = 1e-4 if kernel == "stream_dp" else 1e-5
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=21, chunked=True, bias=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=22, chunked=True, glu=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=23, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=24, norm=True, bias=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=25, chunked=True, norm=True, pair=True, tol=tol)
    scratch = kc_variants._shared["column parts"]
    assert scratch
    for buf in scratch.values():
        assert (np.frombuffer(buf.read(), dtype=np.uint32) == mm.PART_SENTINEL).all()


def test_matvec_stream_column_parts_apart(dev, kc_variants, monkeypatch):
    """Where a workgroup cannot wait for another (software devices: llvmpipe ends a shader's loops
    after 65535 iterations in all, so the last part's wait for the others' sums could end early), the
    column parts are recorded as two dispatches per chunk, the merging last part behind a barrier
    (matvec_stream.comp PHASE 1, 2); elsewhere one dispatch per chunk, the last part waiting in it.
    Either way every part's workgroups are counted (a chained consumer waits for that many)."""
    cfg = MatvecConfig(64, 2, 32, 1, "stream")
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    cols = 4096
    _, rows_per_wg, parts, _ = mm._matvec_spec(kc_variants, cfg, "q4_0", cols, 1, False, False, False)
    raw, _ = make_weight(T.Q4_0, 37, cols, seed=41)
    qw = upload_qweight(dev, raw, T.Q4_0, 37, cols, max_chunk_bytes=raw.shape[1] * 20)
    X, Y = f32(dev, np.ones((1, cols), np.float32)), f32(dev, np.zeros((1, 37), np.float32))
    seq = CommandSequence(dev).begin()
    n = matmul(seq, kc_variants, qw, View.whole(X), View.whole(Y), 1)
    seq.end()
    apart = mm._parts_apart(kc_variants)
    assert parts == 4 and len(qw.chunks) == 2 and apart == kc_variants.info.is_cpu
    assert seq.n_dispatches == 2 * (2 if apart else 1) and seq.n_barriers == seq.n_dispatches - 1
    assert n == parts * sum(-(-ch.n_rows // rows_per_wg) for ch in qw.chunks)


def test_matvec_table_by_shape():
    """MATVEC_CONFIGS rows by device, type, tokens and shape (a stand-in GPU with fast integer dots)."""
    from types import SimpleNamespace
    gpu = SimpleNamespace(device=SimpleNamespace(features={"int_dot": True}), info=SimpleNamespace(is_cpu=False, subgroup_size=32, int_dot=True, int_dot_fast=True,
                                               max_shared_memory=49152, max_workgroup_invocations=1024))
    pick = lambda qtype, rows, cols, n=1: matvec_config(gpu, qtype, rows, cols, n).kernel   # noqa: E731
    assert pick(T.Q4_0, 4096, 4096) == "stream_dp"
    assert pick(T.Q4_K, 1024, 4096) == "stream_dp" and matvec_config(gpu, T.Q4_K, 1024, 4096).nr == 2
    nr = lambda qtype, rows, cols: matvec_config(gpu, qtype, rows, cols).nr   # noqa: E731

    def steps(qtype, rows, cols, pair=False):   # row blocks per workgroup of the product as recorded
        cfg = matvec_config(gpu, qtype, rows, cols)
        return mm._matvec_spec(gpu, cfg, mm.type_suffix(qtype), cols, 1, False, False, False, pair, rows=rows)[3]
    # gate / up: 2 rows of each matrix per lane (Q4_K 1); 7 row blocks per workgroup (whole waves on
    # an H100), 2 below 4096 columns
    assert nr(T.Q4_0, 14336, 4096) == nr(T.Q4_0, 8192, 2048) == 4
    assert steps(T.Q4_0, 14336, 4096, True) == 7 and steps(T.Q4_0, 8192, 2048, True) == 2
    assert nr(T.Q4_K, 14336, 4096) == 2 and steps(T.Q4_K, 14336, 4096, True) == 7
    assert steps(T.Q4_K, 4096, 4096) == 2 and steps(T.Q4_K, 1024, 4096) == 1   # Q (and O), not K / V
    # 5120 columns (the 31.5B): 256 lanes per row, so twice the blocks and steps sized to one wave
    assert steps(T.Q4_0, 27648, 5120, True) == 27 and steps(T.Q4_0, 5120, 5120) == 5
    assert steps(T.Q4_K, 27648, 5120, True) == 27
    assert steps(T.Q4_0, 5120, 6912) == 5 and steps(T.Q4_0, 4096, 7168) == 4   # split down products
    # Q/K/V/O: 2 rows per lane; 2 blocks from 4096 columns (and the 1.1B's down product, 2048 x 8192)
    assert nr(T.Q4_0, 4096, 4096) == nr(T.Q4_0, 1024, 4096) == nr(T.Q4_0, 2048, 2048) == 2
    assert steps(T.Q4_0, 4096, 4096) == 2
    assert steps(T.Q4_0, 1024, 4096) == steps(T.Q4_0, 2048, 8192) == 2 and steps(T.Q4_0, 2048, 2048) == 1
    assert nr(T.Q4_0, 32000, 4096) == nr(T.Q8_0, 32000, 4096) == nr(T.Q8_0, 4096, 4096) == 4
    assert steps(T.Q4_0, 32000, 4096) == 8 and steps(T.Q8_0, 4096, 4096) == 1
    # Q8_0's gate/up pair: 1 row of each per lane, one wave of 256 workgroups
    assert nr(T.Q8_0, 14336, 4096) == 2 and steps(T.Q8_0, 14336, 4096, True) == 14
    assert pick(T.Q4_0, 4096, 4096, n=2) == "base"       # one token only
    long_rows = matvec_config(gpu, T.Q4_0, 4096, 14336)   # long rows: parts of 32 units, 256 threads
    assert long_rows.kernel == "stream_dp" and mm._stream_parts(long_rows, "q4_0", 14336) == 14
    assert long_rows.wg == 256 and matvec_config(gpu, T.Q8_0, 4096, 14336).wg == 256
    q4k_down = matvec_config(gpu, T.Q4_K, 4096, 14336)   # 14 parts of 16 units: 16 lanes per row
    assert mm._stream_parts(q4k_down, "q4_k", 14336) == 14 and q4k_down.wg == 256 and q4k_down.xfirst
    assert mm.stream_split(256, 32, "q4_k", 14336 // 14, q4k_down.nr, dp=True) == (16, 1, 2)
    assert long_rows.xfirst
    assert not any(matvec_config(gpu, T.Q4_0, r, c).xfirst
                   for r, c in ((4096, 4096), (14336, 4096), (1024, 4096), (32000, 4096)))
    assert pick(T.Q4_K, 4096, 14336, n=3) == "wide"
    for shape in ((4096, 4096), (14336, 4096), (4096, 14336), (32000, 4096)):   # Q6_K: Q4_K's rows
        assert matvec_config(gpu, T.Q6_K, *shape) == matvec_config(gpu, T.Q4_K, *shape)
    assert pick(T.Q6_K, 4096, 4096, n=3) == "base"
    gpu.info.max_workgroup_invocations = 256
    fallback = matvec_config(gpu, T.Q4_K, 14336, 4096)   # 512 threads do not fit: the next row that does
    assert fallback.kernel == "stream_dp" and fallback.wg == 256
    gpu.info.int_dot_fast = False
    assert pick(T.Q4_0, 4096, 4096) == "base"


def test_chain_edges_per_device_and_override(dev, monkeypatch):
    """selection.chain_edges: none on software devices, LLAMAVK_CHAIN 0 / 1 / letters, a one-line
    error for anything else."""
    from llamavk.kernels.selection import CHAIN_ALL, chain_edges

    kc = KernelCache(dev)
    monkeypatch.delenv("LLAMAVK_CHAIN", raising=False)
    if kc.info.is_cpu:
        assert chain_edges(kc) == ""
    for env, want in (("0", ""), ("1", CHAIN_ALL), ("ao", "ao")):
        monkeypatch.setenv("LLAMAVK_CHAIN", env)
        assert chain_edges(kc) == want
    monkeypatch.setenv("LLAMAVK_CHAIN", "az")
    with pytest.raises(LlamavkError, match="LLAMAVK_CHAIN"):
        chain_edges(kc)
