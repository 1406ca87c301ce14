"""The dequantize-then-f16 prompt product (kernels/matmul.py mul_mm_cm2d): shaders/dequant_f16.comp
against gguf.quants.dequantize on any device (llvmpipe included), its row slices and the selection
rules everywhere, and the whole product (dequant_f16 + matmul_cm2.comp's F16 form) against numpy
where the device has VK_NV_cooperative_matrix2 (skipped elsewhere)."""

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.errors import LlamavkError
from llamavk.kernels import KernelCache, View, selection, upload_qweight
from llamavk.kernels import matmul as matmul_module
from llamavk.quant import qtype_from_name, quant_info
from llamavk.vk import Buffer, CommandSequence

from .test_kernels_matmul import make_weight, record_product, tol
from .test_kernels_matmul_cm2 import _FakeKC, needs_cm2

DEQUANT_TYPES = [qtype_from_name(t) for t in selection.CM2_DEQUANT_KERNEL_TYPES]
# gguf.quants computes these exactly as the shader (products of an f16 scale and a small integer, or
# the same f32 operations in the same order): their f16 rounding must be the same bits
EXACT = {T.Q4_0, T.Q8_0, T.Q6_K}
F16_NAN = 0x7E00


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def dequant_rows(dev, kc, w, ch, r0, n):
    """Rows [r0, r0 + n) of chunk ch through dequant_f16 as float16 [n][cols]; the output buffer
    poisoned with NaN, one row past the rows checked to stay so (nothing written past them)."""
    out = Buffer(dev, 2 * (n + 1) * w.cols, host_visible=True)
    out.array(np.uint16)[:] = F16_NAN
    seq = CommandSequence(dev).begin()
    matmul_module.dequant_f16(seq, kc, w, ch, r0, n, View(out, 0, 2 * n * w.cols))
    seq.end().run()
    got = out.array(np.uint16, (n + 1) * w.cols).copy().view(np.float16).reshape(n + 1, w.cols)
    out.close()
    assert np.isnan(got[n]).all(), "dequant_f16 wrote past its rows"
    return got[:n]


def check_rows(qtype, got, ref):
    assert not np.isnan(got).any(), "some outputs were not written"
    ref16 = ref.astype(np.float16)
    if qtype in EXACT:
        bad = np.flatnonzero(got.view(np.uint16) != ref16.view(np.uint16))
        assert bad.size == 0, f"{qtype.name}: {bad.size} values differ, first at {bad[0]}: " \
                              f"{got.flat[bad[0]]} against {ref16.flat[bad[0]]}"
    else:   # within one f16 step of the exact value (f32 operations may fuse or reorder)
        err = np.abs(got.astype(np.float64) - ref)
        assert (err <= np.spacing(np.abs(ref16)).astype(np.float64)).all(), \
            f"{qtype.name}: max error {err.max():.3g}"


# Rows and units not multiples of a workgroup's 1024 units, weights in several chunks (the planar
# types' scale plane sits after each chunk's own blocks), row slices that start inside a chunk.
@pytest.mark.parametrize("qtype", DEQUANT_TYPES, ids=lambda t: t.name)
def test_dequant_f16(dev, kc, qtype):
    bs = quant_info(qtype).block_size
    rows, cols = 37, (24 * bs if bs == 32 else 3 * bs)
    raw, ref = make_weight(qtype, rows, cols, seed=11)
    w = upload_qweight(dev, raw, qtype, rows, cols, max_chunk_bytes=15 * quant_info(qtype).row_bytes(cols))
    assert [ch.n_rows for ch in w.chunks] == [15, 15, 7]
    for ch in w.chunks:
        check_rows(qtype, dequant_rows(dev, kc, w, ch, 0, ch.n_rows), ref[ch.row_start:ch.row_start + ch.n_rows])
    ch = w.chunks[1]
    for r0, n in [(3, 5), (14, 1)]:
        got = dequant_rows(dev, kc, w, ch, r0, n)
        check_rows(qtype, got, ref[ch.row_start + r0:ch.row_start + r0 + n])


