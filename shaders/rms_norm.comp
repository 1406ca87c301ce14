#version 450
#include "common.glsl"
// RMS norm, one workgroup per row: out[r,c] = x[r,c] / sqrt(mean_c(x[r,:]^2) + eps) (* w[c]).
// f32 accumulation: per-thread partial sums, subgroupAdd, then one shared slot per subgroup.
// In place is allowed (out aliases x): every thread reads and writes only its own columns.
// Rows: rows of [n_tokens][n_embd], or per-head rows (n_tokens*n_heads of head_dim) for Q/K norm.
// VEC4 (specialization constant 1; rows of a multiple of 4 columns): 16-byte loads and stores, a
// quarter of the load instructions (software devices run each as a loop over the lanes: the prompt's
// residual add and norm took 11% of SmolLM2's step on llvmpipe in scalar loads).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool VEC4 = false;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 0) readonly buffer X4 { vec4 x4[]; };
// OUT_F16: out in f16 (rounded as convert.comp rounds), for prompt products that read their x as
// f16 (kernels/matmul.py record_f16_x): no f32 copy written and converted again.
#ifdef OUT_F16
#define OUT_T float16_t
#define OUT_T4 f16vec4
#else
#define OUT_T float
#define OUT_T4 vec4
#endif
// ADD_IN (with HAS_WEIGHT): x = a + b first (a residual add, its sum written to h: in place on a or
// b too, each thread reading its own elements before writing them), then the norm of x: a prompt's
// residual add and the norm after it in one dispatch (runtime; same bits as add then norm).
#if defined(ADD_IN)
layout(std430, binding = 1) readonly buffer XB { float xb[]; };
layout(std430, binding = 1) readonly buffer XB4 { vec4 xb4[]; };
layout(std430, binding = 2) readonly buffer Wt { float w[]; };
layout(std430, binding = 2) readonly buffer Wt4 { vec4 w4[]; };
layout(std430, binding = 3) writeonly buffer Out { OUT_T o[]; };
layout(std430, binding = 3) writeonly buffer Out4 { OUT_T4 o4[]; };
layout(std430, binding = 4) buffer H { float h[]; };
layout(std430, binding = 4) buffer H4 { vec4 h4[]; };
#elif defined(HAS_WEIGHT)
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
layout(std430, binding = 1) readonly buffer Wt4 { vec4 w4[]; };
layout(std430, binding = 2) writeonly buffer Out { OUT_T o[]; };
layout(std430, binding = 2) writeonly buffer Out4 { OUT_T4 o4[]; };
#else
layout(std430, binding = 1) writeonly buffer Out { OUT_T o[]; };
layout(std430, binding = 1) writeonly buffer Out4 { OUT_T4 o4[]; };
#endif
layout(push_constant) uniform Push { uint n_rows; uint n_cols; float eps; } p;

shared float partial[gl_WorkGroupSize.x];   // one slot per subgroup is used (sized for subgroup size 1)

void main() {
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.n_rows) return;   // uniform per workgroup
    const uint base = row * p.n_cols;
    const uint tid = gl_LocalInvocationID.x;
    const uint base4 = base / 4, n4 = VEC4 ? p.n_cols / 4 : 0;
    float acc = 0.0;
    for (uint c = tid; c < n4; c += gl_WorkGroupSize.x) {
#ifdef ADD_IN
        const vec4 v = x4[base4 + c] + xb4[base4 + c];
        h4[base4 + c] = v;
#else
        const vec4 v = x4[base4 + c];
#endif
        acc += dot(v, v);
    }
    for (uint c = 4 * n4 + tid; c < p.n_cols; c += gl_WorkGroupSize.x) {
#ifdef ADD_IN
        const float v = x[base + c] + xb[base + c];
        h[base + c] = v;
#else
        const float v = x[base + c];
#endif
        acc += v * v;
    }
    acc = subgroupAdd(acc);
    if (subgroupElect()) partial[gl_SubgroupID] = acc;
    barrier();
    float total = 0.0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) total += partial[s];
    const float scale = inversesqrt(total / float(p.n_cols) + p.eps);
    for (uint c = tid; c < n4; c += gl_WorkGroupSize.x) {
#if defined(ADD_IN)
        o4[base4 + c] = OUT_T4(h4[base4 + c] * scale * w4[c]);
#elif defined(HAS_WEIGHT)
        o4[base4 + c] = OUT_T4(x4[base4 + c] * scale * w4[c]);
#else
        o4[base4 + c] = OUT_T4(x4[base4 + c] * scale);
#endif
    }
    for (uint c = 4 * n4 + tid; c < p.n_cols; c += gl_WorkGroupSize.x) {
#if defined(ADD_IN)
        o[base + c] = OUT_T(h[base + c] * scale * w[c]);
#elif defined(HAS_WEIGHT)
        o[base + c] = OUT_T(x[base + c] * scale * w[c]);
#else
        o[base + c] = OUT_T(x[base + c] * scale);
#endif
    }
}
