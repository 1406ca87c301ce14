#version 450
#include "common.glsl"
// A shared expert's gate, one workgroup per token: out[t, :] = y[t, :] * sigmoid(sum_c w[c] * x[t, c]).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Yin { float y[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer W { float w[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push { uint n_tokens; uint width; uint cols; } p;

shared float partial[64];

void main() {
    uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= p.n_tokens) return;   // uniform per workgroup
    uint tid = gl_LocalInvocationID.x;
    float acc = 0.0;
    for (uint c = tid; c < p.cols; c += 64) acc += w[c] * x[t * p.cols + c];
    partial[tid] = acc;
    barrier();
    for (uint s = 32; s > 0; s >>= 1) {
        if (tid < s) partial[tid] += partial[tid + s];
        barrier();
    }
    float g = 1.0 / (1.0 + exp(-partial[0]));
    for (uint c = tid; c < p.width; c += 64) o[t * p.width + c] = y[t * p.width + c] * g;
}
