#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_ballot : require
// matvec.comp's product for a few tokens (t < NT <= 8), shaped for software devices (llvmpipe):
//
//   y[t, y_off + r] = resid[t, y_off + r] + bias[y_off + r] + s_t * sum_c W[r, c] * x'[t, c]
//
// with matvec.comp's bindings, push constants and fused inputs (NORM: x' = x * nw, s_t = 1/rms(x[t]);
// GLU: x' = silu(x) * up; RESID), so that matmul.py records either kernel the same way.
//
// Why a kernel of its own: llvmpipe runs a load inside a loop as a loop over the lanes (~700 cycles
// for 8 lanes, uniform addresses too: matmul_cpu.comp's header), and matvec.comp's lanes each load 4
// bytes of W and 32 of x per 8 weights. Here a workgroup is one subgroup; lane l computes rows row0 + l
// + LANES * i (i < NR) and, per 32-column unit, loads one vec4 of each token's x (two with 4 lanes),
// which subgroupBroadcast hands to every lane (private memory), and each of its rows' unit in the
// type's widest loads (cpu_unit.glsl). A workgroup covers LANES * NR rows (rows_per_wg).
// Specialization: 0 the workgroup size (LANES: the subgroup size, 4 or 8), 1 NT, 2 NORM, 3 RESID,
// 4 NR (rows a lane), 7 GLU (5 and 6, matvec.comp's KS and U, are not read).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint LANES = 8;
layout(constant_id = 1) const uint NT = 1;
layout(constant_id = 2) const bool NORM = false;
layout(constant_id = 3) const bool RESID = false;
layout(constant_id = 4) const uint NR = 8;
layout(constant_id = 7) const bool GLU = false;
#define XV (8 / LANES)   // vec4s of a token's unit per lane

#include "quants.glsl"
layout(binding = 1) uniform usamplerBuffer x_texels;   // x, nw, up as texels (quants.glsl W_TEXELS)
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(binding = 4) uniform usamplerBuffer nw_texels;
layout(std430, binding = 5) readonly buffer Resid { float resid[]; };
layout(binding = 6) uniform usamplerBuffer up_texels;
layout(push_constant) uniform Push {
    uint n_rows;       // rows of this chunk
    uint cols;         // a multiple of 32 (kernels/selection.py)
    uint y_stride;     // floats between two tokens' outputs (rows of the whole matrix)
    uint y_off;        // first row of this chunk in the whole matrix
    uint has_bias;
    uint rows_per_wg;  // LANES * NR
    float eps;
} p;
#include "cpu_unit.glsl"

void main() {
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    uint lane = gl_SubgroupInvocationID;
    uint row0 = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * p.rows_per_wg;
    uint units4 = p.cols / 4;

    uint rows[NR];   // a row past the chunk computes its last one (not stored)
    [[unroll]] for (uint i = 0; i < NR; ++i) rows[i] = min(row0 + lane + LANES * i, p.n_rows - 1);
    float acc[NR][NT], ss[NT];
    [[unroll]] for (uint t = 0; t < NT; ++t) {
        ss[t] = 0.0;
        [[unroll]] for (uint i = 0; i < NR; ++i) acc[i][t] = 0.0;
    }

    for (uint u = 0; u < p.cols / 32; ++u) {
        vec4 xb[NT][8];   // unit u of each token's x', in every lane
        [[unroll]] for (uint v = 0; v < XV; ++v) {
            uint k = 8 * u + XV * lane + v;   // vec4 index within a token's row
            vec4 w = NORM ? uintBitsToFloat(texelFetch(nw_texels, int(k))) : vec4(1.0);
            [[unroll]] for (uint t = 0; t < NT; ++t) {
                vec4 xv = uintBitsToFloat(texelFetch(x_texels, int(t * units4 + k)));
                if (NORM) { ss[t] += dot(xv, xv); xv *= w; }
                if (GLU) xv = xv / (1.0 + exp(-xv)) * uintBitsToFloat(texelFetch(up_texels, int(t * units4 + k)));
                [[unroll]] for (uint l = 0; l < LANES; ++l) xb[t][XV * l + v] = subgroupBroadcast(xv, l);
            }
        }
        [[unroll]] for (uint i = 0; i < NR; ++i) {
            vec4 w[8];
            load_unit(rows[i], u, p.cols, w);
            [[unroll]] for (uint k = 0; k < 8; ++k)
                [[unroll]] for (uint t = 0; t < NT; ++t) acc[i][t] += dot(w[k], xb[t][k]);
        }
    }

    [[unroll]] for (uint t = 0; t < NT; ++t) {
        float scale = NORM ? inversesqrt(subgroupAdd(ss[t]) / float(p.cols) + p.eps) : 1.0;
        [[unroll]] for (uint i = 0; i < NR; ++i) {
            uint r = row0 + lane + LANES * i;
            if (r >= p.n_rows) continue;
            uint row = p.y_off + r;
            float v = acc[i][t] * scale;
            if (p.has_bias != 0) v += bias[row];
            if (RESID) v += resid[t * p.y_stride + row];
            y[t * p.y_stride + row] = v;
        }
    }
}
