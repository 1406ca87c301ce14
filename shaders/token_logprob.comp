#version 450
#include "common.glsl"
// What perplexity needs of a row of logits, so that the host reads 4 floats per row instead of the
// whole vocabulary: per row r, out[r] = (max_c x[r,c], sum_c exp(x[r,c] - max), x[r, target[r]], 0).
// The host takes log p(target) = (x_t - max) - log(sum) in double precision.
// One workgroup per row, one pass over the row (the logits may live in host memory): each thread
// keeps a running maximum and its sum of exp(x - maximum), rescaled when the maximum grows; the
// threads' pairs are then combined per subgroup and across subgroups in shared memory.
// A row whose target is outside the row (the host marks unscored rows so) is skipped: its output
// is left as it was.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Targets { uint target[]; };
layout(std430, binding = 2) writeonly buffer Out { vec4 o[]; };
layout(push_constant) uniform Push { uint n_rows; uint n_cols; uint row_stride; } p;

shared float part_max[gl_WorkGroupSize.x];   // one slot per subgroup is used (sized for subgroup size 1)
shared float part_sum[gl_WorkGroupSize.x];

void main() {
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.n_rows) return;   // uniform per workgroup
    const uint t = target[row];
    if (t >= p.n_cols) return;     // no target: uniform per workgroup too
    const uint base = row * p.row_stride;
    const uint tid = gl_LocalInvocationID.x;
    float m = -3.402823466e38;     // finite: exp(m - m) stays 1 for a thread that saw no column
    float s = 0.0;
    for (uint c = tid; c < p.n_cols; c += gl_WorkGroupSize.x) {
        const float v = x[base + c];
        if (v > m) {
            s = s * exp(m - v) + 1.0;
            m = v;
        } else {
            s += exp(v - m);
        }
    }
    const float sg_max = subgroupMax(m);
    const float sg_sum = subgroupAdd(s * exp(m - sg_max));
    if (subgroupElect()) {
        part_max[gl_SubgroupID] = sg_max;
        part_sum[gl_SubgroupID] = sg_sum;
    }
    barrier();
    if (tid == 0) {
        float wg_max = part_max[0];
        for (uint g = 1; g < gl_NumSubgroups; ++g) wg_max = max(wg_max, part_max[g]);
        float wg_sum = 0.0;
        for (uint g = 0; g < gl_NumSubgroups; ++g) wg_sum += part_sum[g] * exp(part_max[g] - wg_max);
        o[row] = vec4(wg_max, wg_sum, x[base + t], 0.0);
    }
}
