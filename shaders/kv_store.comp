#version 450
#include "common.glsl"
// cache[n_past + t, i] = f16(src[t, i]) for t < n_tokens, i < width; n_past comes from the
// step-parameter buffer at execution time. Grid (ceil(width / WG), n_tokens).
// Rows past the end of the cache (n_past + t >= n_ctx) are not written.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Src { float src[]; };
layout(std430, binding = 1) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, 0]
layout(std430, binding = 2) writeonly buffer Cache { float16_t cache[]; };
layout(push_constant) uniform Push { uint width; uint n_tokens; uint n_ctx; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    const uint t = gl_WorkGroupID.y;
    const uint pos = step[0] + t;
    if (i >= p.width || t >= p.n_tokens || pos >= p.n_ctx) return;
    cache[pos * p.width + i] = float16_t(src[t * p.width + i]);
}
