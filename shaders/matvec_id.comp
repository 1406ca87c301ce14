#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Products with the experts a token's router chose (decode and small batches of a mixture of
// experts): the matrix-vector form of matmul_id, reading only the chosen experts' rows.
//
// Weights: n_exp experts' matrices of R rows x cols stacked in one chunk (expert e0 first); route
// rows hold per token the n_used chosen expert ids (uint bits) and then their weights.
//
//   plain: y[t, s, r] = sum_c W[id(t, s), r, c] * x'[t(, s), c]      grid: (row blocks, tokens x slots)
//   SUM:   y[t, r] = resid[t, r] + sum_s weight(t, s) * sum_c W[id(t, s), r, c] * x'[t, s, c]
//                                                                  grid: (row blocks, tokens)
// x' = x, or rms_norm(x[t]) * nw (NORM: the norm feeding the product, folded in as in matvec.comp), or
// silu(x) * up (GLU: the SwiGLU feeding the down product). XSLOT: x holds one row per (token, slot)
// (the down product's input), else one per token (gate and up read the token's normalized state).
// SUM folds the weighted sum of the slots (and RESID the residual add) into the down product: a
// workgroup takes its rows of every slot in turn, so nothing is written twice.
// A slot whose expert lies outside this chunk [e0, e0 + n_exp) is skipped (another dispatch has it).
//
// Work split: one subgroup per NR consecutive rows; its lanes take every S-th 8-weight quarter of a
// row (neighbouring lanes read neighbouring words), partial sums meet by subgroupAdd.
// Specialization: 0 workgroup size, 1 NR, 2 NORM, 3 GLU, 4 SUM, 5 XSLOT, 6 RESID.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NR = 2;
layout(constant_id = 2) const bool NORM = false;
layout(constant_id = 3) const bool GLU = false;
layout(constant_id = 4) const bool SUM = false;
layout(constant_id = 5) const bool XSLOT = false;
layout(constant_id = 6) const bool RESID = false;

#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Route { float route[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer NormW { float nw[]; };
layout(std430, binding = 4) readonly buffer NormW4 { vec4 nw4[]; };
layout(std430, binding = 5) readonly buffer Resid { float resid[]; };
layout(std430, binding = 6) readonly buffer Up { float up[]; };
layout(std430, binding = 6) readonly buffer Up4 { vec4 up4[]; };
layout(push_constant) uniform Push {
    uint rows;         // R: rows of one expert
    uint cols;
    uint n_used;       // slots per token
    uint e0;           // first expert of this chunk
    uint n_exp;        // experts in this chunk
    uint rows_per_wg;
    float eps;
} p;

// x'[xrow] for the 4 columns of vec4 index k of the row
vec4 xin(uint xrow, uint k, inout float ss) {
    uint idx = (xrow * p.cols) / 4 + k;
    vec4 v = x4[idx];
    if (NORM) { ss += dot(v, v); v *= nw4[k]; }
    if (GLU) v = v / (1.0 + exp(min(-v, vec4(80.0)))) * up4[idx];
    return v;
}
float xin1(uint xrow, uint c, inout float ss) {
    float v = x[xrow * p.cols + c];
    if (NORM) { ss += v * v; v *= nw[c]; }
    if (GLU) v = v / (1.0 + exp(min(-v, 80.0))) * up[xrow * p.cols + c];
    return v;
}

void main() {
    q_chunk_blocks = p.n_exp * p.rows * (p.cols / QK);
    uint lane = gl_SubgroupInvocationID, S = gl_SubgroupSize;
    uint r0 = gl_WorkGroupID.x * p.rows_per_wg + gl_SubgroupID * NR;
    uint pair = gl_WorkGroupID.y;                   // SUM: the token; else token * n_used + slot
    uint t = SUM ? pair : pair / p.n_used;
    uint rbase = t * 2 * p.n_used;
    bool live = r0 < p.rows && gl_SubgroupID * NR < p.rows_per_wg;

    float total[NR];
    [[unroll]] for (uint r = 0; r < NR; ++r) total[r] = 0.0;
    uint s_first = SUM ? 0 : pair % p.n_used, s_end = SUM ? p.n_used : s_first + 1;
    bool mine = SUM;   // a slot's output is written by the dispatch of the chunk holding its expert
    for (uint s = s_first; s < s_end; ++s) {
        uint e = floatBitsToUint(route[rbase + s]);
        if (e < p.e0 || e >= p.e0 + p.n_exp || !live) continue;   // uniform per subgroup
        mine = true;
        uint xrow = XSLOT ? t * p.n_used + s : t;
        uint rows[NR];
        [[unroll]] for (uint r = 0; r < NR; ++r) rows[r] = (e - p.e0) * p.rows + min(r0 + r, p.rows - 1);
        float acc[NR], ss = 0.0;
        [[unroll]] for (uint r = 0; r < NR; ++r) acc[r] = 0.0;
#if defined(QFLOAT)
        for (uint c = lane; c < p.cols; c += S) {
            float xv = xin1(xrow, c, ss);
            [[unroll]] for (uint r = 0; r < NR; ++r) acc[r] += wfloat(rows[r] * p.cols + c) * xv;
        }
#else
        for (uint q = lane; q < p.cols / 8; q += S) {
            uint u = q >> 2, i = q & 3u;
            vec4 xa = xin(xrow, 8 * u + i, ss), xc = xin(xrow, 8 * u + i + 4, ss);
            [[unroll]] for (uint r = 0; r < NR; ++r) {
                vec4 a, c;
                dequant_part(rows[r], u, i, p.cols, a, c);
                acc[r] += dot(a, xa) + dot(c, xc);
            }
        }
#endif
        float scale = 1.0;
        if (NORM) scale = inversesqrt(subgroupAdd(ss) / float(p.cols) + p.eps);
        if (SUM) scale *= route[rbase + p.n_used + s];
        [[unroll]] for (uint r = 0; r < NR; ++r) total[r] += subgroupAdd(acc[r]) * scale;
    }
    if (lane == 0 && live && mine) {
        [[unroll]] for (uint r = 0; r < NR; ++r) {
            uint row = r0 + r;
            if (row < p.rows) {
                uint o = pair * p.rows + row;
                float v = total[r];
                if (RESID) v += resid[o];
                y[o] = v;
            }
        }
    }
}
