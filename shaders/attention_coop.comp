#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_shuffle : require
// Causal GQA attention for prompts on cooperative matrices (tensor cores): what attention.comp
// computes, with the same bindings, push constants (sliding window included) and query-row order
// (read its header), for one split (the prompt grids are large enough). GL_KHR_cooperative_matrix like
// matmul_coop.comp (and built like it); 16 x 8 x 16 f16 -> f32 tiles, 32-lane subgroups.
//
// A workgroup of 4 subgroups takes 64 query rows of one KV head (t-major: 16 tokens x 4 GQA heads
// share every K/V row); subgroup w owns rows 16 w .. 16 w + 15 and keeps its q (scaled, f16) as HD/16
// A tiles in registers. KV positions go in blocks of BC = 32, K and V rows staged in shared memory
// as f16 (the cache's own values); the next block's rows are loaded into registers while this block
// is multiplied, so no block waits for memory. One pass over the causal range (online softmax): per
// block S = q K^T into shared memory (per subgroup 16 x 32 f32), each row's running maximum m and
// sum l, P = exp(S - m) as f16 into shared memory, the output accumulators scaled by exp(m_old - m)
// per row, O += P V on the tiles. Which row an accumulator element holds is the implementation's
// choice (the layout is opaque): it is learned once, by loading a tile whose every element is its row
// index, and the same element of every tile of that type lies in the same row.
// At the end O / l goes out through the S area, 32 columns at a time; SINKS (variants *_sinks, gpt-oss):
// each head's sink logit joins the softmax there, once (attention.comp, attention_split.glsl sink_norm).
// Lane l of a subgroup handles row l / 2, columns (l % 2) * 16 .. + 15 of the subgroup's S tile.
#ifndef HD
#define HD 128               // head_dim: a multiple of 16, <= 128 (variants per value)
#endif
#define BC 32                // KV positions per block
#define NW 4                 // subgroups per workgroup
#define BR (16 * NW)         // query rows per workgroup
#define LDK ((HD + 8) / 4)   // shared K / V / q row stride in uvec2 (4 halves), padded against bank conflicts
#define LDP ((BC + 8) / 4)   // shared P row stride in uvec2
#define KT (HD / 16)         // K steps of q K^T
#define OT (HD / 8)          // 16 x 8 output tiles per subgroup
// the subgroup's tiles: A (M x K) and B (K x N) f16, the f32 accumulator (M x N)
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 8, gl_MatrixUseB>
#define MAT_ACC coopmat<float, gl_ScopeSubgroup, 16, 8, gl_MatrixUseAccumulator>
layout(local_size_x = 32 * NW) in;
const float NEG = -1.0e30;

layout(std430, binding = 0) readonly buffer Q { vec4 q[]; };
layout(std430, binding = 1) readonly buffer K { uvec4 kc[]; };   // 8 halves per uvec4
layout(std430, binding = 2) readonly buffer V { uvec4 vc[]; };
layout(std430, binding = 3) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
// OUT_F16 (variants *_to_f16): out in f16 (rounded as convert.comp rounds), for a prompt's output
// projection reading its x as f16 (kernels/matmul.py record_f16_x)
#ifdef OUT_F16
layout(std430, binding = 4) writeonly buffer Out { float16_t o[]; };
#define STORE(v) float16_t(v)
#else
layout(std430, binding = 4) writeonly buffer Out { float o[]; };
#define STORE(v) (v)
#endif
#ifdef SINKS
// the kernel's last binding (Vulkan bindings numbered 0 .. n-1: kernels/attention.py)
layout(std430, binding = 5) readonly buffer Sinks { float sinks[]; };   // [n_head]
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_head; uint n_head_kv; uint n_splits; uint min_chunk; float scale;
    uint window;       // sliding window: positions a row sees, its own included (0: all)
} p;

shared uvec2 ks[BR * LDK];      // first the workgroup's q rows (f16, scaled), then K rows 0..BC-1
shared uvec2 vs[BC * LDK];      // V rows of the block
shared float ss[NW * 16 * BC];  // per subgroup: S (16 x BC, row-major), at the end O 32 columns at a time
shared uvec2 ps[NW * 16 * LDP]; // per subgroup: P (16 x BC f16, row-major)
shared float alpha[NW * 16];    // per subgroup: each row's factor exp(m_old - m) for this block

uvec2 pack4(vec4 v) { return uvec2(packHalf2x16(v.xy), packHalf2x16(v.zw)); }

// The first position the query at position `pos` may see: its sequence's start (seq_len > 0) or 0,
// and with a sliding window (window = W > 0) no earlier than pos - W + 1.
uint first_visible(const uint pos, const uint seq_len) {
    const uint lo = seq_len > 0 ? pos / seq_len * seq_len : 0;
    return p.window > 0 && pos + 1 > p.window ? max(lo, pos + 1 - p.window) : lo;
}

