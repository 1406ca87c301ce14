"""Q5_K, Q3_K and Q2_K on the one-token stream kernel (matvec_stream.comp; its header says how each
type's unit is loaded): products against the numpy product of the gguf.quants dequantization, f32
and DOT8 forms, every fused input, column parts, steps; a tiny model's decode with the kernel forced."""

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.kernels import upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.kernels.matmul import MatvecConfig, matvec_config

from .test_kernels_matmul import make_weight
from .test_kernels_matvec_fused import kc_variants, run_fused  # noqa: F401 (a fixture)

# (type, columns, rows per lane): Q5_K quarters (64 weights): 12 per row (idle lanes), 4 (4 lanes per
# row, sums by a butterfly), 72 (two x chunks at 64 threads in the f32 form). Q3_K super-blocks (at
# every even byte offset of a uvec4 across a row of 13): 13 (idle lanes), 32 (f32: two x chunks).
# Q2_K super-blocks (every 4-byte offset): the same counts. (llvmpipe compiles each layout anew: few.)
STREAM_KQ_CASES = [(T.Q5_K, 768, 2), (T.Q5_K, 256, 4), (T.Q5_K, 4608, 4),
                   (T.Q3_K, 3328, 2), (T.Q3_K, 8192, 2),
                   (T.Q2_K, 3328, 2), (T.Q2_K, 8192, 2)]


def _dp_ok(kc) -> bool:
    return bool(kc.device.features.get("int_dot"))


def _tol(kernel: str) -> float:
    # as tests/test_kernels_matvec_fused.py: f32 sums as exact as the other kernels; two int8 levels
    # of x within 1/64516 of its block's largest value
    return 1e-4 if kernel.startswith("stream_dp") else 1e-5


@pytest.mark.parametrize("qtype,cols,rj", STREAM_KQ_CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("kernel", ["stream", "stream_dp"])
def test_stream_products(dev, kc_variants, monkeypatch, qtype, cols, rj, kernel):   # noqa: F811
    if kernel == "stream_dp" and not _dp_ok(kc_variants):
        pytest.skip("no integer dot products")
    cfg = MatvecConfig(64, rj, 1, 1, kernel)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    name = mm.type_suffix(qtype)
    assert matvec_config(kc_variants, qtype, 37, cols).kernel == kernel
    sg = kc_variants.info.subgroup_size or 32
    tpr, c, rj_used = mm.stream_split(64, sg, name, cols, rj, kc_variants.info.max_shared_memory,
                                      dp=kernel == "stream_dp")
    assert tpr * (c - 1) < cols // mm.MATVEC_WIDE_UNIT[name] <= tpr * c
    tol = _tol(kernel)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=1, chunked=True, bias=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 1, cols, 1, seed=2, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=11, bias=True, norm=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 21, cols, 1, seed=12, resid=True, glu=True, tol=tol)
    pairable = c * 2 * mm.MATVEC_STREAM_NQ[name] <= mm.MATVEC_STREAM_MAX_LOADS
    assert mm.matvec_pairs(kc_variants, *(upload_qweight(dev, make_weight(qtype, 37, cols, seed=s)[0], qtype, 37, cols)
                                          for s in (1, 2))) == pairable
    if pairable:
        run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=13, chunked=True, norm=True, pair=True, tol=tol)
    if c > 1:   # x loaded before the weights (XFIRST): its first chunk of several, every input
        monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": replace(cfg, xfirst=1)})
        run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=15, chunked=True, bias=True, norm=True, resid=True, tol=tol)
        run_fused(dev, kc_variants, qtype, 21, cols, 1, seed=16, glu=True, tol=tol)


# (type, columns, units per part asked, parts, kernel): Q5_K 72 quarters in 9 parts of 8; Q3_K, Q2_K
# 16 blocks in 2 (the parts' merge does not depend on the type: one form each).
PARTS_CASES = [(T.Q5_K, 4608, 32, 9, "stream"), (T.Q5_K, 4608, 32, 9, "stream_dp+xfirst"),
               (T.Q3_K, 4096, 8, 2, "stream_dp+xfirst"), (T.Q2_K, 4096, 8, 2, "stream")]


