#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_buffer_reference : require
// y[t, y_off + r] = sum_c W[r, c] * x[t, c] (+ bias[y_off + r]) for a batch of tokens (prompt), on
// NV cooperative matrix 2 (VK_NV_cooperative_matrix2): workgroup-scope matrices that the driver
// loads straight from the weight buffer through a decode function per weight type (matmul_coop.comp
// dequantizes its tiles through shared memory itself, and that bounds it). The same bindings, push
// constants and output contract as matmul_coop.comp: kernels/matmul.py chooses either without its
// callers knowing (for X_F16 it converts x to f16 first).
//
// As a GEMM: Y^T (rows x tokens) = W (rows x cols) . X^T (cols x tokens). A workgroup computes BM rows
// x BN tokens with one f32 accumulator matrix, stepping along K by BK columns (specialization
// constants 0, 1, 2, chosen by the recorder: selection.CM2_TILES):
//   A (BM x BK, f16): coopMatLoadTensorNV over a tensor layout of blocks (1 x QK elements, the
//     weight type's block), each element decoded by decode_w below from its block's bytes;
//   B (BK x BN, f16), viewed transposed: x is f32 [tokens][cols], a layout of 1 x 4 blocks (one vec4
//     each) that decode_x converts to f16; or, with X_F16, x converted to f16 [tokens][cols] first
//     and loaded plainly (a row stride the driver can see is a multiple of 8 halves: 16-byte loads);
// whole tiles load without bounds checks; at the edges rows past the chunk and tokens past x's
// readable ones (x_tokens) read as 0 (clamp mode constant). Where cols is a multiple of 256 the
// steps go in spans of 256 columns, 256 / BK steps unrolled (the driver overlaps one step's loads
// with another's products), and the spans may be split over the grid's z (split K: few tiles would
// leave SMs idle), each part storing its sums at part_stride * z for kernels/matmul.py to add
// (reduce_sum.comp). The epilogue adds the bias per element and stores through a layout clamped to
// the chunk's rows and the batch's tokens.
//
// K-quants: a span is one super-block per row. Its sub-block scales (Q4_K: d * scale and dmin * min
// of 8 sub-blocks from 6-bit packed fields; Q6_K: d * scale of 16 groups) are decoded once per span
// into a shared table (two halves: the next span's is written while this one's is read, one barrier
// per span; the next span's header loads are issued before this span's steps), so the per-element
// decode function reads one table entry instead of unpacking the packed scales again for every
// element (that made it 2x slower than matmul_coop.comp).
//
// Weight layouts (quants.glsl): Q4_0 and Q8_0 planar (a quants plane of 16 / 32 bytes per block, then
// the f16 scales at f16 index QD_PLANE * blocks: read from the binding, by block coordinates), Q4_K
// (144 bytes) as in GGUF, Q6_K planar in three planes (ql + qh 192 bytes per block, then the int8
// scales 16 bytes per block, then d: llamavk/kernels/__init__.py PLANES); F16 plain rows.
#if defined(QTYPE_F16)
// The F16 form (plain f16 rows, no decode function, no scale tables): the workgroup size, the steps
// unrolled per loop iteration and the pipelined step order are specialization constants too
// (selection.cm2_f16_form): the driver splits a workgroup-scope matrix over the workgroup's warps, so
// the threads decide each warp's share of a tile.
layout(local_size_x_id = 3) in;
layout(constant_id = 4) const uint UNROLL = 4;   // steps of BK per iteration of the whole-tile loop
layout(constant_id = 5) const uint PIPE = 0;     // 1: step k + 1's tiles loaded before step k's products
// 1: the grid's workgroups in token-tile order (consecutive workgroups share a row block: the tiles of
// one W block run together and read it from memory once, where the weight is larger than L2)
layout(constant_id = 6) const uint TOKENS_FAST = 0;
#else
layout(local_size_x = 256) in;
#endif
layout(constant_id = 0) const uint BM = 128;  // K-quants: 32, 64, 128 or 256 (selection.cm2_tile)
layout(constant_id = 1) const uint BN = 128;
layout(constant_id = 2) const uint BK = 64;   // 32, 64, 128 or 256: whole steps in a span of 256
const uint SPAN = 256;

