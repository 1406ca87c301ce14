#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_shuffle : require
// Flash attention for decode: at most 4 query rows per KV head (one token and its GQA heads, or a
// few tokens of one head), over the f16 (KV_QUANT: or q8_0 / q4_0) KV cache. Same bindings, push constants, grid, split-KV
// scheme and sliding window as attention.comp (see there); this kernel is shaped for latency
// instead of reuse.
//
// Why a kernel of its own: a decode step gives attention one workgroup per KV head and split (8 on a
// 7.2B at short context), so each workgroup's instruction chain is the cost, not the bytes. Here a
// block is only WG / 4 positions (32): every thread does a few loads and about 300 arithmetic
// instructions per block, and the only workgroup barrier per block publishes the scores (H100, 7.2B
// shapes: ~1 us per block against ~5 us per 128-position block of attention.comp). Splits take at
// least min_chunk positions (attention.py's policy: merging splits costs more than a few blocks).
//
// Per block of BP = WG / 4 positions c0 .. c0 + BP - 1:
//   scores: lane (krow = lane / 4, kq = lane % 4) reads K row c0 + krow in 16-byte pieces kq, kq + 4,
//     ... (HD / 32 of them) and forms the partial q_r . k of all 4 rows; a 2-step butterfly over the 4
//     lanes leaves lane kq with row kq's full score. Scores go to shared sc[parity][position].xyzw.
//   P V: thread (d8 = 8-dim slice, vg = row group) takes positions vg, vg + VG, ... of the block. It
//     keeps its own softmax state (m, l) per row over the positions it has seen, so no block-wide max
//     or sum is needed; the VG groups' states and outputs are merged once, at the end.
//   The next block's K and V loads are issued before this block's P V (in flight during it); sc is
//   double-buffered, so one barrier per block orders both its writes and the next block's.
// Rows past kv_end are clamped to the last valid row (loads stay unconditional; p = 0 there).
//
// QK_FUSE (one-token steps of qwen3-style attention: per-head Q/K RMS norm, then NEOX RoPE): q is
// the raw Q product and this kernel also does what rope_kv.comp's QK_NORM form did in a stage of its
// own. Each workgroup norms and rotates its own query rows into qs. The workgroups whose split
// holds the new position n_past (one per row block of that KV head) norm and rotate the new K row
// of their KV head from the raw K product, store it and the new V row into the caches (f16, or
// KV_QUANT blocks: several workgroups store identical values), and read them back with the other
// rows after a workgroup barrier (the cache bindings are coherent for that). Other workgroups never
// read row n_past (their rows are clamped to their own last one), so nothing waits across
// workgroups; loads that cannot reach row n_past are issued before the norms. rope_dim <= head_dim,
// a multiple of 8; dims past rope_dim pass unrotated (qwen35).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HD = 128;    // head_dim: a multiple of 32, at most 256
#define BR 4
const uint HD4 = HD / 4;
const uint HD8 = HD / 8;                // threads per V row (one 16-byte piece each)
const uint BP = WG / 4;                 // positions per block: 4 lanes per K row
const uint KP = HD / 32;                // 16-byte K loads per lane per block (<= KMAX)
const uint KMAX = 8;
const uint VG = WG / HD8;               // V row groups; threads past VG * HD8 sit out P V
const uint VPT = (BP + VG - 1) / VG;    // V rows per thread per block (<= VMAX)
const uint VMAX = 16;
const float NEG = -1.0e30;

