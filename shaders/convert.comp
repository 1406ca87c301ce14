#version 450
// f32 -> OUT_T element-wise over n values: a device's partial result written into the shared host
// buffer in the reduce type of graph split mode (f16 / bf16 halve the bytes crossing the bus).
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer In { float inv[]; };
layout(std430, binding = 1) writeonly buffer Out { OUT_T outv[]; };
layout(push_constant) uniform Push { uint n; } p;

void main() {
    uint i = gl_GlobalInvocationID.x + gl_NumWorkGroups.x * 256u * gl_GlobalInvocationID.y;
    if (i >= p.n) return;
#ifdef OUT_BF16
    // round to nearest even, as ggml's fp32 -> bf16
    uint bits = floatBitsToUint(inv[i]);
    outv[i] = uint16_t((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);
#else
    outv[i] = OUT_T(inv[i]);
#endif
}
