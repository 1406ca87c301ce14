"""The NV cooperative-matrix-2 prompt product (shaders/matmul_cm2.comp, family mul_mm_cm2) against
numpy, where the device has VK_NV_cooperative_matrix2 (NVIDIA; skipped elsewhere, llvmpipe included),
and the selection and raw feature structs that serve it, everywhere. Weights and the float64
reference as in test_kernels_matmul.py; outputs poisoned with NaN first."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.errors import LlamavkError
from llamavk.kernels import KernelCache
from llamavk.kernels import matmul as matmul_module
from llamavk.kernels import selection
from llamavk.quant import quant_info
from llamavk.vk import coopmat2
from llamavk.vk._ffi import ffi

from .test_kernels_matmul import record_product, tol

CM2_TYPES = [T.Q4_0, T.Q8_0, T.Q4_K, T.Q6_K, T.F16]


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


def needs_cm2(kc, monkeypatch):
    """Skip without coopmat2; else every product takes it (small shapes would take other kernels)."""
    if not selection.has_coopmat2(kc):
        pytest.skip(f"{kc.device.info.name} has no VK_NV_cooperative_matrix2 with {', '.join(coopmat2.REQUIRED)}")
    monkeypatch.setattr(matmul_module, "product_kernel", lambda *a: "mul_mm_cm2")


def check(dev, kc, qtype, rows, cols, n_tokens, seed, **kw):
    w, out, names, ref = record_product(dev, kc, qtype, rows, cols, n_tokens, seed, **kw)
    family = "mul_mm_cm2h" if selection.cm2_x_f16() else "mul_mm_cm2"
    assert set(names) - {"convert_f16", "reduce_sum_f32"} == {f"{family}_{qtype.name.lower()}"}, names
    assert ("convert_f16" in names) == (family == "mul_mm_cm2h"), names
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < tol(qtype, coopmat=True), f"{qtype.name} {rows}x{cols} x {n_tokens}: relative error {err:.2e}"
    return w


# Tiles of 128 rows x 128 tokens: rows and tokens that are not multiples of them, several tiles each
# way, a bias, weights in several chunks (each a dispatch writing its rows of y).
# x read as f32 through a decode function, or converted to f16 first (LLAMAVK_CM2_X)
@pytest.mark.parametrize("x_type", ["f32", "f16"])
@pytest.mark.parametrize("qtype", CM2_TYPES, ids=lambda t: t.name)
def test_matmul_cm2(dev, kc, qtype, x_type, monkeypatch):
    monkeypatch.setenv("LLAMAVK_CM2_X", x_type)
    chosen = qtype.name.lower() in selection.cm2_chosen_types()
    # 128 tokens: below CM2_DEQUANT_MIN_TOKENS, where the K-quants take mul_mm_cm2d
    assert not selection.has_coopmat2(kc) or \
        (selection.product_kernel(kc, 128, 4096, 4096, qtype.name.lower()) == "mul_mm_cm2") == chosen
    needs_cm2(kc, monkeypatch)
    bs = quant_info(qtype).block_size
    bs = 32 if bs == 1 else bs   # F16: columns in multiples of 32 as the kernel needs
    cols = 24 * bs if bs == 32 else 3 * bs
    check(dev, kc, qtype, 37, cols, 17, seed=3)
    check(dev, kc, qtype, 300, cols, 130, seed=4, with_bias=True)
    w = check(dev, kc, qtype, 260, cols, 64 + 7, seed=5, with_bias=True,
              max_chunk_bytes=70 * quant_info(qtype).row_bytes(cols))
    assert len(w.chunks) > 1
    if bs == 32:   # whole tiles of rows and tokens, columns not a multiple of the step (64)
        check(dev, kc, qtype, 256, 25 * bs, 256, seed=6)
    # below 65 tokens one tile of 32 or 64 tokens (CM2_TILES), whole or past the batch, then 128-token
    # tiles, with and without edge rows
    for seed, (rows, n_tokens, width) in enumerate([(256, 32, 32), (300, 64, 64), (256, 24, 32), (130, 48, 64),
                                                    (256, 96, 128), (130, 192, 128)], start=10):
        assert qtype == T.F16 or selection.cm2_tile(n_tokens, rows, qtype.name.lower())[1] == width
        check(dev, kc, qtype, rows, cols, n_tokens, seed=seed, with_bias=seed % 2 == 1)


# A batch that is not a multiple of the token tile reads x's f16 scratch past the batch (whole tiles,
# no clamped loads; matmul._padded_x): rows there hold NaN here, and the batch's outputs are exact.
@pytest.mark.parametrize("qtype,n_tokens", [(T.Q4_0, 200), (T.Q4_K, 40), (T.F16, 136)], ids=lambda v: str(v))
def test_matmul_cm2_reads_x_past_the_batch(dev, kc, qtype, n_tokens, monkeypatch):
    needs_cm2(kc, monkeypatch)
    from llamavk.vk.buffer import Buffer
    cols = 512
    size = 1 << (2 * matmul_module.f16_x_room(n_tokens, cols) - 1).bit_length()
    scratch = kc.shared("cm2 f16 x", (size, 0), lambda: Buffer(dev, size))
    scratch.write(np.full(size // 2, np.nan, np.float16))
    check(dev, kc, qtype, 256, cols, n_tokens, seed=30, with_bias=True)


def test_padded_x():
    """How far a product reads x's f16 scratch: whole token tiles where its buffer holds them."""
    from llamavk.kernels import View
    buf = type("B", (), {"size": 2 * 256 * 512})()
    x, n = matmul_module._padded_x(View(buf, 0, 2 * 200 * 512), 200, 512, 128)
    assert n == 256 and x.nbytes == 2 * 256 * 512
    x, n = matmul_module._padded_x(View(buf, 0, 2 * 40 * 512), 40, 512, 64)
    assert n == 64 and x.nbytes == 2 * 64 * 512
    x, n = matmul_module._padded_x(View(buf, 2 * 100 * 512, 2 * 130 * 512), 130, 512, 128)
    assert n == 156 and x.nbytes == 2 * 156 * 512            # as far as the buffer goes
    x, n = matmul_module._padded_x(View(buf, 0, 2 * 256 * 512), 256, 512, 128)
    assert n == 256
    assert matmul_module.f16_x_room(200, 512) == matmul_module.f16_x_room(256, 512) == 256 * 512
    assert matmul_module.f16_x_room(257, 512) == 512 * 512


