#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Decode matrix-vector product for a few tokens (t < NT <= 8), bound by weight bandwidth:
//
//   y[t, y_off + r] = resid[t, y_off + r] + bias[y_off + r] + s_t * sum_c W[r, c] * x'[t, c]
//
// x' = x, or x * nw with s_t = 1/rms(x[t]) when NORM (the RMS norm feeding this product is folded in:
// W (x/rms * nw) = (1/rms) * W (x * nw), and the sum of squares is gathered while x is read anyway).
// RESID folds the residual add that follows the product. Both save a dispatch and a barrier per use.
//
// Work split: KS subgroups share a group of NR consecutive rows, each taking every KS-th run of
// blocks; lanes stride over blocks, U blocks per step (loads issued together: more bytes in flight).
// Partial sums: subgroupAdd, then (KS > 1) shared memory. A workgroup covers rows_per_wg rows with
// however many subgroups it has. Planar types (Q4_0, Q8_0) read one whole block per lane with 16-byte
// loads; other types read 8-weight quarters through quants.glsl.
// Specialization: 0 workgroup size, 1 NT, 2 NORM, 3 RESID, 4 NR, 5 KS, 6 U.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NT = 1;
layout(constant_id = 2) const bool NORM = false;
layout(constant_id = 3) const bool RESID = false;
layout(constant_id = 4) const uint NR = 2;
layout(constant_id = 5) const uint KS = 1;
layout(constant_id = 6) const uint U = 1;
#define NT_MAX 8
#define NR_MAX 8
#define MAX_SUBGROUPS 64
shared float red[MAX_SUBGROUPS][NR_MAX * NT_MAX + NT_MAX];

#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer NormW { float nw[]; };
layout(std430, binding = 4) readonly buffer NormW4 { vec4 nw4[]; };
layout(std430, binding = 5) readonly buffer Resid { float resid[]; };
layout(push_constant) uniform Push {
    uint n_rows;       // rows of this chunk
    uint cols;
    uint y_stride;     // floats between two tokens' outputs (rows of the whole matrix)
    uint y_off;        // first row of this chunk in the whole matrix
    uint has_bias;
    uint rows_per_wg;
    float eps;
} p;

// x'[t] for the 4 columns of vec4 index k (k counts vec4s within one token's row)
vec4 xin(uint t, uint k, inout float ss) {
    vec4 v = x4[(t * p.cols) / 4 + k];
    if (NORM) { ss += dot(v, v); v *= nw4[k]; }
    return v;
}