# More than one workgroup's units per dispatch, and a grid of several (Q4_K: 32 units per super-block,
# each subgroup of 32 lanes one block).
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_dequant_f16_many_workgroups(dev, kc, qtype):
    rows, cols = 300, 1024
    raw, ref = make_weight(qtype, rows, cols, seed=12)
    w = upload_qweight(dev, raw, qtype, rows, cols)
    check_rows(qtype, dequant_rows(dev, kc, w, w.chunks[0], 0, rows), ref)


def test_dequant_f16_rejects_float_and_partial_rows(dev, kc):
    w = upload_qweight(dev, np.zeros((2, 64), np.float16).view(np.uint8), T.F16, 2, 64)
    assert "f16" not in selection.CM2_DEQUANT_KERNEL_TYPES   # f16 weights need no pass
    bad = matmul_module.QWeight(T.Q4_0, 2, 36, w.chunks)
    with pytest.raises(LlamavkError, match="dequant_f16"):
        matmul_module.dequant_f16(None, kc, bad, w.chunks[0], 0, 2, View(w.chunks[0].buffer, 0, 144))


def test_kernel_types_match_the_shaders():
    scope = {}
    exec((Path(__file__).parent.parent / "shaders" / "variants_dequant.py").read_text(), scope)
    assert set(scope["VARIANTS"]) == {f"dequant_f16_{t}" for t in selection.CM2_DEQUANT_KERNEL_TYPES}


def test_cm2d_slices(monkeypatch):
    assert matmul_module.cm2d_slices(14336, 4096, 128) == [(0, 14336)]   # 117 MB: one slice
    big = matmul_module.cm2d_slices(128256, 4096, 128)
    assert sum(n for _, n in big) == 128256 and len(big) == 8
    assert all(2 * n * 4096 <= matmul_module.CM2D_SLICE_BYTES and n % 128 == 0 for _, n in big[:-1])
    assert [r0 for r0, _ in big] == [sum(n for _, n in big[:i]) for i in range(len(big))]
    assert matmul_module.cm2d_slices(300, 256, 64, max_bytes=2 * 256 * 130) == [(0, 128), (128, 128), (256, 44)]
    assert matmul_module.cm2d_slices(300, 256, 64, max_bytes=2 * 256 * 200) == [(0, 192), (192, 108)]
    assert matmul_module.cm2d_slices(300, 256, 64, max_bytes=2 * 256 * 10) == \
        [(r0, min(64, 300 - r0)) for r0 in range(0, 300, 64)]   # one tile of rows at least
    assert matmul_module.cm2d_slices(37, 256, 128) == [(0, 37)]
    # with the grid (4 token tiles, 264 workgroups at once): the slice count the wave model puts
    # fastest, from the fewest the bytes allow -- 27648 x 5120 in 4 slices of one wave each, not 3 of
    # two waves; 14336 x 4096 stays one slice
    grid = (4, 264)
    assert matmul_module.cm2d_slices(27648, 5120, 128, grid=grid) == [(r, 6912) for r in range(0, 27648, 6912)]
    assert len(matmul_module.cm2d_slices(27648, 5120, 128)) == 3
    assert matmul_module.cm2d_slices(14336, 4096, 128, grid=grid) == [(0, 14336)]
    monkeypatch.setenv("LLAMAVK_CM2_WAVES", "0")
    assert len(matmul_module.cm2d_slices(27648, 5120, 128, grid=grid)) == 3


