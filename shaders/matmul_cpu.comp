#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_ballot : require
// y[t, y_off + r] = sum_c W[r, c] * x[t, c] (+ bias[y_off + r]) for a batch of tokens, shaped for software
// devices (llvmpipe): a workgroup is one subgroup, the lanes of one CPU vector register.
//
// Why not matmul.comp there: llvmpipe runs a load from a buffer or shared memory inside a loop as a
// loop over the lanes (a bounds check and a branch per lane and component; uniform addresses too), some
// 700 cycles for 8 lanes, while arithmetic runs 8 lanes an instruction. matmul.comp loads each operand
// from shared memory once per 4 x 8 multiply-adds (after staging it there), ~1 GFLOP/s. Here loads are
// few and wide: lane l loads its rows' blocks of W and, per token, one vec4 of the unit of x (columns
// 4l .. 4l+3; two vec4 with 4 lanes); subgroupBroadcast (a register shuffle) then hands each lane the
// whole unit of every token, kept in private memory (the stack), which feeds RT x TT sums per lane.
// Lane l computes rows row0 + l + LANES * i (i < RT) for TT tokens: a workgroup covers LANES * RT rows
// x TT tokens. MUL_MAT_ID (a mixture of experts' prompt products), as matmul.comp's: workgroup z takes
// expert e0 + z of the chunk (its n_rows rows at chunk row z * n_rows) and the (token, slot) pairs that
// chose it, listed by moe_group.comp: x row = the pair (xslot) or its token, y row = the pair.
// llvmpipe, a 2.9 GHz EPYC core, 576 x 576 Q4_1 weight, 64 tokens (docs/KERNELS.md): RT x TT = 16 x 8
// 6 GFLOP/s, 8 x 8 4.8 (its pipeline made in half the time), 2 x 8 1.6, 32 x 16 as 16 x 8 (a 20 s pipeline).
layout(local_size_x_id = 0) in;           // LANES: the subgroup size, 4 or 8 (kernels/selection.py)
layout(constant_id = 0) const uint LANES = 8;
#define RT 16
#define TT 8
#define XV (8 / LANES)                    // vec4s of a token's unit per lane

#include "quants.glsl"
layout(binding = 1) uniform usamplerBuffer x_texels;   // x as texels (quants.glsl W_TEXELS says why)
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Push {
    uint n_rows;    // rows of this chunk
    uint cols;      // a multiple of 32 (kernels/selection.py)
    uint y_stride;  // floats between two tokens' outputs (rows of the whole matrix)
    uint y_off;     // first row of this chunk in the whole matrix
    uint has_bias;
    uint n_tokens;
#ifdef MUL_MAT_ID
    uint n_used;    // slots per token
    uint e0;        // first expert of this chunk
    uint n_expert;  // experts of the whole model (the group lists' layout)
    uint xslot;     // x has one row per (token, slot), else one per token
#endif
} p;
#ifdef MUL_MAT_ID
layout(std430, binding = 4) readonly buffer Groups { uint groups[]; };
#endif

#include "cpu_unit.glsl"

void main() {
    uint lane = gl_SubgroupInvocationID;
    uint row0 = gl_WorkGroupID.x * (LANES * RT);
    uint tok0 = gl_WorkGroupID.y * TT;
    uint units4 = p.cols / 4;
#ifdef MUL_MAT_ID
    q_chunk_blocks = gl_NumWorkGroups.z * p.n_rows * (p.cols / QK);
    uint e = p.e0 + gl_WorkGroupID.z, n_tok = groups[e];
    if (tok0 >= n_tok) return;   // uniform: this expert has fewer tokens
    uint wrow0 = gl_WorkGroupID.z * p.n_rows;
    uint list = p.n_expert + e * p.n_tokens + tok0;
#else
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    uint wrow0 = 0, n_tok = p.n_tokens;
#endif

    uint rows[RT];   // a row past the chunk computes its last one (not stored)
    [[unroll]] for (uint i = 0; i < RT; ++i) rows[i] = wrow0 + min(row0 + lane + LANES * i, p.n_rows - 1);
    uint xrow[TT];   // a token past the batch reads the last one (not stored)
    [[unroll]] for (uint j = 0; j < TT; ++j) {
#ifdef MUL_MAT_ID
        uint pair = groups[list + min(j, n_tok - 1 - tok0)];
        xrow[j] = (p.xslot != 0 ? pair : pair / p.n_used) * units4 + lane * XV;
#else
        xrow[j] = min(tok0 + j, n_tok - 1) * units4 + lane * XV;
#endif
    }

    float acc[RT][TT];
    [[unroll]] for (uint i = 0; i < RT; ++i)
        [[unroll]] for (uint j = 0; j < TT; ++j) acc[i][j] = 0.0;

    for (uint u = 0; u < p.cols / 32; ++u) {
        vec4 xb[TT][8];   // unit u of each token, in every lane
        [[unroll]] for (uint j = 0; j < TT; ++j)
            [[unroll]] for (uint v = 0; v < XV; ++v) {
                vec4 xv = uintBitsToFloat(texelFetch(x_texels, int(xrow[j] + 8 * u + v)));
                [[unroll]] for (uint l = 0; l < LANES; ++l) xb[j][XV * l + v] = subgroupBroadcast(xv, l);
            }
        [[unroll]] for (uint i = 0; i < RT; ++i) {
            vec4 w[8];
            load_unit(rows[i], u, p.cols, w);
            [[unroll]] for (uint k = 0; k < 8; ++k)
                [[unroll]] for (uint j = 0; j < TT; ++j) acc[i][j] += dot(w[k], xb[j][k]);
        }
    }

    [[unroll]] for (uint i = 0; i < RT; ++i) {
        uint r = row0 + lane + LANES * i;
        if (r >= p.n_rows) continue;
        float b = p.has_bias != 0 ? bias[p.y_off + r] : 0.0;
        [[unroll]] for (uint j = 0; j < TT; ++j) {
            if (tok0 + j >= n_tok) break;
#ifdef MUL_MAT_ID
            uint t = groups[list + j];   // the pair: its output row
#else
            uint t = tok0 + j;
#endif
            y[t * p.y_stride + p.y_off + r] = acc[i][j] + b;
        }
    }
}
