#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
// y[t, y_off + r] = sum_c W[r, c] * x[t, c] (+ bias[y_off + r]) for a batch of tokens (prompt), on
// cooperative matrices (tensor cores): GL_KHR_cooperative_matrix, so it runs wherever
// VK_KHR_cooperative_matrix offers M x N x K = 16 x 8 x 16, f16 inputs, f32 accumulators, with
// 32-lane subgroups (llamavk/kernels/matmul.py selects it only then). Debian 12's glslc does not
// know the extension: shaders/build.py COMPILERS "glslc-trixie-vulkan1.2" builds it (SPIR-V 1.5).
//
// As a GEMM: Y^T (rows x tokens) = W (rows x cols) . X^T (cols x tokens). A workgroup of WARPS_M x
// WARPS_N subgroups computes BM = 16 MT WARPS_M rows x BN = 32 WARPS_N tokens, stepping along K by BK = 32
// columns (one dequant unit). Step u, after one barrier:
//   1. all threads load and convert step u + 1's tiles into registers (load_tile): the BM x 32 tile of
//      W (16-weight runs, quants.glsl dequant_run, where the type has it; else 8-weight pieces,
//      dequant_part) and the BN x 32 tile of x, f16 -- those loads are in flight while
//   2. each subgroup multiplies its 16 MT x 32 part of the output from step u's tiles in shared memory:
//      MT x 4 accumulator tiles of 16 x 8 (MT 4, or 2 where fewer registers pay), two K steps of 16;
//   3. then they store step u + 1's tiles to the other of two shared buffers (NBUF 2), so one barrier
//      per step orders both the stores and the reads. Where two buffers do not fit 48 KiB (the
//      256-row variant), NBUF 1: a second barrier before the store.
// Shared rows are padded by 8 halves so the rows of a 16 x 16 load fall in different banks.
// The accumulators go through a small per-subgroup shared tile to the output (bias, bounds).
// MUL_MAT_ID (a mixture of experts' prompt products, as matmul.comp's): workgroup z takes expert
// e0 + z of the chunk and the (token, slot) pairs that chose it (moe_group.comp's lists).
// Per type (shaders/variants_matmul.py, measured: docs/KERNELS.md): ROW_RUNS, one thread a row's two
// runs; SB_STEPS, the 8 steps of a 256-weight super-block unrolled; X_F16, x read as f16 (fewer
// registers: the tile of step u + 1 is in flight through step u's products); MT 2 with WARPS_M 4, the
// same 128-row tile as 8 subgroups of 32 rows (half the accumulators a thread: on NVIDIA 2 workgroups
// of 256 threads an SM where 64-row parts above 168 registers hold 2 of 128).
#ifndef PHASE
#define PHASE 0
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#ifndef NBUF
#define NBUF 2
#endif
#ifndef MT
#define MT 4            // accumulator tiles down a subgroup's part
#endif
#define NTHREADS (32 * WARPS_M * WARPS_N)
layout(local_size_x = NTHREADS) in;
#define TM 16
#define TN 8
#define TK 16
#define WM (TM * MT)    // rows per subgroup
#define WN 32           // tokens per subgroup
#define NT (WN / TN)    // 4 tiles across
#define BM (WM * WARPS_M)
#define BN (32 * WARPS_N)
#define BK 32
#define LD ((BK + 8) / 4)   // shared row stride in uvec2 units (4 halves)
// the subgroup's tiles: A (M x K) and B (K x N) f16, the f32 accumulator (M x N)
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, TM, TK, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, TK, TN, gl_MatrixUseB>
#define MAT_ACC coopmat<float, gl_ScopeSubgroup, TM, TN, gl_MatrixUseAccumulator>

#define WANT_RUN_TABLE 1   // the table types' f16 runs (quants.glsl RUN_TABLE)
#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
#ifdef X_F16   // x as f16 (kernels/moe.py COOP_ID_X_F16: converted before the product), 4 halves a uvec2
layout(std430, binding = 1) readonly buffer XH4 { uvec2 xh4[]; };
#endif
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n_rows;    // rows of this chunk (MUL_MAT_ID: of one expert)
    uint cols;      // a multiple of 32
    uint y_stride;  // floats between two tokens' outputs (rows of the whole matrix)
    uint y_off;     // first row of this chunk in the whole matrix
    uint has_bias;
    uint n_tokens;
#ifdef MUL_MAT_ID
    uint n_used;    // slots per token
    uint e0;        // first expert of this chunk
    uint n_expert;  // experts of the whole model (the group lists' layout)
    uint xslot;     // x has one row per (token, slot), else one per token
