#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// y[t, y_off + r] = sum_c W[r, c] * x[t, c] (+ bias[y_off + r]) for a few tokens (t < NT <= NT_MAX):
// the decode kernel, bound by weight bandwidth. A workgroup owns NR consecutive rows of one weight
// chunk; its threads split each row into 32-element units (one Q*_0/Q*_1 block, an eighth of a K-quant
// block), each split in 4 quarters of 8 weights; threads take quarters tid, tid + WG, ... (so a
// warp reads a run of consecutive blocks, 4 threads per block, in 32-bit words), dequantize them in
// registers (see quants.glsl), dot them with the NT activation rows, and accumulate in f32; partial sums
// are reduced with subgroupAdd, then across subgroups through shared memory.
// Specialization: 0 = workgroup size, 1 = NT (tokens; the loops are unrolled to NT_MAX and the
// driver drops the unused ones once NT is known).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint NT = 1;
#define NT_MAX 8
#define NR 2
#define MAX_SUBGROUPS 32

#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n_rows;    // rows of this chunk
    uint cols;
    uint y_stride;  // floats between two tokens' outputs (rows of the whole matrix)
    uint y_off;     // first row of this chunk in the whole matrix
    uint has_bias;
} p;

shared float red[NR * NT_MAX][MAX_SUBGROUPS];

void main() {
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint r0 = wg * NR;
    if (r0 >= p.n_rows) return;  // uniform over the workgroup
    uint tid = gl_LocalInvocationID.x;
    float acc[NR][NT_MAX];
    [[unroll]] for (uint r = 0; r < NR; ++r)
        [[unroll]] for (uint t = 0; t < NT_MAX; ++t) acc[r][t] = 0.0;

#ifdef QFLOAT
    // Float weights: any column count; consecutive threads read consecutive elements.
    for (uint c = tid; c < p.cols; c += gl_WorkGroupSize.x) {
        [[unroll]] for (uint r = 0; r < NR; ++r) {
            float wv = wfloat(min(r0 + r, p.n_rows - 1) * p.cols + c);
            [[unroll]] for (uint t = 0; t < NT_MAX; ++t)
                if (t < NT) acc[r][t] += wv * x[t * p.cols + c];
        }
    }
#else
    // Quarter units (8 weights: elements 4i..4i+3 and 16+4i..16+4i+3 of unit u): neighbouring threads
    // read neighbouring words of the same block, and the activations are loaded once for NR rows.
    uint n_parts = p.cols / 8;
    for (uint q = tid; q < n_parts; q += gl_WorkGroupSize.x) {
        uint u = q / 4, i = q % 4;
        vec4 a[NR], c[NR];
        [[unroll]] for (uint r = 0; r < NR; ++r)
            dequant_part(min(r0 + r, p.n_rows - 1), u, i, p.cols, a[r], c[r]);  // past the end: not written
        [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
            if (t < NT) {
                uint xb = (t * p.cols) / 4 + 8 * u + i;
                vec4 xa = x4[xb], xc = x4[xb + 4];
                [[unroll]] for (uint r = 0; r < NR; ++r) acc[r][t] += dot(a[r], xa) + dot(c[r], xc);
            }
        }
    }
#endif

    [[unroll]] for (uint r = 0; r < NR; ++r)
        [[unroll]] for (uint t = 0; t < NT_MAX; ++t)
            if (t < NT) acc[r][t] = subgroupAdd(acc[r][t]);

    if (gl_NumSubgroups > 1) {
        if (subgroupElect()) {
            [[unroll]] for (uint r = 0; r < NR; ++r)
                [[unroll]] for (uint t = 0; t < NT_MAX; ++t)
                    if (t < NT) red[r * NT_MAX + t][gl_SubgroupID] = acc[r][t];
        }
        barrier();
        if (tid < NR * NT_MAX) {
            uint r = tid / NT_MAX, t = tid % NT_MAX;
            if (t < NT && r0 + r < p.n_rows) {
                float s = 0.0;
                for (uint g = 0; g < gl_NumSubgroups; ++g) s += red[tid][g];
                if (p.has_bias != 0) s += bias[p.y_off + r0 + r];
                y[t * p.y_stride + p.y_off + r0 + r] = s;
            }
        }
    } else if (tid == 0) {
        [[unroll]] for (uint r = 0; r < NR; ++r)
            [[unroll]] for (uint t = 0; t < NT_MAX; ++t) {
                if (t < NT && r0 + r < p.n_rows) {
                    float b = p.has_bias != 0 ? bias[p.y_off + r0 + r] : 0.0;
                    y[t * p.y_stride + p.y_off + r0 + r] = acc[r][t] + b;
                }
            }
    }
}
