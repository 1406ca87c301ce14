"""Quantized matrix kernels (llamavk/kernels/matmul.py) on a real Vulkan device against numpy.

Weights come from gguf.quants.quantize where gguf can quantize the type, else random valid blocks
(random bytes with the f16 scale fields set to sane values); the reference is always
gguf.quants.dequantize in float64. Outputs are poisoned with NaN first: every element must be written.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from llamavk.kernels import KernelCache, View, upload_qweight
from llamavk.kernels import matmul as matmul_module
from llamavk.kernels import selection
from llamavk.kernels.matmul import MATVEC_MAX_TOKENS, get_rows, matmul
from llamavk.quant import quant_info
from llamavk.vk import Buffer, CommandSequence


QUANTIZABLE = {T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1}
# Byte offsets of the f16 scale fields of the K-quant and IQ4 blocks (random bytes elsewhere are valid).
F16_FIELDS = {T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,),
              T.IQ4_NL: (0,), T.IQ4_XS: (0,), T.IQ2_XXS: (0,), T.IQ2_XS: (0,), T.IQ2_S: (0,), T.IQ3_XXS: (0,),
              T.IQ3_S: (0,), T.IQ1_S: (0,), T.TQ1_0: (52,), T.TQ2_0: (64,)}
# IQ1_M keeps its f16 scale in the top nibbles of the four 16-bit words from this byte offset.
SPLIT_F16_FIELDS = {T.IQ1_M: 48}
LATTICE_TYPES = [T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M]
# Byte offsets of E8M0 exponent fields (2^(e-128)): random bytes would reach inf. gguf can quantize
# MXFP4, but its quantizer never writes code 8 (-0), which random blocks do.
E8M0_FIELDS = {T.MXFP4: (0,)}
ALL_TYPES = [T.F32, T.F16, T.BF16, T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1,
             T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4, *LATTICE_TYPES,
             T.TQ1_0, T.TQ2_0]


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def make_weight(qtype, rows, cols, seed):
    """(raw blocks as uint8 [rows][row_bytes], dequantized float64 [rows][cols])."""
    rng = np.random.default_rng(seed)
    info = quant_info(qtype)
    if qtype in QUANTIZABLE:
        w = rng.standard_normal((rows, cols)).astype(np.float32)
        raw = np.ascontiguousarray(quants.quantize(w, qtype)).view(np.uint8).reshape(rows, -1)
    else:
        nb = cols // info.block_size
        raw = rng.integers(0, 256, (rows, nb, info.type_size), dtype=np.uint8)
        for off in F16_FIELDS.get(qtype, ()):
            scale = rng.uniform(0.5, 1.5, (rows, nb)).astype(np.float16) / np.float16(64)
            raw[:, :, off:off + 2] = scale.view(np.uint8).reshape(rows, nb, 2)
        for off in E8M0_FIELDS.get(qtype, ()):
            raw[:, :, off] = rng.integers(122, 130, (rows, nb), dtype=np.uint8)
        if qtype in SPLIT_F16_FIELDS:
            off = SPLIT_F16_FIELDS[qtype]
            scale = (rng.uniform(0.5, 1.5, (rows, nb)).astype(np.float16) / np.float16(64)).view(np.uint16)
            words = raw[:, :, off:off + 8].copy().view(np.uint16) & np.uint16(0x0FFF)
            for k in range(4):
                words[:, :, k] |= ((scale >> np.uint16(4 * k)) & np.uint16(0xF)) << np.uint16(12)
            raw[:, :, off:off + 8] = words.view(np.uint8)
        raw = raw.reshape(rows, -1)
    assert raw.shape == (rows, info.row_bytes(cols))
    ref = np.asarray(quants.dequantize(raw, qtype), dtype=np.float64).reshape(rows, cols)
    assert np.isfinite(ref).all()
    return raw, ref


def small_cols(qtype):
    bs = quant_info(qtype).block_size
    return 100 if bs == 1 else 3 * bs if bs == 32 else bs


def big_cols(qtype):
    bs = quant_info(qtype).block_size
    return 333 if bs == 1 else 24 * bs if bs == 32 else 3 * bs


def tol(qtype, coopmat=False):
    # cooperative matrices multiply f16-rounded weights and activations (2^-11 relative each)
    return 3e-3 if coopmat else 1e-4 if qtype == T.F32 else 1e-3


@pytest.fixture
def portable(monkeypatch):
    """Batches > MATVEC_MAX_TOKENS take the portable tiled kernel even where cooperative matrices exist
    (and where the batched matrix-vector path or the software devices' kernel would apply)."""
    monkeypatch.setattr(selection, "_SKIP", {"mul_mm_coop", "mul_mm_coop_big", "mul_mv_batched", "mul_mm_cpu"})


def host_f32(dev, n, poison=True):
    buf = Buffer(dev, 4 * n, host_visible=True)
    if poison:
        buf.array(np.float32)[:] = np.nan
    return buf


def record_product(dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes=None, with_bias=False):
    """matmul() of a random weight and x (and bias): (the weight, the output, the dispatched kernel
    names, the numpy reference in float64)."""
    raw, wref = make_weight(qtype, rows, cols, seed)
    rng = np.random.default_rng(seed + 1)
    x = rng.standard_normal((n_tokens, cols)).astype(np.float32)
    w = upload_qweight(dev, raw, qtype, rows, cols, max_chunk_bytes=max_chunk_bytes)
    X = Buffer(dev, x.nbytes)
    X.write(x)
    Y = host_f32(dev, n_tokens * rows)
    ref = x.astype(np.float64) @ wref.T
    bias = None
    if with_bias:
        b = rng.standard_normal(rows).astype(np.float32)
        B = Buffer(dev, b.nbytes)
        B.write(b)
        bias, ref = View.whole(B), ref + b
    seq = CommandSequence(dev).begin()
    names = []
    dispatch = seq.dispatch
    seq.dispatch = lambda kernel, *a, **k: (names.append(kernel.name), dispatch(kernel, *a, **k))
    matmul(seq, kc, w, View.whole(X), View.whole(Y), n_tokens, bias=bias)
    seq.end().run()
    out = Y.array(np.float32, n_tokens * rows).reshape(n_tokens, rows).copy()
    assert np.isfinite(out).all(), "some outputs were not written"
    return w, out, names, ref


def run_matmul(dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes=None, with_bias=False, coopmat=False):
    w, out, _, ref = record_product(dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes, with_bias)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < tol(qtype, coopmat), f"{qtype.name} {rows}x{cols} n_tokens={n_tokens}: relative error {err:.2e}"
    return w


# Every type, 1 and 5 tokens, rows not multiples of a workgroup's (37, 300), several blocks; on
# software devices both forms (conftest matvec_form), matvec_cpu.comp on float rows of whole units.
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matvec(dev, kc, qtype, matvec_form):
    cpu = matvec_form == "cpu"
    float_type = quant_info(qtype).block_size == 1
    for rows, cols, n_tokens, seed in ((37, small_cols(qtype), 1, 1), (300, big_cols(qtype), 5, 2)):
        cols = (96 if n_tokens == 1 else 320) if cpu and float_type else cols
        _, out, names, ref = record_product(dev, kc, qtype, rows, cols, n_tokens, seed)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < tol(qtype), f"{qtype.name} {rows}x{cols} n_tokens={n_tokens}: relative error {err:.2e}"
        assert (names == [f"mul_mv_cpu_{quant_info(qtype).name.lower()}"]) == cpu, names


@pytest.mark.parametrize("config", ["base:256,4,2,2", "base:512,4,2,2"])
@pytest.mark.parametrize("qtype", [T.IQ1_S, T.IQ2_S], ids=lambda t: t.name)
def test_matvec_lattice_gpu_splits(dev, kc, qtype, config, monkeypatch):
    """The lattice types' GPU work splits (selection.MATVEC_CONFIGS): every thread of a 256- or
    512-thread workgroup copies its share of the grid into shared memory before any row uses it;
    rows in several chunks (each with its grid) and a partial last row group."""
    monkeypatch.setattr(matmul_module, "_MATVEC_ENV", matmul_module.parse_matvec_env(f"{qtype.name.lower()}={config}"))
    run_matmul(dev, kc, qtype, 70, 4 * 256, 1, seed=3, max_chunk_bytes=24 * quant_info(qtype).row_bytes(4 * 256))
    run_matmul(dev, kc, qtype, 21, 256, 1, seed=4)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_tiled(dev, kc, qtype, portable):
    run_matmul(dev, kc, qtype, 37, big_cols(qtype), 17, seed=3)
    run_matmul(dev, kc, qtype, 300, small_cols(qtype), 130, seed=4)


# Software devices' kernel (matmul_cpu.comp, chosen by selection._cpu_product_ok): every type; rows and
# tokens that are not multiples of its tile (16 rows a lane x 8 tokens), a weight in several chunks, a
# bias. 4 lanes (run on an 8-lane llvmpipe as half a vector) take other x loads and rows, the same for
# every type: a planar, a float and a K-quant type (llvmpipe takes 2-5 s to make each pipeline).
@pytest.mark.parametrize("qtype,lanes", [(t, 8) for t in ALL_TYPES] + [(T.Q4_0, 4), (T.F32, 4), (T.Q6_K, 4)],
                         ids=lambda v: v.name if isinstance(v, T) else f"lanes{v}")
def test_matmul_cpu(dev, kc, qtype, lanes, monkeypatch):
    if not kc.info.is_cpu or kc.info.subgroup_size < lanes:
        pytest.skip("software devices of at least 4 lanes only")
    monkeypatch.setattr(selection, "cpu_product_lanes", lambda kc: lanes)
    bs = quant_info(qtype).block_size
    small, big = (96, 320) if bs == 1 else (3 * bs, 24 * bs) if bs == 32 else (bs, 3 * bs)
    tname = quant_info(qtype).name.lower()
    for rows, cols, n_tokens, chunk_rows, bias in ((37, big, 17, None, False), (300, small, 130, 96, True)):
        assert selection.product_kernel(kc, n_tokens, rows, cols) == "mul_mm_cpu"
        chunk = chunk_rows and chunk_rows * quant_info(qtype).row_bytes(cols)
        w, out, names, ref = record_product(dev, kc, qtype, rows, cols, n_tokens, seed=5, max_chunk_bytes=chunk,
                                            with_bias=bias)
        assert names == [f"mul_mm_cpu_{tname}"] * len(w.chunks) and len(w.chunks) == (1 if chunk is None else 4)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < tol(qtype), f"{qtype.name} {rows}x{cols} n_tokens={n_tokens}: relative error {err:.2e}"
    assert selection.product_kernel(kc, 17, 37, 100) == "mul_mm"   # columns not whole 32-column units


# Short prompts: the matrix-vector kernel once per MATVEC_MAX_TOKENS tokens (a partial last slice,
# one-token slices, chunked weights, bias); rows or columns that are not multiples of 8 keep the
# tiled kernels (token slices must stay VIEW_ALIGN-aligned).
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.F16, T.F32], ids=lambda t: t.name)
def test_matvec_batched(dev, kc, qtype, monkeypatch):
    monkeypatch.setitem(selection.MATVEC_BATCHED_MAX, selection.device_kind(kc), 40)
    monkeypatch.setattr(selection, "_SKIP", selection._SKIP | {"mul_mm_cpu"})   # ahead of it on llvmpipe
    cols = big_cols(qtype) if quant_info(qtype).block_size > 1 else 320
    for n_tokens in (9, 17, 40):
        assert selection.product_kernel(kc, n_tokens, 296, cols) == "mul_mv_batched"
    run_matmul(dev, kc, qtype, 296, cols, 17, seed=11, with_bias=True)
    run_matmul(dev, kc, qtype, 64, cols, 9, seed=12, max_chunk_bytes=9 * quant_info(qtype).row_bytes(cols))
    run_matmul(dev, kc, qtype, 24, cols, 40, seed=13)
    assert selection.product_kernel(kc, 17, 300, cols) != "mul_mv_batched"
    assert selection.product_kernel(kc, 41, 296, cols) != "mul_mv_batched"