@pytest.mark.parametrize("qtype,cols,ks,parts,kernel", PARTS_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_stream_column_parts(dev, kc_variants, monkeypatch, qtype, cols, ks, parts, kernel):   # noqa: F811
    """KSPLIT (PHASE 1 and 2 on this device): every part's sums merged, the norm over the whole row,
    pairs; the scratch back to sentinels after each product."""
    kernel, _, xfirst = kernel.partition("+")
    if kernel == "stream_dp" and not _dp_ok(kc_variants):
        pytest.skip("no integer dot products")
    cfg = MatvecConfig(64, 2, ks, 1, kernel, xfirst=int(bool(xfirst)))
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    name = mm.type_suffix(qtype)
    assert mm._matvec_spec(kc_variants, cfg, name, cols, 1, False, True, False)[2] == parts
    tol = _tol(kernel)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=21, chunked=True, bias=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=22, glu=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=24, norm=True, bias=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=25, chunked=True, norm=True, pair=True, tol=tol)
    for buf in kc_variants._shared["column parts"].values():
        assert (np.frombuffer(buf.read(), dtype=np.uint32) == mm.PART_SENTINEL).all()


# (type, columns, rows): Q3_K's and Q2_K's 4-block rows take 4 lanes each, 32 rows per row block
@pytest.mark.parametrize("qtype,cols,rows", [(T.Q5_K, 1024, 37), (T.Q3_K, 1024, 100), (T.Q2_K, 1024, 100)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_stream_steps(dev, kc_variants, monkeypatch, qtype, cols, rows):   # noqa: F811
    """STEPS: several row blocks per workgroup, the last workgroup short, every fused input, pairs."""
    kernel = "stream_dp" if _dp_ok(kc_variants) else "stream"
    cfg = MatvecConfig(64, 2, 1, 1, kernel, steps=3)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    spec, rows_per_wg, _, steps = mm._matvec_spec(kc_variants, cfg, mm.type_suffix(qtype), cols, 1, False, False, False)
    assert steps == 3 and rows > 3 * rows_per_wg and rows % rows_per_wg
    tol = _tol(kernel)
    run_fused(dev, kc_variants, qtype, rows, cols, 1, seed=31, chunked=True, bias=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, rows, cols, 1, seed=33, glu=True, tol=tol)
    run_fused(dev, kc_variants, qtype, rows, cols, 1, seed=34, chunked=True, norm=True, pair=True, tol=tol)


def _stand_in_gpu():
    """A GPU with fast integer dot products as MATVEC_CONFIGS sees one (no device)."""
    from types import SimpleNamespace
    return SimpleNamespace(device=SimpleNamespace(features={"int_dot": True}),
                           info=SimpleNamespace(is_cpu=False, subgroup_size=32, int_dot=True, int_dot_fast=True,
                                                max_shared_memory=49152, max_workgroup_invocations=1024))


@pytest.mark.parametrize("qtype", [T.Q5_K, T.Q3_K, T.Q2_K])
def test_gpu_rows_follow_q4_k(qtype):
    """On a GPU with fast integer dots these types take Q4_K's stream rows shape for shape (the
    7.2B's and the 31.5B's products, a split's down product); several tokens keep the base kernel,
    and the base kernel stays reachable through LLAMAVK_MATVEC (the A/B script's spelling)."""
    gpu = _stand_in_gpu()
    for rows, cols in ((14336, 4096), (4096, 4096), (1024, 4096), (4096, 14336), (32000, 4096),
                       (27648, 5120), (5120, 5120), (4096, 7168), (2048, 2048)):
        got, want = matvec_config(gpu, qtype, rows, cols), matvec_config(gpu, T.Q4_K, rows, cols)
        assert got == want and got.kernel == "stream_dp", (rows, cols)
    assert matvec_config(gpu, qtype, 4096, 4096, n_tokens=3).kernel == "base"
    name = mm.type_suffix(qtype)
    env = mm.parse_matvec_env(f"{name}=base:256,4,2,2")
    assert env[name] == MatvecConfig(256, 4, 2, 2, "base")
    gpu.info.int_dot_fast = False
    assert matvec_config(gpu, qtype, 4096, 4096).kernel == "base"


def test_software_device_keeps_the_base_kernel(dev, kc_variants):   # noqa: F811
    """llvmpipe's selection is unchanged: the base kernel unless forced."""
    if not kc_variants.info.is_cpu:
        pytest.skip("a software device's rows")
    for qtype, _, _ in STREAM_KQ_CASES:
        assert matvec_config(kc_variants, qtype, 4096, 4096).kernel == "base"