# The other tile shapes (specialization constants): the large-weight rule's 128 x 256 and others
# (every BM fills the K-quants' scale tables with its own number of threads per row; BK 32 and 256
# unroll 8 and 1 steps per span), columns in several spans of 256.
@pytest.mark.parametrize("tile", ["128x256", "256x128", "64x64x32", "128x128x128", "32x64x256"])
@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_K, T.Q6_K], ids=lambda t: t.name)
def test_matmul_cm2_tiles(dev, kc, qtype, tile, monkeypatch):
    needs_cm2(kc, monkeypatch)
    monkeypatch.setenv("LLAMAVK_CM2_TILE", tile)
    cols = 32 * 32 if qtype == T.Q4_0 else 3 * 256
    check(dev, kc, qtype, 300, cols, 270, seed=8, with_bias=True)
    check(dev, kc, qtype, 512, cols, 256, seed=9)   # whole tiles only (the unclamped loads)


# The F16 form's other constants (selection.cm2_f16_form): threads per workgroup, steps unrolled per
# iteration (3: 20 steps of 64 in 5 spans leave single steps after the unrolled ones), the pipelined
# order (pairs of steps); columns of 5 spans, whole and edge tiles, with and without split K (parts
# of 3 and 2 spans).
@pytest.mark.parametrize("form", ["128x128x64/WG=128", "128x128x32/PIPE=1", "128x256x64/UNROLL=8",
                                  "128x128x64/WG=128/ORDER=1", "64x128x64/ORDER=1",
                                  "64x128x128/WG=128/PIPE=1", "64x64x64/WG=64/UNROLL=3",
                                  "256x128x64/WG=512", "128x128x64/WG=128/UNROLL=3/PIPE=1"])