layout(std430, binding = 0) readonly buffer Q { vec4 q[]; };
#ifdef QK_FUSE
#define KV_ACCESS coherent      // this workgroup's own stores of row n_past are read back
#else
#define KV_ACCESS readonly
#endif
layout(std430, binding = 1) KV_ACCESS buffer K { uvec4 k8[]; };   // 8 halves per element
layout(std430, binding = 2) KV_ACCESS buffer V { uvec4 v8[]; };
layout(std430, binding = 3) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 4) writeonly buffer Out { vec4 o[]; };
#ifdef KV_QUANT
// Either cache quantized (kv_quant.glsl), its type a specialization constant (KT, VT): read as
// uint16 words through a second declaration of its binding, dequantized to 8 halves as loaded.
#include "kv_quant.glsl"
layout(constant_id = 2) const uint KT = KV_F16;
layout(constant_id = 3) const uint VT = KV_F16;
layout(std430, binding = 1) KV_ACCESS buffer KQ { uint16_t kq16[]; };
layout(std430, binding = 2) KV_ACCESS buffer VQ { uint16_t vq16[]; };
KV_DEQUANT4(k_dequant4, kq16)
KV_DEQUANT4(v_dequant4, vq16)
KV_DEQUANT8(k_dequant8, k_dequant4)
KV_DEQUANT8(v_dequant8, v_dequant4)
#define K8(i) (KT == KV_F16 ? k8[i] : k_dequant8(KT, (i) * 8))
#define V8(i) (VT == KV_F16 ? v8[i] : v_dequant8(VT, (i) * 8))
#else
#define K8(i) k8[i]
#define V8(i) v8[i]
#endif
#ifdef SPLIT
layout(std430, binding = 5) coherent buffer OPart { vec4 opart[]; };   // [n_splits][n_tokens*n_head][HD]
layout(std430, binding = 6) coherent buffer ML { vec2 ml[]; };         // [n_splits][n_tokens*n_head]
layout(std430, binding = 7) coherent buffer Count { uint counter[]; }; // [n_row_blocks][n_head_kv], 0 between runs
shared bool is_last;
#endif
#ifdef SPLIT
#define B_CHAIN 8
#else
#define B_CHAIN 5
#endif
#ifdef CHAIN
// CHAIN: every workgroup counts itself done on chain[p.chain_slot] once its stores are visible, so
// that the next dispatch (the output projection, recorded without a barrier) can wait for the whole
// grid in its shader (matvec_stream.comp WAIT) instead of behind a pipeline barrier.
layout(std430, binding = B_CHAIN) volatile coherent buffer Chain { uint chain[]; };
#define B_FUSE (B_CHAIN + 1)
#else
#define B_FUSE B_CHAIN
#endif
#ifdef QK_FUSE
layout(std430, binding = B_FUSE) readonly buffer KNew { vec4 knew[]; };     // the K product's row [n_head_kv * HD]
layout(std430, binding = B_FUSE + 1) readonly buffer VNew { vec4 vnew[]; }; // the V product's row
layout(std430, binding = B_FUSE + 2) readonly buffer QNorm { vec4 qnw[]; }; // [HD] weights of the norms
layout(std430, binding = B_FUSE + 3) readonly buffer KNorm { vec4 knw[]; };
layout(std430, binding = 1) coherent writeonly buffer KW { float16_t kw16[]; };   // the caches, as halves
layout(std430, binding = 2) coherent writeonly buffer VW { float16_t vw16[]; };
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_head; uint n_head_kv; uint n_splits;
    uint min_chunk;    // positions per split at least (a multiple of BP)
    float scale;
    uint window;       // sliding window: positions a row sees, its own included (0: all)
#ifdef CHAIN
    uint chain_slot;
#endif
#ifdef QK_FUSE
    uint q_stride;     // floats from one query head's first value to the next one's (HD; qwen35: 2 HD)
    uint rope_dim; uint neox;   // (neox: always 1; the name rope_common.glsl reads)
    float log2_theta_scale; float freq_scale; float ext_factor; float attn_factor; float corr_low; float corr_high;
    float eps;
#endif
} p;

shared vec4 qs[BR * HD4];          // scaled queries; at the end, the merged O
shared vec4 sc[2 * BP];            // scores [parity][position], rows in x y z w
shared vec4 po[8 * WG];            // the row groups' outputs [vg][r][HD4] (VG * HD <= 8 WG)
shared vec2 gml[BR * WG];          // the row groups' (m, l) [vg][r]

