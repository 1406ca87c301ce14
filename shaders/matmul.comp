#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// y[t, y_off + r] = sum_c W[r, c] * x[t, c] (+ bias[y_off + r]) for a batch of tokens (prompt).
// Portable tiled kernel: a workgroup of 128 threads computes a tile of BM = 64 rows x BN = 64 tokens,
// stepping along K 32 columns (one dequant unit) at a time. Per step, threads 0..63 each dequantize
// one row's unit of W into shared memory (f32, transposed to [k][row]) while threads 64..127 copy the
// 64 tokens' 32 activations (f32, [k][token]); then each thread accumulates a 4 (rows) x 8 (tokens)
// register tile from vec4 reads of shared memory. Shared memory: 2 x 32 x 64 x 4 B = 16 KiB.
// Each weight is dequantized once per 64 tokens; every output is written exactly once.
// MUL_MAT_ID (a mixture of experts' prompt products): workgroup z takes expert e0 + z of the chunk
// (its R = n_rows rows at chunk row z * R) and the (token, slot) pairs that chose it, listed by
// moe_group.comp: x row = the pair (xslot) or its token, y row = the pair ([token][slot][R]).
layout(local_size_x = 128) in;
#define BM 64
#define BN 64
#define BK 32

#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n_rows;    // rows of this chunk (MUL_MAT_ID: of one expert)
    uint cols;
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
#define N_TOK n_tok
#define WROW(r) (wrow0 + (r))
#define XROW(t) (p.xslot != 0 ? groups[list + (t)] : groups[list + (t)] / p.n_used)
#else
#define N_TOK p.n_tokens
#define WROW(r) (r)
#define XROW(t) (tok0 + (t))
#endif

shared vec4 ws[BK][BM / 4];  // ws[k][r / 4][r % 4] = W[row0 + r, k0 + k]
shared vec4 xs[BK][BN / 4];  // xs[k][t / 4][t % 4] = x[tok0 + t, k0 + k]

void main() {
#ifdef MUL_MAT_ID
    q_chunk_blocks = gl_NumWorkGroups.z * p.n_rows * (p.cols / QK);
    uint e = p.e0 + gl_WorkGroupID.z, n_tok = groups[e];
    if (gl_WorkGroupID.y * BN >= n_tok) return;   // uniform: this expert has fewer tokens
    uint wrow0 = gl_WorkGroupID.z * p.n_rows;
    uint list = p.n_expert + e * p.n_tokens + gl_WorkGroupID.y * BN;
#else
    q_chunk_blocks = p.n_rows * (p.cols / QK);
#endif
    uint tid = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.x * BM;
    uint tok0 = gl_WorkGroupID.y * BN;
    uint tx = tid % 16;  // rows 4tx .. 4tx+3
    uint ty = tid / 16;  // tokens 8ty .. 8ty+7
    uint n_units = (p.cols + 31) / 32;

    vec4 acc[8];  // acc[j][i]: token 8ty+j, row 4tx+i
    [[unroll]] for (uint j = 0; j < 8; ++j) acc[j] = vec4(0.0);

    for (uint u = 0; u < n_units; ++u) {
        if (tid < BM) {
            uint r = tid;
            vec4 w[8];
            dequant_unit(WROW(min(row0 + r, p.n_rows - 1)), u, p.cols, w);
            [[unroll]] for (uint i = 0; i < 8; ++i)
                [[unroll]] for (uint c = 0; c < 4; ++c) ws[4 * i + c][r / 4][r % 4] = w[i][c];
        } else {
            uint t = tid - BM;
            bool live = tok0 + t < N_TOK;
#ifdef QFLOAT
            uint base = XROW(t) * p.cols + 32 * u;
            [[unroll]] for (uint k = 0; k < BK; ++k)
                xs[k][t / 4][t % 4] = (live && 32 * u + k < p.cols) ? x[base + k] : 0.0;
#else
            uint base = (XROW(t) * p.cols + 32 * u) / 4;
            [[unroll]] for (uint i = 0; i < 8; ++i) {
                vec4 v = live ? x4[base + i] : vec4(0.0);
                [[unroll]] for (uint c = 0; c < 4; ++c) xs[4 * i + c][t / 4][t % 4] = v[c];
            }
#endif
        }
        barrier();
        [[unroll]] for (uint k = 0; k < BK; ++k) {
            vec4 a = ws[k][tx];
            vec4 b0 = xs[k][2 * ty], b1 = xs[k][2 * ty + 1];
            acc[0] += a * b0.x; acc[1] += a * b0.y; acc[2] += a * b0.z; acc[3] += a * b0.w;
            acc[4] += a * b1.x; acc[5] += a * b1.y; acc[6] += a * b1.z; acc[7] += a * b1.w;
        }
        barrier();
    }

    [[unroll]] for (uint j = 0; j < 8; ++j) {
        uint t = tok0 + 8 * ty + j;
        if (t >= N_TOK) break;
#ifdef MUL_MAT_ID
        t = groups[list + 8 * ty + j];   // the pair: its output row
#endif
        [[unroll]] for (uint i = 0; i < 4; ++i) {
            uint r = row0 + 4 * tx + i;
            if (r < p.n_rows) {
                float b = p.has_bias != 0 ? bias[p.y_off + r] : 0.0;
                y[t * p.y_stride + p.y_off + r] = acc[j][i] + b;
            }
        }
    }
}
