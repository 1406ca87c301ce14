#version 450
// c = a + b, element-wise over n floats.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer A { float a[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 2) writeonly buffer C { float c[]; };
layout(push_constant) uniform Push { uint n; } p;

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < p.n) c[i] = a[i] + b[i];
}