#include "quants.glsl"

#ifdef X_F16
layout(std430, binding = 1) readonly buffer XH { float16_t xh[]; };
#else
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
#endif
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n_rows;    // rows of this chunk
    uint cols;      // a multiple of 32 (K-quants: of 256)
    uint y_stride;  // floats between two tokens' outputs (rows of the whole matrix)
    uint y_off;     // first row of this chunk in the whole matrix
    uint has_bias;
    uint n_tokens;
    uint spans_per_part;   // split K: workgroup z sums spans [z, z + 1) * spans_per_part (cols % 256 == 0)
    uint part_stride;      // floats between two parts' outputs in y (parts > 1: a scratch)
    uint x_tokens;         // tokens of x that may be read (>= n_tokens): x's rows past the batch, where
                           // its buffer has them (kernels/matmul.py pads its f16 scratch to whole token
                           // tiles), are read as they are; their sums land in tokens that are not stored
} p;

uint blocks_per_row;   // cols / QK, for the planar types' scale index and the K-quants' tables
uint row0;             // first row of this workgroup's tile

// The K-quants' scale tables: TBL_N entries per row and span, entry-major with rows padded by one
// (BM + 1) so that neighbouring entries of one row fall in different banks; two halves of TBL_HALF.
// Filling: TPR = 256 / BM threads per row, each TBL_N / TPR consecutive entries of its row.
#if defined(QTYPE_Q4_K) || defined(QTYPE_Q6_K)
#define SCALE_TABLE 1
#if defined(QTYPE_Q4_K)
const uint TBL_N = 8;
shared vec2 tbl[2 * TBL_N * (BM + 1)];
#else
const uint TBL_N = 16;
shared float tbl[2 * TBL_N * (BM + 1)];
#endif
const uint TBL_HALF = TBL_N * (BM + 1);
const uint TPR = 256 / BM;
const uint TBL_PER_THREAD = TBL_N / TPR;
uint tbl_base = 0;   // the half this span's decodes read
#endif

