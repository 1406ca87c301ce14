#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Decode matrix-vector product for a few tokens (t < NT <= 8), bound by weight bandwidth:
//
//   y[t, y_off + r] = resid[t, y_off + r] + bias[y_off + r] + s_t * sum_c W[r, c] * x'[t, c]
//
// x' = x, or x * nw with s_t = 1/rms(x[t]) when NORM (the RMS norm feeding this product is folded in:
// W (x/rms * nw) = (1/rms) * W (x * nw), and the sum of squares is gathered while x is read anyway).
// RESID folds the residual add that follows the product; GLU makes the input silu(x) * up (the SwiGLU
// feeding the FFN's down product). Each saves a dispatch and a barrier per use.
//
// Work split: KS subgroups share a group of NR consecutive rows, each taking every KS-th run of
// 8-weight quarters (quants.glsl dequant_part: neighbouring lanes read neighbouring words, so a
// subgroup's loads are coalesced), U quarters per lane per step (loads issued together: more bytes in
// flight). Partial sums: subgroupAdd, then (KS > 1) shared memory. A workgroup covers rows_per_wg rows
// with however many subgroups it has.
// READ_ONLY (planar types; benchmark only): the same loads, the words only xor-ed (no x, no dequant).
// Specialization: 0 workgroup size, 1 NT, 2 NORM, 3 RESID, 4 NR, 5 KS, 6 U, 7 GLU.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NT = 1;
layout(constant_id = 2) const bool NORM = false;
layout(constant_id = 3) const bool RESID = false;
layout(constant_id = 4) const uint NR = 2;
layout(constant_id = 5) const uint KS = 1;
layout(constant_id = 6) const uint U = 1;
layout(constant_id = 7) const bool GLU = false;
#define NT_MAX 8
#define NR_MAX 8
#define MAX_SUBGROUPS 64
shared float red[MAX_SUBGROUPS][NR_MAX * NT_MAX + NT_MAX];

#define IQ_GRID_SHARED 1     // the lattice types' grid copied into shared memory (quants.glsl)
#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer NormW { float nw[]; };
layout(std430, binding = 4) readonly buffer NormW4 { vec4 nw4[]; };
layout(std430, binding = 5) readonly buffer Resid { float resid[]; };
layout(std430, binding = 6) readonly buffer Up { float up[]; };
layout(std430, binding = 6) readonly buffer Up4 { vec4 up4[]; };
layout(push_constant) uniform Push {
    uint n_rows;       // rows of this chunk
    uint cols;
    uint y_stride;     // floats between two tokens' outputs (rows of the whole matrix)
    uint y_off;        // first row of this chunk in the whole matrix
    uint has_bias;
    uint rows_per_wg;
    float eps;
} p;

// TOKEN_SLICES (the mul_mv_slices / mul_mv_wide_slices variants, prompt batches of few-row products):
// the grid's z is a slice of NT tokens, slice s taking tokens [NT s, NT s + NT) of x, up, resid and y,
// so one dispatch covers every full slice of a batch instead of one dispatch per slice. Without it
// TOK(t) is t and the kernel is the one-slice decode kernel, unchanged.
#ifdef TOKEN_SLICES
#define TOK(t) (gl_WorkGroupID.z * NT + (t))
#else
#define TOK(t) (t)
#endif

// x'[t] for the 4 columns of vec4 index k (k counts vec4s within one token's row)
vec4 xin(uint t, uint k, inout float ss) {
    uint idx = (TOK(t) * p.cols) / 4 + k;
    vec4 v = x4[idx];
    if (NORM) { ss += dot(v, v); v *= nw4[k]; }
    if (GLU) v = v / (1.0 + exp(-v)) * up4[idx];   // silu(gate) * up: exp(-v) -> inf gives -0, not NaN
    return v;
}

