"""Which kernel runs where: every per-device kernel choice of the engine, in one place.

The recorders (matmul.py, attention.py) ask these tables; nothing else in the engine branches on the
kind of device. Every entry was measured (docs/PERFORMANCE.md says with what); environment variables
named next to each table override them for experiments.

1. PRODUCT_KERNELS: the kernel family of a weight product, by batch size, weight shape and device.
2. MATVEC_CONFIGS: the matrix-vector kernel and work split, by kind of device, weight type, tokens
   and weight shape.
3. ATTENTION_SPLITS: the split-KV grid of decode attention, by kind of device (attention.split_plan).
4. ATTENTION_COOP_HEAD_DIMS: where prompt attention runs on cooperative matrices.
5. CHAIN_VENDORS: devices where a product waits for its producer in the shader instead of behind a
   barrier, and after which producers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from ..errors import LlamavkError

# Token counts up to this use the matrix-vector kernel (one pass over W, NT accumulators per row);
# the tiled kernel needs enough tokens to fill its 64-token tiles before it pays off.
MATVEC_MAX_TOKENS = 8
# What the cooperative-matrix kernel needs (shaders/matmul_coop.comp).
COOPMAT_SHAPE = "16x8x16 f16->f32"


def has_coopmat(kc) -> bool:
    """The device runs shaders/matmul_coop.comp: VK_KHR_cooperative_matrix enabled with its shape,
    32-lane subgroups (the kernel's tile layout), f16 arithmetic (its Q4_0 / Q8_0 runs)."""
    return (kc.device.features.get("coopmat", False) and kc.device.features.get("fp16", False)
            and COOPMAT_SHAPE in kc.info.coopmat and kc.info.subgroup_size == 32)


def _coopmat_ok(kc, cols: int) -> bool:
    return has_coopmat(kc) and cols % 32 == 0


# Weight types of the NV cooperative-matrix-2 prompt kernel (shaders/matmul_cm2.comp), and those it is
# chosen for. H100, benchmarks/bench_matmul.py --no-portable --cm2-tiles 128x256,128x128:2, 512
# tokens, TFLOP/s, cm2 (x as f16, tiles and split by the rules below) against the KHR kernels
# (mul_mm_coop / mul_mm_coop_big): Q4_K 4096x4096 145 / 105, 4096x14336 144 / 101, 1024x4096 86 / 32,
# 14336x4096 (128 x 128, 2 parts) 138 / 122; Q6_K 111 / 126, 112 / 132, 74 / 35, 104 / 129; Q4_0 (128 x
# 256) 156 / 131, 182 / 124, 88 / 37, 172 / 153; Q8_0 150 / 92, 184 / 93, 86 / 31, 174 / 124.
# 7.2B pp512 (same call, second passes; KHR kernels / cm2 / llama.cpp -cm2): Q4_K 7,138 / 8,154 /
# 11,574; Q4_0 8,588 / 10,596 / 10,980; Q8_0 6,778 / 10,424 / 11,195; Q6_K 7,951 / 7,480 (cm2 for
# every product below 8192 rows) / 8,635, so Q6_K's decode function (two 2-byte-aligned bytes per
# element) is not chosen; LLAMAVK_CM2_TYPES=q4_0,q6_k,... chooses others. Batches of 256 tokens and
# more of Q4_K and Q6_K are dequantized to f16 first instead (mul_mm_cm2d, CM2_DEQUANT_TYPES below). Q4_K at 8192
# rows and more (the FFN gate / up) on cm2 too: 8,335 / 8,350 against 8,124 with the KHR 256 x 128
# tiles (same call, 124f9ef). F16 (plain rows, aligned stride) 192-219 TFLOP/s at 512 tokens.
CM2_TYPES = ("q4_0", "q8_0", "q4_k", "q6_k", "f16")
CM2_CHOSEN_TYPES = ("q8_0", "q4_0", "q4_k")
# ... those it is chosen for at 8192 rows and more too (the others take the KHR 256 x 128 tiles), and
# those whose batches of 256 tokens and more take 128 x 256 tiles at any rows (the K-quants lose there:
# Q4_K 4096x4096 75 against 145 with 128 x 128; pp512 6,252)
CM2_LARGE_TYPES = ("q4_0", "q8_0", "q4_k")
CM2_WIDE_TYPES = ("q4_0", "q8_0")


def cm2_chosen_types() -> tuple[str, ...]:
    env = os.environ.get("LLAMAVK_CM2_TYPES")
    return tuple(t for t in env.split(",") if t in CM2_TYPES) if env else CM2_CHOSEN_TYPES


# Prompt products dequantized to f16 rows first (shaders/dequant_f16.comp), then multiplied by
# matmul_cm2.comp's F16 form (kernels/matmul.py mul_mm_cm2d): the dequantization is a fixed cost per
# product (read the weight once, write 2 bytes per weight: a 14336 x 4096 weight ~150 MB, ~55 us at
# 2.9 TB/s), the product then loads plain f16 tiles instead of decoding every element, the same code
# for every type. It pays from enough tokens: CM2_DEQUANT_MIN_TOKENS. H100, 512 tokens, TFLOP/s
# (bench_matmul.py; cm2d / per-element decode cm2 / KHR): Q4_K 4096x4096 165 / 145 / 109, 14336x4096
# 160 / 126 / 122, 4096x14336 181 / 144 / 99; Q6_K 162 / 111 / 124, 159 / 98 / 128, 178 / 111 / 131;
# Q8_0 160 / 152, 158 / 174, 177 / 184; Q4_0 167 / 155, 161 / 172, 182 / 182 (the pass alone 2.4-2.8
# TB/s). 7.2B pp512 (same call, second passes; default before / cm2d / llama.cpp -cm2): Q4_K 8,370 /
# 10,193 / 11,827; Q6_K 7,985 / 10,045 / 9,116; Q8_0 10,454 / 10,059 / 11,718; Q4_0 10,625 / 10,396 /
# 10,973. So the K-quants took it, Q4_0 / Q8_0 kept their decode functions. With the F16 form's
# 128-thread workgroups and split K (cm2_f16_form), 7.2B pp512 (e70419a, one call; 128 threads / 256
# threads / decode functions; llama.cpp -cm2 in the same call 10,840 for Q4_0): Q4_K 12,112 / 10,027,
# Q6_K 11,911 / 9,921, Q4_0 12,268 / 10,226 / 10,567, Q8_0 11,927 / 9,944 / 10,402; pp256 Q4_0 9,850
# against 9,524, Q8_0 9,331 against 9,246 (pp128 below the threshold: the same path). IQ4_XS / IQ4_NL /
# MXFP4 (the KHR kernel before; pp512): 10,065 / 10,216 / 10,171 against 6,028 / 6,215 / 6,256
# (llama.cpp 3,495 / 3,457 / 5,560). The 31.5B Q4_0: 2,631 against 2,197 (llama.cpp 2,957). Q5_K /
# Q3_K / Q2_K / Q5_0 / Q4_1 / Q5_1 (d8924e3, one call; cm2d / before / llama.cpp): 11,741 / 6,417 /
# 9,571, 11,805 / 7,374 / 4,000, 12,201 / 9,610 / 3,830, 12,007 / 8,202 / 8,719, 12,025 / 9,396 /
# 9,626, 11,334 / 9,066 / 8,791. So every type that has the dequantization takes it.
# LLAMAVK_CM2_DEQUANT=q4_k,q6_k,... chooses types (0: none),
# LLAMAVK_CM2_DEQUANT_MIN=N the tokens from which it applies (A/B). CM2_DEQUANT_KERNEL_TYPES: the
# types dequant_f16.comp has (shaders/variants_dequant.py).
CM2_DEQUANT_KERNEL_TYPES = ("q4_0", "q8_0", "q4_k", "q6_k", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q5_k",
                            "iq4_nl", "iq4_xs", "mxfp4", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s",
                            "iq1_s", "iq1_m", "tq1_0", "tq2_0")
CM2_DEQUANT_TYPES: tuple[str, ...] = CM2_DEQUANT_KERNEL_TYPES
CM2_DEQUANT_MIN_TOKENS = 129     # more than one 128-token tile (CM2_TILES)


def cm2_dequant_types() -> tuple[str, ...]:
    env = os.environ.get("LLAMAVK_CM2_DEQUANT")
    if env is None:
        return CM2_DEQUANT_TYPES
    types = tuple(t for t in env.lower().replace(" ", "").split(",") if t and t != "0")
    unknown = [t for t in types if t not in CM2_DEQUANT_KERNEL_TYPES]
    if unknown:
        raise LlamavkError(f"LLAMAVK_CM2_DEQUANT={env!r}: unknown type {unknown[0]!r} (0, or types of "
                           f"{', '.join(CM2_DEQUANT_KERNEL_TYPES)})")
    return types


def cm2_dequant_min() -> int:
    env = os.environ.get("LLAMAVK_CM2_DEQUANT_MIN")
    if not env:
        return CM2_DEQUANT_MIN_TOKENS
    try:
        n = int(env)
    except ValueError:
        n = 0
    if n < 1:
        raise LlamavkError(f"LLAMAVK_CM2_DEQUANT_MIN={env!r}: a number of tokens (at least 1)")
    return n


def has_coopmat2(kc) -> bool:
    """The device runs shaders/matmul_cm2.comp: VK_NV_cooperative_matrix2 enabled with every feature
    it uses (vk/coopmat2.py REQUIRED; NVIDIA). LLAMAVK_CM2=0 keeps the KHR cooperative-matrix kernels
    (A/B on one device)."""
    return os.environ.get("LLAMAVK_CM2", "1") != "0" and bool(kc.device.features.get("coopmat2", False))


def _cm2_ok(kc, cols: int) -> bool:
    return has_coopmat2(kc) and cols % 32 == 0


# Tiles of matmul_cm2.comp (specialization constants), rows x tokens x columns per step, workgroups of
# 256 threads: the first rule that applies (type name, tokens, rows). LLAMAVK_CM2_TILE=BMxBN[xBK]
# overrides (sweeps). Few tiles split the columns (cm2_parts below). H100, 512 tokens: above.
#
# Below 256 tokens (not f16 weights): one token tile as narrow as covers the batch. A tile whose
# tokens run past the batch's bounds-checks x only (matmul_cm2.comp: W's loads stay whole), ~10% over
# a whole tile, while every further token tile decodes the weights again; batches of more than 128
# tokens take the dequantized path (CM2_DEQUANT_MIN_TOKENS). H100, llamavk bench second passes, one
# call (d9fb893, whole tiles forced, greedy tokens the same): 7.2B Q4_0 pp32 548 -> 2,682 (128 x 32),
# pp64 1,102 -> 4,710 (128 x 64; 64 x 64: 4,549; 128 x 32: 2,839); 1.1B pp32 3,243 -> 9,134, pp64
# 6,414 -> 18,199 (64 x 64: 20,347). H200, 7.2B Q4_0 (9a69282, one call, llama.cpp -cm2 beside):
# a 128-token tile runs 17, 48, 100 and 128 tokens in 17.0, 17.4, 18.3 and 16.3 ms, whole 32- and
# 64-token tiles 32 and 64 in 12.0 and 14.2; 200 tokens in two 128-token tiles 30.6 ms (0.85x
# llama.cpp), 256 dequantized first 20.9. H100, same model (d829d85, one call; before -> this rule):
# pp17 / pp24 / pp48 1,071 / 1,530 / 3,042 -> 1,408 / 1,952 / 3,515, pp96 (three 32-token tiles)
# 3,816 -> 5,341, pp136 / pp200 / pp240 4,672 / 6,606 / 7,654 -> 5,298 / 7,186 / 8,037 (and 6,539 /
# 9,061 / 10,497 once the last token tile read x past the batch: kernels/matmul.py _padded_x).
CM2_TILES = (
    (lambda t, n, rows: t != "f16" and n <= 32, (128, 32, 64)),
    (lambda t, n, rows: t != "f16" and n <= 64, (128, 64, 64)),
    (lambda t, n, rows: t in CM2_WIDE_TYPES and n >= 256, (128, 256, 64)),
    (lambda t, n, rows: rows <= 2048, (64, 128, 64)),
    (lambda t, n, rows: True, (128, 128, 64)),
)

CM2_TILE_BM = (32, 64, 128, 256)
CM2_TILE_BK = (32, 64, 128, 256)


def cm2_x_f16() -> bool:
    """matmul_cm2.comp reads x as f16, converted by a pass of its own first (mul_mm_cm2h), rather than
    the f32 x through a decode function: H100 Q4_K 4096x4096 143 against 125 TFLOP/s, 7.2B pp512 7,830
    against 7,718 (same call). LLAMAVK_CM2_X=f32 reads the f32 x."""
    return os.environ.get("LLAMAVK_CM2_X", "f16") == "f16"


# Split K of matmul_cm2.comp: a grid of few tiles leaves SMs idle, and one of a little more than the
# workgroups the GPU runs at once (cm2_fill) runs a second, nearly empty wave; so a grid's columns'
# spans of 256 may be split over parts (at most CM2_MAX_PARTS, two spans each at least) that
# reduce_sum.comp adds. The parts are chosen by a wave model (cm2_cost): ceil(workgroups / fill) waves,
# each as long as one workgroup's share of the columns, plus the sum of the parts (its traffic against
# a tile's multiply-adds: CM2_REDUCE_COST * tiles / cols). LLAMAVK_CM2_SPLIT=N forces N parts (1:
# none); LLAMAVK_CM2_WAVES=0 takes the rule before the model (parts only for grids of at most half a
# wave) and the fewest row slices (A/B).
CM2_FILL_WORKGROUPS = 132
CM2_MAX_PARTS = 8
CM2_REDUCE_COST = 0.8     # H100: ~270 TFLOP/s over 264 workgroups against ~2.5 TB/s for the sum
CM2_SLICE_COST = 0.05     # a row slice's own dispatches and barriers, in the same units (and a margin)


def cm2_waves_on() -> bool:
    return os.environ.get("LLAMAVK_CM2_WAVES", "1") != "0"


def cm2_cost(tiles: int, n_spans: int, fill: int, parts: int) -> float:
    """The wave model's time of a grid of `tiles` tiles whose n_spans spans go in `parts` parts, in
    units of one workgroup's time over every column (parts as the recorder makes them: spans per part
    rounded up, no empty part)."""
    if n_spans == 0 or parts <= 1:
        return float(-(-tiles // fill))
    spp = -(-n_spans // parts)
    real = -(-n_spans // spp)
    t = -(-tiles * real // fill) * spp / n_spans
    return t + (real + 1) * CM2_REDUCE_COST * tiles / (256 * n_spans)


def _cm2_best_parts(tiles: int, n_spans: int, fill: int) -> int:
    choices = range(1, max(1, min(CM2_MAX_PARTS, n_spans // 2)) + 1)
    return min(choices, key=lambda p: (cm2_cost(tiles, n_spans, fill, p), p))


def cm2_parts(tiles: int, n_spans: int, fill: int = CM2_FILL_WORKGROUPS) -> int:
    """Parts of the columns for a grid of `tiles` tiles over n_spans spans of 256 columns (0: cols
    not a multiple of 256, which the kernel does not split); `fill`: the workgroups the GPU runs at
    once (cm2_fill: more where workgroups are smaller)."""
    env = os.environ.get("LLAMAVK_CM2_SPLIT")
    if env:
        try:
            parts = int(env)
        except ValueError:
            raise LlamavkError(f"LLAMAVK_CM2_SPLIT={env!r}: a number of parts") from None
        if parts < 1:
            raise LlamavkError(f"LLAMAVK_CM2_SPLIT={env!r}: a number of parts") from None
    elif not cm2_waves_on():
        parts = fill // tiles if 2 * tiles <= fill else 1
    else:
        return _cm2_best_parts(tiles, n_spans, fill)
    return max(1, min(parts, CM2_MAX_PARTS, n_spans // 2))


def cm2_grid_cost(tiles: int, n_spans: int, fill: int) -> float:
    """The wave model's time of a grid with the parts cm2_parts gives it."""
    return cm2_cost(tiles, n_spans, fill, cm2_parts(tiles, n_spans, fill))


def cm2_fill(threads: int = 256) -> int:
    """Workgroups of `threads` threads the GPU runs at once: CM2_FILL_WORKGROUPS for 256 (one per
    H100 SM: the accumulator's registers), proportionally more for smaller ones."""
    return CM2_FILL_WORKGROUPS * 256 // threads if threads < 256 else CM2_FILL_WORKGROUPS


def cm2_tile(n_tokens: int, rows: int, type_name: str | None = None) -> tuple[int, int, int]:
    env = os.environ.get("LLAMAVK_CM2_TILE")
    if env:
        try:
            tile = tuple(int(v) for v in env.lower().split("x"))
            bm, bn, bk = tile if len(tile) == 3 else (*tile, 64)
        except ValueError:
            raise LlamavkError(f"LLAMAVK_CM2_TILE={env!r}: BMxBN[xBK], e.g. 128x256x64") from None
        # BM: the K-quants' scale tables are filled by 256 / BM threads per row; BK: whole steps in a
        # span of 256 columns (matmul_cm2.comp)
        if bm not in CM2_TILE_BM or bn <= 0 or bn % 16 or bk not in CM2_TILE_BK:
            raise LlamavkError(f"LLAMAVK_CM2_TILE={env!r}: BM one of {CM2_TILE_BM}, BN a multiple of 16, "
                               f"BK one of {CM2_TILE_BK}")
        return bm, bn, bk
    return next(tile for applies, tile in CM2_TILES if applies(type_name, n_tokens, rows))


# matmul_cm2.comp's F16 form (mul_mm_cm2h_f16: f16 weights, and every mul_mm_cm2d product) has three
# more specialization constants: the workgroup's threads (3; the driver splits a workgroup-scope
# matrix over its warps), the steps of BK unrolled per iteration of the whole-tile loop (4) and the
# pipelined order (5: step k + 1's tiles loaded before step k's product). LLAMAVK_CM2_WG=N,
# LLAMAVK_CM2_UNROLL=N and LLAMAVK_CM2_PIPE=0|1 override them (sweeps: bench_matmul.py --cm2-tiles
# 128x128x64/WG=128/PIPE=1). H100, bench_matmul.py --cm2-only --types f16, 512 tokens, TFLOP/s
# (x's f16 conversion and split-K sums included), 4096x4096 / 14336x4096 / 4096x14336, 128 x 128 x 64
# tiles: 256 threads, 4 steps (before) 197.0 / 189.1 / 216.0; 128 threads 185.0 / 261.8 / 197.2, in 2
# parts 207.2 / 209.1 / 265.3 (so cm2_fill: 2 parts for the 128-tile 4096-row weights, 1 for 448
# tiles); 256 threads and 8 steps 213.9 / 207.6 / 240.1 (128 threads and 8 steps: not measured, so 4
# stays); pipelined 140.9 / 122.4 / 144.4; 128 x 256 x 64, 8 steps 185.3 / 223.8 / 238.7; 64 x 128 by
# 128 threads 195.5 / 191.8 / 219.6; 512 threads (256 x 128, 128 x 256, 256 x 256) 106-189 and 25.
# The product alone (--product-only, 256 threads): 225.4 / 193.7 / 238.7: x's conversion is ~12% at
# 4096 columns.
CM2_F16_WG = 128
CM2_F16_UNROLL = 4
CM2_F16_PIPE = 0
# Workgroups in token-tile order (constant 6): consecutive workgroups take the token tiles of one row
# block, so those tiles run together and read its weights from memory once. H100 7.2B Q4_K pp512, one
# call: 13,950 (every product so) against 13,501 (row order) and 13,807 / 13,797 (token order only where
# the grid is more than one wave, cm2_fill); two earlier A/Bs 13,520 / 13,515 -> 13,784 / 13,810. Alone
# (--product-only) 14336x4096 274.4 -> 279.6 but 4096x14336 323.2 -> 302.0: beside the dequantization
# of the next slice (DequantAhead), the whole step gains. LLAMAVK_CM2_ORDER=0 for row order.
CM2_F16_TOKENS_FAST = 1
CM2_F16_WG_SIZES = (64, 128, 256, 512)


def _env_choice(name: str, default: int, allowed) -> int:
    env = os.environ.get(name)
    if not env:
        return default
    try:
        value = int(env)
    except ValueError:
        value = None
    if value not in allowed:
        raise LlamavkError(f"{name}={env!r}: one of {', '.join(map(str, allowed))}")
    return value


def cm2_f16_form(n_tokens: int, rows: int) -> tuple[int, int, int, int, int, int, int]:
    """The F16 form's specialization constants: (BM, BN, BK) by cm2_tile for "f16", then threads,
    unrolled steps, pipelined (0 / 1), workgroups in token-tile order (0 / 1)."""
    bm, bn, bk = cm2_tile(n_tokens, rows, "f16")
    wg = _env_choice("LLAMAVK_CM2_WG", CM2_F16_WG, CM2_F16_WG_SIZES)
    unroll = _env_choice("LLAMAVK_CM2_UNROLL", CM2_F16_UNROLL, range(1, 17))
    pipe = _env_choice("LLAMAVK_CM2_PIPE", CM2_F16_PIPE, (0, 1))
    order = _env_choice("LLAMAVK_CM2_ORDER", CM2_F16_TOKENS_FAST, (0, 1))
    return bm, bn, bk, wg, unroll, pipe, order


def _batched_matvec_ok(kc, n: int, rows: int, cols: int) -> bool:
    limit = int(os.environ.get("LLAMAVK_MV_BATCHED_MAX") or MATVEC_BATCHED_MAX[device_kind(kc)])
    return n <= limit and rows % 8 == 0 and cols % 8 == 0   # token slices stay VIEW_ALIGN-aligned


# Batches a little larger than MATVEC_MAX_TOKENS (short prompts): the matrix-vector kernel once per
# MATVEC_MAX_TOKENS tokens, up to this many tokens, per kind of device. A batch that fills no whole
# token tile sends the cooperative-matrix kernel through its clamped loads (CM2_TILES). H100, prompt
# t/s, coopmat -> batched (aafa74f): 7.2B Q4_0 pp16 439 -> 920, pp32 866 ->
# 1016, pp64 1705 -> 1068; 1.1B Q4_0 pp16 1668 -> 4234, pp32 3379 -> 5117; 7.2B Q4_K pp16 387 -> 398,
# pp32 764 -> 418 (its 8-token kernel is slower). So 16. Software devices: not measured, the same.
MATVEC_BATCHED_MAX = {"gpu": 16, "cpu": 16}
# Products of at most this many rows (a mixture of experts' router: 128 x 2048 in Qwen3-30B-A3B) take
# the small-tile kernel past the short-prompt limit (_small_gemm_ok below), or, with it switched off,
# the matrix-vector kernel once per MATVEC_MAX_TOKENS tokens at any batch (every full slice in one
# dispatch: matmul._matvec_batches): cooperative-matrix tiles of 128 rows x 128 tokens gave a
# 512-token prompt 4 workgroups (H100: 180 us per router product).
# GPUs only: software devices run a few workgroups at a time anyway.
SMALL_ROWS = 256


def _small_rows_ok(kc, n: int, rows: int, cols: int) -> bool:
    limit = int(os.environ.get("LLAMAVK_SMALL_ROWS") or SMALL_ROWS)   # A/B: 0 sends them to the tiles
    return rows <= limit and rows % 8 == 0 and cols % 8 == 0 and not kc.info.is_cpu


# Products of at most SMALL_ROWS rows over more than MATVEC_BATCHED_MAX tokens on GPUs: the small-tile
# kernel (shaders/matmul_small.comp: tiles of a few rows x tokens, the columns split over the grid
# where the tiles alone leave the GPU idle, a second pass adding the parts). H100, 512 tokens, wall
# per product before it: 8-token slices f32 256x2048 170 us, f16 128x2048 87, q4_0 128x2048 131,
# q4_0 32x2048 41 (cooperative-matrix tiles: 108, -, 62, -); the work is 0.27 G multiply-adds
# at most (~10 us). LLAMAVK_SMALL_GEMM=0 keeps the slices (A/B); short prompts keep the slices.
def small_gemm_enabled() -> bool:
    return os.environ.get("LLAMAVK_SMALL_GEMM", "1") != "0"


def _small_gemm_ok(kc, n: int, rows: int, cols: int) -> bool:
    limit = int(os.environ.get("LLAMAVK_MV_BATCHED_MAX") or MATVEC_BATCHED_MAX[device_kind(kc)])
    small = int(os.environ.get("LLAMAVK_SMALL_ROWS") or SMALL_ROWS)
    return small_gemm_enabled() and n > limit and rows <= small and not kc.info.is_cpu   # any rows, cols


@dataclass(frozen=True)
class SmallGemmConfig:
    """Tiles of shaders/matmul_small.comp: bm rows x bn tokens per workgroup, tm x tn outputs per thread
    ((bm / tm) * (bn / tn) threads, at least bm: thread r stages row r), ks parts of the columns (0: as many as bring the grid to about
    SMALL_GEMM_WORKGROUPS workgroups, parts of at least SMALL_GEMM_MIN_PART_UNITS units of 32
    columns, at most 32: reduce_sum.comp's part mask)."""
    bm: int
    bn: int
    tm: int = 4
    tn: int = 4
    ks: int = 0

    def spec(self) -> str:
        """The LLAMAVK_SMALL_GEMM spelling of this config."""
        return f"{self.bm},{self.bn},{self.tm},{self.tn},{self.ks}"


# 32 x 64 tiles of 128 threads give a 256-row router at 512 tokens 64 workgroups, split 4 ways along
# its 2048 columns: 256. H100 (benchmarks/bench_small_rows.py, f32 128 x 2048, 512 tokens, wall per
# product): 32 x 64 35.4 us, 64 x 64 33.5, 32 x 32 44.0, 16 x 64 48.5, 16 x 32 81.0 (the other shapes
# not swept yet); pp512 with it against the slices: 35B-A3B 8,882 / 8,529, 30B-A3B 9,550 / 9,346.
SMALL_GEMM_CONFIGS = {"gpu": SmallGemmConfig(32, 64, 4, 4), "cpu": SmallGemmConfig(32, 32, 4, 4)}
SMALL_GEMM_WORKGROUPS = 256
SMALL_GEMM_MIN_PART_UNITS = 4
SMALL_GEMM_MAX_PARTS = 32


def parse_small_gemm_env(text: str | None) -> SmallGemmConfig | None:
    """LLAMAVK_SMALL_GEMM: 0 off, unset or 1 the SMALL_GEMM_CONFIGS row, else `bm,bn[,tm,tn[,ks]]`
    (sweeps)."""
    if text in (None, "", "0", "1"):
        return None
    try:
        cfg = SmallGemmConfig(*[int(v) for v in text.split(",")])
    except (TypeError, ValueError):
        raise LlamavkError(f"LLAMAVK_SMALL_GEMM={text!r}: 0, 1 or bm,bn[,tm,tn[,ks]]") from None
    if min(cfg.bm, cfg.bn, cfg.tm, cfg.tn) <= 0 or cfg.tm % 4 or cfg.tn % 4 or cfg.bm % cfg.tm or \
            cfg.bn % cfg.tn or not 0 <= cfg.ks <= SMALL_GEMM_MAX_PARTS or (cfg.bm // cfg.tm) * (cfg.bn // cfg.tn) < cfg.bm:
        raise LlamavkError(f"LLAMAVK_SMALL_GEMM={text!r}: tm, tn multiples of 4 dividing bm, bn; "
                           "(bm / tm) * (bn / tn) threads >= bm; ks 0..32")
    return cfg


def small_gemm_config(kc) -> SmallGemmConfig:
    return parse_small_gemm_env(os.environ.get("LLAMAVK_SMALL_GEMM")) or SMALL_GEMM_CONFIGS[device_kind(kc)]


# Software devices (llvmpipe): batches past MATVEC_MAX_TOKENS take shaders/matmul_cpu.comp, a workgroup
# one subgroup (the lanes of a CPU vector register) with few, wide loads (why: the shader's header).
# llvmpipe (Mesa 22.3, AVX2: 8 lanes), one 2.9 GHz EPYC core, 64 tokens, GFLOP/s against matmul.comp's
# tiles: Q4_1 576 x 576 5.5-6.7 / 0.55, 1536 x 576 6.2-6.7 / 0.59; at 8 and 16 tokens 4.7-5.8 and 3.6-3.9
# against the matrix-vector kernel's 0.46-0.55. Subgroups of 4 lanes (SSE) take two vec4 of x a lane;
# other widths, and weights whose columns are not whole 32-column units, keep the portable tiles.
CPU_PRODUCT_LANES = (4, 8)


def cpu_product_lanes(kc) -> int:
    """The lanes of matmul_cpu.comp's workgroup on kc's device (its subgroup)."""
    return kc.info.subgroup_size


def _cpu_product_ok(kc, n: int, rows: int, cols: int) -> bool:
    # their weights are read as texels (shaders/quants.glsl W_TEXELS): a texel buffer must reach as far
    # as a weight chunk (maxStorageBufferRange: kernels/__init__.py upload_qweight)
    return (kc.info.is_cpu and cpu_product_lanes(kc) in CPU_PRODUCT_LANES and cols % 32 == 0
            and kc.info.max_texel_buffer_bytes >= kc.info.max_storage_buffer_range)


# Prompt attention over an f16 cache on the same software devices: shaders/attention_cpu.comp (a
# workgroup one subgroup; why: its header), head_dim a multiple of 8 (its 16-byte K / V loads).
# llvmpipe, SmolLM2-135M pp128, attention's share of the step: 2.74 s of 6.76 with attention.comp.
def cpu_attention_ok(kc, head_dim: int) -> bool:
    return kc.info.is_cpu and cpu_product_lanes(kc) in CPU_PRODUCT_LANES and head_dim % 8 == 0


# 1. Weight products: the first row that applies wins.
PRODUCT_KERNELS = (
    # name              applies when (kc, n_tokens, rows, cols)                why
    ("mul_mv",          lambda kc, n, rows, cols: n <= MATVEC_MAX_TOKENS),    # one pass over W for all tokens
    ("mul_mm_cpu",      _cpu_product_ok),                                     # software devices (above)
    ("mul_mv_batched",  _batched_matvec_ok),                                  # one pass per 8 tokens
    ("mul_mm_small",    _small_gemm_ok),   # few rows, many tokens: small tiles, columns split (above)
    ("mul_mv_batched",  _small_rows_ok),   # few rows (a router): 128-row tiles leave a few workgroups
    ("mul_mm_cm2d",     lambda kc, n, rows, cols: _cm2_ok(kc, cols) and n >= cm2_dequant_min()),
    #                   NV coopmat2 on the weight dequantized to f16 first (cm2_dequant_types() only)
    ("mul_mm_cm2",      lambda kc, n, rows, cols: _cm2_ok(kc, cols)),
    #                   NV coopmat2 (cm2_chosen_types() only; 8192 rows and more CM2_LARGE_TYPES only:
    #                   the others the KHR 256 x 128 tiles, measured faster), tiles by CM2_TILES
    ("mul_mm_coop_big", lambda kc, n, rows, cols: _coopmat_ok(kc, cols) and rows >= 8192 and n >= 256),
    #                   tensor cores, 256 x 128 tiles: W dequantized half as often; enough workgroups
    ("mul_mm_coop",     lambda kc, n, rows, cols: _coopmat_ok(kc, cols)),     # tensor cores, 128 x 128 tiles
    ("mul_mm",          lambda kc, n, rows, cols: True),                     # portable f32 tiles
)
# LLAMAVK_MATMUL=mul_mm skips the cooperative-matrix rows and the software devices' kernel (comparisons on
# one device).
_SKIP = {"mul_mm": {"mul_mm_cpu", "mul_mm_cm2d", "mul_mm_cm2", "mul_mm_coop", "mul_mm_coop_big"}}.get(
    os.environ.get("LLAMAVK_MATMUL", ""), set())


def _cm2_chosen(type_name: str | None, rows: int) -> bool:
    return type_name in cm2_chosen_types() and (rows < 8192 or type_name in CM2_LARGE_TYPES)


def product_kernel(kc, n_tokens: int, rows: int, cols: int, type_name: str | None = None) -> str:
    """The PRODUCT_KERNELS row for n_tokens tokens through a rows x cols weight of type type_name on
    kc's device (rows of kernels that lack the type are passed over; no type: the cm2 row is)."""
    return next(name for name, applies in PRODUCT_KERNELS
                if name not in _SKIP and (name != "mul_mm_cm2" or _cm2_chosen(type_name, rows))
                and (name != "mul_mm_cm2d" or type_name in cm2_dequant_types())
                and applies(kc, n_tokens, rows, cols))


# Expert products of a prompt (kernels/moe.py): tokens grouped by expert, so each expert's tile sees a
# few of the batch's tokens (512 tokens x 8 of 128 experts: 32 on average). Cooperative matrices with
# 128-row x 64-token tiles where the device has them, else the portable f32 tiles. H100, 30B-A3B
# Q4_0 pp512: 9,200 t/s; 256 x 32 tiles (fewer wasted token columns, twice the rows per workgroup)
# 7,553. LLAMAVK_MOE_MATMUL names a family (comparisons on one device).
MOE_PRODUCT_KERNELS = (
    ("mul_mm_coop_id", lambda kc, cols: _coopmat_ok(kc, cols)),
    ("mul_mm_cpu_id", lambda kc, cols: _cpu_product_ok(kc, 0, 0, cols)),   # software devices (above)
    ("mul_mm_id", lambda kc, cols: True),
)


def moe_product_kernel(kc, cols: int, type_name: str) -> str:
    forced = os.environ.get("LLAMAVK_MOE_MATMUL")
    if forced:
        return forced
    return next(name for name, applies in MOE_PRODUCT_KERNELS
                if name not in _SKIP_MOE and applies(kc, cols))


# LLAMAVK_MATMUL=mul_mm (the portable tiles only) applies here too
_SKIP_MOE = {"mul_mm_coop_id", "mul_mm_cpu_id"} if os.environ.get("LLAMAVK_MATMUL") == "mul_mm" else set()


# 2. Matrix-vector kernels.
@dataclass(frozen=True)
class MatvecConfig:
    wg: int   # threads per workgroup
    nr: int   # rows per row group (NR <= 8)
    ks: int   # split of the columns: subgroups sharing one row group (base, wide); stream: units per
              # part of a row, a power of two (KSPLIT = units / gcd(units, ks) workgroups per row block)
    u: int    # units (base: 8-weight quarters; wide: blocks) per lane per loop step
    kernel: str = "base"   # a MATVEC_KERNELS key
    dq: int = 1            # wide kernel's dequantisation (matvec_wide.comp DQ: 0 magic - sub, 1 magic fma,
                           # 2 unpack8 + block x sum)
    xs: int = 1            # wide kernel: stage x in shared memory (where it fits: MATVEC_XS_BYTES)
    steps: int = 1         # stream kernel: row blocks per workgroup, x staged once for all of them
                           # (only where a lane takes one unit of a row)
    xfirst: int = 0        # stream kernel: x loaded before the weights (matvec_stream.comp XFIRST)
    chained_steps: int = 0  # stream kernel waiting for its producer in the shader (selection.chain_edges):
                            # row blocks per workgroup then (0: steps)
    wave: int = 0           # stream kernel: steps chosen per product so that its grid is at most this
                            # many workgroups (the row blocks / wave, rounded up: whole waves of
                            # resident workgroups); 0: steps as given. Not in the LLAMAVK_MATVEC spelling.

    def spec(self) -> str:
        """The LLAMAVK_MATVEC spelling of this config."""
        stream = self.kernel.startswith("stream")
        tail = f",{self.dq},{self.xs}" if self.kernel == "wide" else \
            f",{self.steps},{self.xfirst},{self.chained_steps}" if stream and self.chained_steps else \
            f",{self.steps},{self.xfirst}" if stream and self.xfirst else \
            f",{self.steps}" if stream and self.steps != 1 else ""
        return f"{self.kernel}:{self.wg},{self.nr},{self.ks},{self.u}{tail}"


# Kernel and work split: the first row whose kind of device, weight type and condition (on the device,
# tokens, weight rows and columns) apply, and whose kernel fits the product (matmul.matvec_config),
# wins. Measured with benchmarks/bench_matvec.py (docs/PERFORMANCE.md).
_ANY = lambda kc, n, rows, cols: True   # noqa: E731
# The types that take Q4_K's stream-kernel rules below (same wg / nr / ks / wave / xfirst for the same
# shapes): Q5_K has Q4_K's unit (a quarter super-block) plus a high-bit plane; Q3_K's and Q2_K's unit
# is a whole super-block (matvec_stream.comp), so a 4096-wide row has 16 lanes and the 14336-wide down product
# 7 parts of 8 units (2048 weights; Q4_K 14 of 1024: parts under 8 units are not cut). IQ4_XS's
# unit is half a super-block (as Q6_K's half form, and Q3_K's and Q2_K's half form below): these
# have rows of their own ahead of Q4_K's (HALF_UNIT_ROWS) for the shapes 4096 to 8192 wide and the
# down product. H100, 7.2B tg128 against the base kernel
# they ran before (benchmarks/bench_kquant_stream_ab.sh, one call per group): Q5_K 316.1 / 116.5, Q3_K 179.2 / 157.4,
# Q2_K 237.2 / 229.0, IQ4_XS 188.3 / 111.4 (llama.cpp -cm2 223.8, 209.3, 314.6, 203.3). Q3_K / Q2_K
# are bound by their arithmetic (~0.56 TB/s in whole-block units).
# Q6_K (planar since issue 27, a quarter super-block per unit: 3 uvec4s, its scales' uvec2 and d, as
# Q5_K's 5 loads) takes them: H200 (Vulkan0 of a 4x H200 machine), 7.2B tg128, one call: 342.3
# against 237.1 with the half-super-block form's old rule (LLAMAVK_MATVEC=q6_k=stream_dp_h:256,2,16,1,1,1,
# that form on the planar layout; wg=256, nr=2, ks=16, xfirst on every shape) and llama.cpp -cm2's
# 232.1 (H100 before, GGUF layout: 191.0 against 218.8).
# The lattice types but IQ1's (planar, a quarter super-block per unit as Q4_K's, the grid in shared
# memory: matvec_stream.comp IQ2_XXS) take them too: H200, 7.2B tg128, one call per pair of types, twice
# in alternation, against the base kernel they ran before (LLAMAVK_MATVEC=iq2_xxs=base:256,4,2,2):
# IQ2_XXS 354.0 / 354.3 against 196.8 / 195.3 (4 rows a lane for the 4096-wide products 318.4 /
# 316.1), IQ3_XXS 283.2 / 284.7 against 193.0 / 192.5 (283.2 / 283.0); another call: IQ2_XS 338.8 /
# 334.6 against 194.6 / 194.2, IQ3_S 304.2 / 301.7 against 178.9 / 180.1, IQ2_S 311.9 / 312.6 against
# 183.1 / 183.6 (llama.cpp -cm2 221.9, 211.8, 202.5, 174.8, 153.2).
Q4K_RULE_TYPES = ("q4_k", "q5_k", "q3_k", "q2_k", "iq4_xs", "q6_k", "iq2_xxs", "iq3_xxs", "iq2_xs", "iq2_s",
                  "iq3_s", "iq1_s", "iq1_m", "tq2_0", "tq1_0")
# The types that take Q4_0's stream-kernel rules (same wg / nr / ks / wave / steps / xfirst for the
# same shapes): IQ4_NL and MXFP4 are stored planar as Q4_0 and load as it does, their weights table
# values of the nibbles (matvec_stream.comp). H100, 7.2B tg128 against the base kernel
# (LLAMAVK_MATVEC=iq4_nl=base:256,4,2,2, mxfp4=..., one call): IQ4_NL 262.8 / 117.8, MXFP4 257.6 /
# 111.9 (llama.cpp -cm2 229.3, 208.8). Q4_1, Q5_0 and Q5_1 are stored planar too (their heads in
# the scale plane) and load Q4_0's uvec4 and their head. H200 (Vulkan0 of a 4x H200 machine), 7.2B
# tg128, one call, against the base kernel (LLAMAVK_MATVEC=q4_1=base:256,4,2,2, q5_0=..., q5_1=...)
# and llama.cpp -cm2: Q4_1 457.1 / 246.7 / 271.0, Q5_0 383.3 / 225.1 / 221.8, Q5_1 385.7 / 233.0 / 220.3.
Q40_RULE_TYPES = ("q4_0", "iq4_nl", "mxfp4", "q4_1", "q5_0", "q5_1")
# The types whose one-token unit is half a super-block, 128 weights (IQ4_XS; Q2_K and Q3_K in their half
# form, below): 32 lanes per 4096-wide row where Q4_K has 64. On Q4_K's rows (512 threads) that gave
# them 32 rows per workgroup: 64 workgroups for a 4096 x 4096 product by 2 steps, 32 for K and V, the
# 14336-wide down product in 7 parts. By 256 threads, one step for the square products and K / V, the
# gate/up pair in one wave of 256 workgroups (7 steps) and the down product in Q4_K's 14 parts of 1024
# weights. H100, 7.2B tg128, one call each, in alternation (LLAMAVK_MATVEC shape entries):
# - IQ4_XS 232.35 / 234.97 against 194.30 / 191.57 (the square and K / V rows alone 207.05 / 207.12,
#   with the down product's parts 211.09 / 211.35, the pair by 4 steps 217.70 / 217.93, by 2 214.58 /
#   213.47; the square products by 2 steps 189.53 / 189.75, by 128 threads 207.41 / 207.47);
#   llama.cpp -cm2 212.19 (8d1a644).
# - Q3_K 265.04 / 264.97 against 228.55 / 227.81 (the square and K / V rows alone 238.59 / 240.44, the
#   pair by 4 steps 246.86 / 244.24); Q2_K 383.73 / 371.67 against 341.50 / 349.11 (361.41 / 350.77;
#   368.06 / 367.50). llama.cpp -cm2 in that call: 208.18 / 208.42 and 306.09 / 304.06. (Their down
#   product had these parts already: Q4_K's ks halved.)
# Over 4x as many rows as columns (the output product's shape, the 31.5B's gate/up) they keep Q4_K's
# row: the output product by 8 steps, one wave, read within the spread (Q3_K 266.89 / 265.26, Q2_K
# 375.02 / 374.84 against the rows above).
HALF_UNIT_ROWS = (
    (lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and rows <= 4 * cols and 4096 <= cols <= 8192,
     MatvecConfig(wg=256, nr=2, ks=1, u=1, kernel="stream_dp", wave=256)),
    (lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and cols > 8192,
     MatvecConfig(wg=256, nr=2, ks=8, u=1, kernel="stream_dp", xfirst=1)),
)
MATVEC_CONFIGS = (
    # kind   types                    applies when                                  kernel and work split
    # H100: one token through rows of <= 8192 weights: 1.15-1.3x the base kernel (Q4_0), 1.25-1.5x
    # the wide one (Q4_K); cutting these rows into parts loses. Q4_K: 2 rows per lane (63 registers,
    # 2 workgroups per SM; with 4, 92 registers and 1): 299.5 against 288.3 t/s on the 7.2B.
    # Row blocks per workgroup (steps: x staged once for all of them, the next block's loads in
    # flight during this one's reduction) where a grid has several waves of workgroups; where it has
    # about one, steps only serialize. H100, tg128:
    # - 7.2B gate and up (one pair product, 14336 x 4096): 2 rows of each matrix per lane, 4 blocks
    #   per workgroup; Q/K/V/O: 2 rows per lane, 2 blocks (Q, K and V then fit one wave side by
    #   side): 347.8 / 347.3 against 338.0 / 341.0 t/s (4 rows of each per lane, 4 rows, 1 block:
    #   the rules before). Q4_K gate/up, 1 row of each, 4 blocks: 318.7 / 318.3 against 307.5 / 309.0.
    #   4 rows of each and 2 blocks took 82-95 registers (1 workgroup per SM) and lost (318.9).
    # - 1.1B (2048 columns: 16 row blocks for K): 2 blocks for gate/up and for the down product (2048 x
    #   8192), 1 for Q/K/V/O: 1,275 / 1,280 against 1,228 / 1,234 t/s; 4 and 2 blocks everywhere:
    #   1,169 / 1,184.
    # - Whole waves (seventh session): a grid that spills a little into a second wave of workgroups
    #   leaves most SMs idle while that wave runs. The H100 holds 2 pair workgroups (54 registers; Q4_K
    #   64) per SM, 264 at once: the 7.2B's 1,792 gate/up blocks (Q4_0) by 7 per workgroup are one wave
    #   of 256 (by 4: 448, 1.7 waves). tg128: 364.5 / 364.9 against 354.0 / 354.8 (3 blocks 353, 5
    #   349, 6 336: 1.1-2.3 waves). Q4_K (3,584 blocks) by 7: 512 workgroups, 331 against 318-320
    #   (10: 308, 14 in one wave: 301). Q4_K's Q (4096 x 4096) by 2 blocks: Q, K and V (128 + 64 + 64
    #   workgroups, 50 registers: 2 per SM) fit one wave: 336 / 337 against 331; K and V by 2 as
    #   well (192 workgroups) lose (319 / 320).
    # - Wider rows keep more lanes per row (5120 columns: 256 lanes, as 8192), so a block has half the
    #   rows of a 4096-wide one, and a grid twice the blocks: the steps follow from the shape (wave).
    #   31.5B (5120 x 27648 FFN, over 4x the width: a grid of 6,912 blocks by 1 before, x staged for
    #   every 4 rows of each matrix), tg128: 93.9 against 61.9 (27 steps, one wave; 14: 90.1, 7: 87.3,
    #   14 with x first 87.7; 2 rows per lane by 14 79.7, column parts of 32 units 79.8); its Q and O
    #   (5120 x 5120: 1,280 blocks) by 5: 64.6 against 61.9 (by 10: 62.8). llama.cpp -cm2 86.3 there.
    #   The 7.2B's shapes get the steps they had (7, 2); its output (32,000 x 4096: 2,000 blocks)
    #   8 instead of 1 (the 31.5B's output by 8 or 16: no change, 62.3 / 62.1 against 62.1).
    #   As merged, against the old steps put back through LLAMAVK_MATVEC (one call per model): 31.5B
    #   Q4_0 99.5 / 61.7, Q4_K 88.8 / 60.5, 70B Q4_0 55.6 / 48.9, 7.2B Q4_0 421.7 / 416.0.
    ("gpu", Q40_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and cols < rows
     and 4096 <= cols <= 8192, MatvecConfig(wg=512, nr=4, ks=1, u=1, kernel="stream_dp", wave=256)),
    # (cols < 4096: the 1.1B's gate/up pair, 352 blocks by 2; a mixture of experts' Q (4096 x 2048: 128
    # blocks) by 1, one wave of 128 workgroups rather than 64 by 2. H100 tg128 in alternation, one call:
    # 30B-A3B 429.3 / 432.7 against 417.1 / 416.7; 35B-A3B (and its 8192 x 2048 products) 390.4 / 391.0
    # against 378.6 / 376.6)
    ("gpu", Q40_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and cols < rows <= 4 * cols
     and cols < 4096, MatvecConfig(wg=512, nr=4, ks=1, u=1, kernel="stream_dp", wave=256)),
    *(("gpu", ("iq4_xs", "tq2_0"), applies, cfg) for applies, cfg in HALF_UNIT_ROWS),
    ("gpu", Q4K_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and cols < rows
     and 4096 <= cols <= 8192, MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp", wave=256)),
    # Q5_K's square products (Q and O) by one row block per workgroup, not Q4_K's 2. H100 tg128, 7.2B
    # Q5_K, one call, twice in alternation (LLAMAVK_MATVEC shape entries): 328.75 / 325.86 against
    # 308.57 / 305.22 (by 1 step where chained, 2 elsewhere: 321.84 / 320.61); Q4_K by 1 step loses
    # (418.46 / 417.09 against 442.64 / 442.20), Q6_K ties (323.30 against 324.23 / 328.43). 31.5B Q5_K
    # tg64 (5120 x 5120), one call, twice in alternation: 64.42 / 64.42 against 61.29 / 61.25 by 2 steps.
    # H200, 7.2B: 348.92 / 349.49 against 327.56 / 328.23.
    ("gpu", ("q5_k",), lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and rows == cols
     and 4096 <= cols <= 8192, MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp")),
    ("gpu", Q4K_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and rows == cols
     and 4096 <= cols <= 8192, MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp", steps=2, chained_steps=1)),
    # (chained_steps: the output projection waiting for attention (5. below) by 1 block per workgroup,
    # all 256 workgroups resident while attention runs: 397.1 / 397.4 against 388.2 / 388.5 by 2)
    ("gpu", Q40_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and rows == cols
     and 4096 <= cols <= 8192, MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp", wave=256)),
    # (rows of 2048 and more, fewer than the columns: a split's down product -- -sm tensor's 5120 x 6912
    # on 4 GPUs by 5, 7.2B's 4096 x 7168 on 2 by 4 -- and a mixture of experts' output projection, 2048 x
    # 4096: 256 blocks by 1, one wave. With the rule above, H100 tg128 in alternation, one call: 30B-A3B
    # 435.6 / 433.3 against 417.6 / 414.8 with both rules' old steps; 35B-A3B 391.5 against 375.5. K and
    # V, below, keep 2)
    ("gpu", Q40_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and 2048 <= rows < cols
     and 4096 <= cols <= 8192, MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp", wave=256)),
    ("gpu", Q40_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and rows < cols
     and 4096 <= cols <= 8192, MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp", steps=2)),
    ("gpu", Q40_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and rows <= cols < 4096,
     MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp")),
    # Q8_0's gate/up pair (twice Q4_0's bytes a weight): 1 row of each matrix per lane in whole waves of
    # 256 workgroups (the 7.2B's by 14 steps, the 31.5B's by 54), not 2 rows of each in a workgroup per
    # row block. H100 tg128, 7.2B Q8_0, one call (LLAMAVK_MATVEC shape entries; the rule below first
    # and last 272.98 / 271.17): 297.61 / 303.51; by 7 steps (512 workgroups) 297.85, 10 280.48, 20
    # 293.16, 28 262.34; 256 threads 267.6-275.1; 2 rows of each by 7 steps (Q4_0's rule) 286.86. The
    # square, K / V and output products keep the rule below (Q4_0's square and K / V rules 270.32; the
    # output by 8 or 16 steps 303.2-303.4 against 303.5), and so does the down product (7 parts, 2 rows
    # a lane or 512 threads: 296.8-301.2). 31.5B Q8_0 tg64 (27648 x 5120, 5.4x as many rows as columns;
    # one call): 68.15 against 55.52 / 55.79 (2 rows of each by 27 steps 60.66, 1 by 27 66.42). Output
    # products (6.25x and more) were not measured with it. H200, 7.2B, twice in alternation: 369.88 / 371.47
    # against 316.19 / 314.77; 70B Q8_0 (28672 x 8192, 3.5x) tg64, one call: 41.47 / 41.46 against 33.90 /
    # 33.87 (llama.cpp -cm2 28.39). Q4_1, Q5_0 and Q5_1 by these rows lose or tie
    # (7.2B 401.2 / 335.6 / 353.2 against 425.4-430.8 / 372.6-382.4 / 348.6-354.7): they keep Q4_0's.
    ("gpu", ("q8_0",), lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and cols < rows <= 6 * cols
     and 4096 <= cols <= 8192, MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp", wave=256)),
    ("gpu", Q40_RULE_TYPES + ("q8_0",), lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and cols <= 8192,
     MatvecConfig(wg=512, nr=4, ks=1, u=1, kernel="stream_dp")),
    ("gpu", Q4K_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast and cols <= 8192,
     MatvecConfig(wg=512, nr=2, ks=1, u=1, kernel="stream_dp")),
    # H100, longer rows (the FFN down product, 14336 wide) in column parts, one workgroup each: Q4_0
    # 1.25x the base kernel, Q4_K 1.4x the stream kernel over whole rows, Q8_0 the same. Q4_0 / Q8_0
    # in parts of 32 units (14 parts) by 256-thread workgroups: tg128 on the 7.2B 353.0 / 354.5
    # against 345.4 / 345.5 with parts of 64 by 512 threads (Q8_0 250.2 / 249.5 against 246.6 / 247.3);
    # parts of 16 lose (328-330), as do 128 threads (343-344). Q4_K: 256 threads or parts of 16 units
    # measured no better (317.9 / 318.9 against 315.3 / 317.3; 301). x loaded before the weights
    # (xfirst, eighth session): Q4_0 380.5 / 381.3 against 371.7 / 370.1 (with the output product's
    # rule above), Q8_0 257.0 / 258.7 against 254.4 / 255.3, Q4_K 351.0 / 348.8 against 344.6 / 345.0;
    # on the NORM, ROPE and PAIR products it lost (Q4_0 374-379 against 383, Q4_K 332 against 352).
    # Q4_K in 14 parts of 16 units (16 lanes per row, half a subgroup: 32 rows by 256 threads, as Q4_0):
    # 365.6 / 364.8 against 356.8 / 356.4 (7 parts of 32 by 512 threads; 16-unit parts by 512 threads
    # 358.6 / 358.1, by 128 353.2 / 355.9, 4 rows per lane 358.6 / 359.5).
    ("gpu", Q40_RULE_TYPES + ("q8_0",), lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast,
     MatvecConfig(wg=256, nr=4, ks=32, u=1, kernel="stream_dp", xfirst=1)),
    ("gpu", Q4K_RULE_TYPES, lambda kc, n, rows, cols: n == 1 and kc.info.int_dot_fast,
     MatvecConfig(wg=256, nr=2, ks=16, u=1, kernel="stream_dp", xfirst=1)),
    # (Q6_K's half-super-block form, stream_dp_h, had one rule: column parts of 16 units with x first
    # on every shape. H100, 7.2B tg128 (`sh benchmarks/bench_q6k_stream_ab.sh`, one call): 193.7 /
    # 193.7 against 165.6 / 166.1 with the base kernel; whole rows 2 per lane (stream_dp:512,2,1,1)
    # 185.0, with 2 row blocks 145.3. Per product 1.04-1.4x the base kernel's GB/s (4096 x 14336 1,597
    # against 1,155). Q6_K now takes Q4K_RULE_TYPES' rows above.)
    # A mixture of experts' router (Qwen3-30B-A3B: 128 rows of 2048 f32 weights): 8 rows per
    # workgroup leave 16 workgroups for the whole GPU; one row each, its 8 subgroups on parts of the
    # columns, 128.
    ("gpu", ("f32", "f16", "bf16"), lambda kc, n, rows, cols: rows <= 1024,
     MatvecConfig(wg=256, nr=1, ks=8, u=1)),
    # H100: 1.6-2.3x the base kernel on every shape, which loses to its 8-bit scale loads
    ("gpu", ("q4_k",), _ANY, MatvecConfig(wg=256, nr=4, ks=2, u=1, kernel="wide")),
    # IQ1_S / IQ1_M: every workgroup first copies the 16 KiB grid into shared memory (matvec.comp
    # IQ_LATTICE), so twice the rows per workgroup: H100 7.2B tg128 in alternation, one call, IQ1_S
    # 210.4 / 211.0 against 191.5 / 190.4, IQ1_M 172.3 / 172.5 against 168.7 / 168.6. The other
    # splits tried (256 threads with 2 or 8 rows per row group, one subgroup per row, 4 groups per
    # lane) were slower for IQ1_S, IQ2_XXS and IQ3_S; IQ2_XXS and IQ3_S with 512 threads 190.5 / 174.1
    # against 191.8-193.1 / 179.3-180.4.
    ("gpu", ("iq1_s", "iq1_m"), _ANY, MatvecConfig(wg=512, nr=4, ks=2, u=2)),
    # 8 rows per 256-thread workgroup (4 rows per pair of subgroups), 2 quarters per lane per step
    ("gpu", "*", _ANY, MatvecConfig(wg=256, nr=4, ks=2, u=2)),
    # software devices: matvec_cpu.comp (why: its header) where the rows are whole 32-weight units
    # and the subgroup 4 or 8 lanes, 8 rows a lane (wg: the subgroup's lanes); else the base kernel
    # with the smallest unrolling (pipeline compilation there costs more than it saves). (The rule looks
    # _cpu_product_ok up when it runs: tests replace it to run the base kernel there.)
    ("cpu", "*", lambda kc, n, rows, cols: _cpu_product_ok(kc, n, rows, cols),
     MatvecConfig(wg=1, nr=8, ks=1, u=1, kernel="cpu")),
    ("cpu", "*", _ANY, MatvecConfig(wg=128, nr=2, ks=1, u=1)),
)
# Q2_K and Q3_K with half a super-block per unit (matvec_stream.comp HALF_BLOCK, kernel stream_dp_half):
# Q4_K's GPU rows with that kernel, ahead of them; the whole-block form stays reachable
# (LLAMAVK_MATVEC=q2_k=stream_dp:..., benchmarks/bench_kquant_stream_ab.sh) and takes a product the
# half form does not fit. Chosen for the smaller unit's shorter serial arithmetic per lane (the whole
# block's bounds it). H200 (Vulkan0 of a 4x H200 machine), 7.2B tg128, one call, half / whole-block
# form / llama.cpp -cm2: Q2_K 312.9 / 250.5 / 333.3, Q3_K 208.8 / 190.2 / 213.1. Column parts keep
# Q4_K's weights per part (its ks halved: units twice as long), so the 7.2B's down product is cut in
# 14 parts as Q4_K's, not 7: H100, one call, Q2_K 316.6 against 296.9, Q3_K 212.6 against 200.2.
# Their 128-weight units take the rows IQ4_XS has (HALF_UNIT_ROWS) ahead of those.
HALF_RULE_TYPES = ("q2_k", "q3_k")
MATVEC_CONFIGS = (tuple(("gpu", HALF_RULE_TYPES, applies, replace(cfg, kernel="stream_dp_half"))
                        for applies, cfg in HALF_UNIT_ROWS)
                  + tuple((kind, HALF_RULE_TYPES, applies, replace(cfg, kernel="stream_dp_half", ks=max(1, cfg.ks // 2)))
                          for kind, types, applies, cfg in MATVEC_CONFIGS
                          if types is Q4K_RULE_TYPES and cfg.kernel == "stream_dp")
                  + MATVEC_CONFIGS)


def matvec_configs(kc, type_name: str, n_tokens: int, rows: int, cols: int) -> list:
    """The MATVEC_CONFIGS rows that apply, in order."""
    kind = device_kind(kc)
    return [cfg for k, types, applies, cfg in MATVEC_CONFIGS
            if k == kind and (types == "*" or type_name in types) and applies(kc, n_tokens, rows, cols)]


# 3. Decode attention, split-KV (policy and measurements: attention.py split_plan). Per kind of device:
#    (workgroups the recorded grid aims at, minimum KV positions per active split).
#    LLAMAVK_ATTN_SPLITS / LLAMAVK_ATTN_MIN_CHUNK override them.
ATTENTION_SPLITS = {
    "gpu": (512, 128),    # several workgroups per SM (Vulkan does not tell the SM count); a split merge
                          # costs more than 4 blocks of the decode kernel
    "cpu": (8, 1024),     # software devices: a few cores
}


# 3b. Query rows per workgroup of the one-token decode attention (attention_decode.comp BR: 1, 2 or 4)
#     up to a number of KV positions, 4 beyond it (batches of a few tokens: 4). Per kind of device:
#     (rows, up to n_kv). LLAMAVK_ATTN_ROWS=ROWS[:N_KV] overrides it (A/B).
#     Why: a decode step's attention is a few workgroups per KV head whose serial chain of blocks is
#     the stage's latency, and every later stage waits for it. One row per workgroup makes 4x the
#     workgroups over the same KV rows with a quarter of the arithmetic per block; the K/V rows are
#     then read 4x over from L2, which costs more than it saves at long contexts, so the one-token
#     step is recorded once per form and replayed by n_kv (attention.decode_form, Runtime.sequence).
#     H100, tg128 (one call each; 1 row / 4 rows): 7.2B Q4_0 447.5 / 436.6, 448.0 / 422.3; 30B-A3B
#     Q4_0 420.4 / 380.2, 415.1 / 379.9; at d1024 412.8 / 371.4 and 374.5 / 336.0; at d2048 371.0 /
#     377.9, 372.0 / 367.7 and 321.6 / 313.8, 326.7 / 323.6; at d3072 353.3 / 366.5, 350.9 / 365.9
#     and 309.0 / 306.6, 312.4 / 312.2; at d4096 334.7 / 366.7 and 283.0 / 300.6 (2 rows between).
#     Both forms (up to 2048 / 4 rows): tg128 446.6 / 431.9, 445.2 / 434.7 and 419.1 / 371.7, 415.3 /
#     378.4; d1024 413.8 / 388.3, 419.1 / 390.1 and 374.7 / 329.8, 372.7 / 325.7; d4096 350.8 / 347.1,
#     342.6 / 358.0 and 305.1 / 308.6, 298.7 / 304.1 (the idle form's workgroups cost ~1%). H200, a
#     recording per form (docs/PERFORMANCE.md, KV cache types): the 1-row form wins at d1024 (+7% f16,
#     +3% q8_0 cache), the 4-row from d2048 on (+0-2% f16, +11-18% q8_0; 30B-A3B +4-7%).
DECODE_ATTENTION_ROWS = {"gpu": (1, 2048), "cpu": (4, 0)}


def decode_attention_rows(kc) -> tuple[int, int]:
    """(rows per workgroup, the last n_kv they take) of the one-token decode attention on kc's device."""
    env = os.environ.get("LLAMAVK_ATTN_ROWS", "")
    if env:
        rows, _, limit = env.partition(":")
        if rows not in ("1", "2", "4") or not (limit.isdigit() or not limit):
            raise LlamavkError(f"LLAMAVK_ATTN_ROWS={env!r}: 1, 2 or 4, then :N_KV optionally")
        return int(rows), int(limit) if limit else 0xFFFFFFFF
    return DECODE_ATTENTION_ROWS[device_kind(kc)]


# 4. Prompt attention (one KV split, at least a workgroup's 64 query rows per KV head) on cooperative
#    matrices (shaders/attention_coop.comp) where the device has them and head_dim has a variant; else
#    the scalar flash kernel. H100, 7.2B Q4_0 pp512: attention 7.8 of 69 ms serialized (scalar).
ATTENTION_COOP_HEAD_DIMS = (64, 128)
ATTENTION_COOP_ROWS = 64


def attention_coop_ok(kc, head_dim: int, rows: int) -> bool:
    """The cooperative-matrix prompt attention serves `rows` query rows per KV head of this head_dim
    (LLAMAVK_ATTN_COOP=0 keeps the scalar kernel: comparisons on one device)."""
    return (os.environ.get("LLAMAVK_ATTN_COOP", "1") != "0" and has_coopmat(kc)
            and head_dim in ATTENTION_COOP_HEAD_DIMS and rows >= ATTENTION_COOP_ROWS)


# 5. Stages chained without a barrier (kernels/chain.py): the consumer's workgroups start as the
#    producer's finish, issue their weight loads and wait for the producer's count in the shader. By
#    producer: a decode attention (-> output projection), o output projection (-> gate/up), g gate/up
#    (-> down), d down (-> the next layer's Q/K/V), e the experts' gate/up pair (-> their down product,
#    matvec_id.comp), r the output projection (-> the MoE router, moe_router.comp), x the product writing
#    a split's partial into shared host memory (-> its exchange point, exchange_reduce.comp; -sm graph,
#    which also chains the exchange point to the next product), k rope_kv (-> the decode attention,
#    attention_decode.comp WAIT: its first block's K/V loads before the wait), q the Q/K/V products
#    (-> the rope_kv after them, rope_kv.comp WAIT, all three on one counter), m the experts' summing
#    down product (-> the next layer's Q/K/V products: matvec_id.comp SIGNAL), p the output projection
#    picking the experts (ROUTER) -> their gate/up pair (matvec_id.comp RWAIT: waits before the route). Needs workgroups to start in submission order
#    across dispatches: measured on these vendors' drivers (PCI vendor ids). Software devices run
#    dispatches one after another (the wait is met at once): nothing to gain. LLAMAVK_CHAIN=0 / 1 (all) /
#    letters overrides (A/B; tests on software devices).
#    H100, tg128 on the 7.2B (model loaded once, best of 3 x 128 steps, each setting twice, ninth
#    session): Q4_0 396.2 / 396.4 unchained, a+o 416.0 / 420.6, a+o+g 423.7 / 423.5, a+o+g+d 423.7 /
#    423.6; Q4_K a+o 407.3 / 405.9, a+o+g 409.3 / 409.9, a+o+g+d 387.6 / 387.7 (unchained 385.6 /
#    388.2 in another run); Q8_0 262.8 / 263.2 unchained, a+o+g+d 263.0 / 263.7. At depth 4096, Q4_0
#    330-336 unchained, a+o 346-348, a+o+g+d 350-351. a alone: Q4_K +2.5%; o alone: +0.5-2%.
#    e and r on the 30B-A3B (H100, tg128, one call): aog 261.8, aoge 255.7 (8 loads per lane in
#    matvec_id); at 16 loads aog 241.3, aoge 253.3, aoger 244.8: small products gain less from
#    loads in flight than they lose to waiting workgroups holding the SMs. Since the down product
#    stages its slots' x in shared memory (moe.matvec_id_staged; e181a0d, one call, tg128): e pays,
#    30B-A3B 305.9 / 306.7 -> 329.8 / 325.5, 35B-A3B 325.8 / 327.0 -> 338.3 / 338.7.
#    k (qwen3moe / qwen3 / gemma3 / the hybrids' attention layers: rope_kv with the Q/K norms before
#    the decode attention), H100, tg128, `aogexk` against `aogex` in alternation, two calls: 30B-A3B
#    352.4 / 333.9, 340.4 / 341.9, 335.0 / 329.5, 348.7 / 331.0, 353.0 / 337.5; at d1024 302.3 / 294.7,
#    291.8 / 289.9; 35B-A3B 359.0 / 342.3, 357.3 / 348.5, 353.6 / 349.1. q (the same models' Q/K/V
#    products -> that rope_kv), `aogexkq` against `aogexk`, one call: 30B-A3B 368.1 / 341.3, 362.0 /
#    345.0, 379.1 / 352.6, at d1024 313.5 / 297.1; 35B-A3B (10 attention layers of 40) 352.3 / 361.1,
#    359.5 / 360.3. q where the products do RoPE and the KV store (llama: -> the decode attention), one
#    call, `aogexkqm` against `aogexkm`: 7.2B Q4_0 436.7 / 424.4, 424.1 / 422.5, d4096 360.3 / 357.7;
#    Q4_K 413.8 / 406.2, 410.9 / 416.5; Q8_0 267.6 / 263.8, 269.0 / 263.8; 1.1B 1,583.9 / 1,528.0. m, `aogexkqm` against `aogexkq`, one call: 30B-A3B 372.4 / 367.7, 371.8 / 368.2,
#    381.6 / 369.8, at d1024 329.1 / 307.0; 35B-A3B 365.3 / 356.3, 358.2 / 357.8. p (off: its pair
#    cannot load weights before the route is known), `aogexkqmp` against `aogexkqm`, one call: 30B-A3B
#    365.4 / 376.6, 372.6 / 372.6, 374.5 / 374.8, at d1024 322.7 / 333.0; 35B-A3B 367.1 / 363.0,
#    368.4 / 359.9.
CHAIN_VENDORS = {0x10DE: "aogexkqm"}
CHAIN_ALL = "aogderxkqmp"
# Edge x where the all-reduced vector has at most this many values (LLAMAVK_CHAIN_X_COLS: A/Bs).
# 2x H200, tg128 -sm graph with / without x (one call each): 30B-A3B (2048) 356.5 / 341.0, 35B-A3B
# (2048) 349.4 / 340.1, 7.2B (4096) 420-427 / 411-420; the 31.5B (5120) 113.7 / 139.3.
CHAIN_X_MAX_COLS = 4096


def chain_x_ok(n_cols: int) -> bool:
    """Whether an exchange point of an n_cols-wide all-reduce waits in its shader for its product."""
    try:
        limit = int(os.environ.get("LLAMAVK_CHAIN_X_COLS") or CHAIN_X_MAX_COLS)
    except ValueError:
        raise LlamavkError(f"LLAMAVK_CHAIN_X_COLS={os.environ['LLAMAVK_CHAIN_X_COLS']!r}: a whole number") from None
    return n_cols <= limit


def chain_edges(kc) -> str:
    """The producers (letters above) whose consumers are chained on kc's device; "" for none."""
    env = os.environ.get("LLAMAVK_CHAIN", "")
    if env:
        if env in ("0", "1"):
            return "" if env == "0" else CHAIN_ALL
        if set(env) - set(CHAIN_ALL):
            raise LlamavkError(f"LLAMAVK_CHAIN={env!r}: 0, 1 or letters of {CHAIN_ALL!r}")
        return env
    return "" if kc.info.is_cpu else CHAIN_VENDORS.get(kc.info.vendor_id, "")


def device_kind(kc) -> str:
    return "cpu" if kc.info.is_cpu else "gpu"