#endif
} p;
#ifdef MUL_MAT_ID
layout(std430, binding = 4) readonly buffer Groups { uint groups[]; };
uint n_tok, wrow0, list;   // this expert's token count, first chunk row, list start
#define N_TOK n_tok
#define WROW(r) (wrow0 + (r))
#define XROW(t) (p.xslot != 0 ? groups[list + (t)] : groups[list + (t)] / p.n_used)
#define YROW(t) groups[list + (t)]
#else
#define N_TOK p.n_tokens
#define WROW(r) (r)
#define XROW(t) (t)
#define YROW(t) (t)
#endif

// f16 tiles, 4 halves per uvec2 (coopMatLoad's offset and stride count uvec2s)
shared uvec2 wa[NBUF * BM * LD];   // buffer b: wa[b BM LD + r LD + k/4] = f16 W[row0 + r, k0 + k .. k0 + k + 3]
shared uvec2 xb[NBUF * BN * LD];   // buffer b: xb[b BN LD + t LD + k/4] = f16 x[tok0 + t, k0 + k .. k0 + k + 3]
shared float stage[WARPS_M * WARPS_N * TM * TN]; // one output tile per subgroup, column-major (row m, token n at n*TM+m)

uvec2 pack4(vec4 v) { return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)); }
// x's 4 columns in the weights' order: dequant_run_f16 gives columns (0, 2), (1, 3)
#ifdef HAS_RUN_F16
uvec2 pack4x(vec4 v) { return uvec2(packHalf2x16(v.xz), packHalf2x16(v.yw)); }
// the same from 4 f16 values in their order: halves (0, 1), (2, 3) -> (0, 2), (1, 3)
uvec2 order4x(uvec2 v) { return uvec2((v.x & 0xFFFFu) | (v.y << 16), (v.x >> 16) | (v.y & 0xFFFF0000u)); }
#else
#define pack4x pack4
#define order4x(v) (v)
#endif

// One thread's share of the tiles of step u, as f16: W pieces (row r, quarter i: 8 weights) and x
// vec4s. No branches (rows and tokens past the end are clamped, then zeroed), so the loads of step
// u + 1 can be issued in the same basic block as the multiplications of step u and overlap them.
#define WPIECES (BM * 4 / NTHREADS)
#define XPIECES (BN * 8 / NTHREADS)
struct Tile { uvec2 w[2 * WPIECES]; uvec2 x[XPIECES]; };

#ifdef HAS_DEQUANT_RUN
// Run h of unit u of a row as packed f16 pairs: the type's f16 conversion where it has one, else its
// f32 run rounded to f16
void run_halves(uint row, uint u, uint h, out uvec2 w[4]) {
#ifdef HAS_RUN_F16
    dequant_run_f16(row, u, h, p.cols, w);
#else
    vec4 f[4];
    dequant_run(row, u, h, p.cols, f);
    [[unroll]] for (uint k = 0; k < 4; ++k) w[k] = pack4(f[k]);
#endif
}
#endif

#if defined(ROW_RUNS) && (WPIECES / 2) % 2 == 0
// Both runs of a row by one thread (runs 2k and 2k + 1: row tid + NTHREADS k, halves 0 and 1), so
// that the block's loads and scale serve the two (the compiler merges them). Where it pays is
// measured per type (shaders/variants_matmul.py _ROW_RUNS: H200 30B-A3B pp512, Q4_0's expert tiles
// +11%, MXFP4 +14%, IQ4_NL / IQ4_XS +3-4%; Q4_K, Q5_K -2%: docs/KERNELS.md).
#define RUN_ROW_HALF(tid, s, r, h) const uint r = (tid) + NTHREADS * ((s) / 2), h = (s) % 2;
#else
// neighbouring threads take the two runs of a row, then the next rows
#define RUN_ROW_HALF(tid, s, r, h) const uint piece = (tid) + NTHREADS * (s); const uint r = piece / 2, h = piece % 2;
#endif

