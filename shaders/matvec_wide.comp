#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Decode matrix-vector product, "wide" work split: the same product, fused inputs and push constants as
// matvec.comp (read its header first), but each lane takes whole units of a row with 16-byte loads:
//
//   Q4_0 (planar)  unit = one block (32 weights): one uvec4 of quants + the f16 scale (scale plane)
//   Q8_0 (planar)  unit = one block: two uvec4 of quants + the f16 scale
//   Q4_K           unit = a quarter of a super-block (64 weights = sub-blocks 2g, 2g+1, which share 32
//                  quant bytes): the block's first uvec4 (d, dmin, the 12 scale bytes) + two uvec4 of
//                  quants; the two 6-bit scale/min pairs are decoded from registers (no 8-bit loads),
//                  the mins applied once per sub-block through the sum of its 32 x values.
//
// Neighbouring lanes take neighbouring units (one load instruction of a subgroup reads 512 contiguous
// bytes for Q4_0); KS subgroups share a group of NR rows, each taking every KS-th run of S*U units; a
// lane issues the loads of its U units x NR rows together, then does the arithmetic. x is read as vec4s
// (a unit's 8 or 16 per token, shared by the NR rows); the products of a unit are summed unscaled and
// the block scale applied once per unit and row.
//
// Dequantisation (spec constant DQ, Q4_0/Q8_0):
//   0  magic exponent + subtraction (quants.glsl nibbles_lo/hi, sbytes_fast): per weight shift, and|or,
//      fsub
//   1  magic exponent + positional fma: a field at bit p is masked in place ((w & (m << p)) | 2^23 as
//      float = 2^23 + q * 2^p, exact while p + width <= 23) and fma(f, 2^-p, -(2^(23-p) + offset))
//      gives q - offset exactly: per weight one and|or + one fma (one shift per word for the fields
//      above bit 23)
//   2  vec4(unpack8(...)) conversions and the offset through the block's x sum:
//      d * (dot(q, x) - 8 * sum(x)) (Q4_0; Q8_0 converts signed bytes directly)
// Q4_K always uses 1 (its nibbles have no offset).
//
// READ_ONLY (benchmark only, examples/bench_matvec.py): the same grid, loads and reduction, but the
// weights' words are only xor-ed together (no x, no dequantisation): this access pattern's ceiling.
//
// x staging (XSN > 0): a lane's x vec4s are 128 (256) bytes apart from its neighbours', so a direct
// load instruction touches 32 cache lines (L1 wavefronts, measured: the wide kernel then runs below the
// base kernel). Instead the workgroup copies each step's x (all KS * S * U units, every token, NORM
// and GLU applied) into shared memory with coalesced loads, every x element once, stored swizzled
// (vec4 k of unit v at slot k ^ (v & 7)) so that 8 neighbouring lanes reading the same k hit
// different banks. Barriers: the step loop is uniform over the workgroup. With staging the NORM sum of
// squares comes from the staging threads and is reduced over the whole workgroup.
//
// Specialization: 0 workgroup size, 1 NT, 2 NORM, 3 RESID, 4 NR, 5 KS, 6 U, 7 GLU, 8 DQ,
// 9 XSN (NT * KS * S * U * UNIT / 4, or 0).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NT = 1;
layout(constant_id = 2) const bool NORM = false;
layout(constant_id = 3) const bool RESID = false;
layout(constant_id = 4) const uint NR = 2;
layout(constant_id = 5) const uint KS = 1;
layout(constant_id = 6) const uint U = 1;
layout(constant_id = 7) const bool GLU = false;
layout(constant_id = 8) const uint DQ = 1;
layout(constant_id = 9) const uint XSN = 0;   // vec4s of x staged in shared memory per step; 0: none
#define NT_MAX 8
#define NR_MAX 8
#define MAX_SUBGROUPS 64
shared float red[MAX_SUBGROUPS][NR_MAX * NT_MAX + NT_MAX];
const uint XS_LEN = XSN > 0 ? XSN : 1;
shared vec4 xs[XS_LEN];

