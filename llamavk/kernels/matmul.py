"""Weight matrix products and embedding lookups over GGUF-typed weights (shaders/matvec.comp,
matmul.comp, get_rows.comp; dequantization in shaders/quants.glsl).

- `matmul`: y[t, r] = sum_c W[r, c] x[t, c] (+ bias[r]). selection.PRODUCT_KERNELS picks the kernel: up to
  MATVEC_MAX_TOKENS tokens the matrix-vector kernel (reads W once for all tokens: decode and small
  batches), a little more (short prompts; with LLAMAVK_SMALL_GEMM=0 on GPUs products of few rows at
  any batch) the same kernel
  once per MATVEC_MAX_TOKENS-token slice, all full slices in one dispatch; on GPUs, products of few
  rows over more tokens the small-tile kernel (matmul_small.comp, columns split over the grid where
  the tiles are few, reduce_sum.comp adding the parts); more use NV cooperative matrix 2 where the
  device and the type have it (matmul_cm2.comp; for selection.CM2_DEQUANT_TYPES the weight dequantized
  to f16 rows first by dequant_f16.comp, then its F16 form: mul_mm_cm2d), else KHR cooperative matrices where the device has
  them (matmul_coop.comp, f16 inputs, f32 sums), on software devices (llvmpipe) lanes-shaped tiles
  (matmul_cpu.comp), else the portable tiled kernel (matmul.comp, f32).
- `get_rows`: out[t, :] = dequant(W[ids[t], :]).

Each weight chunk (its own buffer, rows [row_start, row_start + n_rows)) is one dispatch; the kernel
gets the chunk's first row and the row stride of y as push constants and writes its outputs straight
into the right columns of y.
"""

from __future__ import annotations

import math
import os
import re
import struct
from dataclasses import replace

import numpy as np

from ..errors import LlamavkError
from ..quant import quant_info
from ..vk import Buffer
from . import KernelCache, QWeight, View, WeightChunk, filled_buffer, groups_2d
from . import selection as _selection
from .collective import convert, reduce_sum
from .selection import (COOPMAT_SHAPE, MATVEC_CONFIGS, matvec_configs, MATVEC_MAX_TOKENS, MatvecConfig, device_kind,  # noqa: F401
                        cm2_f16_form, cm2_fill, cm2_grid_cost, cm2_parts, cm2_waves_on, CM2_SLICE_COST, cm2_tile, cm2_x_f16, has_coopmat, has_coopmat2, product_kernel, SMALL_GEMM_MAX_PARTS, SMALL_GEMM_MIN_PART_UNITS,
                        SMALL_GEMM_WORKGROUPS, SmallGemmConfig, small_gemm_config)

# Matrix-matrix kernels (prompt batches): kernel name prefix -> (rows, tokens) per workgroup tile.
CPU_TILE = (16, 8)   # matmul_cpu.comp: rows a lane (RT), tokens (TT); a workgroup's rows: RT x its lanes
MATMUL_TILES = {"mul_mm": (64, 64), "mul_mm_coop": (128, 128), "mul_mm_coop_big": (256, 128)}
GET_ROWS_WG = 64
# The NV coopmat2 kernel that reads x as f16 (matmul_cm2.comp X_F16), converted by f16_copy first
CM2_F16_X = "mul_mm_cm2h"


def type_suffix(qtype) -> str:
    return quant_info(qtype).name.lower()


# Matrix-vector kernels: name -> (shader variant prefix, types it exists for; None: every type).
#   base       matvec.comp: each lane takes 8-weight quarters (32-bit loads), every type
#   cpu        matvec_cpu.comp: software devices (a workgroup of one subgroup, a lane's rows by whole
#              32-weight units; selection.py's "cpu" rows), every type, rows of whole units
#   wide       matvec_wide.comp: each lane takes whole blocks (Q4_0/Q8_0) or 64-weight quarters of a
#              super-block (Q4_K) with 16-byte loads
#   stream     matvec_stream.comp: one token; every weight load of a lane first (16-byte loads, whole
#              units), x staged per chunk in shared memory; nr = rows per lane (RJ), ks = units per
#              column part (long rows; the last workgroup adds the parts)
#   stream_dp  the same with x staged as two int8 levels and 4-wide integer dot products (devices
#              with VK_KHR_shader_integer_dot_product)
#   read, wide_read   benchmark only (benchmarks/bench_matvec.py): the loads of base / wide, no arithmetic
#   stream_dp_nox, stream_read   benchmark only: stream_dp without the x staging / without staging
#              and arithmetic
#   stream_half, stream_dp_half   stream / stream_dp with half a super-block per unit where the others
#              take a whole one (matvec_stream.comp HALF_BLOCK: Q2_K, Q3_K)
#   stream_h, stream_dp_h   Q6_K's stream form before the quarter super-block unit (half a super-block
#              per unit: matvec_stream.comp Q6K_HALF), for A/B
# Every kernel supports every fused input (norm, residual, glu, bias) and chunked weights; all but
# stream NT <= 8 tokens (stream: one).
# the types matvec_stream.comp has a form of (shaders/variants_matmul.py STREAM_TYPES)
STREAM_TYPES = frozenset({"q4_0", "q8_0", "q4_k", "q6_k", "q5_k", "q3_k", "q2_k", "iq4_nl", "mxfp4", "iq4_xs",
                          "q4_1", "q5_0", "q5_1", "iq2_xxs", "iq3_xxs", "iq2_xs", "iq2_s", "iq3_s", "iq1_s",
                          "iq1_m", "tq2_0", "tq1_0"})
MATVEC_KERNELS = {
    "base": ("mul_mv", None),
    "cpu": ("mul_mv_cpu", None),
    "wide": ("mul_mv_wide", {"q4_0", "q8_0", "q4_k"}),
    "stream": ("mul_mv_stream", STREAM_TYPES),
    "stream_dp": ("mul_mv_stream_dp", STREAM_TYPES),
    "read": ("mul_mv_read", {"q4_0", "q8_0"}),
    "wide_read": ("mul_mv_wide_read", {"q4_0", "q8_0", "q4_k"}),
    "stream_dp_nox": ("mul_mv_stream_dp_nox", STREAM_TYPES),
    "stream_read": ("mul_mv_stream_read", STREAM_TYPES),
    "stream_half": ("mul_mv_stream_half", {"q2_k", "q3_k"}),
    "stream_dp_half": ("mul_mv_stream_dp_half", {"q2_k", "q3_k"}),
    "stream_h": ("mul_mv_stream_h", {"q6_k"}),
    "stream_dp_h": ("mul_mv_stream_dp_h", {"q6_k"}),
}
# matvec_wide.comp: weights per unit (a lane's share of a row per step; matvec_stream.comp's too, and
# its IQ4_XS unit: half a super-block, Q3_K's and Q2_K's a whole one); x staging limit (the kernel
# has 18 KiB of other shared memory; 48 KiB is the portable minimum of maxComputeSharedMemorySize).
MATVEC_WIDE_UNIT = {"q4_0": 32, "q8_0": 32, "q4_k": 64, "q6_k": 64, "q5_k": 64, "q3_k": 256, "q2_k": 256,
                    "iq4_nl": 32, "mxfp4": 32, "iq4_xs": 128, "q4_1": 32, "q5_0": 32, "q5_1": 32,
                    "iq2_xxs": 64, "iq3_xxs": 64, "iq2_xs": 64, "iq2_s": 64, "iq3_s": 64, "iq1_s": 64, "iq1_m": 64,
                    "tq2_0": 128, "tq1_0": 256}
MATVEC_XS_BYTES = 24576
# matvec_stream.comp: uvec4 loads per unit; x staged per chunk of at most this many bytes; at most
# this many uvec4 weight loads held by one lane (Q6_K: 3 uvec4s and the scales' uvec2 + d, counted
# as a fourth; Q5_K: Q4_K's 3 and the 2 of qh; Q3_K: 7 uvec4s and the scales' 4 words + d, counted as 2; Q2_K: 5 uvec4s and 4 words;
# IQ4_XS: 5 uvec4s and a uvec2; Q4_1 / Q5_0 / Q5_1: a uvec4 and a head of 1 / 2 / 2 words, counted
# as Q4_0's one load, so that they take Q4_0's layouts: matvec_stream.comp's header; IQ2_XXS a uvec4
# and d, IQ3_XXS a uvec4, a uvec2 and d, IQ2_XS a uvec4, a 16-bit word and d, IQ2_S 2 uvec2s, 2
# 16-bit words and d, IQ3_S a uvec4, 4 words and d, IQ1_S a uvec2, a word and d, IQ1_M 2 uvec2s and a word;
# TQ2_0 2 uvec4s and d, TQ1_0 3, a word and d).
MATVEC_STREAM_NQ = {"q4_0": 1, "q8_0": 2, "q4_k": 3, "q6_k": 4, "q5_k": 5, "q3_k": 9, "q2_k": 6, "iq4_nl": 1,
                    "mxfp4": 1, "iq4_xs": 6, "q4_1": 1, "q5_0": 1, "q5_1": 1, "iq2_xxs": 1, "iq3_xxs": 2,
                    "iq2_xs": 2, "iq2_s": 2, "iq3_s": 3, "iq1_s": 2, "iq1_m": 2, "tq2_0": 2, "tq1_0": 4}
