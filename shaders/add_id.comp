#version 450
#include "common.glsl"
// Per-expert bias of an expert product's slots (ggml_add_id: gpt-oss's expert biases):
//   out[t, s, r] = y[t, s, r] + bias[id(t, s), r]
// y, out: [n_tokens][n_used][rows] (out may alias y); bias: [n_expert][rows]; route rows hold per token
// the n_used expert ids (uint bits), then their weights. One thread per element.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Yin { float y[]; };
layout(std430, binding = 1) readonly buffer Bias { float bias[]; };
layout(std430, binding = 2) readonly buffer Route { float route[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push { uint n_tokens; uint rows; uint n_used; uint n_expert; } p;

void main() {
    const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * 256 + gl_LocalInvocationID.x;
    if (i >= p.n_tokens * p.n_used * p.rows) return;
    const uint r = i % p.rows, slot = i / p.rows;           // slot = t * n_used + s
    const uint t = slot / p.n_used, s = slot % p.n_used;
    // an id past the experts (a corrupt route) reads expert 0's bias rather than past the buffer
    uint e = floatBitsToUint(route[t * 2 * p.n_used + s]);
    e = e < p.n_expert ? e : 0u;
    o[i] = y[i] + bias[e * p.rows + r];
}
