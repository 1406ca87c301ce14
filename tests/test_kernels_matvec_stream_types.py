"""The one-token stream kernel's forms of the types added after Q4_0 / Q8_0 / Q4_K / Q6_K
(matvec_stream.comp; its header says how each type's unit is loaded): Q5_K, Q3_K, Q2_K (K-quants) and
IQ4_NL, MXFP4 (Q4_0's planar loads), IQ4_XS (half super-blocks), the last three through a shared table
of the nibbles' values, and Q4_1, Q5_0, Q5_1 (Q4_0's planar loads and a head of scale, min, fifth bits). Products against the numpy product of the gguf.quants dequantization, f32 and
DOT8 forms, every fused input, column parts, steps; the GPU rows each type takes; tiny models decoding
with the kernel forced, against the numpy reference forward pass."""

from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.kernels import upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.kernels.matmul import MatvecConfig, matvec_config

from .test_kernels_matmul import make_weight
from .test_kernels_matvec_fused import kc_variants, run_fused  # noqa: F401 (a fixture)

# (type, columns, rows per lane). Q5_K quarters (64 weights): 12 per row (idle lanes), 4 (4 lanes per
# row, sums by a butterfly), 72 (two x chunks at 64 threads in the f32 form). Q3_K super-blocks (at
# every even byte offset of a uvec4 across a row of 13): 13 (idle lanes), 32 (f32: two x chunks).
# Q2_K super-blocks (every 4-byte offset): the same counts. IQ4_NL / MXFP4 blocks: 3 per row (idle
# lanes, 4 lanes per row), 144 (two x chunks at 64 threads in the f32 form, three in DOT8's); random
# blocks: every nibble, MXFP4's -0 (code 8) included. IQ4_XS half super-blocks: 6 per row (3 blocks:
# rows alternate the blocks' offsets 0 and 8 in their uvec4s), 36 (two x chunks at 64 threads, f32).
# Q4_1 / Q5_0 / Q5_1 blocks: as IQ4_NL's (3 per row: Q5_0's 6-byte heads at both 4-byte offsets).
# The lattice types' quarter super-blocks (64 weights, random blocks: every grid index, high bit and
# sign pattern): 12 per row (idle lanes), 72 (two x chunks at 64 threads in the f32 form). TQ2_0 half
# blocks (128 weights) as IQ4_XS's; TQ1_0 blocks as Q3_K's.
# (llvmpipe compiles each layout anew: few.)
STREAM_CASES = [(T.Q5_K, 768, 2), (T.Q5_K, 256, 4), (T.Q5_K, 4608, 4),
                (T.Q3_K, 3328, 2), (T.Q3_K, 8192, 2),
                (T.Q2_K, 3328, 2), (T.Q2_K, 8192, 2),
                (T.IQ4_NL, 96, 2), (T.IQ4_NL, 4608, 4), (T.MXFP4, 96, 2), (T.MXFP4, 4608, 4),
                (T.IQ4_XS, 768, 2), (T.IQ4_XS, 4608, 2),
                (T.Q4_1, 96, 2), (T.Q4_1, 4608, 4), (T.Q5_0, 96, 2), (T.Q5_0, 4608, 4),
                (T.Q5_1, 96, 2), (T.Q5_1, 4608, 4),
                (T.IQ2_XXS, 768, 2), (T.IQ2_XXS, 4608, 4), (T.IQ3_XXS, 768, 2), (T.IQ3_XXS, 4608, 4),
                (T.IQ2_XS, 768, 2), (T.IQ2_XS, 4608, 4), (T.IQ2_S, 768, 2), (T.IQ2_S, 4608, 4),
                (T.IQ3_S, 768, 2), (T.IQ3_S, 4608, 4), (T.IQ1_S, 768, 2), (T.IQ1_S, 4608, 4),
                (T.IQ1_M, 768, 2), (T.IQ1_M, 4608, 4), (T.TQ2_0, 768, 2), (T.TQ2_0, 4608, 4),
                (T.TQ1_0, 3328, 2), (T.TQ1_0, 8192, 2)]
