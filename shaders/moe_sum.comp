#version 450
#include "common.glsl"
// Weighted sum of a token's expert outputs: out[t, c] = sum_s weight(t, s) * y[t, s, c], one thread per
// (token, column); route rows hold per token the n_used expert ids, then their weights.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Yin { float y[]; };
layout(std430, binding = 1) readonly buffer Route { float route[]; };
layout(std430, binding = 2) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push { uint n_tokens; uint width; uint n_used; } p;

void main() {
    uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * 256 + gl_LocalInvocationID.x;
    if (i >= p.n_tokens * p.width) return;
    uint t = i / p.width, c = i % p.width;
    float acc = 0.0;
    for (uint s = 0; s < p.n_used; ++s)
        acc += route[t * 2 * p.n_used + p.n_used + s] * y[(t * p.n_used + s) * p.width + c];
    o[i] = acc;
}
