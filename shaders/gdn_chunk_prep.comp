#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// The gated delta rule over a prompt in chunks of CH tokens, part 1 of 2 (llamavk/kernels/deltanet.py
// has the derivation): per (chunk, value head), everything that does not depend on the state S0 the
// chunk starts from. With G_r the cumulative log decay of token r within its sequence segment of the
// chunk, carry_r = 1 where no sequence starts in the chunk at or before r (S0 reaches r), and pairs
// (r, s) counted only within one segment:
//   L[r][s]   = beta_r exp(G_r - G_s) k_r.k_s          s < r
//   T         = (I + L)^-1                              (forward substitution, row by row)
//   W         = T diag(beta exp(G) carry) K             so that the chunk's new values U = Ub - W S0
//   Ub        = T diag(beta) V
//   Aqk[r][s] = exp(G_r - G_s) q_r.k_s / sqrt(D)        s <= r
//   Qs[r]     = carry_r exp(G_r) q_r / sqrt(D)          so that out = Qs S0 + Aqk U
//   Kd[s]     = exp(G_last - G_s) k_s  (s in the last segment), glast = carry_last exp(G_last)
//                                                       so that S_next = glast S0 + Kd^T U
// q and k are L2-normed. Scratch per (chunk, head): W, Ub, Qs, Kd [CH][D], Aqk [CH][CH], glast.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Step { uint step[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer Alpha { float alpha[]; };
layout(std430, binding = 3) readonly buffer Beta { float beta[]; };
layout(std430, binding = 4) readonly buffer Dt { float dt[]; };
layout(std430, binding = 5) readonly buffer A { float a_log[]; };
layout(std430, binding = 6) writeonly buffer Scratch { float sc[]; };
layout(push_constant) uniform Push { uint n_tokens; uint n_k_heads; uint n_v_heads; uint head_dim; float eps; } p;
#include "gdn_common.glsl"

#define CH 64
#define TD 32              // key/query columns staged per pass of the dot products
#define TDP (TD + 4)       // their row stride: lanes reading 8 rows' vec4s at once hit 32 distinct banks
#define PAIRS 16           // (r, s) pairs per thread: CH * CH / workgroup size (256)
#define LM4 (2 * CH * TDP / 4)

// First the staged k and q columns ([2][CH][TDP]), then L ([CH][CH], read as L(r, s)); vec4 so that
// the dot products and the substitution read four values a load.
shared vec4 Lm4[LM4 > CH * CH / 4 ? LM4 : CH * CH / 4];
#define L(idx) Lm4[(idx) >> 2][(idx) & 3]
shared float gc[CH], bet[CH], inv_q[CH], inv_k[CH], part_q[gl_WorkGroupSize.x], part_k[gl_WorkGroupSize.x];
shared uint seg[CH], starts[CH];

