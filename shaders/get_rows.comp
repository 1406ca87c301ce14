#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// out[t, :] = dequant(W[ids[t], :]) for the ids that fall in this weight chunk (rows
// [row_start, row_start + n_rows)); one dispatch per chunk, one workgroup per token, threads over
// 32-element units. Tokens whose id is in another chunk are left to that chunk's dispatch.
layout(local_size_x_id = 0) in;

#include "quants.glsl"
layout(std430, binding = 1) readonly buffer Ids { uint ids[]; };
layout(std430, binding = 2) writeonly buffer Out { float o[]; };
layout(std430, binding = 2) writeonly buffer Out4 { vec4 o4[]; };
layout(push_constant) uniform Push {
    uint cols;
    uint n_tokens;
    uint row_start;
    uint n_rows;
} p;

void main() {
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= p.n_tokens) return;
    uint id = ids[t];
    if (id < p.row_start || id - p.row_start >= p.n_rows) return;
    uint row = id - p.row_start;
    uint n_units = (p.cols + 31) / 32;
    for (uint u = gl_LocalInvocationID.x; u < n_units; u += gl_WorkGroupSize.x) {
        vec4 w[8];
        dequant_unit(row, u, p.cols, w);
#ifdef QFLOAT
        uint base = t * p.cols + 32 * u;
        [[unroll]] for (uint i = 0; i < 8; ++i)
            [[unroll]] for (uint c = 0; c < 4; ++c)
                if (32 * u + 4 * i + c < p.cols) o[base + 4 * i + c] = w[i][c];
#else
        uint base = (t * p.cols + 32 * u) / 4;
        [[unroll]] for (uint i = 0; i < 8; ++i) o4[base + i] = w[i];
#endif
    }
}