# the types whose weights are table values of random bytes (the lattice types: grid entries with
# random signs; the ternary types: random digits): a single row's random-walk sum may be small, so its
# check takes x as the DOT8 form rounds it
TABLE_TYPES = (T.IQ4_NL, T.MXFP4, T.IQ4_XS, T.IQ2_XXS, T.IQ3_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_S, T.IQ1_S, T.IQ1_M,
               T.TQ2_0, T.TQ1_0)
# the types that take Q4_0's GPU rows; the others Q4_K's (selection.Q40_RULE_TYPES, Q4K_RULE_TYPES)
Q40_LIKE = (T.IQ4_NL, T.MXFP4, T.Q4_1, T.Q5_0, T.Q5_1)
# the types whose GPU rows take the half-super-block form (selection.HALF_RULE_TYPES)
HALF_TYPES = (T.Q2_K, T.Q3_K)


def _dp_ok(kc) -> bool:
    return bool(kc.device.features.get("int_dot"))


def _tol(kernel: str) -> float:
    # as tests/test_kernels_matvec_fused.py: f32 sums as exact as the other kernels; two int8 levels
    # of x within 1/64516 of its block's largest value
    return 1e-4 if kernel.startswith("stream_dp") else 1e-5


@pytest.mark.parametrize("qtype,cols,rj", STREAM_CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("kernel", ["stream", "stream_dp"])
def test_stream_products(dev, kc_variants, monkeypatch, qtype, cols, rj, kernel):   # noqa: F811
    _check_products(dev, kc_variants, monkeypatch, qtype, cols, rj, kernel)


def _check_products(dev, kc_variants, monkeypatch, qtype, cols, rj, kernel):   # noqa: F811
    """kernel's products of qtype against numpy: chunked weights, one row, every fused input, pairs
    where they fit, x first where x comes in several chunks."""
    if kernel.startswith("stream_dp") and not _dp_ok(kc_variants):
        pytest.skip("no integer dot products")
    cfg = MatvecConfig(64, rj, 1, 1, kernel)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    name = mm.type_suffix(qtype)
    assert matvec_config(kc_variants, qtype, 37, cols).kernel == kernel
    sg = kc_variants.info.subgroup_size or 32
    tpr, c, _ = mm.stream_split(64, sg, name, cols, rj, kc_variants.info.max_shared_memory,
                                dp=kernel.startswith("stream_dp"), kernel=kernel)
    assert tpr * (c - 1) < cols // mm._stream_unit(kernel, name)[0] <= tpr * c
    tol = _tol(kernel)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=1, chunked=True, bias=True, tol=tol)
    if qtype in TABLE_TYPES:   # one row, x as the DOT8 form rounds it: the kernel's own arithmetic (its
        # terms cancel: the error against their magnitudes; a wrong weight is ~2e-4 of them, f32 ~1e-7)
        run_fused(dev, kc_variants, qtype, 1, cols, 1, seed=2, tol=1e-6, x_levels=kernel == "stream_dp",
                  per_term=True)
    else:
        run_fused(dev, kc_variants, qtype, 1, cols, 1, seed=2, tol=tol)
    run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=11, bias=True, norm=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, 21, cols, 1, seed=12, resid=True, glu=True, tol=tol)
    nq = mm._stream_unit(kernel, name)[1]
    pairable = c * 2 * nq <= mm.MATVEC_STREAM_MAX_LOADS
    assert pairable or qtype not in TABLE_TYPES        # every table type's case pairs
    assert mm.matvec_pairs(kc_variants, *(upload_qweight(dev, make_weight(qtype, 37, cols, seed=s)[0], qtype, 37, cols)
                                          for s in (1, 2))) == pairable
    if pairable:   # the pair's scales from binding 7 (MXFP4: its exponent bytes), chunked: per chunk
        run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=13, chunked=True, norm=True, pair=True, tol=tol)
    if c > 1:   # x loaded before the weights (XFIRST): its first chunk of several, every input
        monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": replace(cfg, xfirst=1)})
        run_fused(dev, kc_variants, qtype, 37, cols, 1, seed=15, chunked=True, bias=True, norm=True, resid=True, tol=tol)
        run_fused(dev, kc_variants, qtype, 21, cols, 1, seed=16, glu=True, tol=tol)


