#version 450
#include "common.glsl"
// Per-head RMS norms of the qwen35 hybrids, one workgroup per (token, head) row of n_cols values
// (llamavk/kernels/deltanet.py):
//   GATE_SILU: out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w * silu(z[r, :])   (DeltaNet output)
//   else:      the same without the gate, x's row r read at r * in_stride: the Q half of each head's
//              [q | gate] (gated attention), written densely
// f32 sums: per-thread partial sums, subgroupAdd, one shared slot per subgroup.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Wt { float w[]; };
#ifdef GATE_SILU
layout(std430, binding = 2) readonly buffer Z { float z[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };
#else
layout(std430, binding = 2) writeonly buffer Out { float o[]; };
#endif
layout(push_constant) uniform Push { uint n_rows; uint n_cols; float eps; uint in_stride; } p;

shared float partial[gl_WorkGroupSize.x];

void main() {
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.n_rows) return;   // uniform per workgroup
    const uint src = row * p.in_stride, dst = row * p.n_cols;
    const uint tid = gl_LocalInvocationID.x;
    float acc = 0.0;
    for (uint c = tid; c < p.n_cols; c += gl_WorkGroupSize.x) {
        const float v = x[src + c];
        acc += v * v;
    }
    acc = subgroupAdd(acc);
    if (subgroupElect()) partial[gl_SubgroupID] = acc;
    barrier();
    float total = 0.0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) total += partial[s];
    const float scale = inversesqrt(total / float(p.n_cols) + p.eps);
    for (uint c = tid; c < p.n_cols; c += gl_WorkGroupSize.x) {
        float v = x[src + c] * scale * w[c];
#ifdef GATE_SILU
        const float g = z[dst + c];
        v *= g / (1.0 + exp(-g));
#endif
        o[dst + c] = v;
    }
}