# The DOT8 form's x scale and sums: bytes per 32 values (Q2_K: also both halves' sums, a min per 16;
# Q6_K: a scale and sum per 16, one run of its quarter unit).
MATVEC_STREAM_XSD = {"q2_k": 16, "q6_k": 16}
# The stream_h / stream_dp_h kernels' Q6_K (half a super-block per unit, matvec_stream.comp
# Q6K_HALF): (weights per unit, loads per unit: 6 uvec4s and the scales' uvec2 + d as a seventh,
# DOT8 bytes per 32 values of x).
MATVEC_STREAM_HALF = {"q6_k": (128, 7, 8)}


def _stream_unit(kernel: str, type_name: str) -> tuple[int, int, int]:
    """matvec_stream.comp's (weights per unit, uvec4 loads per unit, DOT8 x bytes per 32 values) of a
    stream kernel and type."""
    if kernel.endswith("_h"):
        return MATVEC_STREAM_HALF[type_name]
    xsd = MATVEC_STREAM_XSD.get(type_name, 8)
    if kernel in STREAM_HALF_KERNELS:
        return MATVEC_WIDE_UNIT[type_name] // 2, MATVEC_STREAM_HALF_NQ[type_name], xsd
    return MATVEC_WIDE_UNIT[type_name], MATVEC_STREAM_NQ[type_name], xsd
# Shared memory beside the x chunk and the reductions: IQ4_NL's and MXFP4's lookup table (kvt, 512 words);
# the lattice types' grid and sign masks (iq_grid_sh: 256 to 2048 words; iqs: 256 or 512 words).
MATVEC_STREAM_TABLE_BYTES = {"iq4_nl": 2048, "mxfp4": 2048, "iq4_xs": 2048, "iq2_xxs": 3072, "iq3_xxs": 2048,
                             "iq2_xs": 5120, "iq2_s": 10240, "iq3_s": 4096, "iq1_s": 16384, "iq1_m": 16384}
MATVEC_STREAM_MAX_LOADS = 24
# matvec_stream.comp HALF_BLOCK (kernels stream_half, stream_dp_half): half of MATVEC_WIDE_UNIT per
# unit, and its uvec4 loads per unit (Q2_K: 2 uvec4s and 6 words, counted as 4; Q3_K: 6 uvec4s and
# the scales' 4 words + d, counted as 2)
STREAM_HALF_KERNELS = ("stream_half", "stream_dp_half")
MATVEC_STREAM_HALF_NQ = {"q2_k": 4, "q3_k": 8}