# (type, columns, units per part asked, parts, kernel): Q5_K 72 quarters in 9 parts of 8; Q3_K, Q2_K
# 16 blocks in 2; IQ4_NL / MXFP4 144 blocks in 9 parts of 16; IQ4_XS 32 halves in 4 parts of 8 (the
# parts' merge does not depend on the type: one form each)
PARTS_CASES = [(T.Q5_K, 4608, 32, 9, "stream"), (T.Q5_K, 4608, 32, 9, "stream_dp+xfirst"),
               (T.Q3_K, 4096, 8, 2, "stream_dp+xfirst"), (T.Q2_K, 4096, 8, 2, "stream"),
               (T.IQ4_NL, 4608, 16, 9, "stream_dp+xfirst"), (T.MXFP4, 4608, 16, 9, "stream"),
               (T.IQ4_XS, 4096, 8, 4, "stream_dp"), (T.Q6_K, 4096, 16, 4, "stream_dp+xfirst"),
               (T.Q6_K, 4096, 16, 4, "stream"),
               (T.Q4_1, 4608, 16, 9, "stream_dp+xfirst"), (T.Q5_0, 4608, 16, 9, "stream"),
               (T.Q5_1, 4608, 16, 9, "stream_dp"),
               (T.IQ2_XXS, 4096, 16, 4, "stream_dp+xfirst"), (T.IQ3_XXS, 4096, 16, 4, "stream"),
               (T.IQ2_S, 4096, 16, 4, "stream_dp"), (T.IQ3_S, 4096, 16, 4, "stream_dp+xfirst"),
               (T.IQ1_M, 4096, 16, 4, "stream_dp"), (T.TQ2_0, 4096, 8, 4, "stream_dp+xfirst"),
               (T.TQ1_0, 4096, 8, 2, "stream")]


