#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_NV_cooperative_matrix2 : require
#extension GL_EXT_buffer_reference : require
// y[t, y_off + r] = sum_c W[r, c] * x[t, c] (+ bias[y_off + r]) for a batch of tokens (prompt), on
// NV cooperative matrix 2 (VK_NV_cooperative_matrix2): workgroup-scope matrices that the driver
// loads straight from the weight buffer through a decode function per weight type, so the shader
// itself has no shared-memory tiles, barriers or conversion loops (matmul_coop.comp has all three,
// and they bound it). The same bindings, push constants and output contract as matmul_coop.comp:
// kernels/matmul.py chooses either without its callers knowing.
//
// As a GEMM: Y^T (rows x tokens) = W (rows x cols) . X^T (cols x tokens). A workgroup computes BM rows
// x BN tokens with one f32 accumulator matrix, stepping along K by BK columns (specialization
// constants 0, 1, 2, chosen by the recorder: selection.CM2_TILES):
//   A (BM x BK, f16): coopMatLoadTensorNV over a tensor layout of blocks (1 x QK elements, the
//     weight type's block), each element decoded by decode_w below from its block's bytes;
//   B (BK x BN, f16): x is f32 [tokens][cols]; a layout of 1 x 4 blocks (one vec4 each) viewed
//     transposed, decode_x converting to f16 (H100: 1.6-2x faster than converting x to f16 in a pass
//     of its own and loading that without a decode function, whose loads are not known aligned);
// whole tiles load without bounds checks; at the edges rows past the chunk and tokens past the batch
// read as 0 (clamp mode constant). The epilogue adds the bias per element and stores through a
// layout clamped to the chunk's rows and the batch's tokens.
//
// Weight layouts (quants.glsl): Q4_0 and Q8_0 planar (a quants plane of 16 / 32 bytes per block, then
// the f16 scales at f16 index QD_PLANE * blocks: read from the binding, by block coordinates), Q4_K
// (144 bytes) and Q6_K (210 bytes) as in GGUF.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint BM = 128;
layout(constant_id = 1) const uint BN = 128;
layout(constant_id = 2) const uint BK = 64;   // a multiple of 32 (K-quants' blocks may span steps)

#include "quants.glsl"

layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n_rows;    // rows of this chunk
    uint cols;      // a multiple of 32 (K-quants: of 256)
    uint y_stride;  // floats between two tokens' outputs (rows of the whole matrix)
    uint y_off;     // first row of this chunk in the whole matrix
    uint has_bias;
    uint n_tokens;
} p;

uint blocks_per_row;   // cols / QK, for the planar types' scale index

// One weight block as the decode functions see it (a buffer reference to its first byte), and the
// weight binding as an array of such blocks (the tensor layout's block index counts in them).
#if defined(QTYPE_Q4_0)
struct WBlock { uvec4 q; };
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
layout(buffer_reference, std430, buffer_reference_align = 16) buffer WRef { uint q[8]; };
float16_t decode_w(const in WRef bl, const in uint bc[2], const in uint ci[2]) {
    const uint e = ci[1];
    const int q = int(bl.q[e >> 2] << (24u - 8u * (e & 3u))) >> 24;   // signed byte e
    const float16_t d = wf16[QD_PLANE * q_chunk_blocks + bc[0] * blocks_per_row + bc[1]];
    return float16_t(float(d) * float(q));
}
#elif defined(QTYPE_Q4_K)
// 144-byte blocks: 16-byte aligned in the chunk, so read as uvec4s (wide loads)
struct WBlock { uvec4 v[9]; };
layout(buffer_reference, std430, buffer_reference_align = 16) buffer WRef { uvec4 v[9]; };
uint q4k_word(const in WRef bl, uint i) { return bl.v[i >> 2][i & 3u]; }
uint q4k_byte(const in WRef bl, uint k) { return (q4k_word(bl, k >> 2) >> (8u * (k & 3u))) & 255u; }
float16_t decode_w(const in WRef bl, const in uint bc[2], const in uint ci[2]) {
    // words: 0 d, dmin (f16 pair); 1..3 twelve bytes of 6-bit scales and mins; 4..35 quants.
    // element e = 32 s + l: nibble s % 2 of quant byte 32 (s / 2) + l; x = d sc[s] q - dmin mn[s]
    const uint e = ci[1], s = e >> 5, l = e & 31u;
    const vec2 dm = unpackHalf2x16(q4k_word(bl, 0u));
    uint sc, mn;
    if (s < 4u) {
        sc = q4k_byte(bl, 4u + s) & 63u;
        mn = q4k_byte(bl, 8u + s) & 63u;
    } else {
        const uint md = q4k_byte(bl, 8u + s);
        sc = (md & 15u) | ((q4k_byte(bl, s) >> 6) << 4);
        mn = (md >> 4) | ((q4k_byte(bl, 4u + s) >> 6) << 4);
    }
    const uint k = 32u * (s >> 1) + l;
    const uint q = (q4k_word(bl, 4u + (k >> 2)) >> (8u * (k & 3u) + 4u * (s & 1u))) & 15u;
    return float16_t(dm.x * float(sc) * float(q) - dm.y * float(mn));
}
#elif defined(QTYPE_Q6_K)
struct WBlock { uint16_t w[105]; };
layout(buffer_reference, std430, buffer_reference_align = 2) buffer WRef { uint16_t w[105]; };
uint q6k_byte(const in WRef bl, uint k) { return (uint(bl.w[k >> 1]) >> (8u * (k & 1u))) & 255u; }
float16_t decode_w(const in WRef bl, const in uint bc[2], const in uint ci[2]) {
    // bytes: ql[128], qh[64] (from 128), int8 scales[16] (from 192), d f16 (at 208).
    // element e = 128 h + 32 j + l: low 4 bits ql[64 h + 32 (j % 2) + l] >> 4 (j / 2), high 2 bits
    // qh[32 h + l] >> 2 j; x = d scale[e / 16] (q - 32)
    const uint e = ci[1], h = e >> 7, j = (e >> 5) & 3u, l = e & 31u;
    const uint lo = (q6k_byte(bl, 64u * h + 32u * (j & 1u) + l) >> (4u * (j >> 1))) & 15u;
    const uint hi = (q6k_byte(bl, 128u + 32u * h + l) >> (2u * j)) & 3u;
    const int sc = int(q6k_byte(bl, 192u + (e >> 4)) << 24) >> 24;
    const float d = unpackHalf2x16(uint(bl.w[104])).x;
    return float16_t(d * float(sc) * float(int(lo | (hi << 4)) - 32));
}
#else
#error "matmul_cm2.comp: Q4_0, Q8_0, Q4_K or Q6_K"
#endif
layout(std430, binding = 0) readonly buffer WBlocks { WBlock wblocks[]; };