// K and V rows pos0 .. pos0 + BC - 1 of KV head kvh, this thread's pieces (positions from `last` on
// repeat row `last`: finite values, their probabilities are 0), loaded into registers, then stored to
// shared memory.
#define KV_PIECES ((BC * HD / 8 + 32 * NW - 1) / (32 * NW))
struct KVRows { uvec4 k[KV_PIECES]; uvec4 v[KV_PIECES]; };
KVRows load_kv(uint pos0, uint last, uint kvh) {
    KVRows r;
    const uint row8 = HD / 8, stride8 = p.n_head_kv * row8;
    [[unroll]] for (uint s = 0; s < KV_PIECES; ++s) {
        const uint idx = min(gl_LocalInvocationID.x + 32 * NW * s, BC * row8 - 1);
        const uint src = min(pos0 + idx / row8, last) * stride8 + kvh * row8 + idx % row8;
        r.k[s] = kc[src];
        r.v[s] = vc[src];
    }
    return r;
}
void store_kv(const in KVRows r) {
    const uint row8 = HD / 8;
    [[unroll]] for (uint s = 0; s < KV_PIECES; ++s) {
        const uint idx = gl_LocalInvocationID.x + 32 * NW * s;
        if (idx < BC * row8) {
            const uint c = idx / row8, e = idx % row8;
            ks[c * LDK + 2 * e] = r.k[s].xy;
            ks[c * LDK + 2 * e + 1] = r.k[s].zw;
            vs[c * LDK + 2 * e] = r.v[s].xy;
            vs[c * LDK + 2 * e + 1] = r.v[s].zw;
        }
    }
}