@pytest.mark.parametrize("qtype,cols,ks,parts,kernel", PARTS_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_stream_column_parts(dev, kc_variants, monkeypatch, qtype, cols, ks, parts, kernel):   # noqa: F811
    """KSPLIT (PHASE 1 and 2 on this device): every part's sums merged, the norm over the whole row,
    pairs; the scratch back to sentinels after each product."""
    kernel, _, xfirst = kernel.partition("+")
    if kernel.startswith("stream_dp") and not _dp_ok(kc_variants):
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
@pytest.mark.parametrize("qtype,cols,rows", [(T.Q5_K, 1024, 37), (T.Q3_K, 1024, 100), (T.Q2_K, 1024, 100),
                                             (T.MXFP4, 512, 100), (T.IQ4_XS, 1024, 100), (T.Q8_0, 1024, 37),
                                             (T.IQ3_XXS, 1024, 100), (T.IQ2_XS, 1024, 100), (T.IQ1_S, 1024, 100)],
                         ids=lambda v: getattr(v, "name", str(v)))
def test_stream_steps(dev, kc_variants, monkeypatch, qtype, cols, rows):   # noqa: F811
    """STEPS: several row blocks per workgroup (a table written once, read by every block), the last
    workgroup short, every fused input, pairs."""
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


# The 128-weight units' own rows (selection.HALF_UNIT_ROWS: IQ4_XS, Q2_K and Q3_K): rows 4096 to 8192
# wide but of the output product's shape (more than 4x as many rows as columns: also the 31.5B's
# gate/up, not measured), and rows over 8192 wide
HALF_UNIT_OWN = ((14336, 4096), (4096, 4096), (1024, 4096), (4096, 14336), (5120, 5120), (4096, 7168))
HALF_UNIT_TYPES = (T.IQ4_XS, T.Q2_K, T.Q3_K, T.TQ2_0)


@pytest.mark.parametrize("qtype", list(dict.fromkeys(c[0] for c in STREAM_CASES)) + [T.Q6_K], ids=lambda v: v.name)
def test_gpu_rows_follow_q4_0_or_q4_k(qtype):
    """On a GPU with fast integer dots IQ4_NL, MXFP4, Q4_1, Q5_0 and Q5_1 take Q4_0's stream rows shape
    for shape, the others Q4_K's (the 7.2B's, the 31.5B's and the 1.1B's products, a split's down
    product; IQ4_XS, Q2_K and Q3_K their own where test_half_unit_rows says, Q5_K its square products by
    one row block per workgroup); several tokens keep the
    base kernel, and the
    base kernel stays reachable through LLAMAVK_MATVEC (the A/B script's spelling)."""
    like = T.Q4_0 if qtype in Q40_LIKE else T.Q4_K
    gpu = _stand_in_gpu()
    half = qtype in HALF_TYPES   # Q4_K's rows on the half-super-block form
    for rows, cols in ((14336, 4096), (4096, 4096), (1024, 4096), (4096, 14336), (32000, 4096),
                       (27648, 5120), (5120, 5120), (4096, 7168), (2048, 2048), (8192, 2048), (256, 2048)):
        if qtype in HALF_UNIT_TYPES and (rows, cols) in HALF_UNIT_OWN:
            continue
        got, want = matvec_config(gpu, qtype, rows, cols), matvec_config(gpu, like, rows, cols)
        if qtype == T.Q5_K and rows == cols and cols >= 4096:   # its square products by one row block
            want = replace(want, steps=1, chained_steps=0)
        if half:   # the same weights per column part: half the (twice as long) units
            want = replace(want, kernel="stream_dp_half", ks=max(1, want.ks // 2))
        assert got == want and got.kernel == ("stream_dp_half" if half else "stream_dp"), (rows, cols)
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


def test_q8_0_pair_rows():
    """Q8_0's gate/up shapes on a GPU with fast integer dots (selection.MATVEC_CONFIGS): 1 row of gate and
    1 of up per lane, one wave of 256 workgroups (the 7.2B's pair by 14 steps, the 31.5B's by 54); its
    square, K / V, down and output products keep the rows they had (Q4_0's without the waves)."""
    gpu = _stand_in_gpu()

    def grid(rows, cols, pair=False):
        cfg = matvec_config(gpu, T.Q8_0, rows, cols)
        _, rows_per_wg, parts, steps = mm._matvec_spec(gpu, cfg, "q8_0", cols, 1, False, False, False, pair,
                                                     rows=rows)
        return cfg.nr, rows_per_wg, parts, steps, parts * -(-rows // rows_per_wg // steps)
    assert grid(14336, 4096, pair=True) == (2, 4, 1, 14, 256)
    assert grid(27648, 5120, pair=True) == (2, 2, 1, 54, 256)
    assert grid(4096, 4096) == (4, 16, 1, 1, 256) and grid(1024, 4096) == (4, 16, 1, 1, 64)
    assert grid(32000, 4096) == (4, 16, 1, 1, 2000) and grid(32000, 5120)[:4] == (4, 8, 1, 1)
    assert grid(4096, 14336) == (4, 32, 14, 1, 1792)
    assert matvec_config(gpu, T.Q8_0, 14336, 4096, n_tokens=3).kernel == "base"


def test_matvec_env_is_read_again_when_it_changes(monkeypatch):
    """LLAMAVK_MATVEC set or changed after import (a tool's settings between two loads in one process,
    benchmarks/greedy_compare.py) takes effect at the next choice; unset, the rows come back; a bad
    value is a one-line error then."""
    from llamavk.errors import LlamavkError
    monkeypatch.setattr(mm, "_MATVEC_ENV", mm._MATVEC_ENV)   # both put back after the test
    monkeypatch.setattr(mm, "_MATVEC_ENV_TEXT", mm._MATVEC_ENV_TEXT)
    gpu = _stand_in_gpu()
    monkeypatch.setenv("LLAMAVK_MATVEC", "q4_0@4096x4096=base:256,4,2,2")
    assert matvec_config(gpu, T.Q4_0, 4096, 4096) == MatvecConfig(256, 4, 2, 2, "base")
    assert matvec_config(gpu, T.Q4_0, 1024, 4096).kernel == "stream_dp"   # other shapes keep their rows
    monkeypatch.delenv("LLAMAVK_MATVEC")
    assert matvec_config(gpu, T.Q4_0, 4096, 4096).kernel == "stream_dp"
    monkeypatch.setenv("LLAMAVK_MATVEC", "q4_0=nope:1,2,3,4")
    with pytest.raises(LlamavkError, match="LLAMAVK_MATVEC: unknown kernel"):
        matvec_config(gpu, T.Q4_0, 4096, 4096)


@pytest.mark.parametrize("qtype", HALF_UNIT_TYPES, ids=lambda v: v.name)
def test_half_unit_rows(qtype):
    """IQ4_XS, and Q2_K / Q3_K in their half form, on a GPU with fast integer dots (selection.HALF_UNIT_ROWS):
    256 threads, so that the 7.2B's gate/up, square and K/V products get Q4_K's row blocks per
    workgroup (their unit, 128 weights, is twice Q4_K's: half the lanes per row) -- the gate/up pair
    one wave of 256 workgroups by 7 steps, the square products 256 by one, K and V 64, the down
    product in Q4_K's 14 parts of 1024 weights (8 lanes per row: 64 rows per workgroup, 896
    workgroups); the output product keeps Q4_K's row."""
    gpu = _stand_in_gpu()
    name = mm.type_suffix(qtype)
    kernel = "stream_dp_half" if qtype in HALF_TYPES else "stream_dp"

    def grid(rows, cols, pair=False):
        cfg = matvec_config(gpu, qtype, rows, cols)
        assert cfg.kernel == kernel and cfg.wg == 256, (rows, cols)
        _, rows_per_wg, parts, steps = mm._matvec_spec(gpu, cfg, name, cols, 1, False, False, False, pair,
                                                     rows=rows)
        return rows_per_wg, parts, steps, parts * -(-rows // rows_per_wg // steps)
    assert grid(14336, 4096, pair=True) == (8, 1, 7, 256)
    assert grid(4096, 4096) == (16, 1, 1, 256) and grid(1024, 4096) == (16, 1, 1, 64)
    assert grid(4096, 14336) == (64, 14, 1, 896) and matvec_config(gpu, qtype, 4096, 14336).xfirst
    assert all(matvec_config(gpu, qtype, r, c).wg == 256 for r, c in HALF_UNIT_OWN)
    q4k_row = matvec_config(gpu, T.Q4_K, 32000, 4096)
    if qtype in HALF_TYPES:
        q4k_row = replace(q4k_row, kernel="stream_dp_half", ks=max(1, q4k_row.ks // 2))
    assert matvec_config(gpu, qtype, 32000, 4096) == q4k_row


# Q6_K's half-super-block form (kernels stream_h, stream_dp_h: matvec_stream.comp Q6K_HALF, kept for
# A/B) on the planar layout: (columns, rows per lane, units per part): 26 halves (idle lanes), 34 (f32:
# two x chunks at 64 threads), 32 in 4 parts of 8.
@pytest.mark.parametrize("cols,rj,ks", [(3328, 2, 1), (4352, 2, 1), (4096, 2, 8)])
@pytest.mark.parametrize("kernel", ["stream_h", "stream_dp_h"])
def test_q6k_half_form_products(dev, kc_variants, monkeypatch, cols, rj, ks, kernel):   # noqa: F811
    if kernel == "stream_dp_h" and not _dp_ok(kc_variants):
        pytest.skip("no integer dot products")
    cfg = MatvecConfig(64, rj, ks, 1, kernel, xfirst=int(ks > 1))
    monkeypatch.setattr(mm, "_MATVEC_ENV", mm.parse_matvec_env(f"q6_k={cfg.spec()}"))
    assert matvec_config(kc_variants, T.Q6_K, 37, cols) == cfg
    _, rows_per_wg, parts, _ = mm._matvec_spec(kc_variants, cfg, "q6_k", cols, 1, False, False, False)
    assert parts == (4 if ks > 1 else 1)
    tol = 1e-4 if kernel == "stream_dp_h" else 1e-5
    run_fused(dev, kc_variants, T.Q6_K, 37, cols, 1, seed=41, chunked=True, bias=True, tol=tol)
    run_fused(dev, kc_variants, T.Q6_K, 37, cols, 1, seed=42, bias=True, norm=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, T.Q6_K, 21, cols, 1, seed=43, resid=True, glu=True, tol=tol)
    two = [upload_qweight(dev, make_weight(T.Q6_K, 37, cols, seed=s)[0], T.Q6_K, 37, cols) for s in (1, 2)]
    if mm.matvec_pairs(kc_variants, *two):   # not where a lane holds two x chunks (2 x 2 x 7 loads)
        run_fused(dev, kc_variants, T.Q6_K, 37, cols, 1, seed=44, chunked=True, norm=True, pair=True, tol=tol)
    else:
        assert cols == 4352 and kernel == "stream_h"
    assert f"{mm.MATVEC_KERNELS[kernel][0]}_q6_k" in {name for name, _ in kc_variants._kernels}


def test_software_device_keeps_its_kernel(dev, kc_variants):   # noqa: F811
    """llvmpipe takes its own kernel (matvec_cpu.comp), not the stream kernel, unless forced."""
    if not kc_variants.info.is_cpu:
        pytest.skip("a software device's rows")
    for qtype, _, _ in STREAM_CASES:
        assert matvec_config(kc_variants, qtype, 4096, 4096).kernel == "cpu"


MODEL_TYPES = ["q5_k", "q3_k", "q2_k", "iq4_nl", "mxfp4", "iq4_xs", "q4_1", "q5_0", "q5_1"]


@pytest.mark.parametrize("qtype", ["q6_k", "q6_k/stream_dp_h"] + MODEL_TYPES +
                         [f"{t}/{k}" for t in ("q2_k", "q3_k") for k in ("stream_dp_half", "stream_half")])
def test_decode_on_the_stream_dp_kernel_through_the_override(synthetic_model, monkeypatch, qtype):
    """A tiny model's one-token steps with every product on the DOT8 stream form (TYPE/KERNEL: that
    kernel, e.g. Q6_K's half-super-block form, Q2_K's / Q3_K's half-block forms, f32 and DOT8), chosen
    as an A/B run chooses it (LLAMAVK_MATVEC=TYPE=stream_dp:..., 2 row blocks per workgroup): each
    step's logits equal the numpy reference forward pass."""
    from llamavk.models import load_model_file
    from llamavk.reference import ReferenceModel

    from .test_engine import one_token_logits, quiet_load

    qtype, _, kernel = qtype.partition("/")
    kernel = kernel or "stream_dp"
    monkeypatch.setattr(mm, "_MATVEC_ENV", mm.parse_matvec_env(f"{qtype}={kernel}:64,2,1,1,2"))
    path = synthetic_model("llama", qtype)
    tokens = [int(t) for t in np.random.default_rng(13).integers(0, 500, 8)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    with quiet_load(path, n_ctx=64) as m:
        rt = m.runtime
        if kernel.startswith("stream_dp") and not rt.kc.device.features.get("int_dot"):
            pytest.skip("no integer dot products")
        got = one_token_logits(rt, tokens)
        assert f"{mm.MATVEC_KERNELS[kernel][0]}_{qtype}" in {name for name, _ in rt.kc._kernels}
    assert np.abs(got - ref).max() <= 0.003 * np.abs(ref).max()


# WAIT / SIGNAL do not depend on the type; the table types write their table after the wait
@pytest.mark.parametrize("qtype", ["q5_k", "q3_k", "iq4_nl", "iq4_xs", "q6_k", "q4_1", "q5_1"])
def test_chained_steps_match_unchained(synthetic_model, monkeypatch, portable_attention, qtype):
    """Stages chained without barriers (WAIT / SIGNAL, x loaded first) on these types' stream
    products: the unchained logits bit for bit, and the reference's within its tolerance."""
    from .vk_fixtures import chainable_stream_kernel

    chainable_stream_kernel(monkeypatch)
    _check_chained(synthetic_model, monkeypatch, qtype)


def _check_chained(synthetic_model, monkeypatch, qtype, variant=None):
    """variant: a kernel the steps must have run."""
    from llamavk.models import load_model_file
    from llamavk.reference import ReferenceModel

    from .test_engine import one_token_logits, quiet_load

    path = synthetic_model("llama", qtype)
    tokens = [int(t) for t in np.random.default_rng(9).integers(0, 500, 10)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    got = {}
    for chain in ("0", "1"):
        monkeypatch.setenv("LLAMAVK_CHAIN", chain)
        with quiet_load(path, n_ctx=64) as m:
            got[chain] = one_token_logits(m.runtime, tokens)
            assert variant is None or variant in {name for name, _ in m.runtime.kc._kernels}
            assert bool(m.runtime.chains[("last", 1, 0, False)]) == (chain == "1")
    assert np.array_equal(got["0"], got["1"])
    assert np.abs(got["1"] - ref).max() <= 0.003 * np.abs(ref).max()


# Half-super-block units (matvec_stream.comp HALF_BLOCK, kernels stream_half / stream_dp_half).
# (type, columns, rows per lane): 26 halves of 13 blocks per row (idle lanes; across 37 rows every
# block offset in its uvec4: Q2_K's 4 word offsets, Q3_K's 8 even byte offsets, both halves), 64 (f32:
# two x chunks at 64 threads).
HALF_CASES = [(T.Q2_K, 3328, 2), (T.Q2_K, 8192, 2), (T.Q3_K, 3328, 2), (T.Q3_K, 8192, 2)]


@pytest.mark.parametrize("qtype,cols,rj", HALF_CASES, ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("kernel", ["stream_half", "stream_dp_half"])
def test_half_block_products(dev, kc_variants, monkeypatch, qtype, cols, rj, kernel):   # noqa: F811
    _check_products(dev, kc_variants, monkeypatch, qtype, cols, rj, kernel)


# (type, columns, units per part asked, parts, kernel): 32 halves in 4 parts of 8
HALF_PARTS_CASES = [(T.Q2_K, 4096, 8, 4, "stream_half"), (T.Q2_K, 4096, 8, 4, "stream_dp_half+xfirst"),
                    (T.Q3_K, 4096, 8, 4, "stream_half+xfirst"), (T.Q3_K, 4096, 8, 4, "stream_dp_half")]


@pytest.mark.parametrize("qtype,cols,ks,parts,kernel", HALF_PARTS_CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_half_block_column_parts(dev, kc_variants, monkeypatch, qtype, cols, ks, parts, kernel):   # noqa: F811
    test_stream_column_parts(dev, kc_variants, monkeypatch, qtype, cols, ks, parts, kernel)


@pytest.mark.parametrize("qtype", HALF_TYPES, ids=lambda v: v.name)
def test_half_block_steps(dev, kc_variants, monkeypatch, qtype):   # noqa: F811
    """STEPS on the half form: 8-half rows of 1024 take 8 lanes each, 16 rows per row block."""
    kernel = "stream_dp_half" if _dp_ok(kc_variants) else "stream_half"
    cfg = MatvecConfig(64, 2, 1, 1, kernel, steps=3)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": cfg})
    rows, cols = 100, 1024
    spec, rows_per_wg, _, steps = mm._matvec_spec(kc_variants, cfg, mm.type_suffix(qtype), cols, 1, False, False, False)
    assert steps == 3 and rows > 3 * rows_per_wg and rows % rows_per_wg and spec[4] == 8
    tol = _tol(kernel)
    run_fused(dev, kc_variants, qtype, rows, cols, 1, seed=31, chunked=True, bias=True, resid=True, tol=tol)
    run_fused(dev, kc_variants, qtype, rows, cols, 1, seed=34, chunked=True, norm=True, pair=True, tol=tol)


def test_half_block_forms_reachable_by_override(monkeypatch):
    """The A/B script's spellings: the half form (the GPU default), the whole-block stream form and the
    base kernel, each through LLAMAVK_MATVEC on a GPU stand-in."""
    gpu = _stand_in_gpu()
    for qtype in HALF_TYPES:
        name = mm.type_suffix(qtype)
        assert matvec_config(gpu, qtype, 4096, 4096).kernel == "stream_dp_half"
        for spelling, kernel in ((f"{name}=stream_dp_half:512,2,1,1,2", "stream_dp_half"),
                                 (f"{name}=stream_dp:512,2,1,1,2", "stream_dp"),
                                 (f"{name}=base:256,4,2,2", "base")):
            monkeypatch.setattr(mm, "_MATVEC_ENV", mm.parse_matvec_env(spelling))
            assert matvec_config(gpu, qtype, 4096, 4096).kernel == kernel, spelling


@pytest.mark.parametrize("qtype", ["q2_k", "q3_k"])
def test_chained_steps_on_the_half_form(synthetic_model, monkeypatch, portable_attention, qtype):
    """WAIT / SIGNAL (x loaded first) on the half form: the unchained logits bit for bit, and the
    reference's within its tolerance."""
    from .vk_fixtures import chainable_stream_kernel

    chainable_stream_kernel(monkeypatch)
    monkeypatch.setattr(mm, "_MATVEC_ENV", {k: replace(v, kernel="stream_half") for k, v in mm._MATVEC_ENV.items()})
    _check_chained(synthetic_model, monkeypatch, qtype, variant=f"mul_mv_stream_half_{qtype}")
