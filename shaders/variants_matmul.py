# Quantized matrix kernels (llamavk/kernels/matmul.py): one variant per kernel x weight type.
_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k",
          "iq4_nl", "iq4_xs", "mxfp4", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m",
          "tq1_0", "tq2_0"]
# the types whose expert products issue every weight load first (llamavk/kernels/moe.py MATVEC_ID_PRELOAD)
_MATVEC_ID_PRELOAD = ["q4_0", "q8_0", "q4_k", "q5_k", "q6_k", "iq4_nl", "iq4_xs", "mxfp4", "iq2_xxs", "iq2_xs",
                      "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq1_m"]

# the types whose expert prompt tiles take both runs of a row by one thread (matmul_coop.comp ROW_RUNS)
_ROW_RUNS = ["q4_0", "iq4_nl", "mxfp4", "iq4_xs", "q4_k", "q5_k", "q6_k"]
# ... step through a super-block's 8 sub-blocks unrolled (SB_STEPS: the 256-weight types with dequant_run_f16_sb)
_SB_STEPS = ["q4_k", "q5_k", "q6_k", "iq4_xs"]
# ... and read x as f16 (X_F16; llamavk/kernels/moe.py COOP_ID_X_F16): where it takes the kernel to 3
# workgroups an SM on NVIDIA, or pays in the 32-row parts below (docs/KERNELS.md)
_X_F16 = ["q4_k", "mxfp4"]
# ... give each subgroup 32 of the tile's 128 rows, 8 subgroups (MT 2, WARPS_M 4): half the accumulators
# a thread, so 2 workgroups of 256 threads an SM where 64-row parts held 2 of 128 (docs/KERNELS.md)
_SUB32 = ["f32", "f16", "bf16", "q8_0", "q4_1", "q5_0", "q5_1", "q2_k", "q5_k", "q6_k", "iq4_nl", "mxfp4"]
VARIANTS = {}
for _t in _TYPES:
    _d = {f"QTYPE_{_t.upper()}": "1"}
    VARIANTS[f"mul_mv_{_t}"] = ("matvec.comp", dict(_d))
    VARIANTS[f"mul_mm_{_t}"] = ("matmul.comp", dict(_d))
    VARIANTS[f"mul_mm_cpu_{_t}"] = ("matmul_cpu.comp", dict(_d, W_TEXELS="1"))   # software devices (llvmpipe)
    VARIANTS[f"mul_mv_cpu_{_t}"] = ("matvec_cpu.comp", dict(_d, W_TEXELS="1"))   # software devices: a few tokens
    VARIANTS[f"mul_mm_coop_{_t}"] = ("matmul_coop.comp", dict(_d))   # cooperative matrices (KHR)
    VARIANTS[f"mul_mm_coop_big_{_t}"] = ("matmul_coop.comp", dict(_d, WARPS_M="4", NBUF="1"))   # 256 x 128 tiles
    VARIANTS[f"get_rows_{_t}"] = ("get_rows.comp", dict(_d))
    # mixture of experts: products with each token's chosen experts (decode; prompts grouped by expert)
    VARIANTS[f"mul_mv_id_{_t}"] = ("matvec_id.comp", dict(_d))
    if _t in _MATVEC_ID_PRELOAD:   # with a shared expert as the last slot (matvec_id.comp SHEXP)
        VARIANTS[f"mul_mv_id_{_t}_shexp"] = ("matvec_id.comp", dict(_d, SHEXP_SLOT="1"))
    VARIANTS[f"mul_mm_id_{_t}"] = ("matmul.comp", dict(_d, MUL_MAT_ID="1"))
    VARIANTS[f"mul_mm_cpu_id_{_t}"] = ("matmul_cpu.comp", dict(_d, MUL_MAT_ID="1", W_TEXELS="1"))   # software devices
    # on cooperative matrices, 128 rows x 64 tokens: an expert sees few of a batch's tokens
    VARIANTS[f"mul_mm_coop_id_{_t}"] = ("matmul_coop.comp", dict(
        _d, MUL_MAT_ID="1", WARPS_N="2", **({"ROW_RUNS": "1"} if _t in _ROW_RUNS else {}),
        **({"SB_STEPS": "1"} if _t in _SB_STEPS else {}), **({"X_F16": "1"} if _t in _X_F16 else {}),
        **({"MT": "2", "WARPS_M": "4"} if _t in _SUB32 else {})))