#include "attention_split.glsl"

// The first block's K and V loads (rows past kv_end clamped to `last`), before its scores.
#define LOAD_FIRST_BLOCK                                                                            \
    {                                                                                               \
        const uint kb = min(start + krow, last) * stride8 + head8 + kq;                             \
        [[unroll]] for (uint i = 0; i < KMAX; ++i)                                                  \
            if (i < KP) kr[i] = K8(kb + i * 4);                                                     \
        [[unroll]] for (uint i = 0; i < VMAX; ++i)                                                  \
            if (i < VPT) vr[i] = V8(min(start + vg + i * VG, last) * stride8 + head8 + d8);         \
    }

#ifdef QK_FUSE
#include "rope_common.glsl"

shared vec4 knorm[HD4];                // the new K row of this KV head: raw, then normed and rotated
shared float red[32 * (BR + 1)];       // sums of squares [subgroup][row]: the BR query rows, the K row

// Dims 4j .. 4j + 3 (lo) and their NEOX partners rope_dim / 2 + 4j .. (hi) rotated to position rpos.
void rotate4(const uint j, const float rpos, inout vec4 lo, inout vec4 hi) {
    [[unroll]] for (uint c = 0; c < 4; ++c) {
        const vec2 cs = rope_cos_sin(4 * j + c, rpos);
        const float x0 = lo[c], x1 = hi[c];
        lo[c] = x0 * cs.x - x1 * cs.y;
        hi[c] = x0 * cs.y + x1 * cs.x;
    }
}

