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
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
#ifdef HAS_FREQS
layout(std430, binding = 1) readonly buffer Freqs { float freqs[]; };
#define B0 2
#else
#define B0 1
#endif
layout(std430, binding = B0) buffer Q { float q[]; };
layout(std430, binding = B0 + 1) readonly buffer K { float k[]; };
layout(std430, binding = B0 + 2) readonly buffer V { float v[]; };
layout(std430, binding = B0 + 3) writeonly buffer KC { float16_t kcache[]; };
layout(std430, binding = B0 + 4) writeonly buffer VC { float16_t vcache[]; };
layout(push_constant) uniform Push {
    uint n_tokens; uint n_heads; uint head_dim; uint rope_dim; uint neox;
    float log2_theta_scale; float freq_scale; float ext_factor; float attn_factor; float corr_low; float corr_high;
    uint n_heads_kv; uint n_ctx;
} p;
#include "rope_common.glsl"

void main() {
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
