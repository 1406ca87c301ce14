#version 450
#include "common.glsl"
// y = W x for a float weight matrix W (rows x cols, row-major, WTYPE = float or float16_t).
// One workgroup per row: threads stride over the row, then a subgroup + shared-memory reduction.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer W { WTYPE w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push { uint rows; uint cols; } p;

shared float partial[32];

void main() {
    uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows) return;
    uint base = row * p.cols;
    float acc = 0.0;
    for (uint c = gl_LocalInvocationID.x; c < p.cols; c += gl_WorkGroupSize.x)
        acc += float(w[base + c]) * x[c];
    acc = subgroupAdd(acc);
    if (subgroupElect()) partial[gl_SubgroupID] = acc;
    barrier();
    if (gl_LocalInvocationID.x == 0) {
        float total = 0.0;
        for (uint s = 0; s < gl_NumSubgroups; ++s) total += partial[s];
        y[row] = total;
    }
}
