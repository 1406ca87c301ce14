#version 450
#include "common.glsl"
// dst[r] = the quantized cache's row r as f16, for rows r < n_kv (step[2], at most n_ctx), 8 values a
// thread (16 bytes out), grid-stride over the rows. Why: prompt attention over a quantized cache on
// cooperative matrices reads f16 tiles only (attention_coop.comp); the scalar flash kernel's
// quantized variant took 0.40x llama.cpp's pp512 at d4096 (H200). So a prompt step dequantizes each
// layer's K and V rows once into a shared f16 copy and runs the cooperative-matrix kernel over it
// (kernels/attention.py). The values are those the decode kernel dequantizes (kv_quant.glsl
// KV_DEQUANT8: d * q in f32, rounded to f16).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint CTYPE = 1u;   // kv_quant.glsl's KV_Q8_0, KV_Q4_0, ...
#include "kv_quant.glsl"
layout(std430, binding = 0) readonly buffer Src { uint16_t src16[]; };
layout(std430, binding = 1) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 2) writeonly buffer Dst { uvec4 dst[]; };   // 8 halves an element
layout(push_constant) uniform Push { uint width; uint n_ctx; } p;
KV_DEQUANT4(src_dequant4, src16)
KV_DEQUANT8(src_dequant8, src_dequant4)

void main() {
    const uint n = min(step[2], p.n_ctx) * (p.width / 8);
    const uint stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y * gl_WorkGroupSize.x;
    const uint first = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * gl_WorkGroupSize.x
                       + gl_LocalInvocationID.x;
    for (uint i = first; i < n; i += stride) dst[i] = src_dequant8(CTYPE, i * 8);
}
