#version 450
#include "common.glsl"
// One dispatch for everything between the Q/K/V products and attention, per token t at KV row
// pos = n_past + t (n_past from the step buffer); the rotation angle uses rope_position(pos)
// (pos itself, or pos % seq_len when the batch holds several sequences: rope_common.glsl):
//   q[t]            rotated in place                   (n_heads pairs of each q head)
//   kcache[pos]     = f16(rotate(k[t]))                 (rotated dims; dims past rope_dim copied)
//   vcache[pos]     = f16(v[t])
// It replaces two RoPE and two KV-store dispatches and one dependent stage. Work items of a token,
// in order: q pairs, k pairs, k dims past rope_dim, v elements. Grid (ceil(items / WG), n_tokens).
// QK_NORM (qwen3's per-head RMS norm of q and k before RoPE, rope_dim == head_dim): the norms too,
// another dispatch and stage fewer. Then a workgroup is one head (q heads, then k heads; WG >=
// head_dim / 2 threads, thread i the pair i) or a block of WG v elements: grid (n_heads +
// n_heads_kv + ceil(kv_width / WG), n_tokens).
// KV_QUANT: either cache may be quantized (kv_quant.glsl; types: specialization constants 1 (K) and
// 2 (V)). Then the grid's workgroups come in three runs, each uniform: q pairs (WG a workgroup), k,
// v (WG items of an f16 cache as above, or 2 WG values of a quantized one). A quantized cache's
// workgroup puts its 2 WG values (K's rotated one dim at a time: a neox pair may straddle two blocks)
// into shared memory, then 16 threads write each block of 32 (kv_quant.glsl KV_STORE_COOP). Why not a
// thread per block: its 32 rotations and its quantization in a row made rope_kv the slowest dispatch
// of a decode step (H200, 7.2B: 16 us a layer serialized). With QK_NORM a k head's rotated values go
// through shared memory the same way (head_dim / 2 threads, 16 a block) and a v workgroup takes 2 WG
// values.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
#ifdef HAS_FREQS
layout(std430, binding = 1) readonly buffer Freqs { float freqs[]; };
#define B0 2
#else
#define B0 1
#endif
#ifdef WAIT
// WAIT (one-token steps, kernels/chain.py edge q): recorded right after the Q/K/V products without a
// barrier; q, k and v are read once their count is seen, through coherent declarations (a read-only
// binding may be served by caches that never see another dispatch's writes).
#define FROM_PRODUCTS coherent
#else
#define FROM_PRODUCTS
#endif
layout(std430, binding = B0) FROM_PRODUCTS buffer Q { float q[]; };
layout(std430, binding = B0 + 1) FROM_PRODUCTS readonly buffer K { float k[]; };
layout(std430, binding = B0 + 2) FROM_PRODUCTS readonly buffer V { float v[]; };
layout(std430, binding = B0 + 3) writeonly buffer KC { float16_t kcache[]; };
layout(std430, binding = B0 + 4) writeonly buffer VC { float16_t vcache[]; };
#ifdef KV_QUANT
#include "kv_quant.glsl"
layout(constant_id = 1) const uint KT = KV_F16;
layout(constant_id = 2) const uint VT = KV_F16;
// the same caches as uint16 words: a quantized one's blocks
layout(std430, binding = B0 + 3) writeonly buffer KCQ { uint16_t kcache16[]; };
layout(std430, binding = B0 + 4) writeonly buffer VCQ { uint16_t vcache16[]; };
#endif
#ifdef QK_NORM
layout(std430, binding = B0 + 5) readonly buffer QN { float qn[]; };
layout(std430, binding = B0 + 6) readonly buffer KN { float kn[]; };
#define B_CHAIN (B0 + 7)
#else
#define B_CHAIN (B0 + 5)
#endif
#if defined(CHAIN) || defined(WAIT)
// CHAIN (one-token steps, kernels/chain.py edge k): every workgroup, padding and early exits included,
// counts itself done on chain[p.chain_slot] once its stores are visible, so that the decode attention
// after it (attention_decode.comp WAIT, recorded without a barrier) waits in its shader instead.
// WAIT: one lane polls chain[p.wait_slot] until the Q/K/V products' p.wait_n workgroups have counted.
layout(std430, binding = B_CHAIN) volatile coherent buffer Chain { uint chain[]; };
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_heads; uint head_dim; uint rope_dim; uint neox;
    float log2_theta_scale; float freq_scale; float ext_factor; float attn_factor; float corr_low; float corr_high;
    uint n_heads_kv; uint n_ctx;