def stream_split(wg: int, subgroup: int, type_name: str, cols: int, rj: int,
                 shared_bytes: int = 49152, dp: bool = False, kernel: str = "stream") -> tuple[int, int, int] | None:
    """matvec_stream.comp's (TPR lanes per row, C units per lane along the row, RJ rows per lane) for a
    row of `cols` weights, or None where the kernel does not fit (the caller takes another kernel).
    TPR: a power of two up to the workgroup, whose x chunk (TPR units) fits shared memory less 5 KiB
    for the reduction (a unit of x takes 4 bytes per value as floats, 2 bytes per value + 8 per 32 as
    the _dp form's int8 levels; Q2_K 16 per 32: MATVEC_STREAM_XSD): the largest <= the row's units, so that lanes cover a row with few
    idle, or twice that where it leaves no more lanes idle (448 units: 512 x 1, not 256 x 2: one x
    chunk, one barrier less). Under a subgroup's lanes only where the row has fewer units (at least 4
    lanes, at most 64 row groups, RJ <= TPR: the kernel's reduction and writes). RJ shrinks until the
    loads fit registers."""
    unit, nq, xsd = _stream_unit(kernel, type_name)
    n_units = cols // unit
    if n_units == 0 or cols % unit:
        return None
    unit_bytes = 2 * unit + xsd * (unit // 32) if dp else 4 * unit
    xs_bytes = shared_bytes - 5120 - MATVEC_STREAM_TABLE_BYTES.get(type_name, 0)
    tprs = [1 << k for k in range(2, wg.bit_length())
            if 1 << k <= wg and (1 << k) * unit_bytes <= xs_bytes and wg % (1 << k) == 0 and wg >> k <= 64]
    full = [t for t in tprs if t >= subgroup]   # whole subgroups per row
    if not full:
        return None
    fits = [t for t in (full if n_units >= subgroup else tprs) if t <= n_units]
    tpr = max(fits or full[:1])
    if 2 * tpr in tprs and 2 * tpr * -(-n_units // (2 * tpr)) <= tpr * -(-n_units // tpr):
        tpr *= 2
    c = -(-n_units // tpr)
    rj = min(rj, tpr)
    while rj > 1 and c * rj * nq > MATVEC_STREAM_MAX_LOADS:
        rj //= 2
    if c * rj * nq > MATVEC_STREAM_MAX_LOADS:
        return None
    return tpr, c, rj


def _stream_split(kc: KernelCache, cfg: MatvecConfig, tname: str, cols: int, rj: int):
    return stream_split(cfg.wg, kc.info.subgroup_size or 32, tname, cols, rj, kc.info.max_shared_memory,
                        dp=cfg.kernel.startswith("stream_dp") or cfg.kernel == "stream_read", kernel=cfg.kernel)


def matvec_kernel_supports(kernel: str, type_name: str) -> bool:
    types = MATVEC_KERNELS[kernel][1]
    return types is None or type_name in types


def parse_matvec_env(text: str | None) -> dict[str, MatvecConfig]:
    """LLAMAVK_MATVEC (experiments, sweeps): entries separated by spaces or ';', each
    `[TYPE[@ROWSxCOLS]=][KERNEL:]wg,nr,ks,u[,dq[,xs]]` (KERNEL default base; no TYPE: every type; a shape:
    only products of that many rows and columns, before the type's own entry; stream kernels:
    `wg,nr,ks,u[,steps[,xfirst[,chained_steps]]]`), e.g.
    "wide:256,4,1,2,1,1" or "q4_0=wide:128,4,1,2 q8_0=wide:128,2,1,2,0,0 q4_k=base:256,4,2,2" or
    "q4_0@27648x5120=stream_dp:512,4,1,1,14" or the old "256,4,2,2". A kernel that lacks the type (or
    does not fit) falls back to MATVEC_CONFIGS. -> {type, type@ROWSxCOLS or "*": config}."""
    out: dict[str, MatvecConfig] = {}
    for entry in (text or "").replace(";", " ").split():
        tname, _, rest = entry.rpartition("=")
        kernel, _, nums = rest.rpartition(":")
        kernel = kernel or "base"
        if kernel not in MATVEC_KERNELS:
            raise LlamavkError(f"LLAMAVK_MATVEC: unknown kernel {kernel!r} (known: {', '.join(MATVEC_KERNELS)})")
        try:
            vals = [int(v) for v in nums.split(",")]
        except ValueError:
            vals = []
        stream = kernel.startswith("stream")
        if not 4 <= len(vals) <= (7 if stream else 6):
            raise LlamavkError(f"LLAMAVK_MATVEC: {entry!r} needs wg,nr,ks,u[,dq[,xs]] "
                               "(stream: [,steps[,xfirst[,chained_steps]]])")
        extra = dict(zip(("steps", "xfirst", "chained_steps") if stream else ("dq", "xs"), vals[4:]))
        key = tname.lower() or "*"
        if "@" in key and not re.fullmatch(r"[a-z0-9_]+@\d+x\d+", key):
            raise LlamavkError(f"LLAMAVK_MATVEC: {entry!r}: a shape is spelled TYPE@ROWSxCOLS")
        out[key] = MatvecConfig(*vals[:4], kernel, **extra)
    return out


# Override for experiments (see parse_matvec_env), and the text it was parsed from (_matvec_env).
_MATVEC_ENV: dict[str, MatvecConfig] = {}
_MATVEC_ENV_TEXT = None


def _matvec_env() -> dict[str, MatvecConfig]:
    """LLAMAVK_MATVEC as parsed, parsed again whenever the variable changed. Not at import: a tool may
    set it between two loads in one process (benchmarks/greedy_compare.py's settings), which a value
    read once at import would ignore without a word, and a bad value is then a command's one-line
    error, not an import's traceback."""
    global _MATVEC_ENV, _MATVEC_ENV_TEXT
    text = os.environ.get("LLAMAVK_MATVEC")
    if text != _MATVEC_ENV_TEXT:
        _MATVEC_ENV, _MATVEC_ENV_TEXT = parse_matvec_env(text), text
    return _MATVEC_ENV


def _fits(kc: KernelCache, cfg: MatvecConfig, tname: str, cols: int, n_tokens: int) -> bool:
    if not matvec_kernel_supports(cfg.kernel, tname) or cfg.wg > (kc.info.max_workgroup_invocations or 1024):
        return False
    if cfg.kernel.startswith("stream"):
        # one token; subgroups of >= 8 lanes (the _dp staging shuffles within 8), <= 64 per workgroup
        sg = kc.info.subgroup_size or 32
        dp_ok = cfg.kernel in ("stream", "stream_half") or (kc.device.features.get("int_dot", False) and sg >= 8)
        cfg = replace(cfg, wg=max(cfg.wg, sg))
        return n_tokens == 1 and dp_ok and cfg.wg // sg <= 64 and \
            _stream_layout(kc, cfg, tname, cols, cfg.nr) is not None
    return True


def matvec_config(kc: KernelCache, qtype, rows: int, cols: int, n_tokens: int = 1) -> MatvecConfig:
    """Matrix-vector kernel and work split for a device and weight (the one place it is chosen): the
    LLAMAVK_MATVEC override where its kernel fits, else the first MATVEC_CONFIGS row that fits."""
    tname = type_suffix(qtype)
    env = _matvec_env()
    forced = env.get(f"{tname}@{rows}x{cols}") or env.get(tname) or env.get("*")
    choices = [forced] + matvec_configs(kc, tname, n_tokens, rows, cols)
    cfg = next(c for c in choices if c is not None and _fits(kc, c, tname, cols, n_tokens))
    return replace(cfg, wg=max(cfg.wg, kc.info.subgroup_size or 32))


def _check_view(view: View, nbytes: int, what: str) -> None:
    if view.nbytes < nbytes:
        raise LlamavkError(f"{what}: view is {view.nbytes} bytes, needs {nbytes}")


def _stream_rj(cfg: MatvecConfig, pair: bool) -> int:
    """Rows per lane asked of stream_split: a pair product's lane takes as many rows, half from each
    matrix (doubling them measured slower: Q4_K 259 against 273 t/s on the 7.2B, H100)."""
    return max(2, cfg.nr - cfg.nr % 2) if pair else cfg.nr


def _stream_parts(cfg: MatvecConfig, name: str, cols: int) -> int:
    """The stream kernel's column parts (KSPLIT workgroups per row block, each over an equal part of
    the row): parts of gcd(units, cfg.ks) units, the largest power of two up to cfg.ks dividing the
    row (448 units, ks 64: 7 parts of 64); whole rows where that leaves parts under 8 units (Q6_K's
    quarter units: or an odd number, since its x staging takes whole halves of super-blocks)."""
    n_units = cols // _stream_unit(cfg.kernel, name)[0]
    size = math.gcd(n_units, cfg.ks) if cfg.kernel.startswith("stream") and cfg.ks > 1 else n_units
    if name == "q6_k" and size % 2 and not cfg.kernel.endswith("_h"):
        return 1
    return n_units // size if size >= 8 else 1


def _stream_layout(kc: KernelCache, cfg: MatvecConfig, name: str, cols: int, rj: int):
    """(parts, (TPR, C, RJ)) of the stream kernel for rows of `cols` weights, or None where it does
    not fit."""
    parts = _stream_parts(cfg, name, cols)
    split = _stream_split(kc, cfg, name, cols // parts, rj)
    return (parts, split) if split is not None else None


def _one_token_stream(kc: KernelCache, w: QWeight, pair: bool = False):
    """(config, parts, (TPR, C, RJ)) of w's one-token product where the stream kernel serves it, else None."""
    cfg = matvec_config(kc, w.qtype, w.rows, w.cols, 1)
    if not cfg.kernel.startswith("stream"):
        return None
    layout = _stream_layout(kc, cfg, type_suffix(w.qtype), w.cols, _stream_rj(cfg, pair))
    return (cfg, *layout) if layout is not None else None


def matvec_pairs(kc: KernelCache, w: QWeight, p: QWeight) -> bool:
    """Whether the one-token product can take w and p as a gate/up pair (y = silu(W x) * (P x), one
    dispatch): same type, shape and row chunks, and the stream kernel serving them."""
    if (w.qtype, w.rows, w.cols) != (p.qtype, p.rows, p.cols) or \
            [c.n_rows for c in w.chunks] != [c.n_rows for c in p.chunks]:
        return False
    found = _one_token_stream(kc, w, pair=True)
    return found is not None and found[2][2] >= 2


def matvec_rope_ok(kc: KernelCache, w: QWeight, rope, head_dim: int) -> bool:
    """Whether w's one-token product can apply RoPE and store K / V itself (matvec_stream.comp ROPE):
    the stream kernel over whole rows with an even number of row groups (pairs in neighbouring
    lanes), llama's adjacent pairs without a frequency table, whole heads, chunks of whole pairs."""
    if rope.neox or rope.freqs is not None or head_dim % 2 or w.rows % head_dim or \
            any(ch.n_rows % 2 for ch in w.chunks):
        return False
    found = _one_token_stream(kc, w)
    if found is None:
        return False
    cfg, parts, (tpr, _, _) = found
    return parts == 1 and (cfg.wg // tpr) % 2 == 0


def matvec_chain_ok(kc: KernelCache, w: QWeight) -> bool:
    """Whether w's one-token product can be chained without a barrier (kernels/chain.py): wait for
    its producer and count its workgroups done in the shader (matvec_stream.comp WAIT, SIGNAL)."""
    return _one_token_stream(kc, w) is not None


# matvec_stream.comp ROUTER (a mixture of experts' router folded into the product writing its input,
# kernels/moe.py FoldedRouter): its bindings and specialization constants start here, past the stream
# kernel's own (room left for more of those).
ROUTER_BINDING0 = 16
ROUTER_SPEC0 = 20
ROUTER_BINDINGS = "rrwwwrrr"  # 16 router matrix, 17 norm weights, 18 partials, 19 count, 20 route, 21 shared gate,
#                               22 bias, 23 the pick's bias per expert
ROUTER_MAX_USED = 32         # the shader's pick (as moe_router.comp's)
ROUTER_MAX_REGS = 32         # router weights a thread holds for a row block (columns x rows)


def _stream_shared_bytes(cfg: MatvecConfig, name: str, tpr: int) -> int:
    """Shared memory of matvec_stream.comp without ROUTER: the x chunk (floats, or the _dp form's
    int8 levels and per-32 scales) and the reductions."""
    unit, _, xsd = _stream_unit(cfg.kernel, name)
    dp = cfg.kernel.startswith("stream_dp") or cfg.kernel == "stream_read"
    xs = tpr * (2 * unit + xsd * (unit // 32)) if dp else 4 * tpr * unit
    return xs + 2 * 64 * 8 * 4 + 64 * 4 + MATVEC_STREAM_TABLE_BYTES.get(name, 0)


def matvec_router_ok(kc: KernelCache, w: QWeight, router_cols: int, n_used: int, sel_bias: bool = False) -> bool:
    """Whether w's one-token product can compute a router of `router_cols` partial columns (experts,
    a shared expert's gate, the sum of squares) choosing n_used experts from the rows it writes
    (matvec_stream.comp ROUTER): the stream kernel over one chunk (the whole of x in one dispatch),
    a thread's router weights of a row block within ROUTER_MAX_REGS, and the router's shared arrays
    fitting beside the kernel's."""
    if len(w.chunks) != 1 or not 1 <= n_used <= ROUTER_MAX_USED:
        return False
    found = _one_token_stream(kc, w)
    if found is None or found[0].kernel.endswith("_h"):   # no ROUTER variant of the A/B forms
        return False
    cfg, _, (tpr, _, rj) = found
    col4 = -(-router_cols // 4)
    regs = -(-router_cols // cfg.wg) * (cfg.wg // tpr) * rj
    # rbuf, rtot, the picks, rlast; the rank tail's keys, candidates and subgroup sums (RTAIL 1: as
    # many experts as columns at most)
    shared = _stream_shared_bytes(cfg, type_suffix(w.qtype), tpr) + 16 * cfg.wg + 16 * col4 + 8 * n_used + 4
    shared += 4 * router_cols + 8 * -(-router_cols // 32) * min(n_used, 32) + 4 * 64
    shared += 4 * router_cols if sel_bias else 0     # RSELB: the serial pick's keys
    return col4 <= cfg.wg and regs <= ROUTER_MAX_REGS and shared <= (kc.info.max_shared_memory or 49152)


def _router_dispatch(kc: KernelCache, router, n_bound: int, filler, writers: int, wg: int, steps: int,
                     rows_per_wg: int) -> tuple[str, tuple, list]:
    """The ROUTER variant's extra access string, specialization constants (from ROUTER_SPEC0) and
    buffers (from ROUTER_BINDING0; the bindings from n_bound up to it, which the shader does not
    have, take `filler`) for `writers` row blocks of y (of rows_per_wg rows), `steps` to a
    `wg`-thread workgroup."""
    scratch, count = router.scratch(kc, writers)
    pad = ROUTER_BINDING0 - n_bound
    bufs = [filler] * pad + [router.w.chunks[0].buffer, (router.norm_w or router.out).range, scratch,
                             count, router.out.range, (router.shexp or router.out).range,
                             (router.bias or router.out).range, (router.sel_bias or router.out).range]
    ahead_fits = steps * -(-router.columns // wg) * rows_per_wg <= ROUTER_MAX_REGS
    return "r" * pad + ROUTER_BINDINGS, router.spec(wg, -(-writers // steps), ahead_fits), bufs


def _matvec_spec(kc: KernelCache, cfg: MatvecConfig, name: str, cols: int, n_tokens: int, norm: bool,
                 resid: bool, glu: bool, pair: bool = False, rope_mode: int = 0,
                 wait: bool = False, signal: bool = False, rows: int = 0) -> tuple[tuple, int, int, int]:
    """Specialization constants of cfg's kernel (its shader header lists them; the stream kernel's
    last, PHASE, is left to matmul; cfg.wave sizes the steps for a dispatch of `rows` rows), rows per row block,
    workgroups per row block (column parts) and row blocks per workgroup (steps)."""
    sg = kc.info.subgroup_size or 32
    if cfg.kernel.startswith("stream"):
        parts, (tpr, c, rj) = _stream_layout(kc, cfg, name, cols, _stream_rj(cfg, pair))
        rows_per_wg = cfg.wg // tpr * (rj // 2 if pair else rj)
        steps = max(1, cfg.steps) if c == 1 else 1   # steps keep x staged: one chunk of it
        if cfg.wave and c == 1 and rows:
            blocks = -(-rows // rows_per_wg)
            steps = max(1, -(-blocks // cfg.wave))
        # PHASE (14) is matmul's: it depends on the dispatch (_parts_apart)
        spec = (cfg.wg, norm, resid, glu, tpr, c, rj, pair, parts, rope_mode, steps, bool(cfg.xfirst), wait, signal)
        return spec, rows_per_wg, parts, steps
    if pair:
        raise LlamavkError(f"matmul: the {cfg.kernel} matrix-vector kernel has no gate/up pair form")
    spec = (cfg.wg, n_tokens, norm, resid, cfg.nr, cfg.ks, cfg.u, glu)
    if cfg.kernel == "cpu":   # a workgroup of one subgroup, nr rows a lane
        lanes = _selection.cpu_product_lanes(kc)
        return (lanes,) + spec[1:], lanes * cfg.nr, 1, 1
    if cfg.kernel.startswith("wide"):
        ch4 = cfg.ks * sg * cfg.u * MATVEC_WIDE_UNIT[name] // 4
        xs = cfg.xs and cfg.kernel == "wide" and 16 * n_tokens * ch4 <= MATVEC_XS_BYTES
        spec += (cfg.dq, n_tokens * ch4 if xs else 0)
    return spec, cfg.nr * max(1, max(1, cfg.wg // sg) // cfg.ks), 1, 1


def _spec_with_router(spec: tuple, router_spec: tuple) -> tuple:
    """The stream kernel's specialization constants, and ROUTER's from ROUTER_SPEC0 (the ids between,
    which the shader does not have, set to 0: Vulkan ignores them)."""
    if not router_spec:
        return spec
    return spec + (0,) * (ROUTER_SPEC0 - len(spec)) + router_spec


# matvec_stream.comp's SENTINEL: what its partial-sum slots hold between runs
PART_SENTINEL = 0xFFFFFFFF


def _parts_apart(kc: KernelCache) -> bool:
    """Whether the stream kernel's column parts run as two dispatches with a barrier between them
    (matvec_stream.comp PHASE 1: the parts that store their sums, then PHASE 2: the last part, which
    merges) instead of one whose last part waits in the shader for the others. Software devices:
    llvmpipe ends a shader's loops after 65535 iterations in all, so a wait there can end before the
    other parts have stored (rows NaN, their sums left in the scratch for the next product)."""
    return kc.info.is_cpu


def _parts_scratch(kc: KernelCache, rows: int, parts: int) -> tuple:
    """The stream kernel's KSPLIT buffer for a matrix of `rows` rows: partial sums [2][parts][rows]
    (a pair's second matrix after the first), every slot PART_SENTINEL between dispatches. Shared by
    every product of that shape on the device: the recorder orders two users (both write it)."""
    buf = kc.shared("column parts", (rows, parts),
                    lambda: filled_buffer(kc.device, np.full(2 * rows * parts, PART_SENTINEL, dtype=np.uint32)))
    return (buf, 0, 8 * rows * parts)


def _stream_tail(kc: KernelCache, w: QWeight, parts: int, x: View, y: View, rope) -> list:
    """matvec_stream.comp's bindings 8-10: KSPLIT's partial sums, ROPE's step buffer and KV cache;
    where unused, y and x (which the kernel then never touches there)."""
    part_bufs = [_parts_scratch(kc, w.rows, parts) if parts > 1 else y.range]
    rope_bufs = [rope.step.range, (rope.cache or y).range] if rope is not None else [x.range, y.range]
    return part_bufs + rope_bufs


# matvec_stream.comp's push constants: the product (7 words), RoPE's (10), WAIT's and SIGNAL's (3);
# CLOCK's stamp slot (1) after them
STREAM_PUSH = 80
# stream kernels with a CLOCK variant (the split timeline's stamps, split/clock.py): the _dp forms
# (stream_dp first: every stream type has its variant)
CLOCK_KERNELS = ("stream_dp", "stream_dp_half")


def matmul(seq, kc: KernelCache, w: QWeight, x: View, y: View, n_tokens: int, bias: View | None = None,
           norm: View | None = None, eps: float = 0.0, residual: View | None = None, glu: View | None = None,
           pair: QWeight | None = None, rope=None, wait=None, signal=None, router=None, clock=None) -> int:
    """Record y[t, r] = residual[t, r] + bias[r] + sum_c W[r, c] * x'[t, c] for t < n_tokens.

    x: float32 [n_tokens][w.cols]; y, residual: float32 [n_tokens][w.rows]; bias: float32 [w.rows].
    x' = x; or rms_norm(x[t]) * norm (norm: float32 [w.cols], epsilon eps); or silu(x) * glu (glu:
    float32 [n_tokens][w.cols]) -- the fused forms exist for matrix-vector batches
    (n_tokens <= MATVEC_MAX_TOKENS) only. Somewhat larger batches (selection.MATVEC_BATCHED_MAX; on GPUs
    with LLAMAVK_SMALL_GEMM=0 weights of at most selection.SMALL_ROWS rows at any batch) run the
    matrix-vector kernel once per MATVEC_MAX_TOKENS-token slice (_matvec_batches); on GPUs, weights of
    at most SMALL_ROWS rows over larger batches the small tiles (_matmul_small), larger ones the tiled kernels. pair (one token, where matvec_pairs allows it): a second
    matrix P, and y[r] = silu(W[r] . x') * (P[r] . x') instead (no bias or residual). rope (one
    token, a rope.RopeOut, where matvec_rope_ok allows it): a Q product writes its rows rotated, a K
    or V product writes row n_past of its KV cache instead of y (no residual). wait (a chain.Wait, one
    token, where matvec_chain_ok allows it): the product is recorded without a barrier after its
    producer and waits in its shader until the producer's workgroups have all counted themselves done,
    its weight loads already issued (matvec_stream.comp WAIT; with the config's xfirst the wait comes
    first; its chained_steps apply). signal (a chain.Signal, likewise): every workgroup counts itself
    done there. router (a moe.FoldedRouter, one token, where matvec_router_ok allows it): the product
    also writes the route of a mixture of experts' router reading its y (matvec_stream.comp ROUTER).
    clock (a split.clock.Stamp, one token): where the stream _dp kernel (CLOCK_KERNELS, no router)
    takes its CLOCK variant and stamps the device clock there (split/clock.py); other kernels ignore it.
    Returns the number of workgroups recorded."""
    if n_tokens <= 0:
        return 0
    name = type_suffix(w.qtype)
    _check_view(x, 4 * n_tokens * w.cols, "matmul x")
    _check_view(y, 4 * n_tokens * w.rows, "matmul y")
    if bias is not None:
        _check_view(bias, 4 * w.rows, "matmul bias")
    b = bias if bias is not None else x  # an unused binding still needs a buffer
    has_bias = 1 if bias is not None else 0
    family = product_kernel(kc, n_tokens, w.rows, w.cols, name)
    if pair is not None and (n_tokens != 1 or bias is not None or residual is not None or glu is not None
                             or not matvec_pairs(kc, w, pair)):
        raise LlamavkError("matmul: a gate/up pair takes one token, no bias, residual or glu, and the stream kernel")
    if rope is not None and (n_tokens != 1 or residual is not None or pair is not None
                             or not matvec_rope_ok(kc, w, rope.rope, rope.head_dim)):
        raise LlamavkError("matmul: RoPE in the product takes one token, no residual or pair, and the stream kernel")
    if (wait is not None or signal is not None) and (n_tokens != 1 or not matvec_chain_ok(kc, w)):
        raise LlamavkError("matmul: chaining without a barrier takes one token and the stream kernel")
    if router is not None and (n_tokens != 1 or pair is not None or rope is not None or router.w.cols != w.rows
                               or not matvec_router_ok(kc, w, router.columns, router.n_used,
                                                       router.sel_bias is not None)):
        raise LlamavkError("matmul: a router in the product takes one token, no pair or RoPE, the stream kernel "
                           "over one chunk, and the router's columns as its rows")
    if family != "mul_mv" and (norm is not None or residual is not None or glu is not None):
        raise LlamavkError("fused norm/residual/glu matmul is only available for matrix-vector batches")
    if family == "mul_mv_batched":
        _matvec_batches(seq, kc, w, x, y, n_tokens, bias)
    elif family == "mul_mm_small":
        return _matmul_small(seq, kc, w, x, y, n_tokens, bias)
    elif family == "mul_mv":
        if norm is not None and glu is not None:
            raise LlamavkError("matmul: norm and glu inputs cannot be combined")
        cfg = matvec_config(kc, w.qtype, w.rows, w.cols, n_tokens)
        if wait is not None and cfg.chained_steps:
            cfg = replace(cfg, steps=cfg.chained_steps, wave=0)
        spec, rows_per_wg, parts, steps = _matvec_spec(kc, cfg, name, w.cols, n_tokens, norm is not None,
                                                residual is not None, glu is not None, pair is not None,
                                                rope.MODES[rope.kind] if rope is not None else 0,
                                                wait is not None, signal is not None,
                                                max(ch.n_rows for ch in w.chunks))
        stream = cfg.kernel.startswith("stream")
        # (kernel, workgroups per row block) per dispatch of a chunk: one; or, column parts apart, the
        # storing parts and then the last one (PHASE 1, 2)
        phases = [(1, parts - 1), (2, 1)] if parts > 1 and _parts_apart(kc) else [(0, parts)]
        extra = [(norm or x).range, (residual or x).range, (glu or x).range]
        chain = wait or signal   # both name the step's counters (binding 11; else an unused y)
        tail = _stream_tail(kc, w, parts, x, y, rope) + [chain.counters if chain else y.range] if stream else []
        access = "rrrwrrrrwrww" if stream else "ttrwtrt" if cfg.kernel == "cpu" else "rrrwrrr"
        variant = f"{MATVEC_KERNELS[cfg.kernel][0]}_{name}"
        router_spec, router_bufs = (), []
        if router is not None:   # one chunk (matvec_router_ok): its workgroups that write y
            # (partials: a slot per row block, at least one per workgroup that writes y)
            router_access, router_spec, router_bufs = _router_dispatch(kc, router, len(access), x.range,
                                                                       -(-w.rows // rows_per_wg), cfg.wg, steps,
                                                                       rows_per_wg)
            access += router_access
            variant = f"{MATVEC_KERNELS[cfg.kernel][0]}_router_{name}"
        elif clock is not None and cfg.kernel in CLOCK_KERNELS:
            access += "w"   # binding 12: the stamps
            variant = f"{MATVEC_KERNELS[cfg.kernel][0]}_clock_{name}"
        else:
            clock = None
        push_size = (STREAM_PUSH + (4 if clock is not None else 0)) if stream else 28
        passes = [(kc.get(variant, access, push_size=push_size,
                          spec=_spec_with_router(spec + (phase,), router_spec) if stream else spec), n)
                  for phase, n in phases]
        rope_push = rope.push() if rope is not None else bytes(40)
        pair_chunks = pair.chunks if pair is not None else w.chunks
        grids = []   # per chunk, per pass
        for ch in w.chunks:
            blocks = (ch.n_rows + rows_per_wg - 1) // rows_per_wg
            grids.append([groups_2d(n * ((blocks + steps - 1) // steps)) for _, n in passes])
        chain_push = struct.pack("<3I", wait.slot if wait else 0, wait.n if wait else 0, signal.slot if signal else 0)
        if clock is not None:
            chain_push += struct.pack("<I", clock.slot)
            tail = tail + [clock.stamps]
        for ch, pch, groups in zip(w.chunks, pair_chunks, grids):
            push = struct.pack("<6If", ch.n_rows, w.cols, w.rows, ch.row_start, has_bias, rows_per_wg, eps)
            if stream:
                push += rope_push + chain_push
            stream_bufs = [pch.buffer] + tail + router_bufs if stream else []
            for i, ((kernel, _), g) in enumerate(zip(passes, groups)):
                # the last part's pass behind a barrier (it reads the scratch the first one wrote)
                seq.dispatch(kernel, [ch.buffer, x.range, b.range, y.range] + extra + stream_bufs, g, push,
                             chained=wait is not None and i == 0)
        return sum(gx * gy * gz for chunk in grids for gx, gy, gz in chunk)
    else:
        if family == "mul_mm_cm2d":
            _matmul_cm2d(seq, kc, w, x, y, n_tokens, bias)
            return 0
        if family.startswith("mul_mm_cm2"):
            _matmul_cm2(seq, kc, family, w, x, y, n_tokens, bias)
            return 0
        kernel, tile_rows, tile_tokens = tile_kernel(kc, family, name, "rrrw", 24, MATMUL_TILES)
        gy = (n_tokens + tile_tokens - 1) // tile_tokens
        for ch in w.chunks:
            gx = (ch.n_rows + tile_rows - 1) // tile_rows
            if gx > 65535 or gy > 65535:
                raise LlamavkError(f"matmul: grid {gx} x {gy} is too large")
            push = struct.pack("<6I", ch.n_rows, w.cols, w.rows, ch.row_start, has_bias, n_tokens)
            seq.dispatch(kernel, [ch.buffer, x.range, b.range, y.range], (gx, gy, 1), push)
    return 0


def tile_kernel(kc: KernelCache, family: str, type_name: str, bindings: str, push_size: int, tiles: dict):
    """(a tiled product's kernel, its tile's rows, its tile's tokens): matmul_cpu.comp's families
    (mul_mm_cpu, mul_mm_cpu_id) a workgroup of the subgroup's lanes, CPU_TILE rows a lane, specialized
    by the lanes; the others as `tiles` says."""
    if family.startswith("mul_mm_cpu"):   # W and x as texels (shaders/quants.glsl W_TEXELS)
        lanes = _selection.cpu_product_lanes(kc)
        kernel = kc.get(f"{family}_{type_name}", "tt" + bindings[2:], push_size=push_size, spec=(lanes,))
        return kernel, lanes * CPU_TILE[0], CPU_TILE[1]
    tile_rows, tile_tokens = tiles[family]
    return kc.get(f"{family}_{type_name}", bindings, push_size=push_size), tile_rows, tile_tokens


def _matmul_cm2(seq, kc: KernelCache, family: str, w: QWeight, x: View, y: View, n_tokens: int,
                bias: View | None) -> None:
    """Record matmul_cm2.comp (family mul_mm_cm2, or mul_mm_cm2h reading x converted to f16) per
    weight chunk: tiles by selection.cm2_tile (specialization constants); where the tiles are few, the
    columns' spans of 256 split over the grid's z into a scratch, and reduce_sum.comp adding the parts
    and the bias into y (a fixed order: the same bits every run)."""
    name = type_suffix(w.qtype)
    if family == "mul_mm_cm2" and cm2_x_f16():
        family = CM2_F16_X
    spec = cm2_f16_form(n_tokens, w.rows) if name == "f16" else cm2_tile(n_tokens, w.rows, name)
    tile_rows, tile_tokens = spec[:2]
    kernel = kc.get(f"{family}_{name}", "rrrw", push_size=36, spec=spec)
    if family == CM2_F16_X:   # it reads x as f16: converted first, into a scratch per size
        x = f16_copy(seq, kc, x, n_tokens * w.cols, room=f16_x_room(n_tokens, w.cols))
    has_bias = int(bias is not None)
    b = bias if bias is not None else x   # an unused binding still needs a buffer
    for ch in w.chunks:
        _cm2_chunk(seq, kc, kernel, ch, w, x, b, y, bias, has_bias, n_tokens, spec, x_f16=family == CM2_F16_X)


def _cm2_chunk(seq, kc: KernelCache, kernel, ch, w: QWeight, x: View, b: View, y: View, bias, has_bias: int,
               n_tokens: int, spec: tuple[int, ...], *, x_f16: bool, then=None) -> None:
    """One chunk's matmul_cm2.comp product with specialization constants spec (tile rows, tokens, BK,
    and for the F16 form its threads, ...): the columns' spans of 256 split over the grid's z where the
    tiles are few for the workgroups the GPU runs at once (selection.cm2_parts, cm2_fill). x_f16: x is
    an f16 scratch of f16_copy (read past the batch where it has room: _padded_x)."""
    tile_rows, tile_tokens = spec[:2]
    x, x_tokens = _padded_x(x, n_tokens, w.cols, tile_tokens) if x_f16 else (x, n_tokens)
    n_spans = w.cols // 256 if w.cols % 256 == 0 else 0   # the kernel splits only whole spans
    gx = (ch.n_rows + tile_rows - 1) // tile_rows
    gy = (n_tokens + tile_tokens - 1) // tile_tokens
    if gx > 65535 or gy > 65535:
        raise LlamavkError(f"matmul: grid {gx} x {gy} is too large")
    parts = cm2_parts(gx * gy, n_spans, cm2_fill(spec[3] if len(spec) > 3 else 256))
    spp = -(-n_spans // parts) if n_spans else 0
    parts = -(-n_spans // spp) if n_spans else 1   # no empty part
    _dispatch_column_parts(seq, kc, kernel, ch, w, x, b, y, bias, has_bias, n_tokens, (gx, gy), parts,
                           max(spp, 1), then=then, tail=struct.pack("<I", x_tokens))


def f16_x_room(n_tokens: int, cols: int) -> int:
    """Values an f16 x scratch holds for a product of n_tokens tokens: whole tiles of up to 256 tokens
    (_padded_x), so that no token tile of matmul_cm2.comp takes its clamped loads."""
    return -(-n_tokens // 256) * 256 * cols


def _padded_x(x: View, n_tokens: int, cols: int, tile_tokens: int) -> tuple[View, int]:
    """x's binding for matmul_cm2.comp and the tokens it may read: an f16 x (a scratch of f16_copy)
    as far as its buffer holds whole token tiles, so that a batch that is not a multiple of the tile
    reads the rows past it (whatever they hold: a column of the product depends on its own token
    alone, and the store stops at the batch) instead of clamping every load of its last token tile. H100, 7.2B Q4_0, 136 / 200 / 240 tokens dequantized first: 25.7 / 27.8 / 29.9 ms, 256
    tokens 22.9 (9a69282 + the tile rule, one call). An f32 x (LLAMAVK_CM2_X=f32) keeps the clamp, as
    does every x with LLAMAVK_CM2_PAD=0 (A/B)."""
    if os.environ.get("LLAMAVK_CM2_PAD", "1") == "0":
        return x, n_tokens
    readable = (x.buffer.size - x.offset) // (2 * cols)
    x_tokens = max(n_tokens, min(-(-n_tokens // tile_tokens) * tile_tokens, readable))
    return View(x.buffer, x.offset, 2 * x_tokens * cols), x_tokens


# The dequantize-then-f16 prompt product (family mul_mm_cm2d, selection.CM2_DEQUANT_TYPES): a weight
# chunk's rows dequantized to f16 rows by dequant_f16.comp (bandwidth-bound: ~0.56-0.82 bytes read and
# 2 written per weight), then matmul_cm2.comp's F16 form (x as f16) on them, loading plain f16 tiles
# instead of decoding every element in the product's loads. The f16 rows live in a scratch per size
# class of at most CM2D_SLICE_BYTES: bigger chunks go in row slices (a 128256-row output matrix of
# 4096 columns: 8 slices), each dequantized and multiplied before the next overwrites the scratch.
CM2D_SLICE_BYTES = 1 << 27
DEQUANT_F16_WG = 256          # dequant_f16.comp's workgroup
DEQUANT_F16_PER_THREAD = 4    # its units (8 weights, one 16-byte store) per thread (NPT)


def _even_slices(n_rows: int, tile_rows: int, n: int) -> list[tuple[int, int]]:
    per = -(-(-(-n_rows // n)) // tile_rows) * tile_rows   # n slices of whole tiles, as equal as can be
    return [(r0, min(per, n_rows - r0)) for r0 in range(0, n_rows, per)]


def cm2d_slices(n_rows: int, cols: int, tile_rows: int, max_bytes: int | None = None,
                grid: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """(first row, rows) of the slices a chunk of n_rows rows of `cols` weights is dequantized in:
    as many whole tiles of rows as fit max_bytes (default CM2D_SLICE_BYTES) of f16 (one tile at
    least), equal where they can be. grid (token tiles, workgroups the GPU runs at once): of that
    fewest number of slices and the three next, the one the wave model puts fastest
    (selection.cm2_grid_cost: 27648 rows of 5120 in 4 slices of 216 tiles, one wave each, rather than
    3 of 288, two waves each)."""
    max_bytes = max_bytes or CM2D_SLICE_BYTES
    per = max(tile_rows, (max_bytes // (2 * cols)) // tile_rows * tile_rows)
    n = -(-n_rows // per)
    if grid is None or not cm2_waves_on():
        return _even_slices(n_rows, tile_rows, n)
    token_tiles, fill = grid
    n_spans = cols // 256 if cols % 256 == 0 else 0

    def cost(slices):
        return sum(cm2_grid_cost(-(-rows // tile_rows) * token_tiles, n_spans, fill) + CM2_SLICE_COST
                   for _, rows in slices)
    return min((_even_slices(n_rows, tile_rows, k) for k in range(n, n + 4)), key=cost)


def dequant_f16(seq, kc: KernelCache, w: QWeight, ch, r0: int, n: int, out: View) -> None:
    """Record rows [r0, r0 + n) of w's chunk ch dequantized to f16 rows [n][w.cols] into out."""
    info = quant_info(w.qtype)
    _check_view(out, 2 * n * w.cols, "dequant_f16 out")
    if w.cols % info.block_size or w.cols % 8:
        raise LlamavkError(f"dequant_f16: rows of {w.cols} weights are not whole blocks of 8 weights or more")
    kernel = kc.get(f"dequant_f16_{type_suffix(w.qtype)}", "rw", push_size=12, spec=(DEQUANT_F16_PER_THREAD,))
    blocks_per_row = w.cols // info.block_size
    units = n * w.cols // 8
    push = struct.pack("<3I", ch.n_rows * blocks_per_row, r0 * blocks_per_row, units)
    seq.dispatch(kernel, [ch.buffer, out.range], groups_2d(-(-units // (DEQUANT_F16_WG * DEQUANT_F16_PER_THREAD))), push)


def _dequant_scratch(kc: KernelCache, nbytes: int, parity: int = 0) -> Buffer:
    """f16 rows of mul_mm_cm2d: two buffers per power-of-two size class, alternated by parity so
    that one product's rows can be dequantized while the previous product reads the other (a
    recording never replaces one its dispatches still use; the recorder's barriers order a
    dequantization after the last product that read the scratch)."""
    size = 1 << max(12, (nbytes - 1).bit_length())
    return kc.shared("cm2d f16 w", (size, parity), lambda: Buffer(kc.device, size))


def dequant_ahead_on() -> bool:
    """LLAMAVK_DEQUANT_AHEAD=0 records every dequantization right before its own product (A/B)."""
    return os.environ.get("LLAMAVK_DEQUANT_AHEAD", "1") != "0"


class DequantAhead:
    """The prompt step's mul_mm_cm2d row slices dequantized one product ahead.

    Why: dequant_f16 is bandwidth-bound (~2.6 TB/s) and the f16 product compute-bound, yet recorded
    one after the other each waits for the other: on an H100 the 7.2B's prompt spends ~7 of ~41 ms
    dequantizing. So right after a slice's product is recorded, the next slice's dequantization
    (this product's next row slice, else the first slice of the next weight product of the step,
    from `plan`) is recorded into the other scratch of its size class: no barrier separates the
    two (they share nothing), so the GPU runs them together, and the barrier before the next product
    waits for both. runtime.record sets one per recording (KernelCache.dequant_ahead) with the
    step's weight products in recording order; a slice dequantized ahead is used only by the very
    next mul_mm_cm2d dispatch of the same command sequence, so a plan that guessed wrong costs
    time, never a result."""

    def __init__(self, kc: KernelCache, plan: list[tuple[QWeight, int]]):
        self.kc = kc
        self.plan = plan         # (weight, tokens) of the step's weight products, in recording order
        self.pos = -1            # the plan entry of the product being recorded (-1: not in it)
        self.searched = 0        # where the next search for an entry starts
        self.parity = 0          # the scratch the next dequantization writes
        self.x_parity = 0        # the f16 x scratch the next conversion writes (f16_copy)
        self.ready = None        # (seq, weight, chunk index, first row, View) dequantized ahead

    def _next_job(self, w: QWeight, n_tokens: int, job: int):
        """(weight, tokens, chunk index, first row, rows) of the slice after slice `job` of w."""
        jobs = cm2d_jobs(w, n_tokens)
        if job + 1 < len(jobs):
            return (w, n_tokens) + jobs[job + 1]
        if self.pos < 0:
            return None          # w is not in the plan: what comes next is unknown
        for nw, nt in self.plan[self.pos + 1:]:   # products of other kernels leave it alone
            if product_kernel(self.kc, nt, nw.rows, nw.cols, type_suffix(nw.qtype)) == "mul_mm_cm2d":
                return (nw, nt) + cm2d_jobs(nw, nt)[0]
        return None

    def begin(self, w: QWeight) -> None:
        """A mul_mm_cm2d product of w is being recorded: find its plan entry (from the last one
        found on; none: -1, and what comes after it is unknown)."""
        found = next((i for i in range(self.searched, len(self.plan)) if self.plan[i][0] is w), -1)
        self.pos = found
        self.searched = found if found >= 0 else self.searched

    def take(self, seq, w: QWeight, ci: int, r0: int) -> View | None:
        """The rows dequantized ahead for this slice, if they were (and were recorded in seq)."""
        ready, self.ready = self.ready, None
        if ready is not None and ready[0] is seq and ready[1] is w and ready[2:4] == (ci, r0):
            return ready[4]
        return None

    def slice_view(self, w: QWeight, n: int) -> View:
        """The next scratch to dequantize n rows of w into (alternating)."""
        nbytes = 2 * n * w.cols
        view = View(_dequant_scratch(self.kc, nbytes, self.parity), 0, nbytes)
        self.parity ^= 1
        return view

    def after(self, seq, w: QWeight, n_tokens: int, job: int) -> None:
        """Slice `job` of w's product is recorded: record the next slice's dequantization."""
        nxt = self._next_job(w, n_tokens, job)
        if nxt is None:
            return
        nw, _, ci, r0, n = nxt
        out = self.slice_view(nw, n)
        dequant_f16(seq, self.kc, nw, nw.chunks[ci], r0, n, out)
        self.ready = (seq, nw, ci, r0, out)


def cm2d_jobs(w: QWeight, n_tokens: int) -> list[tuple[int, int, int]]:
    """(chunk index, first row, rows) of mul_mm_cm2d's row slices of w, in recording order."""
    spec = cm2_f16_form(n_tokens, w.rows)
    grid = (-(-n_tokens // spec[1]), cm2_fill(spec[3]))
    return [(ci, r0, n) for ci, ch in enumerate(w.chunks) for r0, n in cm2d_slices(ch.n_rows, w.cols, spec[0], grid=grid)]


def _matmul_cm2d(seq, kc: KernelCache, w: QWeight, x: View, y: View, n_tokens: int, bias: View | None) -> None:
    """Record the dequantize-then-f16 product (family mul_mm_cm2d) per weight chunk and row slice:
    dequant_f16 into the scratch, then mul_mm_cm2h_f16 over it (tiles by selection.cm2_tile for
    "f16", split K, bias and outputs as _matmul_cm2), x converted to f16 once. With a DequantAhead
    (prompt steps), each slice's rows are dequantized while the slice before it is multiplied."""
    spec = cm2_f16_form(n_tokens, w.rows)
    kernel = kc.get(f"{CM2_F16_X}_f16", "rrrw", push_size=36, spec=spec)
    ahead = kc.dequant_ahead
    if ahead is not None:
        ahead.begin(w)
    xh = f16_copy(seq, kc, x, n_tokens * w.cols, room=f16_x_room(n_tokens, w.cols))
    has_bias = int(bias is not None)
    b = bias if bias is not None else xh   # an unused binding still needs a buffer
    for job, (ci, r0, n) in enumerate(cm2d_jobs(w, n_tokens)):
        ch = w.chunks[ci]
        rows_view = ahead.take(seq, w, ci, r0) if ahead is not None else None
        if rows_view is None:
            rows_view = ahead.slice_view(w, n) if ahead is not None else \
                View(_dequant_scratch(kc, 2 * n * w.cols), 0, 2 * n * w.cols)
            dequant_f16(seq, kc, w, ch, r0, n, rows_view)
        rows = WeightChunk(rows_view.buffer, ch.row_start + r0, n)
        # the next slice's dequantization right after this product's dispatch (before a split K's
        # reduce_sum, which waits behind a barrier), so that the two run together
        then = (lambda job=job: ahead.after(seq, w, n_tokens, job)) if ahead is not None else None
        _cm2_chunk(seq, kc, kernel, rows, w, xh, b, y, bias, has_bias, n_tokens, spec, x_f16=True, then=then)


def _dispatch_column_parts(seq, kc: KernelCache, kernel, ch, w: QWeight, x: View, b: View, y: View, bias,
                           has_bias: int, n_tokens: int, grid: tuple[int, int], parts: int, per_part: int,
                           then=None, tail: bytes = b"") -> None:
    """One chunk's product by a tile kernel whose columns are cut into `parts` (matmul_small.comp,
    matmul_cm2.comp: push constants rows, cols, y stride, y row offset, bias?, tokens, column units or
    spans per part, scratch stride): one part writes y (bias and all) itself; several write their sums
    to a scratch and reduce_sum adds them in a fixed order, with the bias. then(): recorded right
    after the product's dispatch (DequantAhead's next dequantization). tail: more push constants
    (matmul_cm2.comp's x_tokens)."""
    gx, gy = grid
    if parts == 1:
        push = struct.pack("<8I", ch.n_rows, w.cols, w.rows, ch.row_start, has_bias, n_tokens, per_part, 0) + tail
        seq.dispatch(kernel, [ch.buffer, x.range, b.range, y.range], (gx, gy, 1), push)
        if then is not None:
            then()
        return
    stride = n_tokens * ch.n_rows
    scratch = View(_small_gemm_scratch(kc, 4 * parts * stride), 0, 4 * parts * stride)
    push = struct.pack("<8I", ch.n_rows, w.cols, ch.n_rows, 0, 0, n_tokens, per_part, stride) + tail
    seq.dispatch(kernel, [ch.buffer, x.range, x.range, scratch.range], (gx, gy, parts), push)
    if then is not None:     # recorded between the product and the sum of its parts (see callers)
        then()
    reduce_sum(seq, kc, scratch, "f32", (1 << parts) - 1, stride, y, n_tokens, ch.n_rows, ch.n_rows,
               base=bias, base_stride=0, base_c0=ch.row_start, out_stride=w.rows, out_c0=ch.row_start)


def f16_copy(seq, kc: KernelCache, x: View, n: int, room: int = 0) -> View:
    """x's first n floats converted to f16, in a scratch shared by every product of this size class
    (a power of two of at least 4 KiB, so a recording never replaces one its dispatches still use;
    the recorder's barriers order a conversion after the last product that read the scratch).
    Products reading the same x one after another (a layer's Q, K and V; gate and up) share one
    conversion: the last one is reused while nothing recorded since wrote x or the scratch (H100,
    7.2B pp512: each conversion a dispatch of ~9 us behind a barrier, 6 per layer before)."""
    key = (x.buffer, x.offset, n)
    memo = getattr(seq, "memo", None)   # a recorder without one (tests' fakes): no sharing
    if memo is None:
        return record_f16_x(seq, kc, x, n, lambda xh: convert(seq, kc, x, xh, "f16", n), room=room)
    last = memo.get("f16 x") if os.environ.get("LLAMAVK_CM2_X_SHARE", "1") != "0" else None
    if last is not None:
        last_key, xh, mark = last
        if last_key == key and not seq.written_since(mark, x.range, xh.range):
            return xh
    only = memo.get("f16 only", {}).get((x.buffer, x.offset))
    if only is not None and not seq.written_since(only[1], x.range):   # x holds no f32 values
        raise LlamavkError(f"internal error: a product reads {n} values of an x written only as f16 ({only[0]} "
                           "values), whose f16 scratch is gone or of another size (runtime._feeds_f16_products)")
    return record_f16_x(seq, kc, x, n, lambda xh: convert(seq, kc, x, xh, "f16", n), room=room)


def record_f16_x(seq, kc: KernelCache, x: View, n: int, write, f16_only: bool = False, room: int = 0) -> View:
    """The f16 form of x's first n floats, written into its scratch by write(view) (a conversion, or
    the producer of x writing f16 itself: the runtime's norms and SwiGLU before the products reading
    their output, which then never exists as f32: f16_only), and noted so that the products reading
    x next take it (f16_copy). room: the values its buffer holds at least (f16_x_room)."""
    size = 1 << max(12, (2 * max(n, room) - 1).bit_length())
    ahead = kc.dequant_ahead
    parity = 0
    if ahead is not None:   # alternate: converting the next product's x need not wait for this one
        parity, ahead.x_parity = ahead.x_parity, ahead.x_parity ^ 1
    xh = View(kc.shared("cm2 f16 x", (size, parity), lambda: Buffer(kc.device, size)), 0, 2 * n)
    write(xh)
    memo = getattr(seq, "memo", None)
    if memo is not None:
        memo["f16 x"] = ((x.buffer, x.offset, n), xh, seq.write_mark())
        if f16_only:   # by place, not size: a reader asking for another size is an error, not a conversion
            memo.setdefault("f16 only", {})[(x.buffer, x.offset)] = (n, seq.write_mark())
    return xh


def reads_x_f16(kc: KernelCache, w: QWeight, n_tokens: int) -> bool:
    """Whether the product of n_tokens tokens through w reads its x as f16 (f16_copy): the
    dequantize-then-f16 products, and the coopmat2 ones with LLAMAVK_CM2_X=f16 (the default)."""
    family = product_kernel(kc, n_tokens, w.rows, w.cols, type_suffix(w.qtype))
    return family == "mul_mm_cm2d" or (family == "mul_mm_cm2" and cm2_x_f16())


# Matrix-vector kernels with a form that takes its token slice from the grid's z (TOKEN_SLICES in
# matvec.comp / matvec_wide.comp): kernel -> that form's variant prefix.
MATVEC_SLICE_KERNELS = {"base": "mul_mv_slices", "wide": "mul_mv_wide_slices"}
MAX_GRID_Z = 65535   # the portable minimum of maxComputeWorkGroupCount[2]


def _matvec_batches(seq, kc: KernelCache, w: QWeight, x: View, y: View, n_tokens: int, bias: View | None) -> None:
    """The matrix-vector product once per MATVEC_MAX_TOKENS tokens (family mul_mv_batched): every full
    slice of MATVEC_MAX_TOKENS tokens in one dispatch (the slice is the grid's z), a partial last slice
    as an ordinary matrix-vector product of its own. A 512-token prompt through a router used to record
    64 dispatches per product (one per slice): each costs command-processor time on the GPU, and a
    35B-A3B prompt batch has ~100 such products. LLAMAVK_SMALL_ROWS_SLICES=1 records the dispatch per
    slice instead (A/B comparisons)."""
    step = MATVEC_MAX_TOKENS
    full, rest = divmod(n_tokens, step)
    cfg = matvec_config(kc, w.qtype, w.rows, w.cols, step)
    one_dispatch = cfg.kernel in MATVEC_SLICE_KERNELS and os.environ.get("LLAMAVK_SMALL_ROWS_SLICES", "0") == "0"
    if full and one_dispatch:
        for s0 in range(0, full, MAX_GRID_Z):
            ns = min(MAX_GRID_Z, full - s0)
            xs = View(x.buffer, x.offset + 4 * s0 * step * w.cols, 4 * ns * step * w.cols)
            ys = View(y.buffer, y.offset + 4 * s0 * step * w.rows, 4 * ns * step * w.rows)
            _matvec_slices(seq, kc, cfg, w, xs, ys, ns, bias)
    for t0 in range(full * step if one_dispatch else 0, n_tokens, step):
        nt = min(step, n_tokens - t0)
        xs = View(x.buffer, x.offset + 4 * t0 * w.cols, 4 * nt * w.cols)
        ys = View(y.buffer, y.offset + 4 * t0 * w.rows, 4 * nt * w.rows)
        matmul(seq, kc, w, xs, ys, nt, bias=bias)


def _matvec_slices(seq, kc: KernelCache, cfg: MatvecConfig, w: QWeight, x: View, y: View, n_slices: int,
                   bias: View | None) -> None:
    """Record cfg's matrix-vector kernel over n_slices full slices of MATVEC_MAX_TOKENS tokens in one
    dispatch per weight chunk: the same specialization and row blocks as one slice (so each slice's
    workgroups do what one slice's dispatch did), the grid's z counting slices."""
    name = type_suffix(w.qtype)
    spec, rows_per_wg, _, _ = _matvec_spec(kc, cfg, name, w.cols, MATVEC_MAX_TOKENS, False, False, False)
    kernel = kc.get(f"{MATVEC_SLICE_KERNELS[cfg.kernel]}_{name}", "rrrwrrr", push_size=28, spec=spec)
    b = bias if bias is not None else x   # an unused binding still needs a buffer
    for ch in w.chunks:
        gx, gy, _ = groups_2d((ch.n_rows + rows_per_wg - 1) // rows_per_wg)
        push = struct.pack("<6If", ch.n_rows, w.cols, w.rows, ch.row_start, int(bias is not None), rows_per_wg, 0.0)
        seq.dispatch(kernel, [ch.buffer, x.range, b.range, y.range, x.range, x.range, x.range], (gx, gy, n_slices), push)


def small_gemm_plan(kc: KernelCache, cfg: SmallGemmConfig, n_rows: int, cols: int, n_tokens: int) -> tuple:
    """(grid x, grid y, parts, units per part) of matmul_small.comp for a chunk of n_rows rows: the
    tiles, and cfg.ks parts of the columns (0: the most, doubling, that keep the grid within
    SMALL_GEMM_WORKGROUPS and parts of at least SMALL_GEMM_MIN_PART_UNITS units; a 256-row router at
    512 tokens by 32 x 64 tiles: 64 tiles, 4 parts of 16 units)."""
    gx, gy = -(-n_rows // cfg.bm), -(-n_tokens // cfg.bn)
    n_units = -(-cols // 32)
    ks = cfg.ks
    if ks == 0:
        ks = 1
        while 2 * ks <= SMALL_GEMM_MAX_PARTS and gx * gy * 2 * ks <= SMALL_GEMM_WORKGROUPS and \
                n_units >= 2 * ks * SMALL_GEMM_MIN_PART_UNITS:
            ks *= 2
    upp = -(-n_units // min(ks, n_units))
    return gx, gy, -(-n_units // upp), upp   # no empty part


def _small_gemm_scratch(kc: KernelCache, nbytes: int) -> Buffer:
    """matmul_small.comp's per-part sums before reduce_sum.comp adds them: one buffer per power-of-two
    size on the device, shared by every product (the recorder orders the users: both write it)."""
    size = 1 << max(12, (nbytes - 1).bit_length())
    return kc.shared("small-tile parts", size, lambda: Buffer(kc.device, size))


def _matmul_small(seq, kc: KernelCache, w: QWeight, x: View, y: View, n_tokens: int, bias: View | None) -> int:
    """Record the small-tile product (family mul_mm_small: few rows, many tokens) per weight chunk:
    one dispatch where the columns are one part, else the parts into a scratch buffer and
    reduce_sum.comp adding them and the bias into y (a fixed order: the same bits every run).
    Returns the number of workgroups of the products."""
    cfg = small_gemm_config(kc)
    wg = (cfg.bm // cfg.tm) * (cfg.bn // cfg.tn)
    if wg > (kc.info.max_workgroup_invocations or 1024) or 128 * (cfg.bm + cfg.bn) > (kc.info.max_shared_memory or 49152):
        raise LlamavkError(f"matmul: small-tile config {cfg.spec()} does not fit this device "
                           f"({wg} threads, {128 * (cfg.bm + cfg.bn)} bytes of shared memory)")
    kernel = kc.get(f"mul_mm_small_{type_suffix(w.qtype)}", "rrrw", push_size=32,
                    spec=(wg, cfg.bm, cfg.bn, cfg.tm, cfg.tn))
    has_bias = int(bias is not None)
    b = bias if bias is not None else x   # an unused binding still needs a buffer
    total = 0
    for ch in w.chunks:
        gx, gy, parts, upp = small_gemm_plan(kc, cfg, ch.n_rows, w.cols, n_tokens)
        if gy > 65535:
            raise LlamavkError(f"matmul: {n_tokens} tokens make {gy} token tiles (at most 65535)")
        total += gx * gy * parts
        _dispatch_column_parts(seq, kc, kernel, ch, w, x, b, y, bias, has_bias, n_tokens, (gx, gy), parts, upp)
    return total


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