void main() {
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint lane = gl_SubgroupInvocationID, S = gl_SubgroupSize;
    uint sg = gl_SubgroupID, kpart = sg % KS, n_groups = gl_NumSubgroups / KS;
    uint row_base = wg * p.rows_per_wg;

    // Every subgroup runs the same number of iterations (uniform barriers when KS > 1).
    for (uint rl = (sg / KS) * NR; rl < p.rows_per_wg; rl += n_groups * NR) {
        uint r0 = row_base + rl;
        bool live = r0 < p.n_rows;
        uint rows[NR_MAX];
        [[unroll]] for (uint r = 0; r < NR_MAX; ++r) rows[r] = min(r0 + r, p.n_rows - 1);
        float acc[NR_MAX][NT_MAX], ss[NT_MAX];
        [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
            ss[t] = 0.0;
            [[unroll]] for (uint r = 0; r < NR_MAX; ++r) acc[r][t] = 0.0;
        }
        if (live) {
#if defined(QFLOAT)
        for (uint c = kpart * S + lane; c < p.cols; c += KS * S) {
            float wv[NR_MAX];
            [[unroll]] for (uint r = 0; r < NR; ++r) wv[r] = wfloat(rows[r] * p.cols + c);
            [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
                if (t < NT) {
                    float xv = x[t * p.cols + c];
                    if (NORM) { ss[t] += xv * xv; xv *= nw[c]; }
                    [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] += wv[r] * xv;
                }
            }
        }
#elif defined(QPLANAR)
        uint nbr = p.cols / QK;  // blocks per row
        for (uint ub0 = kpart * S * U + lane; ub0 < nbr; ub0 += KS * S * U) {
            [[unroll]] for (uint j = 0; j < U; ++j) {
                uint ub = ub0 + j * S;
                if (ub < nbr) {
                    vec4 w[NR_MAX][8];
                    float d[NR_MAX];
                    [[unroll]] for (uint r = 0; r < NR; ++r) {
                        uint b = rows[r] * nbr + ub;
                        d[r] = block_scale(b);
#if defined(QTYPE_Q4_0)
                        uvec4 q = wu4[b];  // byte j: element j (low nibble) and j + 16 (high nibble)
                        [[unroll]] for (uint k = 0; k < 4; ++k) {
                            w[r][k] = bytes4(q[k] & 0x0F0F0F0Fu) - 8.0;
                            w[r][k + 4] = bytes4((q[k] >> 4) & 0x0F0F0F0Fu) - 8.0;
                        }
#else  // Q8_0
                        uvec4 q0 = wu4[2 * b], q1 = wu4[2 * b + 1];
                        [[unroll]] for (uint k = 0; k < 4; ++k) {
                            w[r][k] = sbytes4(q0[k]);
                            w[r][k + 4] = sbytes4(q1[k]);
                        }
#endif
                    }
                    [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
                        if (t < NT) {
                            vec4 xv[8];
                            [[unroll]] for (uint k = 0; k < 8; ++k) xv[k] = xin(t, 8 * ub + k, ss[t]);
                            [[unroll]] for (uint r = 0; r < NR; ++r) {
                                float s = 0.0;
                                [[unroll]] for (uint k = 0; k < 8; ++k) s += dot(w[r][k], xv[k]);
                                acc[r][t] += d[r] * s;
                            }
                        }
                    }
                }
            }
        }
#else
        // 8-weight quarters: neighbouring lanes read neighbouring words of the same block.
        uint n_parts = p.cols / 8;
        for (uint q0 = kpart * S * U + lane; q0 < n_parts; q0 += KS * S * U) {
            [[unroll]] for (uint j = 0; j < U; ++j) {
                uint q = q0 + j * S;
                if (q < n_parts) {
                    uint u = q / 4, i = q % 4;
                    vec4 a[NR_MAX], c[NR_MAX];
                    [[unroll]] for (uint r = 0; r < NR; ++r) dequant_part(rows[r], u, i, p.cols, a[r], c[r]);
                    [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
                        if (t < NT) {
                            vec4 xa = xin(t, 8 * u + i, ss[t]), xc = xin(t, 8 * u + i + 4, ss[t]);
                            [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] += dot(a[r], xa) + dot(c[r], xc);
                        }
                    }
                }
            }
        }
#endif
        }

        // Reduce: within the subgroup, then across the KS subgroups of this row group.
        [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
            if (t < NT) {
                if (NORM) ss[t] = subgroupAdd(ss[t]);
                [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] = subgroupAdd(acc[r][t]);
            }
        }
        if (KS > 1) {
            if (lane == 0) {
                [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
                    if (t < NT) {
                        red[sg][NR_MAX * NT_MAX + t] = ss[t];
                        [[unroll]] for (uint r = 0; r < NR; ++r) red[sg][r * NT_MAX + t] = acc[r][t];
                    }
                }
            }
            barrier();
            if (kpart == 0) {
                [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
                    if (t < NT) {
                        for (uint k = 1; k < KS; ++k) {
                            ss[t] += red[sg + k][NR_MAX * NT_MAX + t];
                            [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] += red[sg + k][r * NT_MAX + t];
                        }
                    }
                }
            }
            barrier();
        }
        if (kpart == 0 && lane == 0 && live) {
            [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
                if (t < NT) {
                    float scale = NORM ? inversesqrt(ss[t] / float(p.cols) + p.eps) : 1.0;
                    [[unroll]] for (uint r = 0; r < NR; ++r) {
                        if (r0 + r < p.n_rows) {
                            uint row = p.y_off + r0 + r;
                            float v = acc[r][t] * scale;
                            if (p.has_bias != 0) v += bias[row];
                            if (RESID) v += resid[t * p.y_stride + row];
                            y[t * p.y_stride + row] = v;
                        }
                    }
                }
            }
        }
    }
}