// qs <- the block's query rows from the raw Q product, RMS-normed per head (weights qnw), rotated to
// position pos and scaled by p.scale. writer: also the new K row (weights knw) and the V row into
// cache row pos, visible to this workgroup's later loads. Ends with a workgroup barrier.
void qk_prepare(const uint orow[BR], const uint rows_here, const uint kvh, const uint pos, const bool writer) {
    const uint tid = gl_LocalInvocationID.x;
    const uint qstride4 = p.q_stride / 4;
    for (uint idx = tid; idx < BR * HD4; idx += WG) {
        const uint r = idx / HD4;
        qs[idx] = r < rows_here ? q[orow[r] * qstride4 + idx - r * HD4] : vec4(0.0);
    }
    if (writer) {
        for (uint e = tid; e < HD4; e += WG) knorm[e] = knew[kvh * HD4 + e];
    }
    barrier();
    [[unroll]] for (uint r = 0; r < BR + 1; ++r) {
        float part = 0.0;
        for (uint e = tid; e < HD4; e += WG) {
            const vec4 x = r < BR ? qs[r * HD4 + e] : (writer ? knorm[e] : vec4(0.0));
            part += dot(x, x);
        }
        part = subgroupAdd(part);
        if (subgroupElect()) red[gl_SubgroupID * (BR + 1) + r] = part;
    }
    barrier();
    float rs[BR + 1];                  // each row's 1 / rms
    [[unroll]] for (uint r = 0; r < BR + 1; ++r) {
        float ss = 0.0;
        for (uint sg = 0; sg < gl_NumSubgroups; ++sg) ss += red[sg * (BR + 1) + r];
        rs[r] = inversesqrt(ss / float(HD) + p.eps);
    }
    // Item j of a row: j < rope_dim / 8, vec4 j and its partner vec4 j + rope_dim / 8 (4 pairs);
    // else vec4 j + rope_dim / 8, past rope_dim (normed only). Each item owns its vec4s: in place.
    const uint rd8 = p.rope_dim / 8, per_row = rd8 + (HD - p.rope_dim) / 4;
    const float rpos = float(rope_position(pos));
    for (uint idx = tid; idx < (BR + 1) * per_row; idx += WG) {
        const uint r = idx / per_row, j = idx - r * per_row;
        if (r == BR && !writer) break;
        const uint at = r < BR ? r * HD4 : 0;
        vec4 hi = (r < BR ? qs[at + j + rd8] : knorm[j + rd8]) * rs[r] * (r < BR ? qnw[j + rd8] : knw[j + rd8]);
        if (j < rd8) {
            vec4 lo = (r < BR ? qs[at + j] : knorm[j]) * rs[r] * (r < BR ? qnw[j] : knw[j]);
            rotate4(j, rpos, lo, hi);
            if (r < BR) qs[at + j] = lo * p.scale;
            else knorm[j] = lo;
        }
        if (r < BR) qs[at + j + rd8] = hi * p.scale;
        else knorm[j + rd8] = hi;
    }
    barrier();
    if (!writer) return;                           // uniform per workgroup
    const uint row_base = (pos * p.n_head_kv + kvh) * HD;   // the cache row's first value of this head
#ifdef KV_QUANT
    if (KT == KV_F16) {
        for (uint e = tid; e < HD4; e += WG) {
            [[unroll]] for (uint c = 0; c < 4; ++c) kw16[row_base + 4 * e + c] = float16_t(knorm[e][c]);
        }
    }
    if (VT == KV_F16) {
        for (uint e = tid; e < HD4; e += WG) {
            const vec4 x = vnew[kvh * HD4 + e];
            [[unroll]] for (uint c = 0; c < 4; ++c) vw16[row_base + 4 * e + c] = float16_t(x[c]);
        }
    }
    // A quantized cache: the head's HD / 32 blocks, K's by the first threads and V's by the last ones
    // (one call site of kv_quantize: the kernel stays small).
    const uint nblk = HD / 32;                     // blocks row_base / 32 + b of the head's row
    const bool kblk = KT != KV_F16 && tid < nblk, vblk = VT != KV_F16 && tid >= WG - nblk;
    if (kblk || vblk) {
        const uint b = kblk ? tid : tid - (WG - nblk);
        float vals[32];
        for (uint c = 0; c < 32; ++c) vals[c] = kblk ? knorm[b * 8 + c / 4][c % 4] : vnew[kvh * HD4 + b * 8 + c / 4][c % 4];
        uint w[17];
        const uint n = kv_quantize(kblk ? KT : VT, vals, w);
        const uint at = (row_base / 32 + b) * n;
        for (uint c = 0; c < n; ++c) {
            if (kblk) kq16[at + c] = uint16_t(w[c]);
            else vq16[at + c] = uint16_t(w[c]);
        }
    }
#else
    for (uint e = tid; e < HD4; e += WG) {
        const vec4 kx = knorm[e], vx = vnew[kvh * HD4 + e];
        [[unroll]] for (uint c = 0; c < 4; ++c) {
            kw16[row_base + 4 * e + c] = float16_t(kx[c]);
            vw16[row_base + 4 * e + c] = float16_t(vx[c]);
        }
    }
#endif
    memoryBarrierBuffer();
    barrier();
}
#endif

void attend() {
    const uint tid = gl_LocalInvocationID.x;
    const uint kvh = gl_WorkGroupID.y;
    const uint split = gl_WorkGroupID.z;
    const uint n_gqa = p.n_head / p.n_head_kv;
    const uint row0 = gl_WorkGroupID.x * BR;
    const uint rows_here = min(BR, p.n_tokens * n_gqa - row0);
    const uint n_past = step[0];
    const uint n_kv = step[2];
    const uint seq_len = step[4];

    const SplitRange sr = split_range(BP, split, row0, rows_here, n_gqa, n_past, n_kv, seq_len);
    if (sr.begin >= n_kv) return;                  // inactive split: the merge skips it too
    const uint kv_begin = sr.begin, kv_end = sr.end, kv_first = sr.first;
    const uint last = kv_end - 1;

    uint orow[BR];                                 // row of q/out: t * n_head + h
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        const uint row = row0 + min(r, rows_here - 1);
        const uint t = row / n_gqa;
        orow[r] = t * p.n_head + kvh * n_gqa + (row - t * n_gqa);
    }
