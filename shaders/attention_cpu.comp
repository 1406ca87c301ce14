#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : enable
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// Causal GQA flash attention of a prompt batch over the f16 KV cache, shaped for software devices
// (llvmpipe): attention.comp's bindings, push constants, grid, splits and output (attention_split.glsl),
// with a workgroup of one subgroup, the lanes of one CPU vector register.
//
// Why not attention.comp there: llvmpipe runs a load from a buffer or shared memory inside a loop as
// a loop over the lanes (~700 cycles for 8 lanes), and attention.comp reads its queries and
// probabilities from shared memory in its inner loops (~2,300 loads per 8 rows x 128 positions).
// Here the lanes split the head dimensions: lane l owns 8-value slots l, l + LANES, ... of a head (16
// bytes of an f16 K or V row), holds its share of the block's BR queries and outputs in private
// memory, and per KV position loads its slots of the K row, adds its part of each row's score across
// the lanes (subgroupAdd), updates each row's online softmax (every lane alike) and adds p * its slots
// of the V row to its outputs: two loads a position, no shared memory. The code stays small (the
// driver compiles it in well under a second; an unrolled head of 256 took minutes). Rows: as
// attention.comp (t-major, the GQA heads of a KV head together); a row's visible positions likewise
// (n_past, seq_len, window).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 8;       // LANES: the subgroup size (kernels/attention.py)
layout(constant_id = 1) const uint HD = 128;     // head_dim, a multiple of 8
#ifndef BR
#define BR 8
#endif
const uint HD4 = HD / 4;
const uint HD8 = HD / 8;                   // 8-value slots (an f16 uvec4) of a head
const uint SLOTS = (HD8 + WG - 1) / WG;    // ... a lane owns (a lane past HD8 holds zeros)
const float NEG = -1.0e30;

layout(std430, binding = 0) readonly buffer Q { vec4 q[]; };
// K and V as texels (vk/kernel.py "t"): llvmpipe fetches a texel with per-lane addresses as one
// gather, a storage-buffer load as a loop over the lanes (shaders/quants.glsl W_TEXELS)
layout(binding = 1) uniform usamplerBuffer kc;
layout(binding = 2) uniform usamplerBuffer vc;
layout(std430, binding = 3) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 4) writeonly buffer Out { vec4 o[]; };
#ifdef SPLIT
layout(std430, binding = 5) coherent buffer OPart { vec4 opart[]; };   // [n_splits][n_tokens*n_head][HD]
layout(std430, binding = 6) coherent buffer ML { vec2 ml[]; };         // [n_splits][n_tokens*n_head]
layout(std430, binding = 7) coherent buffer Count { uint counter[]; }; // [n_row_blocks][n_head_kv], 0 between runs
shared bool is_last;
#endif
#ifdef SINKS
#ifdef SPLIT
layout(std430, binding = 8) readonly buffer Sinks { float sinks[]; };   // [n_head]
#else
layout(std430, binding = 5) readonly buffer Sinks { float sinks[]; };
#endif
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_head; uint n_head_kv; uint n_splits;
    uint min_chunk;    // positions per split at least (a multiple of WG)
    float scale;
    uint window;       // sliding window: positions a row sees, its own included (0: all)
} p;

shared vec4 qs[BR * HD4];      // the rows' unnormalised outputs, for finish_rows

#include "attention_split.glsl"

// 8 f16 of a K or V row as two vec4
void unpack8(const uvec4 w, out vec4 a, out vec4 b) {
    a = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
    b = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
}