def test_cm2d_selection(monkeypatch):
    """mul_mm_cm2d only for the chosen types (none by default), on coopmat2 devices, from
    CM2_DEQUANT_MIN_TOKENS tokens; the knobs choose types and tokens; bad values are errors."""
    cm2 = _FakeKC({"coopmat": True, "coopmat2": True, "fp16": True})
    khr = _FakeKC({"coopmat": True, "fp16": True})
    monkeypatch.delenv("LLAMAVK_CM2_DEQUANT", raising=False)
    monkeypatch.delenv("LLAMAVK_CM2_DEQUANT_MIN", raising=False)
    monkeypatch.setattr(selection, "CM2_DEQUANT_TYPES", ())
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_k") == "mul_mm_cm2"
    monkeypatch.setattr(selection, "CM2_DEQUANT_TYPES", ("q4_k",))
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_k") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 256, 14336, 4096, "q4_k") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 129, 14336, 4096, "q4_k") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 128, 4096, 4096, "q4_k") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q6_k") == "mul_mm_coop"
    assert selection.product_kernel(khr, 512, 4096, 4096, "q4_k") == "mul_mm_coop"
    assert selection.product_kernel(cm2, 512, 4096, 4096) == "mul_mm_coop"
    assert selection.product_kernel(cm2, 512, 4096, 4100, "q4_k") == "mul_mm"   # cols not a multiple of 32
    monkeypatch.setenv("LLAMAVK_CM2_DEQUANT", "q6_k,q5_k,q4_0")
    monkeypatch.setenv("LLAMAVK_CM2_DEQUANT_MIN", "64")
    assert selection.product_kernel(cm2, 64, 4096, 4096, "q6_k") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 64, 4096, 4096, "q5_k") == "mul_mm_cm2d"   # not on cm2 otherwise
    assert selection.product_kernel(cm2, 63, 4096, 4096, "q5_k") == "mul_mm_coop"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_k") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 8, 4096, 4096, "q4_0") == "mul_mv"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "f16") == "mul_mm_coop"   # not a cm2d type
    monkeypatch.setenv("LLAMAVK_CM2", "0")
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q6_k") == "mul_mm_coop"
    monkeypatch.delenv("LLAMAVK_CM2")
    monkeypatch.setenv("LLAMAVK_CM2_DEQUANT", "0")
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_k") == "mul_mm_cm2"
    monkeypatch.setenv("LLAMAVK_CM2_DEQUANT", "q4_k,f16")
    with pytest.raises(LlamavkError, match="LLAMAVK_CM2_DEQUANT=.*'f16'"):
        selection.product_kernel(cm2, 512, 4096, 4096, "q4_k")
    monkeypatch.setenv("LLAMAVK_CM2_DEQUANT", "q4_k")
    for bad in ["0", "-5", "many"]:
        monkeypatch.setenv("LLAMAVK_CM2_DEQUANT_MIN", bad)
        with pytest.raises(LlamavkError, match="LLAMAVK_CM2_DEQUANT_MIN"):
            selection.product_kernel(cm2, 512, 4096, 4096, "q4_k")