#ifndef QK_FUSE
    for (uint idx = tid; idx < BR * HD4; idx += WG) {
        const uint r = idx / HD4;
        qs[idx] = r < rows_here ? q[orow[r] * HD4 + idx - r * HD4] * p.scale : vec4(0.0);
    }
#endif

    // score lanes: 4 neighbouring lanes of a subgroup share a K row (the butterfly stays among them)
    const uint lin = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    const uint kq = lin % 4;                       // this lane's quarter of the row; its score row
    const uint krow = lin / 4;                     // its position within the block
    const uint my_row = row0 + min(kq, rows_here - 1);
    const uint my_lim = n_past + my_row / n_gqa;   // last position query row kq may see
    const uint my_lo = first_visible(my_lim, seq_len);
    const bool my_live = kq < rows_here;
    // P V threads
    const uint d8 = tid % HD8;
    const uint vg = tid / HD8;
    const uint stride8 = p.n_head_kv * HD8;
    const uint head8 = kvh * HD8;

    float m[BR], l[BR];
    vec4 acc[BR], acc2[BR];                        // O[r] dims 8 d8 .. 8 d8 + 3, + 4 .. + 7
    [[unroll]] for (uint r = 0; r < BR; ++r) { m[r] = NEG; l[r] = 0.0; acc[r] = vec4(0.0); acc2[r] = vec4(0.0); }

    const uint start = max(kv_begin, kv_first);
    uvec4 kr[KMAX], vr[VMAX];
#ifdef QK_FUSE
    // The workgroups that read row n_past (one token: the last row of their range) store it first.
    // First-block loads that cannot reach row n_past (every other workgroup's; a writer's whose first
    // block, V rows past BP included, ends before it) are issued before the norms, the rest after.
    const bool writer = start <= n_past && n_past < kv_end;
    const bool early = start < kv_end && (!writer || start + VG * VPT <= n_past);
    // (one expansion of the loads, not two: a quantized cache's dequantizing loads are most of the code)
    [[dont_unroll]] for (uint pass = 0; pass < 2; ++pass) {
        if (pass == 1) qk_prepare(orow, rows_here, kvh, n_past, writer);
        if (start < kv_end && early == (pass == 0)) LOAD_FIRST_BLOCK
    }
#else
    if (start < kv_end) LOAD_FIRST_BLOCK
    barrier();                                     // qs
