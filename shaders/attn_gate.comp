#version 450
#include "common.glsl"
// qwen35's gated attention output: out[t, h, d] = a[t, h, d] * sigmoid(qg[t, h, head_dim + d]), qg holding
// per head [q | gate] (2 * head_dim values). One thread per output value; out may alias a.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer QG { float qg[]; };
layout(std430, binding = 2) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push { uint n; uint head_dim; } p;

void main() {
    const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * 256 + gl_LocalInvocationID.x;
    if (i >= p.n) return;
    const uint head = i / p.head_dim, d = i - head * p.head_dim;
    const float g = qg[head * 2 * p.head_dim + p.head_dim + d];
    o[i] = a[i] / (1.0 + exp(-g));
}