# Prompt products of few rows (routers, DeltaNet alpha/beta; selection._small_rows_ok, GPUs only) and
# short prompts: every full 8-token slice in ONE dispatch per weight chunk (the slice from the grid's
# z), a partial last slice as a product of its own. Forced here at any batch size (the small-rows rule
# leaves software devices out), against numpy and, bit for bit, against the dispatch per slice.
def record_batches(monkeypatch, dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes=None, slices_env="0"):
    """(the product through matmul's batched path, dispatched kernel names, numpy reference)."""
    monkeypatch.setattr(matmul_module, "product_kernel",
                        lambda kc, n, r, c, t=None: "mul_mv" if n <= MATVEC_MAX_TOKENS else "mul_mv_batched")
    monkeypatch.setenv("LLAMAVK_SMALL_ROWS_SLICES", slices_env)
    # the slices kernels are matvec.comp's and matvec_wide.comp's: a software device's base form
    monkeypatch.setattr(selection, "_cpu_product_ok", lambda kc, n, rows, cols: False)
    return record_product(dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes, with_bias=True)


def check_batches(monkeypatch, dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes=None, slice_kernel=None):
    monkeypatch.setattr(selection, "_cpu_product_ok", lambda kc, n, rows, cols: False)   # as record_batches
    if slice_kernel is None:   # the device's own matrix-vector kernel for 8-token slices (GPUs: Q4_K's is wide)
        cfg = matmul_module.matvec_config(kc, qtype, rows, cols, MATVEC_MAX_TOKENS)
        slice_kernel = {"base": "mul_mv_slices", "wide": "mul_mv_wide_slices"}[cfg.kernel]
    w, out, names, ref = record_batches(monkeypatch, dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes)
    assert np.isfinite(out).all(), "some outputs were not written"
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < tol(qtype), f"{qtype.name} {rows}x{cols} n_tokens={n_tokens}: relative error {err:.2e}"
    full, rest = divmod(n_tokens, MATVEC_MAX_TOKENS)
    tname = quant_info(qtype).name.lower()
    sliced = [n for n in names if n == f"{slice_kernel}_{tname}"]
    assert len(sliced) == (len(w.chunks) if full else 0), names
    assert len(names) - len(sliced) == (len(w.chunks) if rest else 0), names   # the partial slice
    # the same kernel arithmetic as one dispatch per slice: the same bits
    _, old, old_names, _ = record_batches(monkeypatch, dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes,
                                          slices_env="1")
    assert len(old_names) == len(w.chunks) * -(-n_tokens // MATVEC_MAX_TOKENS)
    np.testing.assert_array_equal(out, old)
    return w


def batch_cols(qtype):
    return big_cols(qtype) if quant_info(qtype).block_size > 1 else 320


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matvec_slices_every_type(dev, kc, qtype, monkeypatch):
    """Every type through its slices kernel (the device's choice for 8 tokens): a partial last slice (17), whole slices only (16),
    chunked weights (rows of 9, 9, 9, 5) with a one-token last slice."""
    cols = batch_cols(qtype)
    check_batches(monkeypatch, dev, kc, qtype, 24, cols, 17, seed=30)
    check_batches(monkeypatch, dev, kc, qtype, 24, cols, 16, seed=31)
    w = check_batches(monkeypatch, dev, kc, qtype, 32, cols, 9, seed=32,
                      max_chunk_bytes=9 * quant_info(qtype).row_bytes(cols))
    assert len(w.chunks) == 4


# The GPU configs of these products (selection.MATVEC_CONFIGS at 8 tokens: a float router one row per
# workgroup over 8 subgroups, Q4_K the wide kernel, the rest 8 rows per workgroup, 2 quarters per lane;
# Q4_0 / Q8_0 on the wide kernel too, where LLAMAVK_MATVEC puts them) over prompt-sized batches.
@pytest.mark.parametrize("qtype,config,slice_kernel", [
    (T.F32, "base:256,1,8,1", "mul_mv_slices"),
    (T.F16, "base:256,1,8,1", "mul_mv_slices"),
    (T.Q4_0, "base:256,4,2,2", "mul_mv_slices"),
    (T.Q8_0, "base:256,4,2,2", "mul_mv_slices"),
    (T.Q6_K, "base:256,4,2,2", "mul_mv_slices"),
    (T.Q4_K, "wide:256,4,2,1", "mul_mv_wide_slices"),
    (T.Q4_0, "wide:256,4,2,1,1,1", "mul_mv_wide_slices"),
    (T.Q8_0, "wide:128,2,1,2,1,1", "mul_mv_wide_slices"),
], ids=lambda v: getattr(v, "name", str(v)))
def test_matvec_slices_gpu_configs(dev, kc, qtype, config, slice_kernel, monkeypatch):
    monkeypatch.setattr(matmul_module, "_MATVEC_ENV", matmul_module.parse_matvec_env(config))
    cols = batch_cols(qtype)
    for n_tokens, rows, seed in ((512, 32, 40), (511, 40, 41), (64, 16, 42)):
        check_batches(monkeypatch, dev, kc, qtype, rows, cols, n_tokens, seed, slice_kernel=slice_kernel)
    check_batches(monkeypatch, dev, kc, qtype, 24, cols, 67, seed=43, slice_kernel=slice_kernel,
                  max_chunk_bytes=10 * quant_info(qtype).row_bytes(cols))


def test_matvec_slices_grid_limit(dev, kc, monkeypatch):
    """More slices than the grid's z takes: one dispatch per MAX_GRID_Z slices, each on its own tokens."""
    monkeypatch.setattr(matmul_module, "MAX_GRID_Z", 3)
    w, out, names, ref = record_batches(monkeypatch, dev, kc, T.Q4_0, 16, 96, 69, seed=50)
    assert names == ["mul_mv_slices_q4_0"] * 3 + ["mul_mv_q4_0"]   # slices 3 + 3 + 2, then 5 tokens
    assert np.linalg.norm(out - ref) / np.linalg.norm(ref) < tol(T.Q4_0)


# The cooperative-matrix kernel (GPUs with VK_KHR_cooperative_matrix 16x8x16 f16->f32); tiles of
# 128 rows x 128 tokens, so: partial tiles in both directions, several tiles, chunks and bias.
@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_matmul_coopmat(dev, kc, qtype):
    if not selection.has_coopmat(kc):
        pytest.skip(f"{dev.info.name} has no cooperative matrices of shape {selection.COOPMAT_SHAPE}")
    cols = big_cols(qtype) if quant_info(qtype).block_size > 1 else 320   # a multiple of 32
    assert selection.product_kernel(kc, 70, 300, cols) == "mul_mm_coop"
    run_matmul(dev, kc, qtype, 37, cols, 9, seed=3, coopmat=True)
    run_matmul(dev, kc, qtype, 300, cols, 130, seed=4, coopmat=True, with_bias=True)
    rows = 260
    run_matmul(dev, kc, qtype, rows, cols, 64, seed=5, coopmat=True, with_bias=True,
               max_chunk_bytes=70 * quant_info(qtype).row_bytes(cols))


# The 256 x 128-tile form, chosen for large weights and batches (forced here on a small one).
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.F16, T.IQ4_NL, T.IQ4_XS, T.MXFP4],
                         ids=lambda t: t.name)
