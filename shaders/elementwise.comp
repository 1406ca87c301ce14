#version 450
#include "common.glsl"
// Element-wise ops over n floats, one element per thread (2-D grid for large n).
//   OP_ADD:    out = a + b            (out may alias a or b: residual add in place)
//   OP_SWIGLU: out = silu(a) * b      a = gate, b = up; silu(g) = g / (1 + exp(-g))
//   OP_GEGLU:  out = gelu(a) * b      GELU's tanh approximation, as ggml's (gemma3's FFN)
//   OP_SWIGLU_OAI: out = g sigmoid(alpha g) (u + 1), g = min(a, limit), u = clamp(b, -limit, limit)
//              (gpt-oss's experts: ggml_swiglu_oai; alpha and limit are push constants)
// OUT_F16: out in f16 (rounded as convert.comp rounds), for a prompt's down product that reads its x
// as f16 (kernels/matmul.py record_f16_x): no f32 copy written and converted again.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
#ifdef OUT_F16
layout(std430, binding = 2) writeonly buffer C { float16_t c[]; };
#define STORE(v) float16_t(v)
#else
layout(std430, binding = 2) writeonly buffer C { float c[]; };
#define STORE(v) (v)
#endif
#ifdef OP_SWIGLU_OAI
layout(push_constant) uniform Push { uint n; float alpha; float limit; } p;
#else
layout(push_constant) uniform Push { uint n; } p;
#endif

void main() {
    const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * gl_WorkGroupSize.x
                   + gl_LocalInvocationID.x;
    if (i >= p.n) return;
#if defined(OP_ADD)
    c[i] = a[i] + b[i];
#elif defined(OP_SWIGLU)
    const float g = a[i];
    // exp(-g) overflows f32 for g < -88; clamp: silu(g) is ~0 there anyway (|g| e^g < 1e-33).
    c[i] = STORE(g / (1.0 + exp(min(-g, 80.0))) * b[i]);
#elif defined(OP_GEGLU)
    // gelu(g) = 0.5 g (1 + tanh(u)) = g - g / (e^(2u) + 1), u = sqrt(2/pi) (g + 0.044715 g^3): no
    // tanh(), which some drivers return as NaN for large |u|; e^(2u) clamped short of f32 overflow.
    const float g = a[i];
    const float u = 0.7978845608 * g * (1.0 + 0.044715 * g * g);
    c[i] = STORE((g - g / (exp(min(2.0 * u, 80.0)) + 1.0)) * b[i]);
#elif defined(OP_SWIGLU_OAI)
    const float g = min(a[i], p.limit);
    const float u = clamp(b[i], -p.limit, p.limit);
    c[i] = STORE(g / (1.0 + exp(min(-p.alpha * g, 80.0))) * (u + 1.0));
#else
#error "define OP_ADD, OP_SWIGLU, OP_GEGLU or OP_SWIGLU_OAI"
#endif
}