def test_matmul_cm2_f16_forms(dev, kc, form, monkeypatch):
    needs_cm2(kc, monkeypatch)
    tile, *knobs = form.split("/")
    env = dict(k.split("=") for k in knobs)
    if int(env.get("WG", 256)) > dev.info.coopmat2_max_workgroup:
        pytest.skip(f"{form}: workgroup-scope matrices of at most {dev.info.coopmat2_max_workgroup} threads here")
    monkeypatch.setenv("LLAMAVK_CM2_TILE", tile)
    for key, value in env.items():
        monkeypatch.setenv(f"LLAMAVK_CM2_{key}", value)
    check(dev, kc, T.F16, 300, 5 * 256, 270, seed=11, with_bias=True)
    check(dev, kc, T.F16, 512, 5 * 256, 256, seed=12)   # whole tiles only (the unclamped loads)
    monkeypatch.setenv("LLAMAVK_CM2_SPLIT", "2")
    check(dev, kc, T.F16, 512, 5 * 256, 256, seed=13, with_bias=True)


# Split K: the columns' spans over the grid's z, the parts and the bias added by reduce_sum (3 parts
# of 3, 3 and 2 spans; rows and tokens not multiples of the tiles).
@pytest.mark.parametrize("x_type", ["f32", "f16"])
@pytest.mark.parametrize("qtype", CM2_TYPES, ids=lambda t: t.name)
def test_matmul_cm2_split(dev, kc, qtype, x_type, monkeypatch):
    needs_cm2(kc, monkeypatch)
    monkeypatch.setenv("LLAMAVK_CM2_X", x_type)
    monkeypatch.setenv("LLAMAVK_CM2_SPLIT", "3")
    w, out, names, ref = record_product(dev, kc, qtype, 200, 8 * 256, 150, seed=10, with_bias=True)
    assert "reduce_sum_f32" in names, names
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < tol(qtype, coopmat=True), f"{qtype.name} split: relative error {err:.2e}"


def test_cm2_parts_rule(monkeypatch):
    assert selection.cm2_parts(64, 16) == 2      # 4096 rows x 512 tokens in 128 x 256 tiles
    assert selection.cm2_parts(128, 16) == 1
    assert selection.cm2_parts(8, 16) == 8       # at most CM2_MAX_PARTS
    assert selection.cm2_parts(8, 5) == 2        # two spans a part at least
    assert selection.cm2_parts(8, 0) == 1        # cols not a multiple of 256
    assert selection.cm2_parts(128, 16, selection.cm2_fill(128)) == 2   # 128-thread workgroups: two per SM
    assert selection.cm2_parts(448, 16, selection.cm2_fill(128)) == 1
    assert selection.cm2_fill(256) == selection.cm2_fill(512) == selection.CM2_FILL_WORKGROUPS
    # the wave model: 160 tiles (a 5120-row weight at 512 tokens) on 264 workgroups run in 3 parts of 7
    # spans in two full waves, not in one part and 61% of a wave; 256 tiles stay whole
    fill = selection.cm2_fill(128)
    assert selection.cm2_parts(160, 20, fill) == 3
    assert selection.cm2_cost(160, 20, fill, 3) < selection.cm2_cost(160, 20, fill, 1)
    assert selection.cm2_parts(256, 32, fill) == 1
    monkeypatch.setenv("LLAMAVK_CM2_WAVES", "0")   # the rule before it
    assert selection.cm2_parts(160, 20, fill) == 1
    assert selection.cm2_parts(128, 16, fill) == 2
    monkeypatch.delenv("LLAMAVK_CM2_WAVES")
    monkeypatch.setenv("LLAMAVK_CM2_SPLIT", "3")
    assert selection.cm2_parts(128, 16) == 3
    monkeypatch.setenv("LLAMAVK_CM2_SPLIT", "x")
    with pytest.raises(LlamavkError, match="LLAMAVK_CM2_SPLIT"):
        selection.cm2_parts(128, 16)


class _FakeKC:
    """What the selection reads of a kernel cache: the device's features and info."""
    def __init__(self, features):
        self.device = type("D", (), {"features": features})()
        self.info = type("I", (), {"is_cpu": False, "coopmat": [selection.COOPMAT_SHAPE], "subgroup_size": 32})()