#if defined(SB_STEPS) && (!defined(HAS_RUN_F16_SB) || PHASE != 0)
#error "SB_STEPS: a type with dequant_run_f16_sb (quants.glsl), no benchmark phases"
#endif
#ifdef SB_STEPS
// A 256-weight type's step by super-block U and sub-block sb (a constant where the loop over a super-block's
// 8 steps is unrolled); unit u = 8 U + sb
#define TILE_AT uint U, uint sb
#define TILE_UNIT (8u * U + sb)
#define TILE_RUN(row, h, w) dequant_run_f16_sb(row, U, sb, h, p.cols, w)
#else
#define TILE_AT uint u
#define TILE_UNIT u
#define TILE_RUN(row, h, w) run_halves(row, u, h, w)
#endif
Tile load_tile(TILE_AT, uint tid, uint row0, uint tok0) {
    Tile tl;
#ifdef HAS_DEQUANT_RUN
    // runs of 16 weights (quants.glsl dequant_run: wide loads, a block's head decoded once per run)
    [[unroll]] for (uint s = 0; s < WPIECES / 2; ++s) {
        RUN_ROW_HALF(tid, s, r, h)
        const uint row = min(row0 + r, p.n_rows - 1);
        uvec2 w[4];
        TILE_RUN(WROW(row), h, w);
        const bool live = row0 + r < p.n_rows;
        [[unroll]] for (uint k = 0; k < 4; ++k) tl.w[4 * s + k] = live ? w[k] : uvec2(0);
    }
#else
    [[unroll]] for (uint s = 0; s < WPIECES; ++s) {
        // neighbouring threads take neighbouring quarters of a row (coalesced block reads)
        const uint piece = tid + NTHREADS * s;
        const uint r = piece / 4, i = piece % 4;
        const uint row = min(row0 + r, p.n_rows - 1);
        vec4 a, c;
#ifdef QFLOAT
        const uint base = WROW(row) * p.cols + 32 * u;
        a = vec4(wfloat(base + 4 * i), wfloat(base + 4 * i + 1), wfloat(base + 4 * i + 2), wfloat(base + 4 * i + 3));
        c = vec4(wfloat(base + 4 * i + 16), wfloat(base + 4 * i + 17), wfloat(base + 4 * i + 18), wfloat(base + 4 * i + 19));
#else
        dequant_part(WROW(row), u, i, p.cols, a, c);
#endif
        const bool live = row0 + r < p.n_rows;
        tl.w[2 * s] = live ? pack4(a) : uvec2(0);
        tl.w[2 * s + 1] = live ? pack4(c) : uvec2(0);
    }
#endif
    [[unroll]] for (uint s = 0; s < XPIECES; ++s) {
        const uint idx = tid + NTHREADS * s;
        const uint t = idx / 8, k4 = idx % 8;
#ifdef X_F16
        const uvec2 v = xh4[(XROW(min(tok0 + t, N_TOK - 1)) * p.cols + 32 * TILE_UNIT) / 4 + k4];
        tl.x[s] = tok0 + t < N_TOK ? order4x(v) : uvec2(0);
#else
        const vec4 v = x4[(XROW(min(tok0 + t, N_TOK - 1)) * p.cols + 32 * TILE_UNIT) / 4 + k4];
        tl.x[s] = tok0 + t < N_TOK ? pack4x(v) : uvec2(0);
#endif
    }
    return tl;
}

void store_tile(Tile tl, uint tid, uint buf) {
    const uint wb = buf * BM * LD, xo = buf * BN * LD;
#ifdef HAS_DEQUANT_RUN
    [[unroll]] for (uint s = 0; s < WPIECES / 2; ++s) {
        RUN_ROW_HALF(tid, s, r, h)
        [[unroll]] for (uint k = 0; k < 4; ++k) wa[wb + r * LD + 4 * h + k] = tl.w[4 * s + k];   // weights 16h + 4k ..
    }
#else
    [[unroll]] for (uint s = 0; s < WPIECES; ++s) {
        const uint piece = tid + NTHREADS * s;
        const uint r = piece / 4, i = piece % 4;
        wa[wb + r * LD + i] = tl.w[2 * s];          // weights 4i .. 4i+3
        wa[wb + r * LD + i + 4] = tl.w[2 * s + 1];  // weights 16+4i .. 16+4i+3
    }
#endif
    [[unroll]] for (uint s = 0; s < XPIECES; ++s) {
        const uint idx = tid + NTHREADS * s;
        xb[xo + (idx / 8) * LD + idx % 8] = tl.x[s];
    }
}