void main() {
    const uint lane = gl_SubgroupInvocationID;
    const uint kvh = gl_WorkGroupID.y;
    const uint split = gl_WorkGroupID.z;
    const uint n_gqa = p.n_head / p.n_head_kv;
    const uint row0 = gl_WorkGroupID.x * BR;
    const uint rows_here = min(BR, p.n_tokens * n_gqa - row0);
    const uint n_past = step[0];
    const uint n_kv = step[2];
    const uint seq_len = step[4];

    const SplitRange sr = split_range(WG, split, row0, rows_here, n_gqa, n_past, n_kv, seq_len);
    if (sr.begin >= n_kv) return;                  // inactive split: the merge skips it too
    const uint kv_end = sr.end;

    uint lim[BR], lo[BR], orow[BR];                // last / first position row r sees; its q / out row
    [[unroll]] for (uint r = 0; r < BR; ++r) {
        const uint row = row0 + min(r, rows_here - 1);
        const uint t = row / n_gqa;
        lim[r] = n_past + t;
        lo[r] = first_visible(lim[r], seq_len);
        orow[r] = t * p.n_head + kvh * n_gqa + (row - t * n_gqa);
    }
    // this lane's slots: its queries (scaled; zero past the head) and outputs, each slot two vec4
    vec4 qa[BR][SLOTS], qb[BR][SLOTS], oa[BR][SLOTS], ob[BR][SLOTS];
    uint slot[SLOTS];
    [[unroll]] for (uint i = 0; i < SLOTS; ++i) slot[i] = min(lane + WG * i, HD8 - 1);
    [[unroll]] for (uint r = 0; r < BR; ++r)
        [[unroll]] for (uint i = 0; i < SLOTS; ++i) {
            const float f = lane + WG * i < HD8 ? p.scale : 0.0;
            qa[r][i] = q[orow[r] * HD4 + 2 * slot[i]] * f;
            qb[r][i] = q[orow[r] * HD4 + 2 * slot[i] + 1] * f;
            oa[r][i] = vec4(0.0);
            ob[r][i] = vec4(0.0);
        }
    float m[BR], l[BR];
    [[unroll]] for (uint r = 0; r < BR; ++r) { m[r] = NEG; l[r] = 0.0; }
    const uint stride8 = p.n_head_kv * HD8;
    const uint head_off = kvh * HD8;

    for (uint pos = max(sr.begin, sr.first); pos < kv_end; ++pos) {
        const uint row8 = pos * stride8 + head_off;
        vec4 ka[SLOTS], kb[SLOTS];
        [[unroll]] for (uint i = 0; i < SLOTS; ++i) unpack8(texelFetch(kc, int(row8 + slot[i])), ka[i], kb[i]);
        float pr[BR];
        [[unroll]] for (uint r = 0; r < BR; ++r) {
            float part = 0.0;
            [[unroll]] for (uint i = 0; i < SLOTS; ++i) part += dot(qa[r][i], ka[i]) + dot(qb[r][i], kb[i]);
            const float sc = subgroupAdd(part);
            const bool ok = pos <= lim[r] && pos >= lo[r];
            const float m_new = ok ? max(m[r], sc) : m[r];
            const float alpha = exp(m[r] - m_new);
            pr[r] = ok ? exp(sc - m_new) : 0.0;
            m[r] = m_new;
            l[r] = l[r] * alpha + pr[r];
            [[unroll]] for (uint i = 0; i < SLOTS; ++i) { oa[r][i] *= alpha; ob[r][i] *= alpha; }
        }
        [[unroll]] for (uint i = 0; i < SLOTS; ++i) {
            vec4 va, vb;
            unpack8(texelFetch(vc, int(row8 + slot[i])), va, vb);
            [[unroll]] for (uint r = 0; r < BR; ++r) { oa[r][i] += pr[r] * va; ob[r][i] += pr[r] * vb; }
        }
    }

    // each lane's slots of O to shared memory for finish_rows
    [[unroll]] for (uint r = 0; r < BR; ++r)
        [[unroll]] for (uint i = 0; i < SLOTS; ++i)
            if (lane + WG * i < HD8) {
                qs[r * HD4 + 2 * (lane + WG * i)] = oa[r][i];
                qs[r * HD4 + 2 * (lane + WG * i) + 1] = ob[r][i];
            }
    barrier();

    finish_rows(n_kv - sr.base, sr.chunk, split, row0, rows_here, kvh, n_gqa, orow, m, l);
}
