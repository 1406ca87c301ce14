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
// ROPE (one-token steps, f16 caches; kernels/attention.py rope_fold_ok): what rope_kv.comp does
// before attention is done here, so its dispatch and dependent stage go. q, knew, vnew are the new
// token's raw Q/K/V product rows. Every workgroup (each split, each row block) norms (qk_norm: the
// per-head RMS norms of qwen3, weights qn / kn) and rotates its q rows into qs as its prologue. The
// workgroups whose split holds the new token's row new_row = n_past (the last active split) norm and
// rotate the KV head's k and convert its v to f16 in shared memory (kn8, vn8); row block 0 of them
// also stores both into the caches for later steps, at its end. Their K/V loads of that row read
// another row (LOAD_ROW) and take kn8 / vn8 instead, so no workgroup reads a location this dispatch
// stores: the caches' stores are only read by later dispatches, behind the usual barriers. The rotation and norm
// are rope_kv.comp's expressions (rope_common.glsl; dims past rope_dim copied, normed where qk_norm).
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
layout(std430, binding = 1) readonly buffer K { uvec4 k8[]; };   // 8 halves per element
layout(std430, binding = 2) readonly buffer V { uvec4 v8[]; };
layout(std430, binding = 3) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 4) writeonly buffer Out { vec4 o[]; };
#ifdef KV_QUANT
// Either cache quantized (kv_quant.glsl), its type a specialization constant (KT, VT): read as
// uint16 words through a second declaration of its binding, dequantized to 8 halves as loaded.
#include "kv_quant.glsl"
layout(constant_id = 2) const uint KT = KV_F16;
layout(constant_id = 3) const uint VT = KV_F16;
layout(std430, binding = 1) readonly buffer KQ { uint16_t kq16[]; };
layout(std430, binding = 2) readonly buffer VQ { uint16_t vq16[]; };
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
#ifdef CHAIN
// CHAIN: every workgroup counts itself done on chain[p.chain_slot] once its stores are visible, so
// that the next dispatch (the output projection, recorded without a barrier) can wait for the whole
// grid in its shader (matvec_stream.comp WAIT) instead of behind a pipeline barrier.
#ifdef SPLIT
layout(std430, binding = 8) volatile coherent buffer Chain { uint chain[]; };
#else
layout(std430, binding = 5) volatile coherent buffer Chain { uint chain[]; };
#endif
#endif
#ifdef ROPE
// the rope bindings follow the variant's others
#if defined(SPLIT) && defined(CHAIN)
#define RB 9
#elif defined(SPLIT)
#define RB 8
#elif defined(CHAIN)
#define RB 6
#else
#define RB 5
#endif
// the caches again, for the new token's row (only row n_past is written; the loads through k8 / v8
// never read it: LOAD_ROW)
layout(std430, binding = 1) writeonly buffer KW { uvec4 kw8[]; };
layout(std430, binding = 2) writeonly buffer VW { uvec4 vw8[]; };
layout(std430, binding = RB) readonly buffer KNew { vec4 knew[]; };      // [n_head_kv * HD] raw k
layout(std430, binding = RB + 1) readonly buffer VNew { vec4 vnew[]; };  // [n_head_kv * HD] v
layout(std430, binding = RB + 2) readonly buffer QN { float qn[]; };     // [HD] (qk_norm)
layout(std430, binding = RB + 3) readonly buffer KN { float kn[]; };     // [HD] (qk_norm)
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_head; uint n_head_kv; uint n_splits;
    uint min_chunk;    // positions per split at least (a multiple of BP)
    float scale;
    uint window;       // sliding window: positions a row sees, its own included (0: all)
#ifdef CHAIN
    uint chain_slot;
#endif
#ifdef ROPE
    // rope_common.glsl's fields (kernels/rope.py RopeParams.angles), then the norms'
    uint rope_dim; uint neox;
    float log2_theta_scale; float freq_scale; float ext_factor; float attn_factor; float corr_low; float corr_high;
    uint qk_norm; float eps;
#endif
} p;

