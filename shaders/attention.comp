#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : enable
#ifdef DECODE
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
// Causal GQA flash attention over the f16 KV cache (online softmax over KV blocks; no n_ctx^2 buffer).
//
// Q, out: [n_tokens][n_head * HD] f32.  K, V caches: [n_ctx][n_head_kv * HD] f16 (row = position).
// Query row "r" of KV head g = (token t, query head h = g * n_gqa + j), rows ordered t-major, so a
// block of BR rows shares every K/V row it loads between its GQA heads and tokens.
// Token t attends to positions 0 .. n_past + t; n_past and n_kv come from the step buffer at
// execution time (the recording is replayed as they grow). With seq_len = step[4] > 0 the batch
// holds whole sequences back to back (several perplexity chunks at once): the token at row
// p = n_past + t attends to rows (p / seq_len) * seq_len .. p only, those of its own sequence.
//
// Grid: (ceil(n_tokens * n_gqa / BR), n_head_kv, n_splits). Split z handles the KV chunk
// [z * chunk, (z + 1) * chunk), chunk = max(roundup(ceil(n_kv / n_splits), WG), min_chunk) computed
// at execution time: the grid is fixed (sized for n_ctx) and workgroups past n_kv exit at once, so a
// short context uses few splits (min_chunk, a multiple of WG) and a long one up to n_splits.
// Without SPLIT the (only) split writes out = O / l. With SPLIT, when only one split is active it
// does the same; else every active split writes its unnormalised O and (m, l) to scratch, then
// counts itself done on a per-(row block, KV head) atomic counter; the last one to finish merges all
// splits (out = sum_s e^(m_s-M) O_s / sum_s e^(m_s-M) l_s) and resets the counter to 0 for the next
// replay. One dispatch either way.
//
// Per KV block of WG positions (WG = workgroup size, spec constant 0):
//   scores: thread c owns position c0 + c: s[r] = q_r . k (q pre-scaled, in shared memory)
//   softmax: block row max / sum with subgroup ops + one shared slot per subgroup
//   P V:    thread = (d4 = 4-dim slice of V, c-group g): O[r] += p[r][c] * v[c] for c = g mod NG
// At the end the NG c-groups' O are summed through shared memory.
//
// DECODE (BR = 4, HD a multiple of 32, at most 128; subgroups of at least 4 lanes): the same
// algorithm with the block's loads issued all at once (the decode step is bound by memory latency:
// few rows, long KV ranges). Every load is 16 bytes (8 halves, uvec4 + unpackHalf2x16):
//   K: 4 neighbouring lanes read one K row together (lane q takes pieces q, q + 4, ...; HD / 32 each)
//      for 4 rows each: all HD / 8 K loads of the block before the first dot product. Partial dot
//      products are summed over the 4 lanes by a 2-step butterfly that leaves lane q with position q's
//      full sums, so every thread again owns one position of the block.
//   V: thread = (d8 = 8-dim slice, row group vg), rows vg + i * VG: all VPT (<= 16) V loads of the
//      block issued together with K's (V_LATE: after the scores, overlapping the softmax instead;
//      fewer registers).
// Rows past kv_end are clamped to the last valid row (loads stay unconditional; p = 0 there).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HD = 128;     // head_dim, a multiple of 4, HD / 4 <= WG
#ifdef DECODE
#undef BR
#define BR 4
#endif
#ifndef BR
#define BR 8
#endif
const uint HD4 = HD / 4;
const uint NG = WG / HD4;
const float NEG = -1.0e30;

