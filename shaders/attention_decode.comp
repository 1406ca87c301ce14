#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_shuffle : require
// Flash attention for decode: at most 4 query rows per KV head (one token and its GQA heads, or a
// few tokens of one head), over the f16 (KV_QUANT: or q8_0 / q4_0) KV cache. Same bindings, push constants, grid, split-KV
// scheme, sliding window and sinks (SINKS) as attention.comp (see there); this kernel is shaped for latency
// instead of reuse.
//
// Why a kernel of its own: a decode step gives attention one workgroup per row block, KV head and
// split (8 on a 7.2B at short context with 4 rows per block, 32 with 1), so each workgroup's
// instruction chain is the cost, not the bytes. Here a
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
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 128;
layout(constant_id = 1) const uint HD = 128;    // head_dim: a multiple of 32, at most 256
// BR: query rows per workgroup, 1, 2 or 4 (one token's GQA heads of a KV head, or a few tokens of one
// head): fewer rows, more workgroups over the same KV rows and a shorter chain of arithmetic per block
// (the work of a decode step's attention is its latency: kernels/selection.py DECODE_ATTENTION_ROWS).
layout(constant_id = 4) const uint BR = 4;
const uint HD4 = HD / 4;
const uint HD8 = HD / 8;                // threads per V row (one 16-byte piece each)
const uint BP = WG / 4;                 // positions per block: 4 lanes per K row
const uint KP = HD / 32;                // 16-byte K loads per lane per block (<= KMAX)
const uint KMAX = 8;
const uint VG = WG / HD8;               // V row groups; threads past VG * HD8 sit out P V
const uint VPT = (BP + VG - 1) / VG;    // V rows per thread per block (<= VMAX)
const uint VMAX = 16;
const float NEG = -1.0e30;

#ifdef WAIT
// WAIT (one-token steps, kernels/chain.py): recorded right after its producer without a barrier
// (rope_kv.comp, or the Q/K/V products that rotate and store K and V themselves); q and row n_past of
// the caches are its stores, read after its count is seen: through coherent declarations (a read-only
// binding may be served by caches that never see another dispatch's writes).
#define FROM_PRODUCER coherent readonly
#else
#define FROM_PRODUCER readonly
#endif
layout(std430, binding = 0) FROM_PRODUCER buffer Q { vec4 q[]; };
layout(std430, binding = 1) FROM_PRODUCER buffer K { uvec4 k8[]; };   // 8 halves per element
layout(std430, binding = 2) FROM_PRODUCER buffer V { uvec4 v8[]; };
layout(std430, binding = 3) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 4) writeonly buffer Out { vec4 o[]; };
#ifdef KV_QUANT
// Either cache quantized (kv_quant.glsl), its type a specialization constant (KT, VT): read as
// uint16 words through a second declaration of its binding, dequantized to 8 halves as loaded.
#include "kv_quant.glsl"
layout(constant_id = 2) const uint KT = KV_F16;
layout(constant_id = 3) const uint VT = KV_F16;
layout(std430, binding = 1) FROM_PRODUCER buffer KQ { uint16_t kq16[]; };
layout(std430, binding = 2) FROM_PRODUCER buffer VQ { uint16_t vq16[]; };
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
#if defined(CHAIN) || defined(WAIT)
// CHAIN: every workgroup counts itself done on chain[p.chain_slot] once its stores are visible (those
// with no work in bulk: attend()), so that the next dispatch (the output projection, recorded without a
// barrier) can wait for the whole grid in its shader (matvec_stream.comp WAIT) instead of behind a
// pipeline barrier.
// WAIT: one lane polls chain[p.wait_slot] until the producer's p.wait_n workgroups have counted; the
// first block's K/V loads go before the wait where that block holds no row it writes (row n_past).
#ifdef SPLIT
layout(std430, binding = 8) volatile coherent buffer Chain { uint chain[]; };
#else
layout(std430, binding = 5) volatile coherent buffer Chain { uint chain[]; };
#endif
#endif
#ifdef SINKS
// SINKS (gpt-oss; attention.comp): the kernel's last binding, after Out (4), the split scratch (5-7)
// and Chain where the variant has them (Vulkan bindings numbered 0 .. n-1: kernels/attention.py).
// A weight: no step writes it, so a plain read-only binding even in WAIT variants.
#if defined(SPLIT) && (defined(CHAIN) || defined(WAIT))
layout(std430, binding = 9) readonly buffer Sinks { float sinks[]; };   // [n_head]
#elif defined(SPLIT)
layout(std430, binding = 8) readonly buffer Sinks { float sinks[]; };
#elif defined(CHAIN) || defined(WAIT)
layout(std430, binding = 6) readonly buffer Sinks { float sinks[]; };
#else
layout(std430, binding = 5) readonly buffer Sinks { float sinks[]; };
#endif
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_head; uint n_head_kv; uint n_splits;
    uint min_chunk;    // positions per split at least (a multiple of BP)
    float scale;
    uint window;       // sliding window: positions a row sees, its own included (0: all)
#ifdef CHAIN
    uint chain_slot;
#endif
#ifdef WAIT
    uint wait_slot; uint wait_n;
#endif
} p;

shared vec4 qs[BR * HD4];          // scaled queries; at the end, the merged O
shared vec4 sc[2 * BP];            // scores [parity][position], rows in x y z w
shared vec4 po[8 * WG];            // the row groups' outputs [vg][r][HD4] (VG * HD <= 8 WG)
shared vec2 gml[BR * WG];          // the row groups' (m, l) [vg][r]