#endif

    uint buf = 0;
    for (uint c0 = start; c0 < kv_end; c0 += BP) {
        float part[BR];                            // this lane's pieces of q_r . k
        [[unroll]] for (uint r = 0; r < BR; ++r) part[r] = 0.0;
        [[unroll]] for (uint i = 0; i < KMAX; ++i) {
            if (i < KP) {
                const uint u = (i * 4 + kq) * 2;   // qs index of the piece's first 4 dims
                const uvec4 w = kr[i];
                const vec4 k_lo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
                const vec4 k_hi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
                [[unroll]] for (uint r = 0; r < BR; ++r)
                    part[r] += dot(qs[r * HD4 + u], k_lo) + dot(qs[r * HD4 + u + 1], k_hi);
            }
        }
        // Butterfly over the 4 lanes: after the xor-2 step a lane holds rows {hi2 * 2, hi2 * 2 + 1}
        // summed over 2 lanes, after the xor-1 step row kq summed over all 4.
        const bool hi2 = (kq & 2u) != 0u;
        const bool hi1 = (kq & 1u) != 0u;
        const float h0 = (hi2 ? part[2] : part[0]) + subgroupShuffleXor(hi2 ? part[0] : part[2], 2u);
        const float h1 = (hi2 ? part[3] : part[1]) + subgroupShuffleXor(hi2 ? part[1] : part[3], 2u);
        const float s = (hi1 ? h1 : h0) + subgroupShuffleXor(hi1 ? h0 : h1, 1u);
        const uint pos = c0 + krow;
        const bool ok = my_live && pos < kv_end && pos <= my_lim && pos >= my_lo;
        sc[buf * BP + krow][kq] = ok ? s : NEG;
        barrier();

        // the next block's loads, in flight during this block's P V
        uvec4 vcur[VMAX];
        [[unroll]] for (uint i = 0; i < VMAX; ++i)
            if (i < VPT) vcur[i] = vr[i];
        const uint c1 = c0 + BP;
        if (c1 < kv_end) {
            const uint kb = min(c1 + krow, last) * stride8 + head8 + kq;
            [[unroll]] for (uint i = 0; i < KMAX; ++i)
                if (i < KP) kr[i] = K8(kb + i * 4);
            [[unroll]] for (uint i = 0; i < VMAX; ++i)
                if (i < VPT) vr[i] = V8(min(c1 + vg + i * VG, last) * stride8 + head8 + d8);
        }

        if (vg < VG) {
            vec4 sv[VMAX];
            [[unroll]] for (uint i = 0; i < VMAX; ++i)
                if (i < VPT) sv[i] = vg + i * VG < BP ? sc[buf * BP + vg + i * VG] : vec4(NEG);
            [[unroll]] for (uint r = 0; r < BR; ++r) {
                float mx = m[r];
                [[unroll]] for (uint i = 0; i < VMAX; ++i)
                    if (i < VPT) mx = max(mx, sv[i][r]);
                const float alpha = exp(m[r] - mx);
                m[r] = mx;
                l[r] *= alpha;
                acc[r] *= alpha;
                acc2[r] *= alpha;
            }
            [[unroll]] for (uint i = 0; i < VMAX; ++i) {
                if (i < VPT) {
                    const uvec4 w = vcur[i];
                    const vec4 va = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
                    const vec4 vb = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
                    [[unroll]] for (uint r = 0; r < BR; ++r) {
                        const float pr = sv[i][r] > 0.5 * NEG ? exp(sv[i][r] - m[r]) : 0.0;
                        l[r] += pr;
                        acc[r] += pr * va;
                        acc2[r] += pr * vb;
                    }
                }
            }
        }
        buf ^= 1u;
    }

    // Merge the row groups: M = max_g m_g, l = sum_g e^(m_g - M) l_g, O = sum_g e^(m_g - M) O_g.
    if (vg < VG && d8 == 0) {
        [[unroll]] for (uint r = 0; r < BR; ++r) gml[vg * BR + r] = vec2(m[r], l[r]);
    }
    barrier();
    float mm[BR], ll[BR];
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        mm[r] = NEG;
        for (uint g = 0; g < VG; ++g) mm[r] = max(mm[r], gml[g * BR + r].x);
        ll[r] = 0.0;
        for (uint g = 0; g < VG; ++g) {
            const vec2 v = gml[g * BR + r];
            ll[r] += v.x > 0.5 * NEG ? exp(v.x - mm[r]) * v.y : 0.0;
        }
    }
    if (vg < VG) {
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            const float w = m[r] > 0.5 * NEG ? exp(m[r] - mm[r]) : 0.0;
            po[(vg * BR + r) * HD4 + 2 * d8] = acc[r] * w;
            po[(vg * BR + r) * HD4 + 2 * d8 + 1] = acc2[r] * w;
        }
    }
    barrier();
    for (uint idx = tid; idx < BR * HD4; idx += WG) {
        const uint r = idx / HD4;
        const uint e = idx - r * HD4;
        vec4 sum = vec4(0.0);
        for (uint g = 0; g < VG; ++g) sum += po[(g * BR + r) * HD4 + e];
        qs[idx] = sum;
    }
    barrier();
    finish_rows(n_kv - sr.base, sr.chunk, split, row0, rows_here, kvh, n_gqa, orow, mm, ll);
}

void main() {
    attend();
#ifdef CHAIN
    // every store of this workgroup (output rows, split partials) made visible, then one count
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x == 0) atomicAdd(chain[p.chain_slot], 1u);
#endif
}
