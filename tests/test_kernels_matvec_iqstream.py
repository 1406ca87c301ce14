"""IQ4_NL, MXFP4 and IQ4_XS on the one-token stream kernel (matvec_stream.comp: IQ4_NL and MXFP4
with Q4_0's planar loads, IQ4_XS by half super-blocks; the weights looked up in a shared table of the
nibbles' values): products against the numpy product of the gguf.quants dequantization, f32 and DOT8
forms, fused inputs, column parts, steps; a tiny model's decode with the kernel forced; the GPU rows
follow Q4_0's (IQ4_XS: Q4_K's)."""

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.kernels import upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.kernels.matmul import MatvecConfig, matvec_config

from .test_kernels_matmul import make_weight
from .test_kernels_matvec_fused import kc_variants, run_fused  # noqa: F401 (a fixture)
from .test_kernels_matvec_kquants import _dp_ok, _stand_in_gpu, _tol

# (type, columns, rows per lane): 3 blocks per row (idle lanes, 4 lanes per row: sums by a
# butterfly), 144 (two x chunks at 64 threads in the f32 form, three in DOT8's). Random blocks:
# every nibble, MXFP4's -0 (code 8) included. IQ4_XS half super-blocks: 6 per row (3 blocks: rows
# alternate the blocks' offsets 0 and 8 in their uvec4s), 36 (two x chunks at 64 threads, f32).
# (llvmpipe compiles each layout anew: few.)
STREAM_IQ_CASES = [(T.IQ4_NL, 96, 2), (T.IQ4_NL, 4608, 4), (T.MXFP4, 96, 2), (T.MXFP4, 4608, 4),
                   (T.IQ4_XS, 768, 2), (T.IQ4_XS, 4608, 2)]


@pytest.mark.parametrize("qtype,cols,rj", STREAM_IQ_CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("kernel", ["stream", "stream_dp"])
def test_stream_products(dev, kc_variants, monkeypatch, qtype, cols, rj, kernel):   # noqa: F811
    if kernel == "stream_dp" and not _dp_ok(kc_variants):
        pytest.skip("no integer dot products")
    cfg = MatvecConfig(64, rj, 1, 1, kernel)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    name = mm.type_suffix(qtype)
    assert matvec_config(kc_variants, qtype, 37, cols).kernel == kernel
    sg = kc_variants.info.subgroup_size or 32
    tpr, c, _ = mm.stream_split(64, sg, name, cols, rj, kc_variants.info.max_shared_memory,
                                dp=kernel == "stream_dp")
    assert tpr * (c - 1) < cols // mm.MATVEC_WIDE_UNIT[name] <= tpr * c
    tol = _tol(kernel)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=1, chunked=True, bias=True, tol=tol)
    # one row, x as the DOT8 form rounds it in the reference: the kernel's own arithmetic to f32
    # precision (a single random-walk sum may be small, so the rounding of x alone can exceed tol)
    run_fused(dev, kc_variants, qtype, 1, cols, 1, seed=2, tol=1e-5, x_levels=kernel == "stream_dp")
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=11, bias=True, norm=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 21, cols, 1, seed=12, resid=True, glu=True, tol=tol)
    assert c * 2 * mm.MATVEC_STREAM_NQ[name] <= mm.MATVEC_STREAM_MAX_LOADS   # every case pairs
    assert mm.matvec_pairs(kc_variants, *(upload_qweight(dev, make_weight(qtype, 37, cols, seed=s)[0], qtype, 37, cols)
                                          for s in (1, 2)))
    # the pair's scales come from binding 7 (MXFP4: its exponent bytes), chunked: per chunk's planes
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=13, chunked=True, norm=True, pair=True, tol=tol)
    if c > 1:   # x loaded before the weights (XFIRST): its first chunk of several
        monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": replace(cfg, xfirst=1)})
        run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=15, chunked=True, bias=True, norm=True, resid=True, tol=tol)


# (type, columns, units per part asked, parts, kernel): 144 blocks in 9 parts of 16; IQ4_XS 32 halves
# in 4 parts of 8
PARTS_CASES = [(T.IQ4_NL, 4608, 16, 9, "stream_dp+xfirst"), (T.MXFP4, 4608, 16, 9, "stream"),
               (T.IQ4_XS, 4096, 8, 4, "stream_dp")]


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
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=24, norm=True, bias=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=25, chunked=True, norm=True, pair=True, tol=tol)
    for buf in kc_variants._shared["column parts"].values():
        assert (np.frombuffer(buf.read(), dtype=np.uint32) == mm.PART_SENTINEL).all()


@pytest.mark.parametrize("qtype,cols", [(T.MXFP4, 512), (T.IQ4_XS, 1024)], ids=lambda v: getattr(v, "name", str(v)))
def test_stream_steps(dev, kc_variants, monkeypatch, qtype, cols):   # noqa: F811
    """STEPS: several row blocks per workgroup (the table written once, read by every block), the
    last workgroup short, fused inputs, pairs."""
    kernel = "stream_dp" if _dp_ok(kc_variants) else "stream"
    rows = 100
    cfg = MatvecConfig(64, 2, 1, 1, kernel, steps=3)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    spec, rows_per_wg, _, steps = mm._matvec_spec(kc_variants, cfg, mm.type_suffix(qtype), cols, 1, False, False, False)
    assert steps == 3 and rows > 3 * rows_per_wg and rows % rows_per_wg
    tol = _tol(kernel)
    run_fused(dev, kc_variants, qtype, rows, cols, 1, seed=31, chunked=True, bias=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, rows, cols, 1, seed=34, chunked=True, norm=True, pair=True, tol=tol)


@pytest.mark.parametrize("qtype,like", [(T.IQ4_NL, T.Q4_0), (T.MXFP4, T.Q4_0), (T.IQ4_XS, T.Q4_K)],
                         ids=lambda v: v.name)
def test_gpu_rows_follow_q4_0(qtype, like):
    """On a GPU with fast integer dots IQ4_NL and MXFP4 take Q4_0's stream rows shape for shape (the
    7.2B's, the 31.5B's and the 1.1B's products, a split's down product), IQ4_XS Q4_K's; several
    tokens keep the base kernel, and the base kernel stays reachable through LLAMAVK_MATVEC."""
    gpu = _stand_in_gpu()
    for rows, cols in ((14336, 4096), (4096, 4096), (1024, 4096), (4096, 14336), (32000, 4096),
                       (27648, 5120), (5120, 5120), (4096, 7168), (2048, 2048), (8192, 2048), (256, 2048)):
        got, want = matvec_config(gpu, qtype, rows, cols), matvec_config(gpu, like, rows, cols)
        assert got == want and got.kernel == "stream_dp", (rows, cols)
        if like == T.Q4_0:   # the same parts, lanes per row, units per lane and rows per lane (the
            # lookup table's shared memory leaves Q4_0's x chunks as they are)
            assert mm._stream_layout(gpu, got, mm.type_suffix(qtype), cols, got.nr) == \
                mm._stream_layout(gpu, want, "q4_0", cols, want.nr), (rows, cols)
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
    for qtype in (T.IQ4_NL, T.MXFP4, T.IQ4_XS):
        assert matvec_config(kc_variants, qtype, 4096, 4096).kernel == "base"