# phases of the cooperative-matrix kernel, for benchmarks/bench_matmul.py only: 1 multiplies only, 2 loads only
for _ph in (1, 2):
    VARIANTS[f"mul_mm_coopP{_ph}_q4_0"] = ("matmul_coop.comp", {"QTYPE_Q4_0": "1", "PHASE": str(_ph)})

# Matrix-vector alternatives (llamavk/kernels/matmul.py MATVEC_KERNELS): the "wide" work split
# (matvec_wide.comp) and, for benchmarks/bench_matvec.py only, pure-read kernels with the loads of the
# base ("read") and wide ("wide_read") kernels.
for _t in ["q4_0", "q8_0", "q4_k"]:
    _d = {f"QTYPE_{_t.upper()}": "1"}
    VARIANTS[f"mul_mv_wide_{_t}"] = ("matvec_wide.comp", dict(_d))
    VARIANTS[f"mul_mv_wide_read_{_t}"] = ("matvec_wide.comp", dict(_d, READ_ONLY="1"))
# One token, every weight load first (matvec_stream.comp): the decode default where it exists.
STREAM_TYPES = ["q4_0", "q8_0", "q4_k", "q6_k", "q5_k", "q3_k", "q2_k", "iq4_nl", "mxfp4", "iq4_xs",
                "q4_1", "q5_0", "q5_1", "iq2_xxs", "iq3_xxs", "iq2_xs", "iq2_s", "iq3_s", "iq1_s", "iq1_m",
                "tq2_0", "tq1_0"]
for _t in STREAM_TYPES:
    VARIANTS[f"mul_mv_stream_{_t}"] = ("matvec_stream.comp", {f"QTYPE_{_t.upper()}": "1"})
    VARIANTS[f"mul_mv_stream_dp_{_t}"] = ("matvec_stream.comp", {f"QTYPE_{_t.upper()}": "1", "DOT8": "1"})
    # benchmark only: without the x staging / without staging and arithmetic
    VARIANTS[f"mul_mv_stream_dp_nox_{_t}"] = ("matvec_stream.comp", {f"QTYPE_{_t.upper()}": "1", "DOT8": "1", "NO_X": "1"})
    VARIANTS[f"mul_mv_stream_read_{_t}"] = ("matvec_stream.comp", {f"QTYPE_{_t.upper()}": "1", "DOT8": "1", "READ_ONLY": "1"})
    # a mixture of experts' router folded into the product writing its input (ROUTER)
    VARIANTS[f"mul_mv_stream_router_{_t}"] = ("matvec_stream.comp", {f"QTYPE_{_t.upper()}": "1", "ROUTER": "1"})
    VARIANTS[f"mul_mv_stream_dp_router_{_t}"] = ("matvec_stream.comp", {f"QTYPE_{_t.upper()}": "1", "DOT8": "1", "ROUTER": "1"})
# Q2_K and Q3_K with half a super-block per unit (HALF_BLOCK; kernels/matmul.py stream_half, stream_dp_half),
# every form the whole-block one has
HALF_TYPES = ["q2_k", "q3_k"]
for _t in HALF_TYPES:
    _d = {f"QTYPE_{_t.upper()}": "1", "HALF_BLOCK": "1"}
    VARIANTS[f"mul_mv_stream_half_{_t}"] = ("matvec_stream.comp", dict(_d))
    VARIANTS[f"mul_mv_stream_dp_half_{_t}"] = ("matvec_stream.comp", dict(_d, DOT8="1"))
    VARIANTS[f"mul_mv_stream_half_router_{_t}"] = ("matvec_stream.comp", dict(_d, ROUTER="1"))
    VARIANTS[f"mul_mv_stream_dp_half_router_{_t}"] = ("matvec_stream.comp", dict(_d, DOT8="1", ROUTER="1"))
    VARIANTS[f"mul_mv_stream_dp_half_clock_{_t}"] = ("matvec_stream.comp", dict(_d, DOT8="1", CLOCK="1"))
