#version 450
#include "common.glsl"
// Rotary position embedding, in place on x = [n_tokens][n_heads * head_dim].
// One thread per rotated pair; grid (ceil(n_heads * rope_dim/2 / WG), n_tokens).
// Position of token t = n_past + t, n_past read from the step-parameter buffer at execution time
// (modulo seq_len when the batch holds several sequences: rope_common.glsl).
// Only the first rope_dim dims of a head turn; angles: rope_common.glsl.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
#ifdef HAS_FREQS
layout(std430, binding = 1) readonly buffer Freqs { float freqs[]; }; // rope_freqs: per-frequency divisors
layout(std430, binding = 2) buffer X { float x[]; };
#else
layout(std430, binding = 1) buffer X { float x[]; };
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_heads; uint head_dim; uint rope_dim; uint neox;
    float log2_theta_scale; float freq_scale; float ext_factor; float attn_factor; float corr_low; float corr_high;
} p;
#include "rope_common.glsl"

void main() {
    const uint j = gl_GlobalInvocationID.x;        // pair index within the token
    const uint t = gl_WorkGroupID.y;
    const uint half_dim = p.rope_dim / 2;
    if (j >= p.n_heads * half_dim || t >= p.n_tokens) return;
    const uint head = j / half_dim;
    const uint i = j - head * half_dim;
    const vec2 cs = rope_cos_sin(i, float(rope_position(step[0] + t)));
    const uvec2 e = t * p.n_heads * p.head_dim + head * p.head_dim + rope_pair(i);
    const float x0 = x[e.x], x1 = x[e.y];
    x[e.x] = x0 * cs.x - x1 * cs.y;
    x[e.y] = x0 * cs.y + x1 * cs.x;
}
