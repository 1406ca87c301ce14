"""The small-tile prompt product (shaders/matmul_small.comp, family mul_mm_small: few rows, many
tokens -- a mixture of experts' router, DeltaNet alpha/beta) on a real Vulkan device against numpy.
selection picks it on GPUs only; here it is forced (matmul's product_kernel patched). Weights and the
float64 reference as in test_kernels_matmul.py; outputs poisoned with NaN first."""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.errors import LlamavkError
from llamavk.kernels import KernelCache
from llamavk.kernels import matmul as matmul_module
from llamavk.kernels import selection
from llamavk.kernels.matmul import MATVEC_MAX_TOKENS, small_gemm_plan
from llamavk.kernels.selection import SmallGemmConfig
from llamavk.quant import quant_info

from .test_kernels_matmul import ALL_TYPES, big_cols, record_product, tol


@pytest.fixture(scope="module")
def kc(dev):
    return KernelCache(dev)


@pytest.fixture
def forced(monkeypatch):
    """Batches over MATVEC_MAX_TOKENS take the small-tile kernel (any device, any shape)."""
    monkeypatch.setattr(matmul_module, "product_kernel",
                        lambda kc, n, r, c, t=None: "mul_mv" if n <= MATVEC_MAX_TOKENS else "mul_mm_small")


def run_small(dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes=None, with_bias=True):
    """(output, dispatched kernel names, plan of the first chunk); checks the output against numpy."""
    w, out, names, ref = record_product(dev, kc, qtype, rows, cols, n_tokens, seed, max_chunk_bytes, with_bias)
    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert err < tol(qtype), f"{qtype.name} {rows}x{cols} n_tokens={n_tokens}: relative error {err:.2e}"
    tname = quant_info(qtype).name.lower()
    plans = [small_gemm_plan(kc, selection.small_gemm_config(kc), ch.n_rows, cols, n_tokens) for ch in w.chunks]
    # per chunk: the product, and the sum of its parts where the columns were split
    want = []
    for plan in plans:
        want += [f"mul_mm_small_{tname}"] + (["reduce_sum_f32"] if plan[2] > 1 else [])
    assert names == want
    return out, w, plans


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_every_type(dev, kc, qtype, forced):
    """Every weight type: rows not a multiple of the tile (40), a partial token tile (17), bias,
    chunked weights (rows of 9, 9, 9, 5) over a prompt-sized batch."""
    cols = big_cols(qtype)
    run_small(dev, kc, qtype, 40, cols, 17, seed=1)
    _, w, _ = run_small(dev, kc, qtype, 32, cols, 64, seed=2, with_bias=False,
                        max_chunk_bytes=9 * quant_info(qtype).row_bytes(cols))
    assert len(w.chunks) == 4


# The shapes it is for: routers (f32 128 / 256 x 2048), DeltaNet alpha/beta (32 x 2048 of the model's
# type), at prompt sizes, split along the columns (the default: parts where the tiles are few).
@pytest.mark.parametrize("qtype,rows", [(T.F32, 256), (T.F32, 128), (T.F16, 128), (T.Q4_0, 32), (T.Q4_0, 128),
                                        (T.Q8_0, 32), (T.Q4_K, 40), (T.Q6_K, 32), (T.BF16, 32)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_prompt_shapes(dev, kc, qtype, rows, forced):
    for n_tokens, seed in ((512, 10), (511, 11)):
        out, _, plans = run_small(dev, kc, qtype, rows, 2048, n_tokens, seed=seed)
        assert plans[0][2] > 1, plans   # the columns split: the sum pass is covered
        again, _, _ = run_small(dev, kc, qtype, rows, 2048, n_tokens, seed=seed)
        np.testing.assert_array_equal(out, again)   # the parts add in a fixed order


@pytest.mark.parametrize("spec", ["16,32,4,4,1", "32,64,4,8,3", "64,32,8,4,0", "48,16,4,4,2", "16,16,4,4,32"])
def test_tile_configs(dev, kc, spec, forced, monkeypatch):
    """LLAMAVK_SMALL_GEMM tile configs (the sweeps' spelling): one part, parts not dividing the
    columns' units (3 of 11), rows and tokens not multiples of the tiles, more parts asked than units."""
    monkeypatch.setenv("LLAMAVK_SMALL_GEMM", spec)
    cfg = selection.small_gemm_config(kc)
    assert cfg.spec() == spec
    for qtype, rows, cols, n in ((T.Q4_0, 40, 352, 77), (T.F32, 256, 333, 64), (T.Q6_K, 37, 512, 17)):
        _, _, plans = run_small(dev, kc, qtype, rows, cols, n, seed=rows + n)
        if cfg.ks:
            assert plans[0][2] == min(cfg.ks, -(-cols // 32)), plans


def test_plan():
    """The grid: 256 rows x 512 tokens by 32 x 64 tiles are 64 workgroups, split 4 ways (parts of 16
    units); few tiles split further but keep parts of >= 4 units; many tiles are not split."""
    cfg = SmallGemmConfig(32, 64, 4, 4)
    assert small_gemm_plan(None, cfg, 256, 2048, 512) == (8, 8, 4, 16)
    assert small_gemm_plan(None, cfg, 32, 2048, 512) == (1, 8, 16, 4)
    assert small_gemm_plan(None, cfg, 32, 256, 512) == (1, 8, 2, 4)
    assert small_gemm_plan(None, cfg, 256, 2048, 4096) == (8, 64, 1, 64)
    assert small_gemm_plan(None, SmallGemmConfig(32, 64, 4, 4, 3), 32, 352, 64) == (1, 1, 3, 4)   # 4 + 4 + 3
    assert small_gemm_plan(None, SmallGemmConfig(32, 64, 4, 4, 32), 32, 100, 64) == (1, 1, 4, 1)


def test_env_errors(monkeypatch):
    for bad in ("32", "32,64,3,4", "32,64,4,4,33", "x", "30,64,4,4", "64,16,8,8"):
        with pytest.raises(LlamavkError, match="LLAMAVK_SMALL_GEMM"):
            selection.parse_small_gemm_env(bad)
    assert selection.parse_small_gemm_env("0") is None and selection.parse_small_gemm_env(None) is None


def test_selection(kc, monkeypatch):
    """GPUs: few rows and more tokens than the short-prompt limit take the small tiles; short prompts
    keep the 8-token slices; LLAMAVK_SMALL_GEMM=0 keeps the slices at any batch; software devices
    keep what they had."""
    class Info:
        is_cpu = False
    gpu = type("KC", (), {"info": Info(), "device": type("D", (), {"features": {}})()})()
    pick = selection.product_kernel
    short = selection.MATVEC_BATCHED_MAX["gpu"]
    assert pick(gpu, 512, 256, 2048) == "mul_mm_small"
    assert pick(gpu, short + 1, 32, 2048) == "mul_mm_small"
    assert pick(gpu, 512, 250, 2050) == "mul_mm_small"   # any rows and columns
    assert pick(gpu, short, 32, 2048) == "mul_mv_batched"
    assert pick(gpu, 512, selection.SMALL_ROWS + 8, 2048) == "mul_mm"
    if kc.info.is_cpu:
        assert pick(kc, 512, 256, 2048) != "mul_mm_small"
    monkeypatch.setenv("LLAMAVK_SMALL_GEMM", "0")
    assert pick(gpu, 512, 256, 2048) == "mul_mv_batched"