#ifdef QK_NORM
    float eps;
#endif
#ifdef CHAIN
    uint chain_slot;
#endif
#ifdef WAIT
    uint wait_slot; uint wait_n;
#endif
} p;
#include "rope_common.glsl"

#ifdef KV_QUANT
shared float kv_vals[512];   // the blocks a workgroup writes (2 WG values; a k head of up to 512 dims)
KV_STORE_COOP(store_k_block, kcache16)
KV_STORE_COOP(store_v_block, vcache16)

// Thread i's part in writing the blocks of the 2 WG values kv_vals[0 ..] (after a barrier): block i / 16
// of the row's blocks starting at b0 (of n_blocks in all, cache row pos).
void store_blocks(const bool is_k, const uint pos, const uint b0, const uint n_blocks) {
    const uint i = gl_LocalInvocationID.x, b = b0 + i / 16;
    if (b >= n_blocks) return;
    if (is_k) store_k_block(KT, (i / 16) * 32, pos * n_blocks + b, i % 16);
    else store_v_block(VT, (i / 16) * 32, pos * n_blocks + b, i % 16);
}

// A v workgroup of a quantized cache: v's values 2 WG c .. 2 WG (c + 1) - 1 of token t
void store_v_chunk(const uint t, const uint pos, const uint c, const uint kv_width) {
    const uint i = gl_LocalInvocationID.x, e = 2 * (c * gl_WorkGroupSize.x + i);
    if (e < kv_width) {
        kv_vals[2 * i] = v[t * kv_width + e];
        kv_vals[2 * i + 1] = v[t * kv_width + e + 1];
    }
    barrier();
    store_blocks(false, pos, c * gl_WorkGroupSize.x / 16, kv_width / 32);
}
#endif

#if defined(QK_NORM) && defined(KV_QUANT)
shared float red[64];

void rope_kv_main() {
    const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, i = gl_LocalInvocationID.x;
    const uint pos = step[0] + t;
    if (t >= p.n_tokens || pos >= p.n_ctx) return;   // uniform per workgroup
    const uint hd = p.head_dim, half_dim = hd / 2, kv_width = p.n_heads_kv * hd;
    if (h >= p.n_heads + p.n_heads_kv) {             // a block of v: WG elements, or 2 WG values
        const uint c = h - p.n_heads - p.n_heads_kv, j = c * gl_WorkGroupSize.x + i;
        if (VT == KV_F16) {
            if (j < kv_width) vcache[pos * kv_width + j] = float16_t(v[t * kv_width + j]);
        } else {
            store_v_chunk(t, pos, c, kv_width);
        }
        return;
    }
    const bool is_q = h < p.n_heads;
    const uint head = is_q ? h : h - p.n_heads;
    const uvec2 e = rope_pair(min(i, half_dim - 1));
    float x0 = 0.0, x1 = 0.0;
    if (i < half_dim) {
        const uint base = is_q ? (t * p.n_heads + head) * hd : t * kv_width + head * hd;
        x0 = is_q ? q[base + e.x] : k[base + e.x];
        x1 = is_q ? q[base + e.y] : k[base + e.y];
    }
    float ss = subgroupAdd(x0 * x0 + x1 * x1);
    if (subgroupElect()) red[gl_SubgroupID] = ss;
    barrier();
    ss = 0.0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) ss += red[s];
    const float scale = inversesqrt(ss / float(hd) + p.eps);
    float r0 = 0.0, r1 = 0.0;
    if (i < half_dim) {
        x0 *= scale * (is_q ? qn[e.x] : kn[e.x]);
        x1 *= scale * (is_q ? qn[e.y] : kn[e.y]);
        const vec2 cs = rope_cos_sin(i, float(rope_position(pos)));
        r0 = x0 * cs.x - x1 * cs.y;
        r1 = x0 * cs.y + x1 * cs.x;
    }
    if (is_q) {                                      // uniform per workgroup
        if (i < half_dim) {
            const uint base = (t * p.n_heads + head) * hd;
            q[base + e.x] = r0;
            q[base + e.y] = r1;
        }
        return;
    }
    if (KT == KV_F16) {
        if (i < half_dim) {
            const uint base = pos * kv_width + head * hd;
            kcache[base + e.x] = float16_t(r0);
            kcache[base + e.y] = float16_t(r1);
        }
        return;
    }
    if (i < half_dim) {
        kv_vals[e.x] = r0;
        kv_vals[e.y] = r1;
    }
    barrier();
    if (i < half_dim) store_blocks(true, pos, head * (hd / 32), kv_width / 32);
}
#elif defined(QK_NORM)
shared float red[64];