layout(std430, binding = 0) readonly buffer Q { vec4 q[]; };
#ifdef DECODE
layout(std430, binding = 1) readonly buffer K { uvec4 k8[]; };   // 8 halves per element
layout(std430, binding = 2) readonly buffer V { uvec4 v8[]; };
const uint KL = 4;                      // lanes per K row
const uint KROWS = WG / KL;             // K rows per pass; a lane reads KL rows per block
const uint KP = HD / 32;                // 16-byte K loads per lane per row (<= KMAX)
const uint KMAX = 4;
const uint HD8 = HD / 8;                // lanes per V row
const uint VG = WG / HD8;               // V row groups
const uint VPT = (WG + VG - 1) / VG;    // V rows per lane per block (<= VMAX)
const uint VMAX = 16;
#else
layout(std430, binding = 1) readonly buffer K { f16vec4 kc[]; };
layout(std430, binding = 2) readonly buffer V { f16vec4 vc[]; };
#endif
layout(std430, binding = 3) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 4) writeonly buffer Out { vec4 o[]; };
#ifdef SPLIT
// Written by one workgroup, read by another of the same dispatch: coherent + memoryBarrierBuffer.
layout(std430, binding = 5) coherent buffer OPart { vec4 opart[]; };   // [n_splits][n_tokens*n_head][HD]
layout(std430, binding = 6) coherent buffer ML { vec2 ml[]; };         // [n_splits][n_tokens*n_head]
layout(std430, binding = 7) coherent buffer Count { uint counter[]; }; // [n_row_blocks][n_head_kv], 0 between runs
shared bool is_last;
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_head; uint n_head_kv; uint n_splits;
    uint min_chunk;    // positions per split at least (a multiple of WG)
    float scale;
} p;

shared vec4 qs[BR * HD4];      // scaled queries; at the end, the c-group reduction of O
shared float ps[BR * WG];      // probabilities of the current block
shared float red_max[BR * WG]; // per-subgroup partial maxima (sized for any subgroup size)
shared float red_sum[BR * WG];

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint kvh = gl_WorkGroupID.y;
    const uint split = gl_WorkGroupID.z;
    const uint n_gqa = p.n_head / p.n_head_kv;
    const uint row0 = gl_WorkGroupID.x * BR;
    const uint rows_here = min(BR, p.n_tokens * n_gqa - row0);
    const uint n_past = step[0];
    const uint n_kv = step[2];
    const uint seq_len = step[4];

    uint chunk = (n_kv + p.n_splits - 1) / p.n_splits;
    chunk = max((chunk + WG - 1) / WG * WG, p.min_chunk);
    const uint kv_begin = split * chunk;
    if (kv_begin >= n_kv) return;                  // inactive split: the combine skips it too
    const uint t_last = (row0 + rows_here - 1) / n_gqa;
    const uint kv_end = min(min(kv_begin + chunk, n_kv), n_past + t_last + 1);
    // first position any row of the block may see: its first row's sequence start
    const uint kv_first = seq_len > 0 ? (n_past + row0 / n_gqa) / seq_len * seq_len : 0;

    uint lim[BR];                                  // last position row r may see
    uint lo[BR];                                   // first position row r may see
    uint orow[BR];                                 // row of q/out: t * n_head + h
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        const uint row = row0 + min(r, rows_here - 1);
        const uint t = row / n_gqa;
        lim[r] = n_past + t;
        lo[r] = seq_len > 0 ? lim[r] / seq_len * seq_len : 0;
        orow[r] = t * p.n_head + kvh * n_gqa + (row - t * n_gqa);
    }
    for (uint idx = tid; idx < BR * HD4; idx += WG) {
        const uint r = idx / HD4;
        const uint d4 = idx - r * HD4;
        vec4 val = vec4(0.0);
        if (r < rows_here) {
            const uint row = row0 + r;
            const uint t = row / n_gqa;
            val = q[(t * p.n_head + kvh * n_gqa + (row - t * n_gqa)) * HD4 + d4] * p.scale;
        }
        qs[idx] = val;
    }
    barrier();

    float m[BR], l[BR];
    [[unroll]] for (uint r = 0; r < BR; ++r) { m[r] = NEG; l[r] = 0.0; }
#ifdef DECODE
    vec4 acc[BR], acc2[BR];                        // O[r] dims 8 d8 .. 8 d8 + 3, + 4 .. + 7
    [[unroll]] for (uint r = 0; r < BR; ++r) { acc[r] = vec4(0.0); acc2[r] = vec4(0.0); }
    const uint stride8 = p.n_head_kv * HD8;
    const uint head8 = kvh * HD8;
    // K lanes: 4 consecutive lanes of a subgroup share a row (the butterfly shuffles within them)
    const uint lin = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    const uint kq = lin % KL;                      // this lane's quarter of a K row
    const uint krow = lin / KL;                    // its K row within a pass
    const uint cown = krow + KROWS * kq;           // the position it owns after the butterfly
    const uint d8 = tid % HD8;
    const uint vg = tid / HD8;