#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer NormW4 { vec4 nw4[]; };
layout(std430, binding = 5) readonly buffer Resid { float resid[]; };
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

#if defined(QTYPE_Q4_0)
#define UNIT 32     // weights per unit (UNIT / 4 x vec4s)
#define NQ 1        // uvec4 loads per unit and row
#elif defined(QTYPE_Q8_0)
#define UNIT 32
#define NQ 2
#elif defined(QTYPE_Q4_K)
#define UNIT 64
#define NQ 3
#else
#error "matvec_wide.comp: Q4_0, Q8_0 or Q4_K"
#endif

// x'[t] for the 4 columns of vec4 index k (k counts vec4s within one token's row), as matvec.comp
vec4 xin(uint t, uint k, inout float ss) {
    uint idx = (TOK(t) * p.cols) / 4 + k;
    vec4 v = x4[idx];
    if (NORM) { ss += dot(v, v); v *= nw4[k]; }
    if (GLU) v = v / (1.0 + exp(-v)) * up4[idx];   // silu(gate) * up: exp(-v) -> inf gives -0, not NaN
    return v;
}

// x' vec4 k (< UNIT / 4) of unit u (lane's unit v of the step): staged or straight from x.
bool staged = false;   // XSN > 0 and this subgroup size's step fits in it (set in main)
vec4 xget(uint t, uint u, uint v, uint k, uint ch4, inout float ss) {
    if (staged) return xs[t * ch4 + v * (UNIT / 4) + (k ^ (v & 7u))];
    return xin(t, u * (UNIT / 4) + k, ss);
}

