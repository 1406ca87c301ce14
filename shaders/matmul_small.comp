#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Prompt products of FEW rows and MANY tokens (a mixture of experts' router, 128-256 rows; DeltaNet
// alpha/beta, 32 rows; 512 tokens):
//
//   y[z * part_stride + t * y_stride + y_off + r] = (bias[y_off + r] +) sum over c in part z of W[r, c] x[t, c]
//
// The tiled kernels' 64-128-row tiles leave such a product a handful of workgroups (a 256-row router
// at 512 tokens: 8 cooperative-matrix tiles), the matrix-vector kernel reads x once per 8 tokens per
// row block. Here a workgroup takes a small tile of BM rows x BN tokens, and the grid's z a part of
// the columns (split-K: part z covers units [z * upp, (z + 1) * upp) of 32 columns). With one part
// it writes y (bias added); with several, each part writes its own slice of a scratch buffer and a
// second dispatch (reduce_sum.comp) adds the parts and the bias in a fixed order: deterministic, no
// float atomics.
//
// Per K step of 32 columns (one dequant unit), the workgroup stages W's BM row-units (dequantized to
// f32, ws[k][row]; thread r < BM takes row r) and x's BN x 32 activations (xs[k][token]; vec4s spread
// over all threads, token fastest) in shared memory; each thread then accumulates TM consecutive rows
// x TN consecutive tokens in registers from vec4 reads of shared memory (a warp reads a few distinct
// vec4s: NR = BM / TM row groups, broadcast to the token groups). The next step's W and x are loaded
// into registers before this step's multiply-adds, so their latency overlaps them. All f32 (the error
// bound of an f32 dot product).
// Specialization: 0 workgroup size (= (BM / TM) * (BN / TN), at least BM), 1 BM, 2 BN, 3 TM, 4 TN
// (TM, TN multiples of 4; BM a multiple of TM, BN of TN).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 32;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint TM = 4;
layout(constant_id = 4) const uint TN = 4;
#define BK 32
const uint NR = BM / TM;   // row groups of a tile (threads along rows)
const uint WG = gl_WorkGroupSize.x;
const uint XI = (8 * BN + WG - 1) / WG;   // x vec4s per thread per step

#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n_rows;       // rows of this chunk
    uint cols;
    uint y_stride;     // floats between two tokens' outputs
    uint y_off;        // first output column of this chunk (0 when writing parts)
    uint has_bias;
    uint n_tokens;
    uint upp;          // units (32 columns) per part of the columns
    uint part_stride;  // floats between two parts' outputs (split-K scratch; 0 with one part)
} p;

shared vec4 ws[BK * BM / 4];   // ws[k * BM/4 + r/4][r%4] = W[row0 + r, 32u + k]
shared vec4 xs[BK * BN / 4];   // xs[k * BN/4 + t/4][t%4] = x[tok0 + t, 32u + k]

vec4 wr[8];    // the next step's W row-unit (threads < BM)
vec4 xr[XI];   // the next step's x vec4s

void fetch(uint u, uint tid, uint row0, uint tok0, bool x_vec4) {
    if (tid < BM)
        dequant_unit(min(row0 + tid, p.n_rows - 1), u, p.cols, wr);
    [[unroll]] for (uint i = 0; i < XI; ++i) {
        uint item = tid + i * WG;
        uint t = item % BN, q = item / BN;              // token, quarter (4 columns) of the unit
        uint tok = min(tok0 + t, p.n_tokens - 1);       // past the end: a copy, never stored
        uint c0 = 32 * u + 4 * q;
        if (x_vec4) {
            xr[i] = item < 8 * BN && c0 < p.cols ? x4[(tok * p.cols + c0) / 4] : vec4(0.0);
        } else {
            [[unroll]] for (uint c = 0; c < 4; ++c)
                xr[i][c] = item < 8 * BN && c0 + c < p.cols ? x[tok * p.cols + c0 + c] : 0.0;
        }
    }
}

void stage(uint tid) {
    if (tid < BM)
        [[unroll]] for (uint i = 0; i < 8; ++i)
            [[unroll]] for (uint c = 0; c < 4; ++c) ws[(4 * i + c) * (BM / 4) + tid / 4][tid % 4] = wr[i][c];
    [[unroll]] for (uint i = 0; i < XI; ++i) {
        uint item = tid + i * WG;
        uint t = item % BN, q = item / BN;
        if (item < 8 * BN)   // consecutive threads: consecutive words of xs
            [[unroll]] for (uint c = 0; c < 4; ++c) xs[(4 * q + c) * (BN / 4) + t / 4][t % 4] = xr[i][c];
    }
}

void main() {
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    uint tid = gl_LocalInvocationID.x;
    uint row0 = gl_WorkGroupID.x * BM;
    uint tok0 = gl_WorkGroupID.y * BN;
    uint tr = tid % NR, tt = tid / NR;   // rows TM*tr .., tokens TN*tt ..
    uint n_units = (p.cols + 31) / 32;
    uint u0 = gl_WorkGroupID.z * p.upp, u1 = min(n_units, u0 + p.upp);
    // x as vec4 where every row starts 16-byte aligned (else scalar reads; float weights only)
    bool x_vec4 = p.cols % 4 == 0;

    float acc[TM * TN];   // acc[j * TM + i]: token TN*tt + j, row TM*tr + i
    [[unroll]] for (uint i = 0; i < TM * TN; ++i) acc[i] = 0.0;

    if (u0 < u1)
        fetch(u0, tid, row0, tok0, x_vec4);
    for (uint u = u0; u < u1; ++u) {
        stage(tid);
        barrier();
        if (u + 1 < u1)
            fetch(u + 1, tid, row0, tok0, x_vec4);   // in flight during the multiply-adds
        [[unroll]] for (uint k = 0; k < BK; ++k) {
            vec4 a[TM / 4], b[TN / 4];
            [[unroll]] for (uint i = 0; i < TM / 4; ++i) a[i] = ws[k * (BM / 4) + tr * (TM / 4) + i];
            [[unroll]] for (uint j = 0; j < TN / 4; ++j) b[j] = xs[k * (BN / 4) + tt * (TN / 4) + j];
            [[unroll]] for (uint j = 0; j < TN; ++j)
                [[unroll]] for (uint i = 0; i < TM; ++i)
                    acc[j * TM + i] = fma(a[i / 4][i % 4], b[j / 4][j % 4], acc[j * TM + i]);
        }
        barrier();
    }

    uint out0 = gl_WorkGroupID.z * p.part_stride + p.y_off;
    [[unroll]] for (uint j = 0; j < TN; ++j) {
        uint t = tok0 + TN * tt + j;
        if (t < p.n_tokens) {
            [[unroll]] for (uint i = 0; i < TM; ++i) {
                uint r = row0 + TM * tr + i;
                if (r < p.n_rows)
                    y[out0 + t * p.y_stride + r] = acc[j * TM + i] + (p.has_bias != 0 ? bias[p.y_off + r] : 0.0);
            }
        }
    }
}