// One weight block as the decode functions see it (a buffer reference to its first byte), and the
// weight binding as an array of such blocks (the tensor layout's block index counts in them).
#if defined(QTYPE_Q4_0)
struct WBlock { uvec4 q; };
layout(std430, binding = 0) readonly buffer WBlocks { WBlock wblocks[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer WRef { uvec4 q; };
float16_t decode_w(const in WRef bl, const in uint bc[2], const in uint ci[2]) {
    // element e: low nibble of byte e (e < 16), high nibble of byte e - 16; planar scale
    const uint e = ci[1];
    const uint q = (bl.q[(e & 15u) >> 2] >> (8u * (e & 3u) + 4u * (e >> 4))) & 15u;
    const float16_t d = wf16[QD_PLANE * q_chunk_blocks + bc[0] * blocks_per_row + bc[1]];
    return d * float16_t(int(q) - 8);
}
#elif defined(QTYPE_Q8_0)
struct WBlock { uvec4 q[2]; };
layout(std430, binding = 0) readonly buffer WBlocks { WBlock wblocks[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer WRef { uint q[8]; };
float16_t decode_w(const in WRef bl, const in uint bc[2], const in uint ci[2]) {
    const uint e = ci[1];
    const int q = int(bl.q[e >> 2] << (24u - 8u * (e & 3u))) >> 24;   // signed byte e
    const float16_t d = wf16[QD_PLANE * q_chunk_blocks + bc[0] * blocks_per_row + bc[1]];
    return float16_t(float(d) * float(q));
}
#elif defined(QTYPE_Q4_K)
// 144-byte blocks: 16-byte aligned in the chunk, so read as uvec4s (wide loads). Words: 0 d, dmin (f16
// pair); 1..3 twelve bytes of 6-bit scales and mins; 4..35 quants.
struct WBlock { uvec4 v[9]; };
layout(std430, binding = 0) readonly buffer WBlocks { WBlock wblocks[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer WRef { uvec4 v[9]; };
float16_t decode_w(const in WRef bl, const in uint bc[2], const in uint ci[2]) {
    // element e = 32 s + l: nibble s % 2 of quant byte 32 (s / 2) + l; x = d sc[s] q - dmin mn[s]
    const uint e = ci[1], s = e >> 5;
    const vec2 dm = tbl[tbl_base + s * (BM + 1) + bc[0] % BM];
    const uint k = ((e >> 1) & 0x60u) | (e & 31u);   // 32 (s / 2) + l
    const uint q = (bl.v[1u + (k >> 4)][(k >> 2) & 3u] >> (8u * (k & 3u) + 4u * (s & 1u))) & 15u;
    return float16_t(dm.x * float(q) - dm.y);
}
uvec4 tbl_hdr;   // the next span's block header of this thread's row: d, dmin, 12 bytes of scales
void tbl_fetch(const uint span) {
    const uint r = gl_LocalInvocationIndex % BM;
    tbl_hdr = row0 + r < p.n_rows ? wblocks[(row0 + r) * blocks_per_row + span].v[0] : uvec4(0);
}
void tbl_store(const uint half_) {
    const uint r = gl_LocalInvocationIndex % BM, s0 = (gl_LocalInvocationIndex / BM) * TBL_PER_THREAD;
    const vec2 dm = unpackHalf2x16(tbl_hdr.x);
    [[unroll]] for (uint i = 0; i < TBL_PER_THREAD; ++i) {
        // sub-block s: scale and min in the low 6 bits of bytes s and s + 4 (s < 4); else 4 bits from
        // byte s + 4 (low: scale, high: min) and the top 2 bits of bytes s - 4 and s
        const uint s = s0 + i, j = 8u * (s & 3u);
        uint sc, mn;
        if (s < 4u) {
            sc = (tbl_hdr.y >> j) & 63u;
            mn = (tbl_hdr.z >> j) & 63u;
        } else {
            const uint md = tbl_hdr.w >> j;
            sc = (md & 15u) | (((tbl_hdr.y >> (j + 6u)) & 3u) << 4);
            mn = ((md >> 4) & 15u) | (((tbl_hdr.z >> (j + 6u)) & 3u) << 4);
        }
        tbl[half_ + s * (BM + 1) + r] = vec2(dm.x * float(sc), dm.y * float(mn));
    }
}
#elif defined(QTYPE_Q6_K)
// the quants plane's block: ql[128], qh[64] (from 128); the scales and d in their planes (tbl_fetch)
struct WBlock { uint16_t w[96]; };
layout(std430, binding = 0) readonly buffer WBlocks { WBlock wblocks[]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer WRef { uint16_t w[96]; };
float16_t decode_w(const in WRef bl, const in uint bc[2], const in uint ci[2]) {
    // element e = 128 h + 32 j + l: low 4 bits ql[64 h + 32 (j % 2) + l] >> 4 (j / 2), high 2 bits
    // qh[32 h + l] >> 2 j; x = d scale[e / 16] (q - 32)
    const uint e = ci[1], h = e >> 7, j = (e >> 5) & 3u, l = e & 31u;
    const uint lb = 64u * h + 32u * (j & 1u) + l, hb = 128u + 32u * h + l;
    const uint lo = (uint(bl.w[lb >> 1]) >> (8u * (lb & 1u) + 4u * (j >> 1))) & 15u;
    const uint hi = (uint(bl.w[hb >> 1]) >> (8u * (hb & 1u) + 2u * j)) & 3u;
    const float dl = tbl[tbl_base + (e >> 4) * (BM + 1) + bc[0] % BM];
    return float16_t(dl * float(int(lo | (hi << 4)) - 32));
}
// the next span's scale words of this thread's row (two int8 scales each) and d
uint tbl_words[8];   // TBL_PER_THREAD / 2 used
uint tbl_d;
void tbl_fetch(const uint span) {
    const uint r = gl_LocalInvocationIndex % BM, s0 = (gl_LocalInvocationIndex / BM) * TBL_PER_THREAD;
    const bool in_rows = row0 + r < p.n_rows;
    const uint b = (row0 + r) * blocks_per_row + span;
    tbl_d = in_rows ? uint(wu16[104u * q_chunk_blocks + b]) : 0u;
    [[unroll]] for (uint i = 0; i < TBL_PER_THREAD / 2; ++i)
        tbl_words[i] = in_rows ? uint(wu16[96u * q_chunk_blocks + 8u * b + s0 / 2u + i]) : 0u;
}
void tbl_store(const uint half_) {
    const uint r = gl_LocalInvocationIndex % BM, s0 = (gl_LocalInvocationIndex / BM) * TBL_PER_THREAD;
    const float d = unpackHalf2x16(tbl_d).x;
    [[unroll]] for (uint i = 0; i < TBL_PER_THREAD; ++i) {
        const int sc = int(tbl_words[i >> 1] << (24u - 8u * (i & 1u))) >> 24;   // signed byte
        tbl[half_ + (s0 + i) * (BM + 1) + r] = d * float(sc);
    }
}
#elif defined(QTYPE_F16)
// f16 rows (quants.glsl's wf16 binding), loaded as they are: no decode function. Used for a quantized
// weight dequantized to f16 first where that pays (kernels/matmul.py), and for f16 weights.
#define PLAIN_W 1
#else
#error "matmul_cm2.comp: Q4_0, Q8_0, Q4_K, Q6_K or F16"
#endif

#ifndef X_F16
// x: f32, read as blocks of 4 consecutive columns of one token (16-byte aligned loads), to f16
layout(buffer_reference, std430, buffer_reference_align = 16) buffer XRef { vec4 v; };
float16_t decode_x(const in XRef bl, const in uint bc[2], const in uint ci[2]) {
    return float16_t(bl.v[ci[1]]);
}
#endif

float add_bias(const in uint r, const in uint c, const in float v, const in uint row0_) {
    return row0_ + r < p.n_rows ? v + bias[p.y_off + row0_ + r] : v;
}

// One step of BK columns from k0: the tiles of W and x loaded through tensor layouts lw, lx, and
// multiplied into acc.
#ifdef X_F16
#define LOAD_XM(M, LX) coopMatLoadTensorNV(M, xh, 0, sliceTensorLayoutNV(LX, tok0, BN, k0, BK), transposed)
#define X_BLOCK 1
#else
#define LOAD_XM(M, LX) coopMatLoadTensorNV(M, x4, 0, sliceTensorLayoutNV(LX, tok0, BN, k0, BK), transposed, decode_x)
#define X_BLOCK 4
#endif
#define LOAD_X(LX) LOAD_XM(b, LX)
// W's row stride in its blocks; plain f16 rows: cols, a multiple of 32, which the driver learns from
// the mask (aligned, vectorized loads: with p.cols as it is, it loads element by element, 47 TFLOP/s)
#ifdef PLAIN_W
#define W_STRIDE (p.cols & ~31u)
#else
#define W_STRIDE blocks_per_row
#endif
#ifdef PLAIN_W
#define LOAD_WM(M, LW) coopMatLoadTensorNV(M, wf16, 0, sliceTensorLayoutNV(LW, row0, BM, k0, BK))
#else
#define LOAD_WM(M, LW) coopMatLoadTensorNV(M, wblocks, 0, sliceTensorLayoutNV(LW, row0, BM, k0, BK), decode_w)
#endif
#define LOAD_W(LW) LOAD_WM(a, LW)
#define STEP(LW, LX) { \
    coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a; \
    coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b; \
    LOAD_W(LW); \
    LOAD_X(LX); \
    acc = coopMatMulAdd(a, b, acc); }
#define LAYOUTS(CLAMP_W, CLAMP_X) \
    tensorLayoutNV<2, CLAMP_W> lw = createTensorLayoutNV(2, CLAMP_W); \
    lw = setTensorLayoutBlockSizeNV(lw, 1, QK); \
    lw = setTensorLayoutDimensionNV(lw, p.n_rows, p.cols); \
    lw = setTensorLayoutStrideNV(lw, W_STRIDE, 1); \
    tensorLayoutNV<2, CLAMP_X> lx = createTensorLayoutNV(2, CLAMP_X); \
    lx = setTensorLayoutBlockSizeNV(lx, 1, X_BLOCK); \
    lx = setTensorLayoutDimensionNV(lx, p.x_tokens, p.cols); \
    lx = setTensorLayoutStrideNV(lx, x_stride, 1);
#ifdef SCALE_TABLE
#define TBL_FIRST(SPAN_I) { tbl_fetch(SPAN_I); tbl_store(((SPAN_I) & 1u) * TBL_HALF); barrier(); }
#define TBL_NEXT(SPAN_I) tbl_fetch(SPAN_I)
#define TBL_SWAP(SPAN_I) { tbl_store(((SPAN_I) & 1u) * TBL_HALF); barrier(); }
#define TBL_USE(SPAN_I) tbl_base = ((SPAN_I) & 1u) * TBL_HALF
#else
#define TBL_FIRST(SPAN_I)
#define TBL_NEXT(SPAN_I)
#define TBL_SWAP(SPAN_I)
#define TBL_USE(SPAN_I)
#endif
// cols a multiple of SPAN: spans of 256 / BK unrolled steps (the K-quants' tables per span), this
// workgroup's part of them (split K)
#define PRODUCT_SPANS(CLAMP_W, CLAMP_X) { \
    LAYOUTS(CLAMP_W, CLAMP_X) \
    const uint sp0 = gl_WorkGroupID.z * p.spans_per_part; \
    const uint sp_end = min(p.cols / SPAN, sp0 + p.spans_per_part); \
    TBL_FIRST(sp0) \
    for (uint sp = sp0; sp < sp_end; ++sp) { \
        TBL_USE(sp); \
        if (sp + 1u < sp_end) TBL_NEXT(sp + 1u); \
        [[unroll]] for (uint j = 0; j < SPAN / BK; ++j) { \
            const uint k0 = sp * SPAN + j * BK; \
            STEP(lw, lx) \
        } \
        if (sp + 1u < sp_end) TBL_SWAP(sp + 1u); \
    } }
#ifdef PLAIN_W
// The F16 form's whole tiles: this part's columns [k_begin, k_end) (whole spans, so whole steps) in
// iterations of UNROLL steps, then single steps. PIPE: two tiles of each matrix in flight, the next
// step's loads issued before this step's product (the steps come in pairs: a span has 256 / BK).
#define PRODUCT_F16(CLAMP_W, CLAMP_X) { \
    LAYOUTS(CLAMP_W, CLAMP_X) \
    const uint k_begin = gl_WorkGroupID.z * p.spans_per_part * SPAN; \
    const uint k_end = min(p.cols, k_begin + p.spans_per_part * SPAN); \
    if (PIPE != 0u && (SPAN / BK) % 2u == 0u) { \
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a, a1; \
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b, b1; \
        { const uint k0 = k_begin; LOAD_W(lw); LOAD_X(lx); } \
        for (uint kk = k_begin; kk < k_end; kk += 2u * BK) { \
            { const uint k0 = kk + BK; LOAD_WM(a1, lw); LOAD_XM(b1, lx); } \
            acc = coopMatMulAdd(a, b, acc); \
            if (kk + 2u * BK < k_end) { const uint k0 = kk + 2u * BK; LOAD_W(lw); LOAD_X(lx); } \
            acc = coopMatMulAdd(a1, b1, acc); \
        } \
    } else { \
        uint k0_ = k_begin; \
        for (; k0_ + UNROLL * BK <= k_end; k0_ += UNROLL * BK) { \
            [[unroll]] for (uint j = 0; j < UNROLL; ++j) { \
                const uint k0 = k0_ + j * BK; \
                STEP(lw, lx) \
            } \
        } \
        for (; k0_ < k_end; k0_ += BK) { const uint k0 = k0_; STEP(lw, lx) } \
    } }
#endif
// any cols (a multiple of 32; Q4_0 / Q8_0 only: the K-quants' cols are multiples of 256)
#define PRODUCT_STEPS(CLAMP) { \
    LAYOUTS(CLAMP, CLAMP) \
    for (uint k0 = 0; k0 < p.cols; k0 += BK) STEP(lw, lx) }

void main() {
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    blocks_per_row = p.cols / QK;
#if defined(QTYPE_F16)
    // TOKENS_FAST: the same grid (row tiles x token tiles), its linear index read tokens first
    const uint lin = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    row0 = (TOKENS_FAST != 0u ? lin / gl_NumWorkGroups.y : gl_WorkGroupID.x) * BM;
    const uint tok0 = (TOKENS_FAST != 0u ? lin % gl_NumWorkGroups.y : gl_WorkGroupID.y) * BN;
#else
    row0 = gl_WorkGroupID.x * BM;
    const uint tok0 = gl_WorkGroupID.y * BN;
#endif
    // x's row stride, in its blocks: cols is a multiple of 32, which the driver learns from the mask
    // (aligned, vectorized loads of x)
    const uint x_stride = (p.cols & ~31u) / X_BLOCK;
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    // whole tiles (uniform per workgroup) load without bounds checks; the edges clamp, W only where
    // the tile's rows run past the chunk's: a token tile past x's readable tokens checks x alone, not
    // every element W's decode function makes. A token tile past the batch but within x_tokens is
    // whole: a column of the product depends on its own token's x alone, and is not stored
    if (p.cols % SPAN == 0u) {
#ifdef PLAIN_W
#define PRODUCT_TILE PRODUCT_F16
#else
#define PRODUCT_TILE PRODUCT_SPANS
#endif
        const bool rows_whole = row0 + BM <= p.n_rows;
        if (rows_whole && tok0 + BN <= p.x_tokens)
            PRODUCT_TILE(gl_CooperativeMatrixClampModeUndefinedNV, gl_CooperativeMatrixClampModeUndefinedNV)
        else if (rows_whole)
            PRODUCT_TILE(gl_CooperativeMatrixClampModeUndefinedNV, gl_CooperativeMatrixClampModeConstantNV)
        else
            PRODUCT_TILE(gl_CooperativeMatrixClampModeConstantNV, gl_CooperativeMatrixClampModeConstantNV)
    } else {
#ifndef SCALE_TABLE
        PRODUCT_STEPS(gl_CooperativeMatrixClampModeConstantNV)
#endif
    }
    if (p.has_bias != 0)
        coopMatPerElementNV(acc, acc, add_bias, row0);

    // y[t][y_off + r]: rows past the chunk and tokens past the batch are not stored
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> ly = createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    ly = setTensorLayoutDimensionNV(ly, p.n_tokens, p.y_off + p.n_rows);
    ly = setTensorLayoutStrideNV(ly, p.y_stride, 1);
    coopMatStoreTensorNV(acc, y, gl_WorkGroupID.z * p.part_stride, sliceTensorLayoutNV(ly, tok0, BN, p.y_off + row0, BM), transposed);
}