shared vec4 qs[BR * HD4];          // scaled queries; at the end, the merged O
shared vec4 sc[2 * BP];            // scores [parity][position], rows in x y z w
shared vec4 po[8 * WG];            // the row groups' outputs [vg][r][HD4] (VG * HD <= 8 WG)
shared vec2 gml[BR * WG];          // the row groups' (m, l) [vg][r]

#include "attention_split.glsl"
#ifdef ROPE
#include "rope_common.glsl"
const uint SEG = WG / 8;           // threads per head in the prologue's sums of squares
shared float red[WG];              // their partial sums [slot][SEG]
shared uvec4 kn8[HD8];             // the new token's rotated k and its v, f16 as the caches hold them
shared uvec4 vn8[HD8];

uvec4 pack8(const vec4 a, const vec4 b) {
    return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

// The prologue: qs = scale * rotate(norm(q rows)); with has_new, kn8 / vn8 = the new token's k head
// (normed, rotated) and v head as f16 (attend() stores them into the caches at its end, after its
// own loads: a load of that row which missed take_new would read the NaN or stale row, not these).
// po (free until the row groups' merge) holds the raw heads: slots 0 .. BR-1 the q rows, slot BR
// the k head.
void rope_prologue(const uint kvh, const uint rows_here, const uint orow[BR], const uint pos, const bool has_new) {
    const uint tid = gl_LocalInvocationID.x;
    {
        const uint slot = tid / SEG, seg = tid - slot * SEG;
        const bool live = slot < BR ? slot < rows_here : slot == BR && has_new;
        float ss = 0.0;
        if (live) {
            for (uint j = seg; j < HD4; j += SEG) {
                const vec4 x = slot < BR ? q[orow[min(slot, BR - 1)] * HD4 + j] : knew[kvh * HD4 + j];
                po[slot * HD4 + j] = x;
                ss += dot(x, x);
            }
        }
        red[tid] = ss;
        if (has_new && tid < HD8) {
            vn8[tid] = pack8(vnew[kvh * HD4 + 2 * tid], vnew[kvh * HD4 + 2 * tid + 1]);
        }
        for (uint idx = tid; idx < BR * HD4; idx += WG)
            if (idx / HD4 >= rows_here) qs[idx] = vec4(0.0);
    }
    barrier();
    // one thread per pair (i < rope_dim / 2: rope_pair(i) rotated) or pair of dims past rope_dim
    // (copied), normed in place: q rows into qs, the k head back into its slot of po
    const uint half_hd = HD / 2, rhalf = p.rope_dim / 2;
    const float rpos = float(rope_position(pos));
    // where WG is a multiple of half_hd (head_dim 32, 64, 128, 256) a thread's pair is the same in
    // every pass: its angle once
    const bool same_pair = WG % half_hd == 0;
    const vec2 cs0 = same_pair && tid % half_hd < rhalf ? rope_cos_sin(tid % half_hd, rpos) : vec2(0.0);
    for (uint idx = tid; idx < (BR + 1) * half_hd; idx += WG) {
        const uint slot = idx / half_hd, i = idx - slot * half_hd;
        const bool is_q = slot < BR;
        if (is_q ? slot >= rows_here : !has_new) continue;
        const uvec2 e = i < rhalf ? rope_pair(i) : uvec2(p.rope_dim + 2 * (i - rhalf)) + uvec2(0, 1);
        float x0 = po[slot * HD4 + e.x / 4][e.x % 4], x1 = po[slot * HD4 + e.y / 4][e.y % 4];
        if (p.qk_norm != 0) {
            float ss = 0.0;
            for (uint s = 0; s < SEG; ++s) ss += red[slot * SEG + s];
            const float scale = inversesqrt(ss / float(HD) + p.eps);
            x0 *= scale * (is_q ? qn[e.x] : kn[e.x]);
            x1 *= scale * (is_q ? qn[e.y] : kn[e.y]);
        }
        float r0 = x0, r1 = x1;
        if (i < rhalf) {
            const vec2 cs = same_pair ? cs0 : rope_cos_sin(i, rpos);
            r0 = x0 * cs.x - x1 * cs.y;
            r1 = x0 * cs.y + x1 * cs.x;
        }
        if (is_q) {
            qs[slot * HD4 + e.x / 4][e.x % 4] = r0 * p.scale;
            qs[slot * HD4 + e.y / 4][e.y % 4] = r1 * p.scale;
        } else {
            po[slot * HD4 + e.x / 4][e.x % 4] = r0;
            po[slot * HD4 + e.y / 4][e.y % 4] = r1;
        }
    }
    barrier();
    if (has_new && tid < HD8) kn8[tid] = pack8(po[BR * HD4 + 2 * tid], po[BR * HD4 + 2 * tid + 1]);
    // the caller's next barrier publishes kn8, vn8 and qs
}
#endif

#ifdef ROPE
// The K and V pieces just loaded for the block at c0 whose row is the new token's: the shared copies
void take_new(const uint c0, const uint last, const uint pos, const uint kq, const uint krow, const uint vg,
              const uint d8, inout uvec4 kr[KMAX], inout uvec4 vr[VMAX]) {
    if (min(c0 + krow, last) == pos) {
        [[unroll]] for (uint i = 0; i < KMAX; ++i)
            if (i < KP) kr[i] = kn8[kq + i * 4];
    }
    [[unroll]] for (uint i = 0; i < VMAX; ++i)
        if (i < VPT && min(c0 + vg + i * VG, last) == pos) vr[i] = vn8[d8];
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
#ifdef ROPE
    const uint new_row = n_past;                   // the new token's row (one token per step)
    const bool has_new = kv_begin <= new_row && new_row < kv_end;
    // Loads of the new row read another row, one this dispatch does not write (the row below, or
    // at row 0 row 1, whatever it holds), and take_new replaces what they read: no load of this
    // dispatch meets its stores, which only later steps read.
    const uint alt_row = new_row > 0 ? new_row - 1 : min(1u, kw8.length() / (p.n_head_kv * HD8) - 1);
#define LOAD_ROW(r) ((r) == new_row ? alt_row : (r))
#else
#define LOAD_ROW(r) (r)
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
    if (start < kv_end) {
        const uint kb = LOAD_ROW(min(start + krow, last)) * stride8 + head8 + kq;
        [[unroll]] for (uint i = 0; i < KMAX; ++i)
            if (i < KP) kr[i] = K8(kb + i * 4);
        [[unroll]] for (uint i = 0; i < VMAX; ++i)
            if (i < VPT) vr[i] = V8(LOAD_ROW(min(start + vg + i * VG, last)) * stride8 + head8 + d8);
    }
#ifdef ROPE
    // after the first block's loads: they are in flight during the prologue
    rope_prologue(kvh, rows_here, orow, new_row, has_new);
#endif
    barrier();                                     // qs (ROPE: and kn8, vn8)
#ifdef ROPE
    if (has_new && start < kv_end) take_new(start, last, new_row, kq, krow, vg, d8, kr, vr);
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
            const uint kb = LOAD_ROW(min(c1 + krow, last)) * stride8 + head8 + kq;
            [[unroll]] for (uint i = 0; i < KMAX; ++i)
                if (i < KP) kr[i] = K8(kb + i * 4);
            [[unroll]] for (uint i = 0; i < VMAX; ++i)
                if (i < VPT) vr[i] = V8(LOAD_ROW(min(c1 + vg + i * VG, last)) * stride8 + head8 + d8);
#ifdef ROPE
            if (has_new) take_new(c1, last, new_row, kq, krow, vg, d8, kr, vr);
#endif
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
#ifdef ROPE
    // row block 0 stores the new row for later steps (within the cache: kw8's length is n_ctx rows)
    if (has_new && gl_WorkGroupID.x == 0 && tid < HD8 && (new_row + 1) * stride8 <= kw8.length()) {
        kw8[new_row * stride8 + head8 + tid] = kn8[tid];
        vw8[new_row * stride8 + head8 + tid] = vn8[tid];
    }
#endif
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