// x: f32, read as blocks of 4 consecutive columns of one token (16-byte aligned loads), to f16
layout(buffer_reference, std430, buffer_reference_align = 16) buffer XRef { vec4 v; };
float16_t decode_x(const in XRef bl, const in uint bc[2], const in uint ci[2]) {
    return float16_t(bl.v[ci[1]]);
}

float add_bias(const in uint r, const in uint c, const in float v, const in uint row0) {
    return row0 + r < p.n_rows ? v + bias[p.y_off + row0 + r] : v;
}

// The product of one tile over all columns, with tensor layouts LW (weights) and LX (x) of clamp mode
// CLAMP: rows and tokens past the ends read as 0 where it is constant.
#define LOAD_W(LW) coopMatLoadTensorNV(a, wblocks, 0, sliceTensorLayoutNV(LW, row0, BM, k0, BK), decode_w)
#define LOAD_X(LX) coopMatLoadTensorNV(b, x4, 0, sliceTensorLayoutNV(LX, tok0, BN, k0, BK), transposed, decode_x)
#define PRODUCT(CLAMP) { \
    tensorLayoutNV<2, CLAMP> lw = createTensorLayoutNV(2, CLAMP); \
    lw = setTensorLayoutBlockSizeNV(lw, 1, W_BLOCK); \
    lw = setTensorLayoutDimensionNV(lw, p.n_rows, p.cols); \
    lw = setTensorLayoutStrideNV(lw, W_STRIDE, 1); \
    tensorLayoutNV<2, CLAMP> lx = createTensorLayoutNV(2, CLAMP); \
    lx = setTensorLayoutBlockSizeNV(lx, 1, X_BLOCK); \
    lx = setTensorLayoutDimensionNV(lx, p.n_tokens, p.cols); \
    lx = setTensorLayoutStrideNV(lx, p.cols / X_BLOCK, 1); \
    for (uint k0 = 0; k0 < p.cols; k0 += BK) { \
        coopmat<float16_t, gl_ScopeWorkgroup, BM, BK, gl_MatrixUseA> a; \
        coopmat<float16_t, gl_ScopeWorkgroup, BK, BN, gl_MatrixUseB> b; \
        LOAD_W(lw); \
        LOAD_X(lx); \
        acc = coopMatMulAdd(a, b, acc); \
    } }
#define W_BLOCK QK
#define W_STRIDE (p.cols / QK)
#define X_BLOCK 4

void main() {
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    blocks_per_row = p.cols / QK;
    const uint row0 = gl_WorkGroupID.x * BM;
    const uint tok0 = gl_WorkGroupID.y * BN;
    tensorViewNV<2, false, 1, 0> transposed = createTensorViewNV(2, false, 1, 0);

    coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator> acc =
        coopmat<float, gl_ScopeWorkgroup, BM, BN, gl_MatrixUseAccumulator>(0.0);
    // whole tiles (uniform per workgroup) load without bounds checks; the edges clamp
    if (row0 + BM <= p.n_rows && tok0 + BN <= p.n_tokens && p.cols % BK == 0)
        PRODUCT(gl_CooperativeMatrixClampModeUndefinedNV)
    else
        PRODUCT(gl_CooperativeMatrixClampModeConstantNV)
    if (p.has_bias != 0)
        coopMatPerElementNV(acc, acc, add_bias, row0);

    // y[t][y_off + r]: rows past the chunk and tokens past the batch are not stored
    tensorLayoutNV<2, gl_CooperativeMatrixClampModeConstantNV> ly = createTensorLayoutNV(2, gl_CooperativeMatrixClampModeConstantNV);
    ly = setTensorLayoutDimensionNV(ly, p.n_tokens, p.y_off + p.n_rows);
    ly = setTensorLayoutStrideNV(ly, p.y_stride, 1);
    coopMatStoreTensorNV(acc, y, 0, sliceTensorLayoutNV(ly, tok0, BN, p.y_off + row0, BM), transposed);
}