# Q6_K's stream form before the quarter-super-block unit (Q6K_HALF: half a super-block per unit), for
# A/B (kernels stream_h, stream_dp_h)
VARIANTS["mul_mv_stream_h_q6_k"] = ("matvec_stream.comp", {"QTYPE_Q6_K": "1", "Q6K_HALF": "1"})
VARIANTS["mul_mv_stream_dp_h_q6_k"] = ("matvec_stream.comp", {"QTYPE_Q6_K": "1", "DOT8": "1", "Q6K_HALF": "1"})
# the split timeline's stamps (CLOCK, llamavk/split/clock.py): the products after an all-reduce,
# every type with a stream form (matmul.CLOCK_KERNELS asks for them by the type's name)
for _t in STREAM_TYPES:
    VARIANTS[f"mul_mv_stream_dp_clock_{_t}"] = ("matvec_stream.comp", {f"QTYPE_{_t.upper()}": "1", "DOT8": "1", "CLOCK": "1"})
for _t in ["q4_0", "q8_0"]:
    VARIANTS[f"mul_mv_read_{_t}"] = ("matvec.comp", {f"QTYPE_{_t.upper()}": "1", "READ_ONLY": "1"})
# Prompt batches of products with few rows (routers, DeltaNet alpha/beta; kernels/matmul.py
# _matvec_batches): the base and wide kernels with the token slice taken from the grid's z
# (TOKEN_SLICES), every full 8-token slice of a batch in one dispatch.
for _t in _TYPES:
    VARIANTS[f"mul_mv_slices_{_t}"] = ("matvec.comp", {f"QTYPE_{_t.upper()}": "1", "TOKEN_SLICES": "1"})
for _t in ["q4_0", "q8_0", "q4_k"]:
    VARIANTS[f"mul_mv_wide_slices_{_t}"] = ("matvec_wide.comp", {f"QTYPE_{_t.upper()}": "1", "TOKEN_SLICES": "1"})
# Prompt products of few rows and many tokens (routers, DeltaNet alpha/beta; kernels/matmul.py
# _matmul_small): small tiles, the columns split over the grid's z. Tile sizes are specialization
# constants (selection.SMALL_GEMM_CONFIGS).
for _t in _TYPES:
    VARIANTS[f"mul_mm_small_{_t}"] = ("matmul_small.comp", {f"QTYPE_{_t.upper()}": "1"})
# Prompt products on NV cooperative matrix 2 (matmul_cm2.comp; selection.has_coopmat2): workgroup-scope
# matrices loaded through a decode function per type. GL_NV_cooperative_matrix2 needs shaderc 2025.2.
COMPILERS = {}
# mul_mm_cm2h: x converted to f16 first (X_F16; kernels/matmul.py CM2_F16_X).
for _t in ["q4_0", "q8_0", "q4_k", "q6_k", "f16"]:
    VARIANTS[f"mul_mm_cm2_{_t}"] = ("matmul_cm2.comp", {f"QTYPE_{_t.upper()}": "1"})
    COMPILERS[f"mul_mm_cm2_{_t}"] = "glslc-trixie"
    VARIANTS[f"mul_mm_cm2h_{_t}"] = ("matmul_cm2.comp", {f"QTYPE_{_t.upper()}": "1", "X_F16": "1"})
    COMPILERS[f"mul_mm_cm2h_{_t}"] = "glslc-trixie"
# Every matmul_coop.comp variant: GL_KHR_cooperative_matrix, which shaderc 2023.2 does not know.
COMPILERS.update({_n: "glslc-trixie-vulkan1.2" for _n, (_src, _) in VARIANTS.items() if _src == "matmul_coop.comp"})
COMPILERS.update({_n: "glslc-unoptimized" for _n, (_src, _) in VARIANTS.items()
                  if _src in ("matmul_cpu.comp", "matvec_cpu.comp")})