def test_cm2d_recording(dev, kc, monkeypatch):
    """What mul_mm_cm2d records, on any device (a recorder that keeps the dispatches instead of
    running them): x to f16 once; per chunk and row slice the rows dequantized into the f16 scratch,
    then the f16 product over that scratch writing those rows of y (push constants: rows, cols, y
    stride, first row in y, bias, tokens, spans per part, part stride, x's readable tokens)."""
    calls = []

    class Kernel:
        def __init__(self, name, bindings):
            self.name, self.bindings = name, bindings

    class Recorder:
        def dispatch(self, kernel, buffers, groups=(1, 1, 1), push=b"", **kw):
            calls.append((kernel.name, buffers, groups, struct.unpack(f"<{len(push) // 4}I", push)))

    monkeypatch.setattr(kc, "get", lambda name, bindings, push_size=0, spec=(): Kernel(name, bindings))
    monkeypatch.setattr(matmul_module, "product_kernel", lambda *a: "mul_mm_cm2d")
    monkeypatch.setattr(matmul_module, "CM2D_SLICE_BYTES", 2 * 100 * 256)
    monkeypatch.setenv("LLAMAVK_CM2_SPLIT", "1")
    rows, cols, n_tokens = 300, 256, 40
    raw, _ = make_weight(T.Q4_K, rows, cols, seed=1)
    w = upload_qweight(dev, raw, T.Q4_K, rows, cols, max_chunk_bytes=200 * quant_info(T.Q4_K).row_bytes(cols))
    X, Y, B = Buffer(dev, 4 * n_tokens * cols), Buffer(dev, 4 * n_tokens * rows), Buffer(dev, 4 * rows)
    matmul_module.matmul(Recorder(), kc, w, View.whole(X), View.whole(Y), n_tokens, bias=View.whole(B))
    names = [c[0] for c in calls]
    # chunks of 200 and 100 rows; f16 tiles of 64 rows (cm2_tile, <= 2048 rows): slices of 64
    slices = [(0, r0, min(64, 200 - r0)) for r0 in range(0, 200, 64)] + [(200, 0, 64), (200, 64, 36)]
    assert names == ["convert_f16"] + ["dequant_f16_q4_k", "mul_mm_cm2h_f16"] * len(slices), names
    xh = calls[0][1][1]
    for (start, r0, n), deq, prod in zip(slices, calls[1::2], calls[2::2]):
        ch = next(c for c in w.chunks if c.row_start == start)
        scratch = deq[1][1]
        assert deq[1][0] is ch.buffer and scratch[1:] == (0, 2 * n * cols)
        assert deq[3] == (ch.n_rows, r0, n * cols // 8)   # blocks of the chunk, first block, units
        assert deq[2][0] * 1024 >= n * cols // 8 > (deq[2][0] - 1) * 1024
        # x read as one whole token tile of 128 (its scratch has room: matmul._padded_x)
        assert prod[1][0] is scratch[0] and prod[1][1] == (xh[0], 0, 2 * 128 * cols) and prod[1][2] == (B, 0, B.size)
        assert prod[1][3] == (Y, 0, Y.size)
        assert prod[3] == (n, cols, rows, start + r0, 1, n_tokens, 1, 0, 128)
        assert prod[2] == (-(-n // 64), -(-n_tokens // 128), 1)


# The whole product where coopmat2 exists: rows and tokens not multiples of the tiles, a bias, weights
# in several chunks, row slices of a chunk (the scratch cap made small), split K.
def check_cm2d(dev, kc, qtype, rows, cols, n_tokens, seed, **kw):
    w, out, names, ref = record_product(dev, kc, qtype, rows, cols, n_tokens, seed, **kw)
    name = qtype.name.lower()
    assert set(names) - {"reduce_sum_f32"} == {"convert_f16", f"dequant_f16_{name}", "mul_mm_cm2h_f16"}, names
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < tol(qtype, coopmat=True), f"{qtype.name} {rows}x{cols} x {n_tokens}: relative error {err:.2e}"
    return w, names


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.Q5_K, T.IQ4_NL], ids=lambda t: t.name)
def test_matmul_cm2d(dev, kc, qtype, monkeypatch):
    needs_cm2(kc, monkeypatch)
    monkeypatch.setattr(matmul_module, "product_kernel", lambda *a: "mul_mm_cm2d")
    bs = quant_info(qtype).block_size
    cols = 24 * bs if bs == 32 else 3 * bs
    check_cm2d(dev, kc, qtype, 37, cols, 17, seed=3)
    check_cm2d(dev, kc, qtype, 300, cols, 130, seed=4, with_bias=True)
    w, _ = check_cm2d(dev, kc, qtype, 260, cols, 71, seed=5, with_bias=True,
                      max_chunk_bytes=70 * quant_info(qtype).row_bytes(cols))
    assert len(w.chunks) > 1
    monkeypatch.setattr(matmul_module, "CM2D_SLICE_BYTES", 2 * 100 * cols)   # slices of 64 or 128 rows
    _, names = check_cm2d(dev, kc, qtype, 300, cols, 130, seed=6, with_bias=True)
    assert names.count(f"dequant_f16_{qtype.name.lower()}") > 1, names
    monkeypatch.setenv("LLAMAVK_CM2_SPLIT", "3")
    _, names = check_cm2d(dev, kc, qtype, 200, 8 * 256, 150, seed=7, with_bias=True)
    assert "reduce_sum_f32" in names, names


class _BarrierRecorder:
    """A recorder that keeps the dispatches instead of running them and places barriers by
    CommandSequence's own rule (vk/sequence.py _depend): calls holds (kernel name, reads, writes)
    and "barrier" markers."""

    write_mark = CommandSequence.write_mark
    written_since = CommandSequence.written_since

    def __init__(self):
        self.calls, self._written, self._read, self._src_stages = [], [], [], 0
        self._writes, self.memo = [], {}

    def barrier(self, *a):
        self.calls.append("barrier")
        self._written, self._read, self._src_stages = [], [], 0

    def dispatch(self, kernel, buffers, groups=(1, 1, 1), push=b"", **kw):
        from llamavk.vk.sequence import COMPUTE, as_range
        ranges = [as_range(b) for b in buffers]
        reads = [r for r, a in zip(ranges, kernel.bindings) if a == "r"]
        writes = [r for r, a in zip(ranges, kernel.bindings) if a == "w"]
        CommandSequence._depend(self, reads, writes, COMPUTE)
        self.calls.append((kernel.name, reads, writes))


def _record_ahead(dev, kc, monkeypatch, weights, plan, n_tokens=40):
    """matmul() of each weight in order, one recorder, a DequantAhead of `plan` (None: none)."""
    class Kernel:
        def __init__(self, name, bindings):
            self.name, self.bindings = name, bindings

    monkeypatch.setattr(kc, "get", lambda name, bindings, push_size=0, spec=(): Kernel(name, bindings))
    monkeypatch.setattr(matmul_module, "product_kernel", lambda *a: "mul_mm_cm2d")
    monkeypatch.setattr(matmul_module, "CM2D_SLICE_BYTES", 2 * 100 * 1024)   # slices of 64 rows
    monkeypatch.setenv("LLAMAVK_CM2_SPLIT", "2")    # split K: the sum of the parts behind a barrier
    rec = _BarrierRecorder()
    kc.dequant_ahead = matmul_module.DequantAhead(kc, plan) if plan is not None else None
    try:
        for w in weights:
            X, Y = Buffer(dev, 4 * n_tokens * w.cols), Buffer(dev, 4 * n_tokens * w.rows)
            matmul_module.matmul(rec, kc, w, View.whole(X), View.whole(Y), n_tokens)
    finally:
        kc.dequant_ahead = None
    return rec.calls


def _intervals(calls):
    """The recorded dispatches as [(interval between barriers, name, reads, writes)]."""
    out, k = [], 0
    for c in calls:
        if c == "barrier":
            k += 1
        else:
            out.append((k,) + c)
    return out


def test_dequant_ahead_recording(dev, kc, monkeypatch):
    """With a DequantAhead, each row slice's rows are dequantized right after the slice before it is
    multiplied (this product's previous slice, else the previous product's last), with no barrier
    between the two, into the other scratch of its size class; every product reads the rows its own
    slice's dequantization wrote, and a barrier separates the two. Without one (LLAMAVK_DEQUANT_AHEAD=0
    at runtime) each slice's dequantization precedes its product behind a barrier, as before."""
    w1 = upload_qweight(dev, make_weight(T.Q4_K, 150, 1024, seed=1)[0], T.Q4_K, 150, 1024)   # slices 64, 64, 22
    w2 = upload_qweight(dev, make_weight(T.Q8_0, 70, 1024, seed=2)[0], T.Q8_0, 70, 1024)     # slices 64, 6
    barriers = []
    for plan in ([(w1, 40), (w2, 40)], None):
        ds = _intervals(_record_ahead(dev, kc, monkeypatch, [w1, w2], plan))
        deq = [d for d in ds if d[1].startswith("dequant_f16")]
        prod = [d for d in ds if d[1] == "mul_mm_cm2h_f16"]
        assert len(deq) == len(prod) == 5, [d[1] for d in ds]
        assert [d[1] for d in deq] == ["dequant_f16_q4_k"] * 3 + ["dequant_f16_q8_0"] * 2
        for j, (d, p) in enumerate(zip(deq, prod)):
            rows = d[3][0]
            assert p[2][0][0] is rows[0], f"slice {j} reads another scratch than its rows went to"
            assert p[0] > d[0], f"slice {j}: no barrier between its dequantization and its product"
            if plan is not None and j > 0:   # dequantized together with the product before
                assert d[0] == prod[j - 1][0], f"slice {j} was not dequantized ahead"
                assert rows[0] is not prod[j - 1][2][0][0], "the slice ahead overwrote the rows in use"
            if plan is None:
                assert d[0] > (prod[j - 1][0] if j else -1)
        barriers.append(ds[-1][0])
    # fewer barriers: besides the dequantizations', the x conversion of the second product need not
    # wait for the first product (the other f16 x scratch)
    assert barriers[0] < barriers[1], barriers


def test_dequant_ahead_wrong_plan(dev, kc, monkeypatch):
    """A plan that names another weight next: the rows dequantized ahead go unused, and the product
    actually recorded dequantizes its own (a wrong plan costs time, never a result)."""
    w1 = upload_qweight(dev, make_weight(T.Q4_0, 70, 1024, seed=3)[0], T.Q4_0, 70, 1024)
    w2 = upload_qweight(dev, make_weight(T.Q4_0, 64, 1024, seed=4)[0], T.Q4_0, 64, 1024)
    w3 = upload_qweight(dev, make_weight(T.Q6_K, 64, 1024, seed=5)[0], T.Q6_K, 64, 1024)
    ds = _intervals(_record_ahead(dev, kc, monkeypatch, [w1, w3], [(w1, 40), (w2, 40)]))
    names = [d[1] for d in ds if d[1].startswith("dequant_f16") or d[1] == "mul_mm_cm2h_f16"]
    assert names == ["dequant_f16_q4_0", "mul_mm_cm2h_f16", "dequant_f16_q4_0", "mul_mm_cm2h_f16",
                     "dequant_f16_q4_0", "dequant_f16_q6_k", "mul_mm_cm2h_f16"], names
    last_deq = [d for d in ds if d[1] == "dequant_f16_q6_k"][0]
    last_prod = [d for d in ds if d[1] == "mul_mm_cm2h_f16"][-1]
    assert last_prod[2][0][0] is last_deq[3][0][0] and last_prod[0] > last_deq[0]


def test_matmul_cm2d_ahead(dev, kc, monkeypatch):
    """Where coopmat2 exists: three products recorded in one sequence with their slices dequantized
    ahead (small slices, so the scratches alternate within and across products) equal numpy."""
    needs_cm2(kc, monkeypatch)
    monkeypatch.setattr(matmul_module, "product_kernel", lambda *a: "mul_mm_cm2d")
    monkeypatch.setattr(matmul_module, "CM2D_SLICE_BYTES", 2 * 100 * 512)
    shapes = [(T.Q4_K, 300, 512, 7), (T.Q8_0, 130, 512, 8), (T.Q4_0, 200, 512, 9)]
    n_tokens = 70
    rng = np.random.default_rng(10)
    x = rng.standard_normal((n_tokens, 512)).astype(np.float32)
    X = Buffer(dev, x.nbytes)
    X.write(x)
    ws, refs, outs = [], [], []
    for qtype, rows, cols, seed in shapes:
        raw, wref = make_weight(qtype, rows, cols, seed)
        ws.append(upload_qweight(dev, raw, qtype, rows, cols))
        refs.append(x.astype(np.float64) @ wref.T)
        Y = Buffer(dev, 4 * n_tokens * rows, host_visible=True)
        Y.array(np.uint32)[:] = 0x7FC00000
        outs.append(Y)
    seq = CommandSequence(dev).begin()
    kc.dequant_ahead = matmul_module.DequantAhead(kc, [(w, n_tokens) for w in ws])
    try:
        for w, Y in zip(ws, outs):
            matmul_module.matmul(seq, kc, w, View.whole(X), View.whole(Y), n_tokens)
    finally:
        kc.dequant_ahead = None
    seq.end().run()
    for (qtype, rows, _, _), Y, ref in zip(shapes, outs, refs):
        out = Y.array(np.float32, n_tokens * rows).reshape(n_tokens, rows)
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < tol(qtype, coopmat=True), f"{qtype.name} {rows} rows: relative error {err:.2e}"