void rope_kv_main() {
    const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, i = gl_LocalInvocationID.x;
    const uint pos = step[0] + t;
    if (t >= p.n_tokens || pos >= p.n_ctx) return;   // uniform per workgroup
    const uint hd = p.head_dim, half_dim = hd / 2, kv_width = p.n_heads_kv * hd;
    if (h >= p.n_heads + p.n_heads_kv) {             // a block of v
        const uint j = (h - p.n_heads - p.n_heads_kv) * gl_WorkGroupSize.x + i;
        if (j < kv_width) vcache[pos * kv_width + j] = float16_t(v[t * kv_width + j]);
        return;
    }
    const bool is_q = h < p.n_heads;
    const uint head = is_q ? h : h - p.n_heads;
    const uvec2 e = rope_pair(min(i, half_dim - 1));
    float x0 = 0.0, x1 = 0.0;
    if (i < half_dim) {
        const uint base = is_q ? (t * p.n_heads + head) * hd : t * kv_width + head * hd;
        x0 = is_q ? q[base + e.x] : k[base + e.x];
        x1 = is_q ? q[base + e.y] : k[base + e.y];
    }
    // the head's sum of squares: subgroups, then shared memory
    float ss = subgroupAdd(x0 * x0 + x1 * x1);
    if (subgroupElect()) red[gl_SubgroupID] = ss;
    barrier();
    ss = 0.0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) ss += red[s];
    const float scale = inversesqrt(ss / float(hd) + p.eps);
    if (i >= half_dim) return;
    x0 *= scale * (is_q ? qn[e.x] : kn[e.x]);
    x1 *= scale * (is_q ? qn[e.y] : kn[e.y]);
    const vec2 cs = rope_cos_sin(i, float(rope_position(pos)));
    const float r0 = x0 * cs.x - x1 * cs.y, r1 = x0 * cs.y + x1 * cs.x;
    if (is_q) {
        const uint base = (t * p.n_heads + head) * hd;
        q[base + e.x] = r0;
        q[base + e.y] = r1;
    } else {
        const uint base = pos * kv_width + head * hd;
        kcache[base + e.x] = float16_t(r0);
        kcache[base + e.y] = float16_t(r1);
    }
}
#elif defined(KV_QUANT)

// Rotated value of dim `dim` of a k head whose values start at k[base]: each of a pair's two dims
// computed as the unquantized path computes it.
float k_rotated(const uint base, const uint dim, const float rpos) {
    if (dim >= p.rope_dim) return k[base + dim];
    const uint half_dim = p.rope_dim / 2;
    const bool first = p.neox != 0 ? dim < half_dim : (dim & 1u) == 0u;
    const uint i = p.neox != 0 ? (first ? dim : dim - half_dim) : dim / 2;
    const uvec2 e = rope_pair(i);
    const float x0 = k[base + e.x], x1 = k[base + e.y];
    const vec2 cs = rope_cos_sin(i, rpos);
    return first ? x0 * cs.x - x1 * cs.y : x0 * cs.y + x1 * cs.x;
}

