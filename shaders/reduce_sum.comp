#version 450
// Sum of partial results from several devices (the all-reduce of tensor/graph split modes), read
// straight from the shared host buffer where each device left its part:
//   out[t, out_c0 + c] = base[t, base_c0 + c] + sum over p in part_mask of part_p[t, in_c0 + c]
// for t < n_tokens, c < n_cols. Part p starts at element p * part_stride of `parts`; rows of a part
// are in_stride elements apart. PART_T: float (f32), float16_t (f16) or uint16_t (bf16 bits).
#include "common.glsl"
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer Parts { PART_T parts[]; };
layout(std430, binding = 1) readonly buffer Base { float base[]; };
layout(std430, binding = 2) writeonly buffer Out { float outv[]; };
layout(push_constant) uniform Push {
    uint n_tokens; uint n_cols; uint part_mask; uint part_stride;
    uint in_stride; uint in_c0; uint base_stride; uint base_c0;
    uint out_stride; uint out_c0; uint has_base;
} p;

float load_part(uint i) {
#ifdef PART_BF16
    return uintBitsToFloat(uint(parts[i]) << 16);
#else
    return float(parts[i]);
#endif
}

void main() {
    uint c = gl_GlobalInvocationID.x;
    uint t = gl_GlobalInvocationID.y + gl_NumWorkGroups.y * gl_GlobalInvocationID.z;
    if (c >= p.n_cols || t >= p.n_tokens) return;
    float acc = p.has_base != 0u ? base[t * p.base_stride + p.base_c0 + c] : 0.0;
    uint mask = p.part_mask;
    while (mask != 0u) {
        uint part = findLSB(mask);
        mask &= mask - 1u;
        acc += load_part(part * p.part_stride + t * p.in_stride + p.in_c0 + c);
    }
    outv[t * p.out_stride + p.out_c0 + c] = acc;
}