#include "attention_split.glsl"

#ifdef WAIT
#include "chain_wait.glsl"
#endif

// The first block's K and V loads (positions from `start`, rows past `last` clamped to it).
void first_loads(const uint start, const uint last, const uint krow, const uint kq, const uint vg, const uint d8,
                 const uint stride8, const uint head8, inout uvec4 kr[KMAX], inout uvec4 vr[VMAX]) {
    const uint kb = min(start + krow, last) * stride8 + head8 + kq;
    [[unroll]] for (uint i = 0; i < KMAX; ++i)
        if (i < KP) kr[i] = K8(kb + i * 4);
    [[unroll]] for (uint i = 0; i < VMAX; ++i)
        if (i < VPT) vr[i] = V8(min(start + vg + i * VG, last) * stride8 + head8 + d8);
}

// The scaled queries of this workgroup's rows into qs.
void load_queries(const uint rows_here, const uint orow[BR]) {
    for (uint idx = gl_LocalInvocationID.x; idx < BR * HD4; idx += WG) {
        const uint r = idx / HD4;
        qs[idx] = r < rows_here ? q[orow[r] * HD4 + idx - r * HD4] * p.scale : vec4(0.0);
    }
}

// attend() returns the counts this workgroup adds to the chain's counter (CHAIN): 1 where it worked.
// Splits past n_kv have no work and add theirs in bulk instead, one atomic for many: the first of a
// row block and KV head those of the splits from it on, the others none. Why: at short contexts most
// of a grid sized for the whole context is idle, and up to 512 atomics on the counter the consumer
// polls become a few.
uint attend() {
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
    if (sr.begin >= n_kv)                          // inactive split: the merge skips it too
        return sr.begin - sr.chunk < n_kv ? p.n_splits - split : 0u;
    const uint kv_begin = sr.begin, kv_end = sr.end, kv_first = sr.first;
    const uint last = kv_end - 1;

    uint orow[BR];                                 // row of q/out: t * n_head + h
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        const uint row = row0 + min(r, rows_here - 1);
        const uint t = row / n_gqa;
        orow[r] = t * p.n_head + kvh * n_gqa + (row - t * n_gqa);
    }
#ifndef WAIT
    load_queries(rows_here, orow);
#endif

    // score lanes: 4 neighbouring lanes of a subgroup share a K row (the butterfly stays among them)
    const uint lin = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
    const uint kq = lin % 4;                       // this lane's quarter of the row; its score row
    const uint krow = lin / 4;                     // its position within the block
    const uint my_r = kq & (BR - 1);              // the row whose full score this lane ends with
    const uint my_row = row0 + min(my_r, rows_here - 1);
    const uint my_lim = n_past + my_row / n_gqa;   // last position query row my_r may see
    const uint my_lo = first_visible(my_lim, seq_len);
    const bool my_live = my_r < rows_here;
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
#ifdef WAIT
    const bool early = start + BP <= n_past;      // the first block ends before the producer's row
    if (early && start < kv_end) first_loads(start, last, krow, kq, vg, d8, stride8, head8, kr, vr);
    wait_for_producer();
    if (!early && start < kv_end) first_loads(start, last, krow, kq, vg, d8, stride8, head8, kr, vr);
    load_queries(rows_here, orow);
#else
    if (start < kv_end) first_loads(start, last, krow, kq, vg, d8, stride8, head8, kr, vr);
#endif
    barrier();                                     // qs

    uint buf = 0;
    for (uint c0 = start; c0 < kv_end; c0 += BP) {
        float part[4];                             // this lane's pieces of q_r . k (r < BR)
        [[unroll]] for (uint r = 0; r < 4; ++r) part[r] = 0.0;
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
        // Butterfly over the 4 lanes. BR 4: after the xor-2 step a lane holds rows {hi2 * 2,
        // hi2 * 2 + 1} summed over 2 lanes, after the xor-1 step row kq summed over all 4. BR 2: the
        // xor-1 step leaves row kq & 1 summed over a pair, the xor-2 step adds the other pair's. BR 1:
        // both steps sum row 0.
        const bool hi2 = (kq & 2u) != 0u;
        const bool hi1 = (kq & 1u) != 0u;
        float s;
        if (BR == 4) {
            const float h0 = (hi2 ? part[2] : part[0]) + subgroupShuffleXor(hi2 ? part[0] : part[2], 2u);
            const float h1 = (hi2 ? part[3] : part[1]) + subgroupShuffleXor(hi2 ? part[1] : part[3], 2u);
            s = (hi1 ? h1 : h0) + subgroupShuffleXor(hi1 ? h0 : h1, 1u);
        } else if (BR == 2) {
            const float h = (hi1 ? part[1] : part[0]) + subgroupShuffleXor(hi1 ? part[0] : part[1], 1u);
            s = h + subgroupShuffleXor(h, 2u);
        } else {
            const float h = part[0] + subgroupShuffleXor(part[0], 1u);
            s = h + subgroupShuffleXor(h, 2u);
        }
        const uint pos = c0 + krow;
        const bool ok = my_live && pos < kv_end && pos <= my_lim && pos >= my_lo;
        if (kq < BR) sc[buf * BP + krow][kq] = ok ? s : NEG;
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
    return 1u;
}

void main() {
    const uint counts = attend();
#ifdef CHAIN
    // every store of this workgroup (output rows, split partials) made visible, then its count
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationID.x == 0 && counts > 0u) atomicAdd(chain[p.chain_slot], counts);
#endif
}