void main() {
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint lane = gl_SubgroupInvocationID, S = gl_SubgroupSize;
    uint sg = gl_SubgroupID, kpart = sg % KS, n_groups = gl_NumSubgroups / KS;
    uint row_base = wg * p.rows_per_wg;
    uint n_units = p.cols / UNIT;

    // Every subgroup runs the same number of iterations (uniform barriers when KS > 1).
    for (uint rl = (sg / KS) * NR; rl < p.rows_per_wg; rl += n_groups * NR) {
        uint r0 = row_base + rl;
        uint rows[NR];
        [[unroll]] for (uint r = 0; r < NR; ++r) rows[r] = min(r0 + r, p.n_rows - 1);
        float acc[NR][NT], ss[NT];
        [[unroll]] for (uint t = 0; t < NT; ++t) {
            ss[t] = 0.0;
            [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] = 0.0;
        }
#ifdef READ_ONLY
        uint racc[NR];
        [[unroll]] for (uint r = 0; r < NR; ++r) racc[r] = 0u;
#endif
        // (no early exit for rows past the end: loads use clamped rows, barriers need every subgroup)
        uint chunk = KS * S * U, ch4 = chunk * (UNIT / 4);
        staged = XSN > 0 && NT * ch4 <= XSN;
        for (uint base = 0; base < n_units; base += chunk) {
            uint u0 = base + kpart * S * U + lane;
            // Loads of the step, all issued before any arithmetic.
            uvec4 wq[U][NR][NQ];
#if !defined(QTYPE_Q4_K)
            float wd[U][NR];
#endif
            [[unroll]] for (uint j = 0; j < U; ++j) {
                uint u = u0 + j * S;
                if (u < n_units) {
                    [[unroll]] for (uint r = 0; r < NR; ++r) {
#if defined(QTYPE_Q4_K)
                        uint ib = rows[r] * (n_units / 4) + u / 4;
                        wq[j][r][0] = wu4[9 * ib];
                        wq[j][r][1] = wu4[9 * ib + 1 + 2 * (u % 4)];
                        wq[j][r][2] = wu4[9 * ib + 2 + 2 * (u % 4)];
#else
                        uint b = rows[r] * n_units + u;
                        [[unroll]] for (uint k = 0; k < NQ; ++k) wq[j][r][k] = wu4[NQ * b + k];
                        wd[j][r] = block_scale(b);
#endif
                    }
                }
            }
#ifndef READ_ONLY
            if (staged) {   // the step's x into shared memory (the weight loads above are in flight)
                barrier();
                [[unroll]] for (uint t = 0; t < NT; ++t) {
                    for (uint k = gl_LocalInvocationIndex; k < ch4; k += gl_WorkGroupSize.x) {
                        uint v = k / (UNIT / 4), e = k % (UNIT / 4);
                        if (base + v < n_units)
                            xs[t * ch4 + v * (UNIT / 4) + (e ^ (v & 7u))] = xin(t, base * (UNIT / 4) + k, ss[t]);
                    }
                }
                barrier();
            }
#endif
            [[unroll]] for (uint j = 0; j < U; ++j) {
                uint u = u0 + j * S;
                if (u < n_units) {
#ifdef READ_ONLY
                    [[unroll]] for (uint r = 0; r < NR; ++r) {
                        [[unroll]] for (uint k = 0; k < NQ; ++k) {
                            uvec4 v = wq[j][r][k];
                            racc[r] ^= v.x ^ v.y ^ v.z ^ v.w;
                        }
#if !defined(QTYPE_Q4_K)
                        racc[r] ^= floatBitsToUint(wd[j][r]);
#endif
                    }
#elif defined(QTYPE_Q4_K)
                    // sub-blocks s0 = 2g (low nibbles), s1 = 2g + 1 (high nibbles); x vec4 base 16u
                    uint g = u % 4;
                    float t0[NR][NT], t1[NR][NT], sx0[NT], sx1[NT];
                    [[unroll]] for (uint t = 0; t < NT; ++t) {
                        sx0[t] = 0.0; sx1[t] = 0.0;
                        [[unroll]] for (uint r = 0; r < NR; ++r) { t0[r][t] = 0.0; t1[r][t] = 0.0; }
                    }
                    [[unroll]] for (uint w = 0; w < 8; ++w) {
                        vec4 xa[NT], xc[NT];
                        [[unroll]] for (uint t = 0; t < NT; ++t) {
                            xa[t] = xget(t, u, u - base, w, ch4, ss[t]);
                            xc[t] = xget(t, u, u - base, 8 + w, ch4, ss[t]);
                            sx0[t] += (xa[t].x + xa[t].y) + (xa[t].z + xa[t].w);
                            sx1[t] += (xc[t].x + xc[t].y) + (xc[t].z + xc[t].w);
                        }
                        [[unroll]] for (uint r = 0; r < NR; ++r) {
                            vec4 a, c;
                            nib_fma(wq[j][r][1 + w / 4][w % 4], 0.0, a, c);
                            [[unroll]] for (uint t = 0; t < NT; ++t) {
                                t0[r][t] += dot(a, xa[t]);
                                t1[r][t] += dot(c, xc[t]);
                            }
                        }
                    }
                    [[unroll]] for (uint r = 0; r < NR; ++r) {
                        vec2 dl, ml;
                        q4k_quarter_scales(wq[j][r][0], g, dl, ml);
                        [[unroll]] for (uint t = 0; t < NT; ++t)
                            acc[r][t] += (dl.x * t0[r][t] - ml.x * sx0[t]) + (dl.y * t1[r][t] - ml.y * sx1[t]);
                    }
#else
                    // block u: quants of elements 4i..4i+3 and 16+4i..16+4i+3 in word i (Q4_0: low and
                    // high nibbles; Q8_0: words i and 4 + i); x vec4s 8u + i, 8u + 4 + i
                    float tq[NR][NT], sx[NT];
                    [[unroll]] for (uint t = 0; t < NT; ++t) {
                        sx[t] = 0.0;
                        [[unroll]] for (uint r = 0; r < NR; ++r) tq[r][t] = 0.0;
                    }
                    [[unroll]] for (uint i = 0; i < 4; ++i) {
                        vec4 xa[NT], xc[NT];
                        [[unroll]] for (uint t = 0; t < NT; ++t) {
                            xa[t] = xget(t, u, u - base, i, ch4, ss[t]);
                            xc[t] = xget(t, u, u - base, 4 + i, ch4, ss[t]);
                            if (DQ == 2) sx[t] += dot(xa[t] + xc[t], vec4(1.0));
                        }
                        [[unroll]] for (uint r = 0; r < NR; ++r) {
                            vec4 a, c;
#if defined(QTYPE_Q4_0)
                            uint q = wq[j][r][0][i];
                            if (DQ == 0) { a = nibbles_lo(q); c = nibbles_hi(q); }
                            else if (DQ == 1) nib_fma(q, 8.0, a, c);
                            else { a = vec4(unpack8(q & 0x0F0F0F0Fu)); c = vec4(unpack8((q >> 4) & 0x0F0F0F0Fu)); }
#else
                            uint qa = wq[j][r][0][i], qc = wq[j][r][1][i];
                            if (DQ == 0) { a = sbytes_fast(qa); c = sbytes_fast(qc); }
                            else if (DQ == 1) { a = sbytes_fma(qa); c = sbytes_fma(qc); }
                            else { a = vec4(unpack8(int(qa))); c = vec4(unpack8(int(qc))); }
#endif
                            [[unroll]] for (uint t = 0; t < NT; ++t) tq[r][t] += dot(a, xa[t]) + dot(c, xc[t]);
                        }
                    }
                    [[unroll]] for (uint r = 0; r < NR; ++r) {
                        [[unroll]] for (uint t = 0; t < NT; ++t) {
#if defined(QTYPE_Q4_0)
                            if (DQ == 2) tq[r][t] -= 8.0 * sx[t];
#endif
                            acc[r][t] += wd[j][r] * tq[r][t];
                        }
                    }
#endif
                }
            }
        }
#ifdef READ_ONLY
        [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][0] = float(racc[r] & 0xFFFFu);
#endif

        // Reduce: within the subgroup, then across the KS subgroups of this row group (the NORM sum of
        // squares: across the whole workgroup when x was staged).
        [[unroll]] for (uint t = 0; t < NT; ++t) {
            if (NORM) ss[t] = subgroupAdd(ss[t]);
            [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] = subgroupAdd(acc[r][t]);
        }
        if (NORM && staged) {
            if (lane == 0) {
                [[unroll]] for (uint t = 0; t < NT; ++t) red[sg][NR_MAX * NT_MAX + t] = ss[t];
            }
            barrier();
            [[unroll]] for (uint t = 0; t < NT; ++t) {
                ss[t] = 0.0;
                for (uint k = 0; k < gl_NumSubgroups; ++k) ss[t] += red[k][NR_MAX * NT_MAX + t];
            }
            barrier();
        }
        if (KS > 1) {
            if (lane == 0) {
                [[unroll]] for (uint t = 0; t < NT; ++t) {
                    red[sg][NR_MAX * NT_MAX + t] = ss[t];
                    [[unroll]] for (uint r = 0; r < NR; ++r) red[sg][r * NT_MAX + t] = acc[r][t];
                }
            }
            barrier();
            if (kpart == 0) {
                [[unroll]] for (uint t = 0; t < NT; ++t) {
                    for (uint k = 1; k < KS; ++k) {
                        if (!staged) ss[t] += red[sg + k][NR_MAX * NT_MAX + t];
                        [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] += red[sg + k][r * NT_MAX + t];
                    }
                }
            }
            barrier();
        }
        if (kpart == 0 && lane == 0 && r0 < p.n_rows) {
            [[unroll]] for (uint t = 0; t < NT; ++t) {
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