def test_cm2_selection(monkeypatch):
    """Devices with coopmat2 take it for its types; other types and devices keep the KHR kernels;
    LLAMAVK_CM2=0 and LLAMAVK_MATMUL=mul_mm switch it off."""
    cm2 = _FakeKC({"coopmat": True, "coopmat2": True, "fp16": True})
    khr = _FakeKC({"coopmat": True, "fp16": True})
    # by default batches of more than 128 tokens (one token tile) dequantize to f16 first (mul_mm_cm2d),
    # every type that can
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_k") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 256, 14336, 4096, "q6_k") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 128, 4096, 4096, "q4_k") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 129, 4096, 4096, "q4_k") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_0") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "iq4_xs") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q5_k") == "mul_mm_cm2d"
    assert selection.product_kernel(cm2, 128, 4096, 4096, "q4_0") == "mul_mm_cm2"
    assert selection.product_kernel(khr, 512, 4096, 4096, "q4_k") == "mul_mm_coop"
    # the KHR kernel converts weights in packed f16 arithmetic: not without shaderFloat16
    assert selection.product_kernel(_FakeKC({"coopmat": True}), 512, 4096, 4096, "q4_k") == "mul_mm"
    monkeypatch.setenv("LLAMAVK_CM2_DEQUANT", "0")   # the per-element decode rows below
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q8_0") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 512, 1024, 4096, "q8_0") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 512, 14336, 4096, "q8_0") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_0") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_k") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 512, 14336, 4096, "q4_k") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 512, 14336, 4096, "q6_k") == "mul_mm_coop_big"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q6_k") == "mul_mm_coop"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q5_0") == "mul_mm_coop"
    monkeypatch.setenv("LLAMAVK_CM2_TYPES", "q6_k,q5_0")
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q6_k") == "mul_mm_cm2"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q4_k") == "mul_mm_coop"
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q5_0") == "mul_mm_coop"   # no such kernel
    monkeypatch.delenv("LLAMAVK_CM2_TYPES")
    assert selection.product_kernel(cm2, 512, 4096, 4096) == "mul_mm_coop"
    assert selection.product_kernel(cm2, 4, 4096, 4096, "q4_0") == "mul_mv"
    assert selection.product_kernel(khr, 512, 4096, 4096, "q8_0") == "mul_mm_coop"
    monkeypatch.setenv("LLAMAVK_CM2", "0")
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q8_0") == "mul_mm_coop"
    monkeypatch.setattr(selection, "_SKIP", {"mul_mm_cm2", "mul_mm_coop", "mul_mm_coop_big"})
    monkeypatch.delenv("LLAMAVK_CM2")
    assert selection.product_kernel(cm2, 512, 4096, 4096, "q8_0") == "mul_mm"


def test_cm2_tiles_rule(monkeypatch):
    assert selection.cm2_tile(512, 14336, "q4_0") == (128, 256, 64)
    assert selection.cm2_tile(512, 1024, "q8_0") == (128, 256, 64)
    assert selection.cm2_tile(128, 4096, "q4_0") == (128, 128, 64)
    assert selection.cm2_tile(512, 4096, "q4_k") == (128, 128, 64)
    assert selection.cm2_tile(512, 1024, "q4_k") == (64, 128, 64)
    assert selection.cm2_tile(512, 4096) == (128, 128, 64)
    # below 65 tokens one tile as narrow as covers the batch (whole or not), then 128-token tiles
    assert selection.cm2_tile(64, 4096, "q4_0") == selection.cm2_tile(33, 1024, "q4_k") == (128, 64, 64)
    assert selection.cm2_tile(32, 4096, "q4_0") == selection.cm2_tile(17, 14336, "q6_k") == (128, 32, 64)
    assert selection.cm2_tile(48, 4096, "q4_0") == (128, 64, 64)
    assert selection.cm2_tile(96, 4096, "q4_0") == selection.cm2_tile(65, 4096, "q4_k") == (128, 128, 64)
    assert selection.cm2_tile(192, 1024, "q4_k") == (64, 128, 64)
    assert selection.cm2_tile(64, 4096, "f16") == (128, 128, 64)        # f16 weights: not measured
    assert selection.cm2_tile(256, 4096, "q4_k") == (128, 128, 64)
    monkeypatch.setenv("LLAMAVK_CM2_TILE", "64x32")
    assert selection.cm2_tile(512, 4096) == (64, 32, 64)
    monkeypatch.setenv("LLAMAVK_CM2_TILE", "64x32x128")
    assert selection.cm2_tile(512, 4096) == (64, 32, 128)
    for bad in ["64", "48x64", "64x40", "64x64x96", "512x64"]:
        monkeypatch.setenv("LLAMAVK_CM2_TILE", bad)
        with pytest.raises(LlamavkError, match="LLAMAVK_CM2_TILE"):
            selection.cm2_tile(512, 4096)


