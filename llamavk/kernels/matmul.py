"""Weight matrix products and embedding lookups over GGUF-typed weights (shaders/matvec.comp,
matmul.comp, get_rows.comp; dequantization in shaders/quants.glsl).

- `matmul`: y[t, r] = sum_c W[r, c] x[t, c] (+ bias[r]). Up to MATVEC_MAX_TOKENS tokens use the
  matrix-vector kernel (reads W once for all tokens: decode and small batches); more use the tiled
  matrix-matrix kernel (64 rows x 64 tokens per workgroup).
- `get_rows`: out[t, :] = dequant(W[ids[t], :]).

Each weight chunk (its own buffer, rows [row_start, row_start + n_rows)) is one dispatch; the kernel
gets the chunk's first row and the row stride of y as push constants and writes its outputs straight
into the right columns of y.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass

from ..errors import LlamavkError
from ..quant import quant_info
from . import KernelCache, QWeight, View, groups_2d

# Token counts up to this use the matrix-vector kernel (one pass over W, NT accumulators per row);
# the tiled kernel needs enough tokens to fill its 64-token tiles before it pays off.
MATVEC_MAX_TOKENS = 8
MATMUL_TILE_ROWS = 64       # BM in matmul.comp
MATMUL_TILE_TOKENS = 64     # BN in matmul.comp
GET_ROWS_WG = 64


def type_suffix(qtype) -> str:
    return quant_info(qtype).name.lower()


@dataclass(frozen=True)
class MatvecConfig:
    wg: int   # threads per workgroup
    nr: int   # rows per row group (NR <= 8)
    ks: int   # subgroups sharing one row group (split of the columns)
    u: int    # blocks per lane per loop step


# Override for experiments: LLAMAVK_MATVEC="wg,nr,ks,u".
_MATVEC_ENV = os.environ.get("LLAMAVK_MATVEC")


# Work split per kind of device: measured with examples/bench_matvec.py (docs/PERFORMANCE.md). GPUs:
# 8 rows per 256-thread workgroup (4 rows per pair of subgroups), 2 quarters per lane per step.
# Software devices: the smallest unrolling, since pipeline compilation there costs more than it saves.
MATVEC_CONFIGS = {
    "gpu": MatvecConfig(wg=256, nr=4, ks=2, u=2),
    "cpu": MatvecConfig(wg=128, nr=2, ks=1, u=1),
}


def matvec_config(kc: KernelCache, qtype, rows: int, cols: int) -> MatvecConfig:
    """Matrix-vector work split for a device and weight (the one place it is chosen)."""
    if _MATVEC_ENV:
        return MatvecConfig(*(int(v) for v in _MATVEC_ENV.split(",")))
    cfg = MATVEC_CONFIGS["cpu" if kc.info.is_cpu else "gpu"]
    return MatvecConfig(max(cfg.wg, kc.info.subgroup_size or 32), cfg.nr, cfg.ks, cfg.u)


def _check_view(view: View, nbytes: int, what: str) -> None:
    if view.nbytes < nbytes:
        raise LlamavkError(f"{what}: view is {view.nbytes} bytes, needs {nbytes}")


def matmul(seq, kc: KernelCache, w: QWeight, x: View, y: View, n_tokens: int, bias: View | None = None,
           norm: View | None = None, eps: float = 0.0, residual: View | None = None, glu: View | None = None) -> None:
    """Record y[t, r] = residual[t, r] + bias[r] + sum_c W[r, c] * x'[t, c] for t < n_tokens.

    x: float32 [n_tokens][w.cols]; y, residual: float32 [n_tokens][w.rows]; bias: float32 [w.rows].
    x' = x; or rms_norm(x[t]) * norm (norm: float32 [w.cols], epsilon eps); or silu(x) * glu (glu:
    float32 [n_tokens][w.cols]) -- the fused forms exist for matrix-vector batches
    (n_tokens <= MATVEC_MAX_TOKENS) only."""
    if n_tokens <= 0:
        return
    name = type_suffix(w.qtype)
    _check_view(x, 4 * n_tokens * w.cols, "matmul x")
    _check_view(y, 4 * n_tokens * w.rows, "matmul y")
    if bias is not None:
        _check_view(bias, 4 * w.rows, "matmul bias")
    b = bias if bias is not None else x  # an unused binding still needs a buffer
    has_bias = 1 if bias is not None else 0
    if n_tokens <= MATVEC_MAX_TOKENS:
        cfg = matvec_config(kc, w.qtype, w.rows, w.cols)
        n_subgroups = max(1, cfg.wg // (kc.info.subgroup_size or 32))
        rows_per_wg = cfg.nr * max(1, n_subgroups // cfg.ks)
        if norm is not None and glu is not None:
            raise LlamavkError("matmul: norm and glu inputs cannot be combined")
        kernel = kc.get(f"mul_mv_{name}", "rrrwrrr", push_size=28,
                        spec=(cfg.wg, n_tokens, norm is not None, residual is not None, cfg.nr, cfg.ks, cfg.u,
                              glu is not None))
        extra = [(norm or x).range, (residual or x).range, (glu or x).range]
        for ch in w.chunks:
            push = struct.pack("<6If", ch.n_rows, w.cols, w.rows, ch.row_start, has_bias, rows_per_wg, eps)
            groups = groups_2d((ch.n_rows + rows_per_wg - 1) // rows_per_wg)
            seq.dispatch(kernel, [ch.buffer, x.range, b.range, y.range] + extra, groups, push)
    else:
        if norm is not None or residual is not None or glu is not None:
            raise LlamavkError("fused norm/residual/glu matmul is only available for matrix-vector batches")
        kernel = kc.get(f"mul_mm_{name}", "rrrw", push_size=24)
        gy = (n_tokens + MATMUL_TILE_TOKENS - 1) // MATMUL_TILE_TOKENS
        for ch in w.chunks:
            gx = (ch.n_rows + MATMUL_TILE_ROWS - 1) // MATMUL_TILE_ROWS
            if gx > 65535 or gy > 65535:
                raise LlamavkError(f"matmul: grid {gx} x {gy} is too large")
            push = struct.pack("<6I", ch.n_rows, w.cols, w.rows, ch.row_start, has_bias, n_tokens)
            seq.dispatch(kernel, [ch.buffer, x.range, b.range, y.range], (gx, gy, 1), push)


def get_rows(seq, kc: KernelCache, w: QWeight, ids: View, out: View, n_tokens: int) -> None:
    """Record out[t, :] = dequant(W[ids[t], :]) for t < n_tokens (ids: uint32 [n_tokens];
    out: float32 [n_tokens][w.cols]). Ids outside [0, w.rows) leave their output row untouched."""
    if n_tokens <= 0:
        return
    name = type_suffix(w.qtype)
    _check_view(ids, 4 * n_tokens, "get_rows ids")
    _check_view(out, 4 * n_tokens * w.cols, "get_rows out")
    kernel = kc.get(f"get_rows_{name}", "rrw", push_size=16, spec=(GET_ROWS_WG,))
    groups = groups_2d(n_tokens)
    for ch in w.chunks:
        push = struct.pack("<4I", w.cols, n_tokens, ch.row_start, ch.n_rows)
        seq.dispatch(kernel, [ch.buffer, ids.range, out.range], groups, push)