#else
    vec4 acc[BR];
    [[unroll]] for (uint r = 0; r < BR; ++r) acc[r] = vec4(0.0);
    const uint stride4 = p.n_head_kv * HD4;
    const uint head_off = kvh * HD4;
    const uint d4 = tid % HD4;
    const uint g = tid / HD4;
    const uint cown = tid;
#endif

    for (uint c0 = max(kv_begin, kv_first); c0 < kv_end; c0 += WG) {
        const uint pos = c0 + cown;
        float s[BR];
#ifdef DECODE
        const uint last = kv_end - 1;
        uvec4 kr[KL][KMAX];
        [[unroll]] for (uint k = 0; k < KL; ++k) {
            const uint kb = min(c0 + krow + k * KROWS, last) * stride8 + head8 + kq;
            [[unroll]] for (uint i = 0; i < KMAX; ++i)
                if (i < KP) kr[k][i] = k8[kb + i * KL];
        }
        uvec4 vr[VMAX];
#ifndef V_LATE
        [[unroll]] for (uint i = 0; i < VMAX; ++i)
            if (i < VPT) vr[i] = v8[min(c0 + vg + i * VG, last) * stride8 + head8 + d8];
#endif
        float part[KL][BR];                        // partial q_r . k over this lane's pieces, row k
        [[unroll]] for (uint k = 0; k < KL; ++k)
            [[unroll]] for (uint r = 0; r < BR; ++r) part[k][r] = 0.0;
        [[unroll]] for (uint i = 0; i < KMAX; ++i) {
            if (i < KP) {
                const uint u = (i * KL + kq) * 2;  // qs index of the piece's first 4 dims
                vec4 qa[BR], qb[BR];
                [[unroll]] for (uint r = 0; r < BR; ++r) { qa[r] = qs[r * HD4 + u]; qb[r] = qs[r * HD4 + u + 1]; }
                [[unroll]] for (uint k = 0; k < KL; ++k) {
                    const uvec4 w = kr[k][i];
                    const vec4 k_lo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
                    const vec4 k_hi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
                    [[unroll]] for (uint r = 0; r < BR; ++r) part[k][r] += dot(qa[r], k_lo) + dot(qb[r], k_hi);
                }
            }
        }
        // Butterfly over the 4 lanes of a row group: after the xor-2 step a lane holds rows
        // {2 hi, 2 hi + 1} summed over 2 lanes, after the xor-1 step row kq summed over all 4.
        const bool hi2 = (kq & 2u) != 0u;
        const bool hi1 = (kq & 1u) != 0u;
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            const float h0 = (hi2 ? part[2][r] : part[0][r]) + subgroupShuffleXor(hi2 ? part[0][r] : part[2][r], 2u);
            const float h1 = (hi2 ? part[3][r] : part[1][r]) + subgroupShuffleXor(hi2 ? part[1][r] : part[3][r], 2u);
            s[r] = (hi1 ? h1 : h0) + subgroupShuffleXor(hi1 ? h0 : h1, 1u);
        }
#ifdef V_LATE
        [[unroll]] for (uint i = 0; i < VMAX; ++i)
            if (i < VPT) vr[i] = v8[min(c0 + vg + i * VG, last) * stride8 + head8 + d8];
#endif
#else
        [[unroll]] for (uint r = 0; r < BR; ++r) s[r] = 0.0;
        if (pos < kv_end) {
            const uint kb = pos * stride4 + head_off;
            if (HD4 % 4 == 0) {   // 4 K loads in flight per iteration
                for (uint e = 0; e < HD4; e += 4) {
                    const vec4 k0 = vec4(kc[kb + e]), k1 = vec4(kc[kb + e + 1]);
                    const vec4 k2 = vec4(kc[kb + e + 2]), k3 = vec4(kc[kb + e + 3]);
                    [[unroll]] for (uint r = 0; r < BR; ++r) {
                        s[r] += dot(qs[r * HD4 + e], k0) + dot(qs[r * HD4 + e + 1], k1)
                              + dot(qs[r * HD4 + e + 2], k2) + dot(qs[r * HD4 + e + 3], k3);
                    }
                }
            } else {
                for (uint e = 0; e < HD4; ++e) {
                    const vec4 kk = vec4(kc[kb + e]);
                    [[unroll]] for (uint r = 0; r < BR; ++r) s[r] += dot(qs[r * HD4 + e], kk);
                }
            }
        }
