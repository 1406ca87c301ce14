#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// The gated delta rule over a prompt in chunks, part 2 of 2 (gdn_chunk_prep.comp computed each
// chunk's W, Ub, Qs, Kd, Aqk, glast): the chunks one after another from the layer's state S0,
//   U = Ub - W S0;  out = Qs S0 + Aqk U;  S0 = glast S0 + Kd^T U
// and S0 back into the state at the end. Grid (value heads, head_dim / COLS): a workgroup holds COLS
// columns of its head's state in shared memory (all of a column's rows), and U's columns likewise.
//
// The workgroup is RG = WG / COLS row groups of COLS lanes, one column per lane. A lane computes RU
// rows of U and of out (rows rg, rg + RG, ...) and RS rows of the new S0 (4 RS4 rows from rg 4 RS4):
// every S0 / U value it loads from shared memory feeds RU (or RS) independent sums, and the
// scratch rows (row-major in i, 16-byte aligned) come as vec4. The host keeps RG a power of two of
// at least 8 (COLS <= WG / 8), so RU <= MAX_RU and RS4 <= MAX_RS4 for head_dim <= 256.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint COLS = 32;
layout(constant_id = 2) const uint SD = 128;       // head_dim
layout(std430, binding = 0) readonly buffer Step { uint step[]; };
layout(std430, binding = 1) readonly buffer Scratch { float sc[]; };
layout(std430, binding = 1) readonly buffer Scratch4 { vec4 sc4[]; };
layout(std430, binding = 2) buffer State { float state[]; };
layout(std430, binding = 3) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push { uint n_tokens; uint n_k_heads; uint n_v_heads; uint head_dim; float eps; } p;
#include "gdn_common.glsl"

#define CH 64
#define MAX_RU 8
#define MAX_RS4 8

shared float Ssh[SD * COLS];     // [i][column]
shared float Ush[CH * COLS];     // [r][column]

void main() {
    const uint h = gl_WorkGroupID.x, D = SD, D4 = SD / 4, j0 = gl_WorkGroupID.y * COLS;
    const uint tid = gl_LocalInvocationID.x, WG = gl_WorkGroupSize.x;
    const uint RG = WG / COLS, RU = CH / RG, RS4 = (D4 + RG - 1) / RG;
    const uint rg = tid / COLS, jl = tid % COLS, j = j0 + jl, i0 = rg * 4 * RS4;
    const uint block = 4 * CH * D + CH * CH + 4;
    const bool fresh = gdn_starts(0);
    for (uint idx = tid; idx < D * COLS; idx += WG) {
        const uint i = idx / COLS, jj = j0 + idx % COLS;
        Ssh[idx] = (!fresh && jj < D) ? state[(h * D + i) * D + jj] : 0.0;
    }
    barrier();
    const uint n_chunks = (p.n_tokens + CH - 1) / CH;
    for (uint c = 0; c < n_chunks; ++c) {
        const uint t0 = c * CH, n = min(CH, p.n_tokens - t0);
        const uint base = (c * p.n_v_heads + h) * block;
        const uint W_AT = base, UB_AT = base + CH * D, QS_AT = base + 2 * CH * D, KD_AT = base + 3 * CH * D;
        const uint AQK_AT = base + 4 * CH * D;
        const float glast = sc[AQK_AT + CH * CH];
        // 1. U = Ub - W S0 and the first half of out, Qs S0, in one pass over S0's column. Rows past
        // the chunk's n read row n - 1 (finite: scratch rows from n on are stale), are never used.
        float u[MAX_RU], acc[MAX_RU];
        uint row4[MAX_RU];
        [[unroll]] for (uint m = 0; m < MAX_RU; ++m) {
            if (m < RU) {
                const uint r = min(rg + RG * m, n - 1);
                row4[m] = r * D4;
                u[m] = j < D ? sc[UB_AT + r * D + j] : 0.0;
                acc[m] = 0.0;
            }
        }
        for (uint k4 = 0; k4 < D4; ++k4) {
            const uint at = 4 * k4 * COLS + jl;
            const vec4 s = vec4(Ssh[at], Ssh[at + COLS], Ssh[at + 2 * COLS], Ssh[at + 3 * COLS]);
            [[unroll]] for (uint m = 0; m < MAX_RU; ++m) {
                if (m < RU) {
                    u[m] -= dot(sc4[W_AT / 4 + row4[m] + k4], s);
                    acc[m] += dot(sc4[QS_AT / 4 + row4[m] + k4], s);
                }
            }
        }
        [[unroll]] for (uint m = 0; m < MAX_RU; ++m) {
            if (m < RU) Ush[(rg + RG * m) * COLS + jl] = u[m];
        }
        barrier();
        // 2. out += Aqk U (Aqk is zero above the diagonal: sum up to the lane's last row, in fours)
        const uint s4_end = min(rg + RG * (RU - 1), n - 1) / 4 + 1;
        for (uint s4 = 0; s4 < s4_end; ++s4) {
            const uint at = 4 * s4 * COLS + jl;
            const vec4 uu = vec4(Ush[at], Ush[at + COLS], Ush[at + 2 * COLS], Ush[at + 3 * COLS]);
            [[unroll]] for (uint m = 0; m < MAX_RU; ++m) {
                if (m < RU) acc[m] += dot(sc4[AQK_AT / 4 + (rg + RG * m) * (CH / 4) + s4], uu);
            }
        }
        [[unroll]] for (uint m = 0; m < MAX_RU; ++m) {
            const uint r = rg + RG * m;
            if (m < RU && r < n && j < D) o[(t0 + r) * p.n_v_heads * D + h * D + j] = acc[m];
        }
        // 3. S0 = glast S0 + Kd^T U: this lane's own rows of S0 (nobody reads S0 until the barrier).
        // Rows past head_dim (a row group past the end) read the last row and are not written back;
        // U's rows four at a time, so that 4 RS4 loads are in flight (past n: Kd row n - 1, U as 0).
        float s_new[4 * MAX_RS4];
        uint kcol[MAX_RS4];
        [[unroll]] for (uint b = 0; b < MAX_RS4; ++b) {
            if (b < RS4) {
                kcol[b] = min(i0 / 4 + b, D4 - 1);
                [[unroll]] for (uint e = 0; e < 4; ++e) s_new[4 * b + e] = glast * Ssh[(4 * kcol[b] + e) * COLS + jl];
            }
        }
        for (uint r4 = 0; r4 < CH / 4; ++r4) {
            if (4 * r4 >= n) break;
            [[unroll]] for (uint q = 0; q < 4; ++q) {
                const uint r = 4 * r4 + q;
                const float uv = r < n ? Ush[r * COLS + jl] : 0.0;
                const uint row = min(r, n - 1) * D4;
                [[unroll]] for (uint b = 0; b < MAX_RS4; ++b) {
                    if (b < RS4) {
                        const vec4 kd = sc4[KD_AT / 4 + row + kcol[b]];
                        [[unroll]] for (uint e = 0; e < 4; ++e) s_new[4 * b + e] += kd[e] * uv;
                    }
                }
            }
        }
        [[unroll]] for (uint b = 0; b < MAX_RS4; ++b) {
            [[unroll]] for (uint e = 0; e < 4; ++e) {
                if (b < RS4 && i0 + 4 * b < D) Ssh[(i0 + 4 * b + e) * COLS + jl] = s_new[4 * b + e];
            }
        }
        barrier();
    }
    for (uint idx = tid; idx < D * COLS; idx += WG) {
        const uint i = idx / COLS, jj = j0 + idx % COLS;
        if (jj < D) state[(h * D + i) * D + jj] = Ssh[idx];
    }
}
