#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : enable
// Causal GQA flash attention over the f16 (KV_QUANT: or q8_0 / q4_0) KV cache (online softmax over KV blocks; no n_ctx^2 buffer).
//
// Q, out: [n_tokens][n_head * HD] f32.  K, V caches: [n_ctx][n_head_kv * HD] f16 (row = position).
// Query row "r" of KV head g = (token t, query head h = g * n_gqa + j), rows ordered t-major, so a
// block of BR rows shares every K/V row it loads between its GQA heads and tokens.
// Token t attends to positions 0 .. n_past + t; n_past and n_kv come from the step buffer at
// execution time (the recording is replayed as they grow). With seq_len = step[4] > 0 the batch
// holds whole sequences back to back (several perplexity chunks at once): the token at row
// p = n_past + t attends to rows (p / seq_len) * seq_len .. p only, those of its own sequence.
// A sliding window (push window = W > 0) further limits row p to rows p - W + 1 .. p.
//
// Grid: (ceil(n_tokens * n_gqa / BR), n_head_kv, n_splits). Split z handles the KV chunk
// [base + z * chunk, base + (z + 1) * chunk), chunk = max(roundup(ceil((n_kv - base) / n_splits), WG),
// min_chunk) computed at execution time (base: the first position the batch may see, 0 without a
// window): the grid is fixed (sized for n_ctx) and workgroups past n_kv exit at once, so a
// short context uses few splits (min_chunk, a multiple of WG) and a long one up to n_splits.
// Without SPLIT the (only) split writes out = O / l; with SPLIT the splits' partial results are
// merged by the last one to finish (attention_split.glsl). One dispatch either way.
//
// Per KV block of WG positions (WG = workgroup size, spec constant 0):
//   scores: thread c owns position c0 + c: s[r] = q_r . k (q pre-scaled, in shared memory)
//   softmax: block row max / sum with subgroup ops + one shared slot per subgroup
//   P V:    thread = (d4 = 4-dim slice of V, c-group g): O[r] += p[r][c] * v[c] for c = g mod NG
// At the end the NG c-groups' O are summed through shared memory.
//
// SINKS (variants *_sinks, gpt-oss): a per-head logit that joins each row's softmax once, at its
// end (attention_split.glsl sink_norm): out = O e^(m-M) / (l e^(m-M) + e^(sink-M)), M = max(m, sink).
//
// Decode steps (at most 4 query rows per KV head) use attention_decode.comp instead: same bindings,
// grid and splits, shaped for latency. The end of a workgroup (one split, or the merge of several)
// is attention_split.glsl.
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HD = 128;     // head_dim, a multiple of 4, HD / 4 <= WG
#ifndef BR
#define BR 8
#endif
const uint HD4 = HD / 4;
const uint NG = WG / HD4;
const float NEG = -1.0e30;

layout(std430, binding = 0) readonly buffer Q { vec4 q[]; };
layout(std430, binding = 1) readonly buffer K { f16vec4 kc[]; };
layout(std430, binding = 2) readonly buffer V { f16vec4 vc[]; };
layout(std430, binding = 3) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 4) writeonly buffer Out { vec4 o[]; };
#ifdef KV_QUANT
// Either cache quantized (kv_quant.glsl), its type a specialization constant (KT, VT): read as
// uint16 words through a second declaration of its binding, dequantized as it is loaded.
#include "kv_quant.glsl"
layout(constant_id = 2) const uint KT = KV_F16;
layout(constant_id = 3) const uint VT = KV_F16;
layout(std430, binding = 1) readonly buffer KQ { uint16_t kq16[]; };
layout(std430, binding = 2) readonly buffer VQ { uint16_t vq16[]; };
KV_DEQUANT4(k_dequant4, kq16)
KV_DEQUANT4(v_dequant4, vq16)
#define K4(i) (KT == KV_F16 ? vec4(kc[i]) : k_dequant4(KT, (i) * 4))
#define V4(i) (VT == KV_F16 ? vec4(vc[i]) : v_dequant4(VT, (i) * 4))
#else
#define K4(i) vec4(kc[i])
#define V4(i) vec4(vc[i])
#endif
#ifdef SPLIT
// Written by one workgroup, read by another of the same dispatch: coherent + memoryBarrierBuffer.
layout(std430, binding = 5) coherent buffer OPart { vec4 opart[]; };   // [n_splits][n_tokens*n_head][HD]
layout(std430, binding = 6) coherent buffer ML { vec2 ml[]; };         // [n_splits][n_tokens*n_head]
layout(std430, binding = 7) coherent buffer Count { uint counter[]; }; // [n_row_blocks][n_head_kv], 0 between runs
shared bool is_last;
#endif
#ifdef SINKS
// the sinks (SINKS): the kernel's last binding, as Vulkan bindings are numbered 0 .. n-1 in
// kernels/attention.py's order (vk/kernel.py): 8 after the split scratch, else 5
#ifdef SPLIT
layout(std430, binding = 8) readonly buffer Sinks { float sinks[]; };   // [n_head]
#else
layout(std430, binding = 5) readonly buffer Sinks { float sinks[]; };
#endif
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_head; uint n_head_kv; uint n_splits;
    uint min_chunk;    // positions per split at least (a multiple of WG)
    float scale;
    uint window;       // sliding window: positions a row sees, its own included (0: all)
} p;