void main() {
#ifdef MUL_MAT_ID
    q_chunk_blocks = gl_NumWorkGroups.z * p.n_rows * (p.cols / QK);
    n_tok = groups[p.e0 + gl_WorkGroupID.z];
    if (gl_WorkGroupID.y * BN >= n_tok) return;   // uniform: this expert has fewer tokens
    wrow0 = gl_WorkGroupID.z * p.n_rows;
    list = p.n_expert + (p.e0 + gl_WorkGroupID.z) * p.n_tokens;
#else
    q_chunk_blocks = p.n_rows * (p.cols / QK);
#endif
    const uint tid = gl_LocalInvocationID.x;
    const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint row0 = gl_WorkGroupID.x * BM;
    const uint tok0 = gl_WorkGroupID.y * BN;
    const uint wm = (sg % WARPS_M) * WM, wn = (sg / WARPS_M) * WN;

    MAT_ACC acc[MT][NT];
    [[unroll]] for (uint i = 0; i < MT; ++i)
        [[unroll]] for (uint j = 0; j < NT; ++j) acc[i][j] = MAT_ACC(0.0);

    const uint n_units = p.cols / 32;
#ifdef RUN_TABLE
    run_table_fill(tid, NTHREADS);
    barrier();
#endif
    // the products of one step's tiles in shared buffer buf
#define MULTIPLY_STEP(buf) \
        [[unroll]] for (uint kk = 0; kk < BK; kk += TK) { \
            MAT_A fa[MT]; \
            MAT_B fb[NT]; \
            [[unroll]] for (uint i = 0; i < MT; ++i) \
                coopMatLoad(fa[i], wa, (buf) * BM * LD + (wm + i * TM) * LD + kk / 4, LD, \
                            gl_CooperativeMatrixLayoutRowMajor); \
            [[unroll]] for (uint j = 0; j < NT; ++j) \
                coopMatLoad(fb[j], xb, (buf) * BN * LD + (wn + j * TN) * LD + kk / 4, LD, \
                            gl_CooperativeMatrixLayoutColumnMajor); \
            [[unroll]] for (uint i = 0; i < MT; ++i) \
                [[unroll]] for (uint j = 0; j < NT; ++j) acc[i][j] = coopMatMulAdd(fa[i], fb[j], acc[i][j]); \
        }
#ifdef SB_STEPS
    // a super-block's 8 steps unrolled: each step's sub-block is a constant (quants.glsl
    // dequant_run_f16_sb), so its scale fields and quant offsets fold; same tiles and barriers as below
    const uint n_sb = n_units / 8;
    Tile next = load_tile(0, 0, tid, row0, tok0);
    store_tile(next, tid, 0);
    for (uint U = 0; U < n_sb; ++U) {
        [[unroll]] for (uint sb = 0; sb < 8; ++sb) {
            barrier();
            const uint nU = sb < 7 ? U : min(U + 1, n_sb - 1);
            next = load_tile(nU, (sb + 1) % 8, tid, row0, tok0);
            MULTIPLY_STEP(sb % NBUF)
            if (NBUF == 1) barrier();
            store_tile(next, tid, (sb + 1) % NBUF);
        }
    }
#else
    Tile next = load_tile(0, tid, row0, tok0);
    store_tile(next, tid, 0);
    for (uint u = 0; u < n_units; ++u) {
        barrier();   // step u's tiles are stored; every subgroup is done with step u - 1's
        const uint buf = u % NBUF;
#if PHASE != 1
        next = load_tile(min(u + 1, n_units - 1), tid, row0, tok0);   // in flight during the products
#endif
#if PHASE == 2   // benchmark only: loads and conversions, no multiplications
        if (u + 1 == n_units)
#endif
        MULTIPLY_STEP(buf)
#if PHASE != 1   // (benchmark PHASE 1: multiply the first tile over and over, no loads after it)
        if (NBUF == 1) barrier();   // one buffer: every subgroup is done reading it
        store_tile(next, tid, (u + 1) % NBUF);
#endif
    }
#endif

    // Epilogue: each tile through the subgroup's shared stage, 4 outputs per lane, bias, bounds.
    // Every loop here must unroll completely: one run-time index into acc[] moves the whole array of
    // accumulators to local memory (measured: 20x slower on an H100).
    [[unroll]] for (uint i = 0; i < MT; ++i) {
        [[unroll]] for (uint j = 0; j < NT; ++j) {
            coopMatStore(acc[i][j], stage, sg * TM * TN, TM, gl_CooperativeMatrixLayoutColumnMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            [[unroll]] for (uint q = 0; q < TM * TN / 32; ++q) {   // a constant trip count: see below
                const uint e = lane + 32 * q;
                const uint m = e % TM, n = e / TM;
                const uint r = row0 + wm + i * TM + m, t = tok0 + wn + j * TN + n;
                if (r < p.n_rows && t < N_TOK) {
                    float v = stage[sg * TM * TN + e];
                    if (p.has_bias != 0) v += bias[p.y_off + r];
                    y[YROW(t) * p.y_stride + p.y_off + r] = v;
                }
            }
            subgroupBarrier();
        }
    }
}