void main() {
    q_chunk_blocks = p.n_rows * (p.cols / QK);
#if defined(IQ_LATTICE)
    iq_grid_stage(gl_LocalInvocationIndex, gl_WorkGroupSize.x);
    barrier();
#endif
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint lane = gl_SubgroupInvocationID, S = gl_SubgroupSize;
    uint sg = gl_SubgroupID, kpart = sg % KS, n_groups = gl_NumSubgroups / KS;
    uint row_base = wg * p.rows_per_wg;

    // Every subgroup runs the same number of iterations (uniform barriers when KS > 1).
    for (uint rl = (sg / KS) * NR; rl < p.rows_per_wg; rl += n_groups * NR) {
        uint r0 = row_base + rl;
        bool live = r0 < p.n_rows;
        // Arrays sized by specialization constants: exact after specialization, so they stay in
        // registers (sized by the maxima they spill to local memory and run several times slower).
        uint rows[NR];
        [[unroll]] for (uint r = 0; r < NR; ++r) rows[r] = min(r0 + r, p.n_rows - 1);
        float acc[NR][NT], ss[NT];
        [[unroll]] for (uint t = 0; t < NT; ++t) {
            ss[t] = 0.0;
            [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] = 0.0;
        }
        if (live) {
#if defined(QFLOAT)
        for (uint c = kpart * S + lane; c < p.cols; c += KS * S) {
            float wv[NR];
            [[unroll]] for (uint r = 0; r < NR; ++r) wv[r] = wfloat(rows[r] * p.cols + c);
            [[unroll]] for (uint t = 0; t < NT; ++t) {
                {
                    float xv = x[TOK(t) * p.cols + c];
                    if (NORM) { ss[t] += xv * xv; xv *= nw[c]; }
                    if (GLU) xv = xv / (1.0 + exp(-xv)) * up[TOK(t) * p.cols + c];
                    [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] += wv[r] * xv;
                }
            }
        }
#elif defined(QPLANAR)
#if defined(QTYPE_Q4_0)
#define NQW 4u
#else
#define NQW 8u
#endif
        // Planar Q4_0 / Q8_0: the quants of a quarter are one (Q4_0) or two (Q8_0) aligned words; the
        // block scale multiplies the quarter's dot product once instead of each weight.
        uint n_parts = p.cols / 8, nbr = p.cols / QK;
        uint rb[NR];
        [[unroll]] for (uint r = 0; r < NR; ++r) rb[r] = rows[r] * nbr;
        for (uint q0 = kpart * S * U + lane; q0 < n_parts; q0 += KS * S * U) {
            [[unroll]] for (uint j = 0; j < U; ++j) {
                uint q = q0 + j * S;
                if (q < n_parts) {
                    uint u = q >> 2, i = q & 3u;
                    vec4 xa[NT], xc[NT];
                    [[unroll]] for (uint t = 0; t < NT; ++t) {
                        xa[t] = xin(t, 8 * u + i, ss[t]);
                        xc[t] = xin(t, 8 * u + i + 4, ss[t]);
                    }
                    [[unroll]] for (uint r = 0; r < NR; ++r) {
                        uint b = rb[r] + u;
                        float d = block_scale(b);
#if defined(READ_ONLY)
                        // benchmark only (examples/bench_matvec.py): this access pattern's ceiling
                        uint wx = floatBitsToUint(d) ^ wu32[NQW * b + i];
                        if (NQW == 8) wx ^= wu32[NQW * b + 4 + i];
                        acc[r][0] += uintBitsToFloat((wx & 0x007FFFFFu) | 0x3F800000u);
#elif defined(QTYPE_Q4_0)
                        uint wq = wu32[4 * b + i];
                        vec4 a = nibbles_lo(wq), c = nibbles_hi(wq);
                        [[unroll]] for (uint t = 0; t < NT; ++t) acc[r][t] += d * (dot(a, xa[t]) + dot(c, xc[t]));
#else
                        vec4 a = sbytes_fast(wu32[8 * b + i]), c = sbytes_fast(wu32[8 * b + 4 + i]);
                        [[unroll]] for (uint t = 0; t < NT; ++t) acc[r][t] += d * (dot(a, xa[t]) + dot(c, xc[t]));
#endif
                    }
                }
            }
        }
#elif defined(IQ_LATTICE)
        // The lattice types by groups of 8 consecutive weights (quants.glsl dequant_group: a group's
        // scale, signs and index read once for its 8 weights): a subgroup's lanes take a super-block's
        // 32 groups together.
        uint n_parts = p.cols / 8;
        for (uint q0 = kpart * S * U + lane; q0 < n_parts; q0 += KS * S * U) {
            [[unroll]] for (uint j = 0; j < U; ++j) {
                uint q = q0 + j * S;
                if (q < n_parts) {
                    vec4 a[NR], c[NR];
                    [[unroll]] for (uint r = 0; r < NR; ++r) dequant_group(rows[r], q, p.cols, a[r], c[r]);
                    [[unroll]] for (uint t = 0; t < NT; ++t) {
                        vec4 xa = xin(t, 2 * q, ss[t]), xc = xin(t, 2 * q + 1, ss[t]);
                        [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] += dot(a[r], xa) + dot(c[r], xc);
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
                    vec4 a[NR], c[NR];
                    [[unroll]] for (uint r = 0; r < NR; ++r) dequant_part(rows[r], u, i, p.cols, a[r], c[r]);
                    [[unroll]] for (uint t = 0; t < NT; ++t) {
                        {
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
        [[unroll]] for (uint t = 0; t < NT; ++t) {
            {
                if (NORM) ss[t] = subgroupAdd(ss[t]);
                [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] = subgroupAdd(acc[r][t]);
            }
        }
        if (KS > 1) {
            if (lane == 0) {
                [[unroll]] for (uint t = 0; t < NT; ++t) {
                    {
                        red[sg][NR_MAX * NT_MAX + t] = ss[t];
                        [[unroll]] for (uint r = 0; r < NR; ++r) red[sg][r * NT_MAX + t] = acc[r][t];
                    }
                }
            }
            barrier();
            if (kpart == 0) {
                [[unroll]] for (uint t = 0; t < NT; ++t) {
                    {
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
            [[unroll]] for (uint t = 0; t < NT; ++t) {
                {
                    float scale = NORM ? inversesqrt(ss[t] / float(p.cols) + p.eps) : 1.0;
                    [[unroll]] for (uint r = 0; r < NR; ++r) {
                        if (r0 + r < p.n_rows) {
                            uint row = p.y_off + r0 + r;
                            float v = acc[r][t] * scale;
                            if (p.has_bias != 0) v += bias[row];
                            if (RESID) v += resid[TOK(t) * p.y_stride + row];
                            y[TOK(t) * p.y_stride + row] = v;
                        }
                    }
                }
            }
        }
    }
}