#endif
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            if (r < rows_here) {
                const bool ok = pos < kv_end && pos <= lim[r] && pos >= lo[r];
                s[r] = ok ? s[r] : NEG;
                const float mx = subgroupMax(s[r]);
                if (subgroupElect()) red_max[r * WG + gl_SubgroupID] = mx;
            }
        }
        barrier();
        float alpha[BR];
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            alpha[r] = 1.0;
            float pr = 0.0;
            if (r < rows_here) {
                float bm = NEG;
                for (uint sg = 0; sg < gl_NumSubgroups; ++sg) bm = max(bm, red_max[r * WG + sg]);
                const float m_new = max(m[r], bm);
                alpha[r] = exp(m[r] - m_new);
                m[r] = m_new;
                pr = s[r] > 0.5 * NEG ? exp(s[r] - m_new) : 0.0;
                const float sm = subgroupAdd(pr);
                if (subgroupElect()) red_sum[r * WG + gl_SubgroupID] = sm;
            }
            ps[r * WG + cown] = pr;
        }
        barrier();
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            if (r < rows_here) {
                float bs = 0.0;
                for (uint sg = 0; sg < gl_NumSubgroups; ++sg) bs += red_sum[r * WG + sg];
                l[r] = l[r] * alpha[r] + bs;
                acc[r] *= alpha[r];
#ifdef DECODE
                acc2[r] *= alpha[r];
#endif
            }
        }
#ifdef DECODE
        // every ps entry of the block was written (0 past kv_end, where the rows were clamped)
        if (vg < VG) {
            [[unroll]] for (uint i = 0; i < VMAX; ++i) {
                const uint c = vg + i * VG;
                if (i < VPT && c < WG) {
                    const uvec4 w = vr[i];
                    const vec4 va = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
                    const vec4 vb = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
                    [[unroll]] for (uint r = 0; r < BR; ++r) {
                        const float pr = ps[r * WG + c];
                        acc[r] += pr * va;
                        acc2[r] += pr * vb;
                    }
                }
            }
        }
#else
        if (g < NG) {
            const uint n_here = min(WG, kv_end - c0);
            if (n_here == WG && WG % (4 * NG) == 0) {
                // full block: 4 V loads in flight per iteration (a full unroll compiles slowly on llvmpipe)
                for (uint c = g; c < WG; c += 4 * NG) {
                    const uint vb = (c0 + c) * stride4 + head_off + d4;
                    const vec4 v0 = vec4(vc[vb]);
                    const vec4 v1 = vec4(vc[vb + NG * stride4]);
                    const vec4 v2 = vec4(vc[vb + 2 * NG * stride4]);
                    const vec4 v3 = vec4(vc[vb + 3 * NG * stride4]);
                    [[unroll]] for (uint r = 0; r < BR; ++r) {
                        acc[r] += ps[r * WG + c] * v0 + ps[r * WG + c + NG] * v1
                                + ps[r * WG + c + 2 * NG] * v2 + ps[r * WG + c + 3 * NG] * v3;
                    }
                }
            } else {
                for (uint c = g; c < n_here; c += NG) {
                    const vec4 vv = vec4(vc[(c0 + c) * stride4 + head_off + d4]);
                    [[unroll]] for (uint r = 0; r < BR; ++r) acc[r] += ps[r * WG + c] * vv;
                }
            }
        }
#endif
        barrier();
    }

    // Sum the c-groups' partial outputs (qs is free now: its last reads precede the barrier above).
#ifdef DECODE
    for (uint gg = 0; gg < VG; ++gg) {
        if (vg == gg) {
            [[unroll]] for (uint r = 0; r < BR; ++r) {
                qs[r * HD4 + 2 * d8] = gg == 0 ? acc[r] : qs[r * HD4 + 2 * d8] + acc[r];
                qs[r * HD4 + 2 * d8 + 1] = gg == 0 ? acc2[r] : qs[r * HD4 + 2 * d8 + 1] + acc2[r];
            }
        }
        barrier();
    }