void rope_kv_main() {
    const uint g = gl_WorkGroupID.x, t = gl_WorkGroupID.y, i = gl_LocalInvocationID.x, wg = gl_WorkGroupSize.x;
    const uint pos = step[0] + t;
    if (t >= p.n_tokens || pos >= p.n_ctx) return;   // uniform per workgroup
    const float rpos = float(rope_position(pos));
    const uint half_dim = p.rope_dim / 2, hd = p.head_dim;
    const uint q_pairs = p.n_heads * half_dim, k_pairs = p.n_heads_kv * half_dim;
    const uint k_rest = p.n_heads_kv * (hd - p.rope_dim), kv_width = p.n_heads_kv * hd;
    // the runs of workgroups (rope.py sizes the grid alike): q pairs, k, v
    const uint q_groups = (q_pairs + wg - 1) / wg;
    const uint k_groups = KT == KV_F16 ? (k_pairs + k_rest + wg - 1) / wg : (kv_width + 2 * wg - 1) / (2 * wg);
    if (g < q_groups) {
        const uint j = g * wg + i;
        if (j >= q_pairs) return;
        const uint head = j / half_dim, pi = j - head * half_dim;
        const vec2 cs = rope_cos_sin(pi, rpos);
        const uvec2 e = t * p.n_heads * hd + head * hd + rope_pair(pi);
        const float x0 = q[e.x], x1 = q[e.y];
        q[e.x] = x0 * cs.x - x1 * cs.y;
        q[e.y] = x0 * cs.y + x1 * cs.x;
        return;
    }
    if (g < q_groups + k_groups) {
        const uint c = g - q_groups;
        if (KT == KV_F16) {
            uint j = c * wg + i;
            if (j < k_pairs) {
                const uint head = j / half_dim, pi = j - head * half_dim;
                const vec2 cs = rope_cos_sin(pi, rpos);
                const uvec2 e = head * hd + rope_pair(pi);
                const float x0 = k[t * kv_width + e.x], x1 = k[t * kv_width + e.y];
                kcache[pos * kv_width + e.x] = float16_t(x0 * cs.x - x1 * cs.y);
                kcache[pos * kv_width + e.y] = float16_t(x0 * cs.y + x1 * cs.x);
                return;
            }
            j -= k_pairs;
            if (j < k_rest) {
                const uint rest = hd - p.rope_dim, head = j / rest, e = head * hd + p.rope_dim + (j - head * rest);
                kcache[pos * kv_width + e] = float16_t(k[t * kv_width + e]);
            }
            return;
        }
        const uint e = 2 * (c * wg + i);              // this thread's two dims of k (kv_width is even)
        if (e < kv_width) {
            const uint head = e / hd, d = e - head * hd;
            kv_vals[2 * i] = k_rotated(t * kv_width + head * hd, d, rpos);
            kv_vals[2 * i + 1] = k_rotated(t * kv_width + head * hd, d + 1, rpos);
        }
        barrier();
        store_blocks(true, pos, c * wg / 16, kv_width / 32);
        return;
    }
    const uint c = g - q_groups - k_groups;
    if (VT == KV_F16) {
        const uint j = c * wg + i;
        if (j < kv_width) vcache[pos * kv_width + j] = float16_t(v[t * kv_width + j]);
    } else {
        store_v_chunk(t, pos, c, kv_width);
    }
}
#else

void rope_kv_main() {
    uint j = gl_GlobalInvocationID.x;
    const uint t = gl_WorkGroupID.y;
    const uint pos = step[0] + t;
    if (t >= p.n_tokens || pos >= p.n_ctx) return;
    const float rpos = float(rope_position(pos));
    const uint half_dim = p.rope_dim / 2, hd = p.head_dim;
    const uint q_pairs = p.n_heads * half_dim, k_pairs = p.n_heads_kv * half_dim;
    const uint k_rest = p.n_heads_kv * (hd - p.rope_dim), kv_width = p.n_heads_kv * hd;
    if (j < q_pairs) {
        const uint head = j / half_dim, i = j - head * half_dim;
        const vec2 cs = rope_cos_sin(i, rpos);
        const uvec2 e = t * p.n_heads * hd + head * hd + rope_pair(i);
        const float x0 = q[e.x], x1 = q[e.y];
        q[e.x] = x0 * cs.x - x1 * cs.y;
        q[e.y] = x0 * cs.y + x1 * cs.x;
        return;
    }
    j -= q_pairs;
    if (j < k_pairs) {
        const uint head = j / half_dim, i = j - head * half_dim;
        const vec2 cs = rope_cos_sin(i, rpos);
        const uvec2 e = head * hd + rope_pair(i);
        const float x0 = k[t * kv_width + e.x], x1 = k[t * kv_width + e.y];
        kcache[pos * kv_width + e.x] = float16_t(x0 * cs.x - x1 * cs.y);
        kcache[pos * kv_width + e.y] = float16_t(x0 * cs.y + x1 * cs.x);
        return;
    }
    j -= k_pairs;
    if (j < k_rest) {
        const uint rest = hd - p.rope_dim, head = j / rest, e = head * hd + p.rope_dim + (j - head * rest);
        kcache[pos * kv_width + e] = float16_t(k[t * kv_width + e]);
        return;
    }
    j -= k_rest;
    if (j < kv_width) vcache[pos * kv_width + j] = float16_t(v[t * kv_width + j]);
}
#endif

#ifdef WAIT
#include "chain_wait.glsl"
#endif

void main() {
#ifdef WAIT
    wait_for_producer();
#endif
    rope_kv_main();
#ifdef CHAIN
    memoryBarrierBuffer();
    barrier();
    if (gl_LocalInvocationIndex == 0) atomicAdd(chain[p.chain_slot], 1u);
#endif
}