def test_cm2_f16_form_rule(monkeypatch):
    """The F16 form's constants: the f16 tiles, then threads, unrolled steps, pipelined; each one's
    variable checked."""
    bm, bn, bk = selection.cm2_tile(512, 4096, "f16")
    assert selection.cm2_f16_form(512, 4096) == (bm, bn, bk, selection.CM2_F16_WG, selection.CM2_F16_UNROLL,
                                                 selection.CM2_F16_PIPE, selection.CM2_F16_TOKENS_FAST)
    monkeypatch.setenv("LLAMAVK_CM2_TILE", "64x128x32")
    monkeypatch.setenv("LLAMAVK_CM2_WG", "128")
    monkeypatch.setenv("LLAMAVK_CM2_UNROLL", "8")
    monkeypatch.setenv("LLAMAVK_CM2_PIPE", "1")
    monkeypatch.setenv("LLAMAVK_CM2_ORDER", "1")
    assert selection.cm2_f16_form(512, 4096) == (64, 128, 32, 128, 8, 1, 1)
    for name, bad in [("LLAMAVK_CM2_WG", "96"), ("LLAMAVK_CM2_UNROLL", "0"), ("LLAMAVK_CM2_PIPE", "yes"),
                      ("LLAMAVK_CM2_ORDER", "2")]:
        monkeypatch.setenv(name, bad)
        with pytest.raises(LlamavkError, match=name):
            selection.cm2_f16_form(512, 4096)
        monkeypatch.delenv(name)


def test_raw_structs_match_the_c_layout():
    """sType at 0, pNext at 8, members from 16: the layout of every Vulkan feature struct (checked on
    the KHR cooperative-matrix one the `vulkan` package does know)."""
    known = "VkPhysicalDeviceCooperativeMatrixFeaturesKHR"
    assert (ffi.offsetof(known, "sType"), ffi.offsetof(known, "pNext"), ffi.offsetof(known, "cooperativeMatrix")) == (0, 8, 16)
    nxt = ffi.new("uint32_t[4]")
    s = coopmat2.features_struct(nxt)
    raw = bytes(ffi.buffer(s.words))
    assert len(raw) == 16 + 4 * len(coopmat2.FEATURES)
    assert int.from_bytes(raw[0:4], "little") == coopmat2.FEATURES_STYPE
    assert int.from_bytes(raw[8:16], "little") == int(ffi.cast("uintptr_t", nxt))
    s.set_member(coopmat2.FEATURES.index("block_loads"), 1)
    s.set_member(0, 1)
    assert coopmat2.feature_names(s) == ["workgroup_scope", "block_loads"]
    p = coopmat2.properties_struct()
    p.set_member(0, 256)
    assert coopmat2.property_values(p)["workgroup_scope_max_workgroup_size"] == 256
    assert int.from_bytes(bytes(ffi.buffer(p.words))[8:16], "little") == 0


def test_device_reports_cm2_consistently(dev):
    """The device enables coopmat2 only with the extension and every feature the kernel uses."""
    if dev.features.get("coopmat2"):
        assert coopmat2.EXTENSION in dev.extensions
        assert set(coopmat2.REQUIRED) <= set(dev.info.coopmat2_features)
    else:
        assert not (coopmat2.EXTENSION in dev.extensions and set(coopmat2.REQUIRED) <= set(dev.info.coopmat2_features)
                    and "VK_KHR_cooperative_matrix" in dev.extensions)