void main() {
    const uint tid = gl_LocalInvocationID.x;
    const uint w = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    const uint kvh = gl_WorkGroupID.y;
    const uint n_gqa = p.n_head / p.n_head_kv;
    const uint n_rows = p.n_tokens * n_gqa;
    const uint row0 = gl_WorkGroupID.x * BR;
    const uint rows_here = min(BR, n_rows - row0);
    const uint n_past = step[0], n_kv = step[2], seq_len = step[4];

    // This lane's row of the S tile: its visible positions [lo, lim].
    const uint my_r = w * 16 + lane / 2;
    const uint my_row = row0 + min(my_r, rows_here - 1);
    const uint my_t = my_row / n_gqa;
    const uint lim = min(n_past + my_t, n_kv - 1);
    const uint lo = first_visible(n_past + my_t, seq_len);
    const uint col0 = (lane % 2) * 16;
    // The workgroup's positions: from its first row's first visible one to its last row's last.
    const uint t_first = row0 / n_gqa, t_last = (row0 + rows_here - 1) / n_gqa;
    const uint kv_end = min(n_kv, n_past + t_last + 1);
    const uint kv_begin = first_visible(n_past + t_first, seq_len) / BC * BC;

    // q rows -> f16 in shared (scaled), then each subgroup's 16 x HD as KT A tiles in registers.
    for (uint idx = tid; idx < BR * (HD / 4); idx += 32 * NW) {
        const uint r = idx / (HD / 4), e = idx % (HD / 4);
        vec4 v = vec4(0.0);
        if (r < rows_here) {
            const uint row = row0 + r, t = row / n_gqa;
            v = q[((t * p.n_head + kvh * n_gqa + (row - t * n_gqa)) * HD) / 4 + e] * p.scale;
        }
        ks[r * LDK + e] = pack4(v);
    }
    barrier();
    MAT_A qa[KT];
    [[unroll]] for (uint k = 0; k < KT; ++k) coopMatLoad(qa[k], ks, (w * 16) * LDK + k * 4, LDK, gl_CooperativeMatrixLayoutRowMajor);
    barrier();   // ks is K's from here on

    const uint sbase = w * 16 * BC;   // this subgroup's S tile
    // the accumulator's element -> row map: a tile of row indices loaded from the S area
    for (uint e = lane; e < 16 * 8; e += 32) ss[sbase + (e / 8) * BC + e % 8] = float(e / 8);
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    MAT_ACC rowmap;
    coopMatLoad(rowmap, ss, sbase, BC, gl_CooperativeMatrixLayoutRowMajor);
    subgroupBarrier();
    float m = NEG, l = 0.0;
    MAT_ACC oacc[OT];
    [[unroll]] for (uint j = 0; j < OT; ++j) oacc[j] = MAT_ACC(0.0);

    KVRows next = load_kv(kv_begin, kv_end - 1, kvh);
    for (uint c0 = kv_begin; c0 < kv_end; c0 += BC) {
        store_kv(next);
        barrier();
        if (c0 + BC < kv_end) next = load_kv(c0 + BC, kv_end - 1, kvh);   // in flight during this block
        // S = q K^T: BC / 8 tiles of 16 x 8, KT steps each
        [[unroll]] for (uint j = 0; j < BC / 8; ++j) {
            MAT_ACC sacc = MAT_ACC(0.0);
            [[unroll]] for (uint k = 0; k < KT; ++k) {
                MAT_B kb;
                coopMatLoad(kb, ks, (j * 8) * LDK + k * 4, LDK, gl_CooperativeMatrixLayoutColumnMajor);   // B[d][c] = K[c][d]
                sacc = coopMatMulAdd(qa[k], kb, sacc);
            }
            coopMatStore(sacc, ss, sbase + j * 8, BC, gl_CooperativeMatrixLayoutRowMajor);
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        float s[16];
        float bmax = NEG;
        [[unroll]] for (uint i = 0; i < 16; ++i) {
            const uint pos = c0 + col0 + i;
            s[i] = (pos >= lo && pos <= lim) ? ss[sbase + (lane / 2) * BC + col0 + i] : NEG;
            bmax = max(bmax, s[i]);
        }
        bmax = max(bmax, subgroupShuffleXor(bmax, 1u));
        const float m_new = max(m, bmax);
        const float a = exp(m - m_new);   // 0 for the first visible block, 1 while nothing is visible
        m = m_new;
        // P = exp(S - m) (masked: 0) as f16, this lane's 16 values of its row
        float psum = 0.0;
        uvec2 packed[4];
        [[unroll]] for (uint i = 0; i < 16; i += 4) {
            vec4 pv;
            [[unroll]] for (uint e = 0; e < 4; ++e) pv[e] = s[i + e] > 0.5 * NEG ? exp(s[i + e] - m) : 0.0;
            psum += (pv.x + pv.y) + (pv.z + pv.w);
            packed[i / 4] = pack4(pv);
        }
        l = l * a + psum;
        const uint pb = (w * 16 + lane / 2) * LDP + col0 / 4;
        [[unroll]] for (uint i = 0; i < 4; ++i) ps[pb + i] = packed[i];
        if (lane % 2 == 0) alpha[w * 16 + lane / 2] = a;
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        // O = O * a (per row) + P V: BC / 16 K steps, OT output tiles
        [[unroll]] for (uint i = 0; i < rowmap.length(); ++i) {
            const float f = alpha[w * 16 + uint(rowmap[i])];
            [[unroll]] for (uint j = 0; j < OT; ++j) oacc[j][i] *= f;
        }
        [[unroll]] for (uint k = 0; k < BC / 16; ++k) {
            MAT_A pa;
            coopMatLoad(pa, ps, (w * 16) * LDP + k * 4, LDP, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint j = 0; j < OT; ++j) {
                MAT_B vb;
                coopMatLoad(vb, vs, (k * 16) * LDK + j * 2, LDK, gl_CooperativeMatrixLayoutRowMajor);   // B[c][d] = V[c][d]
                oacc[j] = coopMatMulAdd(pa, vb, oacc[j]);
            }
        }
        barrier();   // every subgroup is done with this block's K / V (and S, P)
    }

    // out = O / l, through this subgroup's S area: 4 tiles (32 columns) at a time.
    l += subgroupShuffleXor(l, 1u);
#ifdef SINKS
    // out = O e^(m-M) / (l e^(m-M) + e^(s-M)), M = max(m, s): the head's sink s, not scaled like q.k
    const float sink = sinks[kvh * n_gqa + (my_row - my_t * n_gqa)];
    const float m_s = max(m, sink), a_s = exp(m - m_s);
    const float inv_l = a_s / (l * a_s + exp(sink - m_s));
#else
    const float inv_l = l > 0.0 ? 1.0 / l : 0.0;
#endif
    const bool live = my_r < rows_here;
    const uint orow = my_t * p.n_head + kvh * n_gqa + (my_row - my_t * n_gqa);
    [[unroll]] for (uint j0 = 0; j0 < OT; j0 += 4) {
        [[unroll]] for (uint j = 0; j < 4; ++j)
            if (j0 + j < OT) coopMatStore(oacc[j0 + j], ss, sbase + j * 8, BC, gl_CooperativeMatrixLayoutRowMajor);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
        if (live) {
            [[unroll]] for (uint i = 0; i < 16; ++i) {
                const uint d = j0 * 8 + col0 + i;
                if (d < HD) o[orow * HD + d] = STORE(ss[sbase + (lane / 2) * BC + col0 + i] * inv_l);
            }
        }
        subgroupBarrier();
    }
}
