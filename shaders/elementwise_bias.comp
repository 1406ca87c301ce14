#version 450
#include "common.glsl"
// x[t, i] += bias[i] in place over rows of `width` floats; grid (ceil(width / WG), n_rows).
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Bias { float bias[]; };
layout(std430, binding = 1) buffer X { float x[]; };
layout(push_constant) uniform Push { uint width; uint n_rows; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    const uint t = gl_WorkGroupID.y;
    if (i >= p.width || t >= p.n_rows) return;
    x[t * p.width + i] += bias[i];
}
