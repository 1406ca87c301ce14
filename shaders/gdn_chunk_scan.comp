#version 450
#include "common.glsl"
// The gated delta rule over a prompt in chunks, part 2 of 2 (gdn_chunk_prep.comp computed each
// chunk's W, Ub, Qs, Kd, Aqk, glast): the chunks one after another from the layer's state S0,
//   U = Ub - W S0;  out = Qs S0 + Aqk U;  S0 = glast S0 + Kd^T U
// and S0 back into the state at the end. Grid (value heads, head_dim / COLS): a workgroup holds COLS
// columns of its head's state in shared memory (all of a column's rows), and U's columns likewise.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint COLS = 32;
layout(constant_id = 2) const uint SD = 128;       // head_dim
layout(std430, binding = 0) readonly buffer Step { uint step[]; };
layout(std430, binding = 1) readonly buffer Scratch { float sc[]; };
layout(std430, binding = 2) buffer State { float state[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push { uint n_tokens; uint n_k_heads; uint n_v_heads; uint head_dim; float eps; } p;
#include "gdn_common.glsl"

#define CH 64

shared float Ssh[SD * COLS];     // [i][column]
shared float Ush[CH * COLS];     // [r][column]

void main() {
    const uint h = gl_WorkGroupID.x, D = SD, j0 = gl_WorkGroupID.y * COLS;
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    const uint block = 4 * CH * D + CH * CH + 4;
    const bool fresh = gdn_starts(0);
    for (uint idx = tid; idx < D * COLS; idx += WG) {
        const uint i = idx / COLS, j = j0 + idx % COLS;
        Ssh[idx] = (!fresh && j < D) ? state[(h * D + i) * D + j] : 0.0;
    }
    barrier();
    const uint n_chunks = (p.n_tokens + CH - 1) / CH;
    for (uint c = 0; c < n_chunks; ++c) {
        const uint t0 = c * CH, n = min(CH, p.n_tokens - t0);
        const uint base = (c * p.n_v_heads + h) * block;
        const uint W_AT = base, UB_AT = base + CH * D, QS_AT = base + 2 * CH * D, KD_AT = base + 3 * CH * D;
        const uint AQK_AT = base + 4 * CH * D;
        const float glast = sc[AQK_AT + CH * CH];
        for (uint idx = tid; idx < n * COLS; idx += WG) {          // U = Ub - W S0
            const uint r = idx / COLS, jl = idx % COLS, j = j0 + jl;
            float acc = j < D ? sc[UB_AT + r * D + j] : 0.0;
            for (uint i = 0; i < D; ++i) acc -= sc[W_AT + r * D + i] * Ssh[i * COLS + jl];
            Ush[idx] = acc;
        }
        barrier();
        for (uint idx = tid; idx < n * COLS; idx += WG) {          // out = Qs S0 + Aqk U
            const uint r = idx / COLS, jl = idx % COLS, j = j0 + jl;
            float acc = 0.0;
            for (uint i = 0; i < D; ++i) acc += sc[QS_AT + r * D + i] * Ssh[i * COLS + jl];
            for (uint s = 0; s <= r; ++s) acc += sc[AQK_AT + r * CH + s] * Ush[s * COLS + jl];
            if (j < D) o[(t0 + r) * p.n_v_heads * D + h * D + j] = acc;
        }
        barrier();
        for (uint idx = tid; idx < D * COLS; idx += WG) {          // S0 = glast S0 + Kd^T U
            const uint i = idx / COLS, jl = idx % COLS;
            float acc = glast * Ssh[idx];
            for (uint r = 0; r < n; ++r) acc += sc[KD_AT + r * D + i] * Ush[r * COLS + jl];
            Ssh[idx] = acc;
        }
        barrier();
    }
    for (uint idx = tid; idx < D * COLS; idx += WG) {
        const uint i = idx / COLS, j = j0 + idx % COLS;
        if (j < D) state[(h * D + i) * D + j] = Ssh[idx];
    }
}