def test_matmul_coopmat_big_tiles(dev, kc, qtype, monkeypatch):
    if not selection.has_coopmat(kc):
        pytest.skip(f"{dev.info.name} has no cooperative matrices of shape {selection.COOPMAT_SHAPE}")
    assert selection.product_kernel(kc, 512, 8192, 4096) == "mul_mm_coop_big"
    monkeypatch.setattr(matmul_module, "product_kernel", lambda *a: "mul_mm_coop_big")
    cols = big_cols(qtype) if quant_info(qtype).block_size > 1 else 320
    run_matmul(dev, kc, qtype, 300, cols, 130, seed=6, coopmat=True, with_bias=True)
    run_matmul(dev, kc, qtype, 520, cols, 256, seed=7, coopmat=True,
               max_chunk_bytes=270 * quant_info(qtype).row_bytes(cols))


@pytest.mark.parametrize("qtype,n_tokens", [(T.Q4_0, 2), (T.Q6_K, 64), (T.F16, 8), (T.Q4_K, 9)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_single_row_and_thresholds(dev, kc, qtype, n_tokens, portable):
    run_matmul(dev, kc, qtype, 1, big_cols(qtype), n_tokens, seed=5)
    run_matmul(dev, kc, qtype, 65, small_cols(qtype), n_tokens, seed=6)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q5_K, T.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("n_tokens", [3, 70])
def test_chunked_with_bias(dev, kc, qtype, n_tokens, portable):
    cols = small_cols(qtype)
    # about 7 rows per chunk: 300 rows in 43 buffers, 37 rows in 6
    max_chunk = 7 * quant_info(qtype).row_bytes(cols)
    for rows in (37, 300):
        w = run_matmul(dev, kc, qtype, rows, cols, n_tokens, seed=rows + n_tokens, max_chunk_bytes=max_chunk,
                       with_bias=True)
        assert len(w.chunks) > 1


@pytest.mark.parametrize("qtype", [T.F32, T.Q8_0], ids=lambda t: t.name)
def test_bias_unchunked(dev, kc, qtype, portable):
    run_matmul(dev, kc, qtype, 37, small_cols(qtype), 1, seed=7, with_bias=True)
    run_matmul(dev, kc, qtype, 37, small_cols(qtype), 20, seed=8, with_bias=True)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_get_rows_chunked(dev, kc, qtype):
    rows, cols = 37, small_cols(qtype)
    raw, wref = make_weight(qtype, rows, cols, seed=9)
    w = upload_qweight(dev, raw, qtype, rows, cols, max_chunk_bytes=5 * quant_info(qtype).row_bytes(cols))
    assert len(w.chunks) == 8
    ids = np.array([0, 36, 5, 6, 17, 17, 30, 1, 35, 12, 4], dtype=np.uint32)  # every chunk, repeats
    n = len(ids)
    I = Buffer(dev, ids.nbytes)
    I.write(ids)
    out = host_f32(dev, n * cols)
    seq = CommandSequence(dev).begin()
    get_rows(seq, kc, w, View.whole(I), View.whole(out), n)
    seq.end().run()
    got = out.array(np.float32, n * cols).reshape(n, cols)
    # f32 dequantization; the GPU may fuse multiply-adds, so allow a rounding difference
    np.testing.assert_allclose(got, wref[ids], rtol=1e-6, atol=1e-6 * np.abs(wref).max())


def test_product_kernel_edges(dev, kc):
    """Where selection.PRODUCT_KERNELS switches kernels (MATVEC_MAX_TOKENS, the batched form's limit
    for this kind of device; software devices take matmul_cpu.comp past MATVEC_MAX_TOKENS), each side
    of each edge picks the kernel the table says and agrees with numpy."""
    batched_max = selection.MATVEC_BATCHED_MAX[selection.device_kind(kc)]
    coop = selection.has_coopmat(kc)
    cpu = selection._cpu_product_ok(kc, MATVEC_MAX_TOKENS + 1, 296, 96)   # software devices: one kernel past 8
    short, tiled = ("mul_mm_cpu", "mul_mm_cpu") if cpu else ("mul_mv_batched", "mul_mm_coop" if coop else "mul_mm")
    for n, want in ((MATVEC_MAX_TOKENS, "mul_mv"), (MATVEC_MAX_TOKENS + 1, short), (batched_max, short),
                    (batched_max + 1, tiled)):
        assert selection.product_kernel(kc, n, 296, 96) == want, n
        run_matmul(dev, kc, T.Q4_0, 296, 96, n, seed=20 + n, coopmat=want.startswith("mul_mm_coop"))


def test_f16_x_conversion_shared_until_x_changes(dev, kc, monkeypatch):
    """Products reading the same x one after another share its f16 conversion (matmul.f16_copy):
    the second asks for it without recording a dispatch; once a command writes x the next asks
    convert again, and the scratch then holds the new values. LLAMAVK_CM2_X_SHARE=0 converts every
    time."""
    n = 1024
    x0 = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    x = View(Buffer(dev, 4 * n), 0, 4 * n)
    x.buffer.write(x0)
    other = Buffer(dev, 4 * n)
    other.write(-x0)
    seq = CommandSequence(dev).begin()
    xh = matmul_module.f16_copy(seq, kc, x, n)
    assert seq.n_dispatches == 1
    assert matmul_module.f16_copy(seq, kc, x, n) == xh and seq.n_dispatches == 1     # shared
    seq.copy(other, x.buffer, 4 * n)                                               # x rewritten
    xh2 = matmul_module.f16_copy(seq, kc, x, n)
    assert seq.n_dispatches == 2
    seq.end()
    seq.run()
    got = np.frombuffer(xh2.buffer.read(2 * n, xh2.offset), np.float16)
    np.testing.assert_array_equal(got, (-x0).astype(np.float16))
    seq.close()
    monkeypatch.setenv("LLAMAVK_CM2_X_SHARE", "0")
    seq = CommandSequence(dev).begin()
    matmul_module.f16_copy(seq, kc, x, n)
    matmul_module.f16_copy(seq, kc, x, n)
    assert seq.n_dispatches == 2
    seq.end()
    seq.close()


def test_f16_only_x_is_never_converted_from_missing_f32(dev, kc):
    """An x its producer wrote only as f16 (matmul.record_f16_x f16_only: the runtime's norms and
    SwiGLU before the products reading them): asking for it after its scratch was replaced is an
    error, not a conversion of f32 values that were never written; once x is written, it converts."""
    from llamavk.errors import LlamavkError
    n = 1024
    x = View(Buffer(dev, 4 * n), 0, 4 * n)
    y = View(Buffer(dev, 4 * n), 0, 4 * n)
    seq = CommandSequence(dev).begin()
    xh = matmul_module.record_f16_x(seq, kc, x, n, lambda v: seq.fill(v.buffer, 0, v.nbytes, v.offset), f16_only=True)
    assert matmul_module.f16_copy(seq, kc, x, n) == xh           # its readers share it
    matmul_module.f16_copy(seq, kc, y, n)                         # another x's conversion replaces it
    with pytest.raises(LlamavkError, match="only as f16"):
        matmul_module.f16_copy(seq, kc, x, n)
    xh = matmul_module.record_f16_x(seq, kc, x, n, lambda v: seq.fill(v.buffer, 0, v.nbytes, v.offset), f16_only=True)
    with pytest.raises(LlamavkError, match="only as f16"):       # a reader of another size (a head split's)
        matmul_module.f16_copy(seq, kc, x, n // 2)
    seq.copy(y.buffer, x.buffer, 4 * n)                            # x written as f32: converted again
    n0 = seq.n_dispatches
    matmul_module.f16_copy(seq, kc, x, n)
    assert seq.n_dispatches == n0 + 1
    seq.end()
    seq.close()