#else
    for (uint gg = 0; gg < NG; ++gg) {
        if (g == gg) {
            [[unroll]] for (uint r = 0; r < BR; ++r)
                qs[r * HD4 + d4] = gg == 0 ? acc[r] : qs[r * HD4 + d4] + acc[r];
        }
        barrier();
    }
#endif

#ifdef SPLIT
    const uint n_active = min(p.n_splits, (n_kv + chunk - 1) / chunk);
    if (n_active > 1) {
        const uint n_out_rows = p.n_tokens * p.n_head;
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            if (r < rows_here) {
                for (uint e = tid; e < HD4; e += WG)
                    opart[(split * n_out_rows + orow[r]) * HD4 + e] = qs[r * HD4 + e];
                if (tid == 0) ml[split * n_out_rows + orow[r]] = vec2(m[r], l[r]);
            }
        }
        // Publish the partials, then count this split done; the last split to finish merges them.
        memoryBarrierBuffer();
        barrier();
        const uint cidx = gl_WorkGroupID.x * p.n_head_kv + kvh;
        if (tid == 0) {
            const uint done = atomicAdd(counter[cidx], 1u);
            is_last = done == n_active - 1;
            if (is_last) counter[cidx] = 0u;   // every split has counted: ready for the next replay
        }
        barrier();
        if (!is_last) return;
        memoryBarrierBuffer();
        // Merge: thread sp < n_active (<= WG) takes split sp's (m, l) of each row; the weights
        // e^(m_s - M) go to ps, the denominators sum_s e^(m_s - M) l_s to red_sum (per subgroup).
        float mv[BR], lv[BR];
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            mv[r] = NEG;
            lv[r] = 0.0;
            if (r < rows_here) {
                if (tid < n_active) {
                    const vec2 v = ml[tid * n_out_rows + orow[r]];
                    mv[r] = v.x;
                    lv[r] = v.y;
                }
                const float mx = subgroupMax(mv[r]);
                if (subgroupElect()) red_max[r * WG + gl_SubgroupID] = mx;
            }
        }
        barrier();
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            if (r < rows_here) {
                float mx = NEG;
                for (uint sg = 0; sg < gl_NumSubgroups; ++sg) mx = max(mx, red_max[r * WG + sg]);
                const float w = tid < n_active ? exp(mv[r] - mx) : 0.0;
                ps[r * WG + tid] = w;
                const float sm = subgroupAdd(w * lv[r]);
                if (subgroupElect()) red_sum[r * WG + gl_SubgroupID] = sm;
            }
        }
        barrier();
        for (uint idx = tid; idx < rows_here * HD4; idx += WG) {
            const uint r = idx / HD4;
            const uint e = idx - r * HD4;
            const uint row = row0 + r;
            const uint t = row / n_gqa;
            const uint orw = t * p.n_head + kvh * n_gqa + (row - t * n_gqa);
            float denom = 0.0;
            for (uint sg = 0; sg < gl_NumSubgroups; ++sg) denom += red_sum[r * WG + sg];
            vec4 sum = vec4(0.0);
            uint sp = 0;
            for (; sp + 8 <= n_active; sp += 8) {   // 8 loads in flight
                vec4 a[8];
                [[unroll]] for (uint u = 0; u < 8; ++u) a[u] = opart[((sp + u) * n_out_rows + orw) * HD4 + e];
                [[unroll]] for (uint u = 0; u < 8; ++u) sum += ps[r * WG + sp + u] * a[u];
            }
            for (; sp < n_active; ++sp) sum += ps[r * WG + sp] * opart[(sp * n_out_rows + orw) * HD4 + e];
            o[orw * HD4 + e] = denom > 0.0 ? sum / denom : vec4(0.0);
        }
        return;
    }
#endif
    // a single (active) split: out = O / l
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        if (r < rows_here) {
            for (uint e = tid; e < HD4; e += WG)
                o[orow[r] * HD4 + e] = l[r] > 0.0 ? qs[r * HD4 + e] / l[r] : vec4(0.0);
        }
    }
}