void main() {
    const uint c = gl_WorkGroupID.x, h = gl_WorkGroupID.y, D = p.head_dim, kh = gdn_key_head(h);
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    const uint t0 = c * CH, n = min(CH, p.n_tokens - t0);
    const float scale = inversesqrt(float(D));
    const uint block = 4 * CH * D + CH * CH + 4;
    const uint base = (c * p.n_v_heads + h) * block;
    const uint W_AT = base, UB_AT = base + CH * D, QS_AT = base + 2 * CH * D, KD_AT = base + 3 * CH * D;
    const uint AQK_AT = base + 4 * CH * D, GLAST_AT = AQK_AT + CH * CH;

    // 1. squared norms of q_r and k_r: WG / CH threads per token
    const uint tpr = WG / CH, r1 = tid / tpr, lane = tid % tpr;
    float ssq = 0.0, ssk = 0.0;
    if (r1 < n) {
        for (uint i = lane; i < D; i += tpr) {
            const float qv = x[gdn_q_at(t0 + r1, kh) + i], kv = x[gdn_k_at(t0 + r1, kh) + i];
            ssq += qv * qv;
            ssk += kv * kv;
        }
    }
    part_q[tid] = ssq;
    part_k[tid] = ssk;
    barrier();
    if (tid < n) {
        float q2 = 0.0, k2 = 0.0;
        for (uint l = 0; l < tpr; ++l) {
            q2 += part_q[tid * tpr + l];
            k2 += part_k[tid * tpr + l];
        }
        inv_q[tid] = inversesqrt(q2 + p.eps);
        inv_k[tid] = inversesqrt(k2 + p.eps);
        const uint t = t0 + tid;
        gc[tid] = gdn_log_decay(alpha[t * p.n_v_heads + h], dt[h], a_log[h]);
        bet[tid] = gdn_sigmoid(beta[t * p.n_v_heads + h]);
        starts[tid] = gdn_starts(t) ? 1u : 0u;
    }
    barrier();
    // 2. cumulative log decay per segment (a sequence start opens a new one)
    if (tid == 0) {
        float g = 0.0;
        uint s = 0;
        for (uint r = 0; r < n; ++r) {
            if (starts[r] != 0u) {
                s += 1u;
                g = 0.0;
            }
            g += gc[r];
            gc[r] = g;
            seg[r] = s;
        }
    }
    barrier();
    // 3. the chunk's k_r.k_s and q_r.k_s (all pairs; those with s > r are not used), TD columns of k
    // and q staged at a time. A thread's pairs share s (idx % CH): k_s is loaded once per 4 columns
    // for all PAIRS rows r, whose loads are the same for a whole subgroup (broadcasts).
    float kk[PAIRS], qk[PAIRS];
    [[unroll]] for (uint m = 0; m < PAIRS; ++m) {
        kk[m] = 0.0;
        qk[m] = 0.0;
    }
    const uint s_own = tid % CH;
    for (uint d0 = 0; d0 < D; d0 += TD) {
        for (uint idx = tid; idx < CH * TD; idx += WG) {
            const uint r = idx / TD, dd = idx % TD, t = t0 + r;
            const bool ok = r < n && d0 + dd < D;
            L(r * TDP + dd) = ok ? x[gdn_k_at(t, kh) + d0 + dd] : 0.0;
            L(CH * TDP + r * TDP + dd) = ok ? x[gdn_q_at(t, kh) + d0 + dd] : 0.0;
        }
        barrier();
        for (uint d4 = 0; d4 < TD / 4; ++d4) {
            const vec4 ks = Lm4[s_own * (TDP / 4) + d4];
            [[unroll]] for (uint m = 0; m < PAIRS; ++m) {
                const uint r = (m * WG + tid) / CH;
                kk[m] += dot(Lm4[r * (TDP / 4) + d4], ks);
                qk[m] += dot(Lm4[(CH + r) * (TDP / 4) + d4], ks);
            }
        }
        barrier();
    }
    // L (shared, replacing the staged columns) and Aqk (scratch), within one segment only
    [[unroll]] for (uint m = 0; m < PAIRS; ++m) {
        const uint idx = m * WG + tid, r = idx / CH, s = idx % CH;
        float l = 0.0, aqk = 0.0;
        if (r < n && s <= r && seg[r] == seg[s]) {
            const float dec = exp(gc[r] - gc[s]);
            l = s < r ? bet[r] * dec * kk[m] * inv_k[r] * inv_k[s] : 0.0;
            aqk = scale * dec * qk[m] * inv_q[r] * inv_k[s];
        }
        L(idx) = l;
        sc[AQK_AT + idx] = aqk;
    }
    barrier();
    // 4. W and Ub by forward substitution: one column of [W | Ub] per thread, its CH rows in registers.
    // L is zero from the diagonal on, so row r sums whole fours of earlier rows (acc starts at 0), in
    // two independent partial sums.
    for (uint col = tid; col < 2 * D; col += WG) {
        const bool is_w = col < D;
        const uint d = is_w ? col : col - D;
        float acc[CH];
        [[unroll]] for (uint r = 0; r < CH; ++r) acc[r] = 0.0;
        [[unroll]] for (uint r = 0; r < CH; ++r) {
            if (r >= n) break;
            const uint t = t0 + r;
            float rhs = is_w ? (seg[r] == 0u ? bet[r] * exp(gc[r]) * x[gdn_k_at(t, kh) + d] * inv_k[r] : 0.0)
                             : bet[r] * x[gdn_v_at(t, h) + d];
            float rhs2 = 0.0;
            [[unroll]] for (uint s4 = 0; s4 < (r + 3) / 4; ++s4) {
                const float part = dot(Lm4[r * (CH / 4) + s4], vec4(acc[4 * s4], acc[4 * s4 + 1], acc[4 * s4 + 2],
                                                                     acc[4 * s4 + 3]));
                if ((s4 & 1u) == 0u) rhs -= part; else rhs2 -= part;
            }
            acc[r] = rhs + rhs2;
            sc[(is_w ? W_AT : UB_AT) + r * D + d] = acc[r];
        }
    }
    // 5. Qs and Kd
    const uint last = n - 1;
    for (uint idx = tid; idx < n * D; idx += WG) {
        const uint r = idx / D, d = idx % D, t = t0 + r;
        sc[QS_AT + idx] = seg[r] == 0u ? scale * exp(gc[r]) * x[gdn_q_at(t, kh) + d] * inv_q[r] : 0.0;
        sc[KD_AT + idx] = seg[r] == seg[last] ? exp(gc[last] - gc[r]) * x[gdn_k_at(t, kh) + d] * inv_k[r] : 0.0;
    }
    if (tid == 0) sc[GLAST_AT] = seg[last] == 0u ? exp(gc[last]) : 0.0;
}
