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
// 2 (V)). A quantized cache is written a block of 32 values per work item (the block's K dims
// rotated one by one: a neox pair may straddle two blocks): the k pairs and k rest items become
// n_heads_kv * head_dim / 32 k blocks, the v elements kv_width / 32 v blocks. With QK_NORM a k head's
// rotated values go through shared memory and its head_dim / 32 first threads write the blocks;
// the v workgroups take WG blocks each.
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
// Quantize the 32 values v into block `blk` of the K (is_k) or V cache of type `type`.
void store_block(const bool is_k, const uint type, const uint blk, const float v[32]) {
    uint w[17];
    const uint n = kv_quantize(type, v, w);
    for (uint j = 0; j < n; ++j) {
        if (is_k) kcache16[blk * n + j] = uint16_t(w[j]);
        else vcache16[blk * n + j] = uint16_t(w[j]);
    }
}

// V block b (of kv_width / 32) of token t into cache row pos
void store_v_block(const uint t, const uint pos, const uint b, const uint kv_width) {
    float vals[32];
    for (uint j = 0; j < 32; ++j) vals[j] = v[t * kv_width + b * 32 + j];
    store_block(false, VT, pos * (kv_width / 32) + b, vals);
}
#endif

#if defined(QK_NORM) && defined(KV_QUANT)
shared float red[64];
shared float krot[512];            // a k head's rotated values (head_dim <= 512: rope.py checks)

void rope_kv_main() {
    const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y, i = gl_LocalInvocationID.x;
    const uint pos = step[0] + t;
    if (t >= p.n_tokens || pos >= p.n_ctx) return;   // uniform per workgroup
    const uint hd = p.head_dim, half_dim = hd / 2, kv_width = p.n_heads_kv * hd;
    if (h >= p.n_heads + p.n_heads_kv) {             // a block of v: WG elements, or WG blocks
        const uint j = (h - p.n_heads - p.n_heads_kv) * gl_WorkGroupSize.x + i;
        if (VT == KV_F16) {
            if (j < kv_width) vcache[pos * kv_width + j] = float16_t(v[t * kv_width + j]);
        } else if (j < kv_width / 32) {
            store_v_block(t, pos, j, kv_width);
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
        krot[e.x] = r0;
        krot[e.y] = r1;
    }
    barrier();
    if (i < hd / 32) {
        float vals[32];
        for (uint j = 0; j < 32; ++j) vals[j] = krot[i * 32 + j];
        store_block(true, KT, pos * (kv_width / 32) + head * (hd / 32) + i, vals);
    }
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
    if (KT == KV_F16) {
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
    } else {
        const uint k_blocks = kv_width / 32, per_head = hd / 32;
        if (j < k_blocks) {
            const uint head = j / per_head, d0 = (j - head * per_head) * 32;
            float vals[32];
            for (uint e = 0; e < 32; ++e) vals[e] = k_rotated(t * kv_width + head * hd, d0 + e, rpos);
            store_block(true, KT, pos * k_blocks + j, vals);
            return;
        }
        j -= k_blocks;
    }
    if (VT == KV_F16) {
        if (j < kv_width) vcache[pos * kv_width + j] = float16_t(v[t * kv_width + j]);
    } else if (j < kv_width / 32) {
        store_v_block(t, pos, j, kv_width);
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
