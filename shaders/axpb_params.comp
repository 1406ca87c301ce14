#version 450
// y = alpha * x + beta, with alpha, beta and n read from a parameter buffer at execution time:
// the replay mechanism (record once, change the parameters, submit again).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Params { float alpha; float beta; uint n; } params;
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) writeonly buffer Y { float y[]; };

void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < params.n) y[i] = params.alpha * x[i] + params.beta;
}