shared vec4 qs[BR * HD4];      // scaled queries; at the end, the c-group reduction of O
shared float ps[BR * WG];      // probabilities of the current block
shared float red_max[BR * WG]; // per-subgroup partial maxima (sized for any subgroup size)
shared float red_sum[BR * WG];

#include "attention_split.glsl"

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

    const SplitRange sr = split_range(WG, split, row0, rows_here, n_gqa, n_past, n_kv, seq_len);
    if (sr.begin >= n_kv) return;                  // inactive split: the merge skips it too
    const uint kv_begin = sr.begin, kv_end = sr.end, kv_first = sr.first;

    uint lim[BR];                                  // last position row r may see
    uint lo[BR];                                   // first position row r may see
    uint orow[BR];                                 // row of q/out: t * n_head + h
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        const uint row = row0 + min(r, rows_here - 1);
        const uint t = row / n_gqa;
        lim[r] = n_past + t;
        lo[r] = first_visible(lim[r], seq_len);
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
    vec4 acc[BR];
    [[unroll]] for (uint r = 0; r < BR; ++r) acc[r] = vec4(0.0);
    const uint stride4 = p.n_head_kv * HD4;
    const uint head_off = kvh * HD4;
    const uint d4 = tid % HD4;
    const uint g = tid / HD4;
    const uint cown = tid;

    for (uint c0 = max(kv_begin, kv_first); c0 < kv_end; c0 += WG) {
        const uint pos = c0 + cown;
        float s[BR];
        [[unroll]] for (uint r = 0; r < BR; ++r) s[r] = 0.0;
        if (pos < kv_end) {
            const uint kb = pos * stride4 + head_off;
            if (HD4 % 4 == 0) {   // 4 K loads in flight per iteration
                for (uint e = 0; e < HD4; e += 4) {
                    const vec4 k0 = K4(kb + e), k1 = K4(kb + e + 1);
                    const vec4 k2 = K4(kb + e + 2), k3 = K4(kb + e + 3);
                    [[unroll]] for (uint r = 0; r < BR; ++r) {
                        s[r] += dot(qs[r * HD4 + e], k0) + dot(qs[r * HD4 + e + 1], k1)
                              + dot(qs[r * HD4 + e + 2], k2) + dot(qs[r * HD4 + e + 3], k3);
                    }
                }
            } else {
                for (uint e = 0; e < HD4; ++e) {
                    const vec4 kk = K4(kb + e);
                    [[unroll]] for (uint r = 0; r < BR; ++r) s[r] += dot(qs[r * HD4 + e], kk);
                }
            }
        }
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
            }
        }
        if (g < NG) {
            const uint n_here = min(WG, kv_end - c0);
            if (n_here == WG && WG % (4 * NG) == 0) {
                // full block: 4 V loads in flight per iteration (a full unroll compiles slowly on llvmpipe)
                for (uint c = g; c < WG; c += 4 * NG) {
                    const uint vb = (c0 + c) * stride4 + head_off + d4;
                    const vec4 v0 = V4(vb);
                    const vec4 v1 = V4(vb + NG * stride4);
                    const vec4 v2 = V4(vb + 2 * NG * stride4);
                    const vec4 v3 = V4(vb + 3 * NG * stride4);
                    [[unroll]] for (uint r = 0; r < BR; ++r) {
                        acc[r] += ps[r * WG + c] * v0 + ps[r * WG + c + NG] * v1
                                + ps[r * WG + c + 2 * NG] * v2 + ps[r * WG + c + 3 * NG] * v3;
                    }
                }
            } else {
                for (uint c = g; c < n_here; c += NG) {
                    const vec4 vv = V4((c0 + c) * stride4 + head_off + d4);
                    [[unroll]] for (uint r = 0; r < BR; ++r) acc[r] += ps[r * WG + c] * vv;
                }
            }
        }
        barrier();
    }

    // Sum the c-groups' partial outputs (qs is free now: its last reads precede the barrier above).
    for (uint gg = 0; gg < NG; ++gg) {
        if (g == gg) {
            [[unroll]] for (uint r = 0; r < BR; ++r)
                qs[r * HD4 + d4] = gg == 0 ? acc[r] : qs[r * HD4 + d4] + acc[r];
        }
        barrier();
    }

    finish_rows(n_kv - sr.base, sr.chunk, split, row0, rows_here, kvh, n_gqa, orow, m, l);
}
