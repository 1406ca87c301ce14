#version 450
#include "common.glsl"
// cache[n_past + t, i] = f16(src[t, i]) for t < n_tokens, i < width; n_past comes from the
// step-parameter buffer at execution time. Grid (ceil(width / WG), n_tokens).
// Rows past the end of the cache (n_past + t >= n_ctx) are not written.
// KV_QUANT: the cache is quantized (kv_quant.glsl; its type the specialization constant 1), one
// thread per block of 32 values: grid (ceil(width / 32 / WG), n_tokens).
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Src { float src[]; };
layout(std430, binding = 1) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, 0]
#ifdef KV_QUANT
#include "kv_quant.glsl"
layout(constant_id = 1) const uint CTYPE = KV_Q8_0;
layout(std430, binding = 2) writeonly buffer Cache { uint16_t cache[]; };
#else
layout(std430, binding = 2) writeonly buffer Cache { float16_t cache[]; };
#endif
layout(push_constant) uniform Push { uint width; uint n_tokens; uint n_ctx; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    const uint t = gl_WorkGroupID.y;
    const uint pos = step[0] + t;
#ifdef KV_QUANT
    const uint nb = p.width / 32;
    if (i >= nb || t >= p.n_tokens || pos >= p.n_ctx) return;
    float v[32];
    for (uint j = 0; j < 32; ++j) v[j] = src[t * p.width + i * 32 + j];
    uint w[17];
    const uint n = kv_quantize(CTYPE, v, w);
    const uint base = (pos * nb + i) * n;
    for (uint j = 0; j < n; ++j) cache[base + j] = uint16_t(w[j]);
#else
    if (i >= p.width || t >= p.n_tokens || pos >= p.n_ctx) return;
    cache[pos * p.width + i] = float16_t(src[t * p.width + i]);
#endif
}
