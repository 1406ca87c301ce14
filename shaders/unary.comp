#version 450
#include "common.glsl"
// Element-wise ops over n floats with one parameter s, one element per thread (2-D grid for large n).
//   OP_SCALE:   out = s x                (gemma3's embedding scale; out may alias x)
//   OP_SOFTCAP: out = s tanh(x / s)      (final logit soft-capping)
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push { uint n; float s; } p;

void main() {
    const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * gl_WorkGroupSize.x
                   + gl_LocalInvocationID.x;
    if (i >= p.n) return;
#if defined(OP_SCALE)
    o[i] = p.s * x[i];
#elif defined(OP_SOFTCAP)
    // tanh(y) = 1 - 2 / (e^(2y) + 1): finite for every y (e^(2y) clamped short of f32 overflow)
    const float y = x[i] / p.s;
    o[i] = p.s * (1.0 - 2.0 / (exp(min(2.0 * y, 80.0)) + 1.0));
#else
#error "define OP_SCALE or OP_SOFTCAP"
#endif
}
