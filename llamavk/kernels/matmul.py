"""Weight matrix products and embedding lookups over GGUF-typed weights (shaders/matvec.comp,
matmul.comp, get_rows.comp; dequantization in shaders/quants.glsl).

- `matmul`: y[t, r] = sum_c W[r, c] x[t, c] (+ bias[r]). selection.PRODUCT_KERNELS picks the kernel: up to
  MATVEC_MAX_TOKENS tokens the matrix-vector kernel (reads W once for all tokens: decode and small
  batches); more use cooperative matrices where the device has them (matmul_coop.comp, f16 inputs,
  f32 sums), else the portable tiled kernel (matmul.comp, f32).
- `get_rows`: out[t, :] = dequant(W[ids[t], :]).

Each weight chunk (its own buffer, rows [row_start, row_start + n_rows)) is one dispatch; the kernel
gets the chunk's first row and the row stride of y as push constants and writes its outputs straight
into the right columns of y.
"""

from __future__ import annotations

import os
import struct
from dataclasses import replace

from ..errors import LlamavkError
from ..quant import quant_info
from . import KernelCache, QWeight, View, groups_2d
from .selection import (COOPMAT_SHAPE, MATVEC_CONFIGS, MATVEC_MAX_TOKENS, MatvecConfig, device_kind,  # noqa: F401
                        has_coopmat, product_kernel)

# Matrix-matrix kernels (prompt batches): kernel name prefix -> (rows, tokens) per workgroup tile.
MATMUL_TILES = {"mul_mm": (64, 64), "mul_mm_coop": (128, 128), "mul_mm_coop_big": (256, 128)}
GET_ROWS_WG = 64


def type_suffix(qtype) -> str:
    return quant_info(qtype).name.lower()


# Matrix-vector kernels: name -> (shader variant prefix, types it exists for; None: every type).
#   base       matvec.comp: each lane takes 8-weight quarters (32-bit loads), every type
#   wide       matvec_wide.comp: each lane takes whole blocks (Q4_0/Q8_0) or 64-weight quarters of a
#              super-block (Q4_K) with 16-byte loads
#   read, wide_read   benchmark only (examples/bench_matvec.py): the loads of base / wide, no arithmetic
# Every kernel supports every fused input (norm, residual, glu, bias), NT <= 8 and chunked weights.
MATVEC_KERNELS = {
    "base": ("mul_mv", None),
    "wide": ("mul_mv_wide", {"q4_0", "q8_0", "q4_k"}),
    "read": ("mul_mv_read", {"q4_0", "q8_0"}),
    "wide_read": ("mul_mv_wide_read", {"q4_0", "q8_0", "q4_k"}),
}
# matvec_wide.comp: weights per unit (a lane's share of a row per step); x staging limit (the kernel
# has 18 KiB of other shared memory; 48 KiB is the portable minimum of maxComputeSharedMemorySize).
MATVEC_WIDE_UNIT = {"q4_0": 32, "q8_0": 32, "q4_k": 64}
MATVEC_XS_BYTES = 24576


def matvec_kernel_supports(kernel: str, type_name: str) -> bool:
    types = MATVEC_KERNELS[kernel][1]
    return types is None or type_name in types


def parse_matvec_env(text: str | None) -> dict[str, MatvecConfig]:
    """LLAMAVK_MATVEC (experiments, sweeps): entries separated by spaces or ';', each
    `[TYPE=][KERNEL:]wg,nr,ks,u[,dq[,xs]]` (KERNEL default base; no TYPE: every type), e.g.
    "wide:256,4,1,2,1,1" or "q4_0=wide:128,4,1,2 q8_0=wide:128,2,1,2,0,0 q4_k=base:256,4,2,2" or the old
    "256,4,2,2". A kernel that lacks the type falls back to MATVEC_CONFIGS. -> {type or "*": config}."""
    out: dict[str, MatvecConfig] = {}
    for entry in (text or "").replace(";", " ").split():
        tname, _, rest = entry.rpartition("=")
        kernel, _, nums = rest.rpartition(":")
        kernel = kernel or "base"
        if kernel not in MATVEC_KERNELS:
            raise LlamavkError(f"LLAMAVK_MATVEC: unknown kernel {kernel!r} (known: {', '.join(MATVEC_KERNELS)})")
        vals = [int(v) for v in nums.split(",")]
        if not 4 <= len(vals) <= 6:
            raise LlamavkError(f"LLAMAVK_MATVEC: {entry!r} needs wg,nr,ks,u[,dq[,xs]]")
        out[tname.lower() or "*"] = MatvecConfig(*vals[:4], kernel, *vals[4:])
    return out


# Override for experiments (see parse_matvec_env).
_MATVEC_ENV = parse_matvec_env(os.environ.get("LLAMAVK_MATVEC"))


def matvec_config(kc: KernelCache, qtype, rows: int, cols: int) -> MatvecConfig:
    """Matrix-vector kernel and work split for a device and weight (the one place it is chosen)."""
    tname = type_suffix(qtype)
    kind = device_kind(kc)
    table = MATVEC_CONFIGS.get((kind, tname)) or MATVEC_CONFIGS[(kind, "*")]
    cfg = _MATVEC_ENV.get(tname) or _MATVEC_ENV.get("*") or table
    if not matvec_kernel_supports(cfg.kernel, tname):
        cfg = table
    return replace(cfg, wg=max(cfg.wg, kc.info.subgroup_size or 32))


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
    family = product_kernel(kc, n_tokens, w.rows, w.cols)
    if family == "mul_mv":
        cfg = matvec_config(kc, w.qtype, w.rows, w.cols)
        n_subgroups = max(1, cfg.wg // (kc.info.subgroup_size or 32))
        rows_per_wg = cfg.nr * max(1, n_subgroups // cfg.ks)
        if norm is not None and glu is not None:
            raise LlamavkError("matmul: norm and glu inputs cannot be combined")
        spec = (cfg.wg, n_tokens, norm is not None, residual is not None, cfg.nr, cfg.ks, cfg.u, glu is not None)
        if cfg.kernel.startswith("wide"):
            ch4 = cfg.ks * (kc.info.subgroup_size or 32) * cfg.u * MATVEC_WIDE_UNIT[name] // 4
            xs = cfg.xs and cfg.kernel == "wide" and 16 * n_tokens * ch4 <= MATVEC_XS_BYTES
            spec += (cfg.dq, n_tokens * ch4 if xs else 0)
        kernel = kc.get(f"{MATVEC_KERNELS[cfg.kernel][0]}_{name}", "rrrwrrr", push_size=28, spec=spec)
        extra = [(norm or x).range, (residual or x).range, (glu or x).range]
        for ch in w.chunks:
            push = struct.pack("<6If", ch.n_rows, w.cols, w.rows, ch.row_start, has_bias, rows_per_wg, eps)
            groups = groups_2d((ch.n_rows + rows_per_wg - 1) // rows_per_wg)
            seq.dispatch(kernel, [ch.buffer, x.range, b.range, y.range] + extra, groups, push)
    else:
        if norm is not None or residual is not None or glu is not None:
            raise LlamavkError("fused norm/residual/glu matmul is only available for matrix-vector batches")
        tile_rows, tile_tokens = MATMUL_TILES[family]
        kernel = kc.get(f"{family}_{name}", "rrrw", push_size=24)
        gy = (n_tokens + tile_tokens - 1) // tile_tokens
        for ch in w.chunks:
            gx = (ch.n_rows + tile_rows - 1) // tile_rows
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
