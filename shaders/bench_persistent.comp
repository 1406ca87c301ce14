#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_clustered : require
// Benchmark only (benchmarks/bench_persistent.py): a chain of dependent Q4_0 matrix-vector products
// with their arithmetic, the way a decode step's products follow each other, run either as one
// dispatch per product with barriers between (MODE 0, what the engine records) or as one persistent
// dispatch (MODE 1) whose workgroups stay resident, pass from product to product at a grid barrier
// (a counter every workgroup increments once its rows are stored) and issue the next product's first
// weight loads before waiting at it. Both run the same fixed grid, each workgroup looping over
// chunks of rows, so what differs is only how a product follows the one before: bench_chain.comp's
// MODE 0 against MODE 4, with x staged and the weights multiplied.
// Products come in layers of p.np (p.rows[e] x p.cols[e]; cols a multiple of 1024 up to 32 * 32 *
// MAXB, or of 2048 up to 64 * 32 * MAXB), the weight copies of p.copies layers one after another;
// product s reads act half s & 1 and writes rows into the other half. Weights: a 32-weight block's
// 16 quant bytes in wq (byte k: weight k in its low nibble, k + 16 in its high one), its f16 scale in
// wd; w = d (q - 8).
// Arithmetic as the engine's DOT8 form, one level: every workgroup quantizes x per 32 values to int8
// (scale s = max|x| / 127; cols a multiple of 1024, so every lane of a cluster loops alike) in
// shared memory, and a block's sum is d (s sum q xq - 8 s sum xq) with 4-wide integer dot products.
// A row group of LPR lanes per row (32, or 64 for rows past 32 * 32 * MAXB weights), its lanes on
// neighbouring blocks, at most MAXB blocks each: few registers, so 3 workgroups fit an H100 SM (72
// registers; MAXB 4: 54-56, 4).
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dot_ss(uint a, uint b, spirv_literal int packed4x8);   // OpSDotKHR: signed x signed
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint MODE = 0;
layout(constant_id = 1) const uint PIPE = 0;     // 1: the next chunk's loads before this one's arithmetic
// XMODE 1: no staging; every product reads one fixed int8 x from binding 4 (the host's quantization of act's
// first half), through the cache, inside the dot: what the products cost when x arrives quantized (as a
// producer could write it) instead of every workgroup reading, quantizing and storing it in shared memory
// XMODE 2: that fixed int8 x copied into shared memory (staging without reading f32 and quantizing); 3: a lane
// keeps the x of its blocks in registers for the whole product (its blocks are the same in every chunk);
// 4 (FORM 1 only): x quantized per 8 values, not 32 (binding 4's second half), as a producer could write it
// from chunks of 8 rows of its own without waiting for other workgroups' rows
layout(constant_id = 2) const uint XMODE = 0;
#ifndef MAXB_BLOCKS
#define MAXB_BLOCKS 7   // variant bench_persistent_b4: 4, fewer registers (rows of at most 8192 weights)
#endif
const uint MAXB = MAXB_BLOCKS;                  // blocks per lane of a row, at most (a constant, not a
                                                // specialization one: the unrolled arrays stay in registers)
const uint ACT_MAX = 32768;                     // values per act half
const uint MAXCOLS = 2048 * MAXB;
layout(std430, binding = 0) readonly buffer WQ { uvec4 wq[]; };
layout(std430, binding = 0) readonly buffer WQU { uint wqu[]; };   // PREF's touches
layout(std430, binding = 1) readonly buffer WD { uint wd[]; };            // f16 scales, two per word
layout(std430, binding = 2) coherent buffer Act { float act[]; };         // [2][ACT_MAX]
layout(std430, binding = 2) coherent buffer Act4 { vec4 act4[]; };
// flags[0]: the grid barrier's count; flags[1023]: waits given up
layout(std430, binding = 3) coherent volatile buffer F { uint flags[]; };
// XMODE 1: block b's int8 values as XQ's two uvec4s 2b, 2b + 1 (values 0-15, 16-31), then per block (s, s * sum)
layout(std430, binding = 4) readonly buffer XG { uvec4 xg[]; };
layout(std430, binding = 4) readonly buffer XGS { vec2 xgs[]; };
layout(push_constant) uniform P { uint stage; uint n_stages; uint copies; uint np; uint rows[6]; uint cols[6]; } p;
// x as int8: block b's 32 values in two uvec4s (values 0-15, 16-31) at 2b + (half ^ ((b >> 2) & 1)), so
// that the 8 lanes of one 16-byte shared-memory phase (neighbouring blocks) read 32 different banks
// (as words 8b + w, 8 lanes reading word w of neighbouring blocks met 8-way bank conflicts)
shared uvec4 xq[MAXCOLS / 16];
shared vec2 xs[MAXCOLS / 32];      // per block: s, s * sum of its int8 values
shared float red[256];

uvec4 q[MAXB], q2[MAXB];   // PIPE: two chunks' weights, one in flight while the other is multiplied
float d[MAXB], d2[MAXB];
uvec4 xr_lo[MAXB], xr_hi[MAXB];   // XMODE 3
// PREF > 0: before waiting at the grid barrier, a lane also touches (loads one word of each 16-byte unit,
// and its scale word) the units it reads in its next PREF chunks, so that the wait's idle memory pulls
// them into L2; the words are folded into `sink` after the wait and kept alive by an impossible store
layout(constant_id = 5) const uint PREF = 0;
uint sink = 0u;
vec2 xr_s[MAXB];

// Macros, not functions: a function taking the arrays would copy them (register moves that wait for
// the loads in flight).
#define LOAD_CHUNK(Q, D, blk0) { \
    [[unroll]] for (uint i = 0; i < MAXB; ++i) { \
        if (i < nbl) { \
            uint b_ = (blk0) + lpr * i; \
            Q[i] = wq[b_]; \
            D[i] = unpackHalf2x16(wd[b_ >> 1])[b_ & 1u]; \
        } \
    } }

#define DOT_CHUNK(Q, D, ACC) { \
    [[unroll]] for (uint i = 0; i < MAXB; ++i) { \
        if (i < nbl) { \
            uint b = lane + lpr * i; \
            uint sw = (b >> 2) & 1u; \
            uvec4 lo, hi; \
            vec2 sx; \
            if (XMODE == 1u) { lo = xg[2u * b]; hi = xg[2u * b + 1u]; sx = xgs[ACT_MAX / 8u + b]; } \
            else if (XMODE == 3u) { lo = xr_lo[i]; hi = xr_hi[i]; sx = xr_s[i]; } \
            else { lo = xq[2u * b + sw]; hi = xq[2u * b + (sw ^ 1u)]; sx = xs[b]; } \
            int dot = 0; \
            [[unroll]] for (uint w = 0; w < 4u; ++w) { \
                dot += dot_ss(Q[i][w] & 0x0F0F0F0Fu, lo[w], 0); \
                dot += dot_ss((Q[i][w] >> 4) & 0x0F0F0F0Fu, hi[w], 0); \
            } \
            ACC += D[i] * (sx.x * float(dot) - 8.0 * sx.y); \
        } \
    } }

uint pack_i8x4(ivec4 v) {
    return (uint(v.x) & 0xFFu) | ((uint(v.y) & 0xFFu) << 8) | ((uint(v.z) & 0xFFu) << 16) | (uint(v.w) << 24);
}

void stage_x(uint in_base, uint cols) {
    if (XMODE == 2u) {
        for (uint v = gl_LocalInvocationID.x; v < cols / 16u; v += 256u) {
            uint b = v / 2u;
            xq[2u * b + ((v & 1u) ^ ((b >> 2) & 1u))] = xg[v];
        }
        for (uint b = gl_LocalInvocationID.x; b < cols / 32u; b += 256u) xs[b] = xgs[ACT_MAX / 8u + b];
        barrier();
        return;
    }
    // 8 neighbouring lanes per 32 values (a vec4 each): the block's max and sum by clustered reductions.
    // One load in flight per thread: 4 (loads before use) took 85-87 registers, so 2 workgroups an SM
    // where 3 fit (H100: the layer at grid 264 81.6-83.2 against 85.6-87.5 us persistent, but grid 396,
    // 77.5 here, no longer resident).
    for (uint v = gl_LocalInvocationID.x; v < cols / 4u; v += 256u) {
        vec4 x = act4[in_base / 4u + v];
        float amax = subgroupClusteredMax(max(max(abs(x.x), abs(x.y)), max(abs(x.z), abs(x.w))), 8u);
        ivec4 i4 = ivec4(round(x * (amax > 0.0 ? 127.0 / amax : 0.0)));
        int sum = subgroupClusteredAdd(i4.x + i4.y + i4.z + i4.w, 8u);
        uint b = v / 8u, w = v % 8u;
        xq[2u * b + ((w >> 2) ^ ((b >> 2) & 1u))][w & 3u] = pack_i8x4(i4);
        if ((v & 7u) == 0u) xs[v / 8u] = vec2(amax / 127.0, amax / 127.0 * float(sum));
    }
    barrier();
}

// The row's sum over its row group's lanes, stored by the first.
void store_row(float acc, uint at, uint lane, uint lpr, uint tid) {
    if (gl_SubgroupSize == 32u) {
        acc = subgroupAdd(acc);
        if (lpr == 32u) {
            if (lane == 0u) act[at] = acc;
        } else {
            if ((tid & 31u) == 0u) red[tid / 32u] = acc;
            barrier();
            if (lane == 0u) act[at] = red[tid / 32u] + red[tid / 32u + 1u];
            barrier();
        }
    } else {
        red[tid] = acc;
        barrier();
        if (lane == 0u) {
            float t = 0.0;
            for (uint k = 0u; k < lpr; ++k) t += red[tid + k];
            act[at] = t;
        }
        barrier();
    }
}

// FORM 1: the engine's stream-kernel shape (matvec_stream.comp) in the persistent loop: a row group of
// TPR = units-per-row lanes (each lane one 32-weight block of a row, its x in registers for the whole
// product), RJ rows per lane, so a lane's x serves RJ rows and its RJ loads are in flight together; the
// next chunk's loads issued right after this chunk's arithmetic, in flight during its reduction
// (subgroup sums, then one barrier: double-buffered partials). x: the fixed int8 x of binding 4 (XMODE
// ignored). Rows 64 to 256 blocks wide dividing 256 (2048, 4096, 8192 weights).
// (RJ 4: 73 registers on an H100, 3 workgroups an SM)
layout(constant_id = 3) const uint FORM = 0;
layout(constant_id = 4) const uint RJ = 4;   // rows per lane (FORM 1)
shared float part[2][RJ][32];   // per chunk parity, row of the lane, subgroup (of at least 8 lanes)

void wait_stage(uint s, uint grid) {
    if (gl_LocalInvocationID.x == 0u) {
        // gives up after 2^24 polls, or within 1024 when another wait gave up (a grid not
        // resident at once): such a run then ends, slowly, instead of waiting out every barrier
        uint n = 0u;
        bool quit = false;
        while (flags[0] < grid * s) {
            if (++n == (1u << 24) || ((n & 1023u) == 0u && flags[1023] != 0u)) { quit = true; break; }
        }
        if (quit) atomicAdd(flags[1023], 1u);
    }
    barrier();
}

void rows_form_stage(uint s, uint g, uint grid, uint rows, uint nb, uint base, uint out_base) {
    uint tid = gl_LocalInvocationID.x, tpr = nb, groups = 256u / tpr, rpc = groups * RJ;
    uint c = tid % tpr, gq = tid / tpr, chunks = rows / rpc, ch = g;
    uvec4 qv[RJ];
    float dv[RJ];
    #define LOAD_ROWS(CH) { \
        [[unroll]] for (uint j = 0; j < RJ; ++j) { \
            uint b_ = base + ((CH) * rpc + gq + groups * j) * nb + c; \
            qv[j] = wq[b_]; \
            dv[j] = unpackHalf2x16(wd[b_ >> 1])[b_ & 1u]; \
        } }
    if (ch < chunks) LOAD_ROWS(ch);
    uint t[8];
    [[unroll]] for (uint k = 0; k < PREF; ++k) {
        uint cc = ch + grid * (k + 1u);
        if (cc < chunks) {
            uint b0 = base + (cc * rpc + gq) * nb + c;
            t[k] = 0u;
            [[unroll]] for (uint j = 0; j < RJ; ++j) t[k] ^= wqu[4u * (b0 + 256u * j)] ^ wd[(b0 + 256u * j) >> 1];
        }
    }
    if (MODE == 1u && s > 0u) wait_stage(s, grid);
    [[unroll]] for (uint k = 0; k < PREF; ++k) if (ch + grid * (k + 1u) < chunks) sink ^= t[k];
    const uint Q8 = ACT_MAX * 5u / 64u, S8 = ACT_MAX * 9u / 32u;   // XMODE 4's uvec4 / vec2 offsets
    uvec4 lo = xg[(XMODE == 4u ? Q8 : 0u) + 2u * c], hi = xg[(XMODE == 4u ? Q8 : 0u) + 2u * c + 1u];
    vec2 sx = xgs[ACT_MAX / 8u + c];
    vec4 s8 = vec4(0.0);   // XMODE 4: the scales of values 0-7, 8-15, 16-23, 24-31
    if (XMODE == 4u) {
        vec2 a0 = xgs[S8 + 4u * c], a1 = xgs[S8 + 4u * c + 1u], a2 = xgs[S8 + 4u * c + 2u], a3 = xgs[S8 + 4u * c + 3u];
        s8 = vec4(a0.x, a1.x, a2.x, a3.x);
        sx.y = a0.y + a1.y + a2.y + a3.y;
    }
    for (uint it = 0u; ch < chunks; ++it) {
        float acc[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) {
            if (XMODE == 4u) {
                // sub-block k: lo words 2k, 2k + 1 (k < 2) or hi words 2k - 4, 2k - 3
                ivec4 dk = ivec4(0);
                [[unroll]] for (uint w = 0; w < 4u; ++w) {
                    dk[w >> 1] += dot_ss(qv[j][w] & 0x0F0F0F0Fu, lo[w], 0);
                    dk[2u + (w >> 1)] += dot_ss((qv[j][w] >> 4) & 0x0F0F0F0Fu, hi[w], 0);
                }
                acc[j] = dv[j] * (dot(s8, vec4(dk)) - 8.0 * sx.y);
            } else {
                int dot = 0;
                [[unroll]] for (uint w = 0; w < 4u; ++w) {
                    dot += dot_ss(qv[j][w] & 0x0F0F0F0Fu, lo[w], 0);
                    dot += dot_ss((qv[j][w] >> 4) & 0x0F0F0F0Fu, hi[w], 0);
                }
                acc[j] = dv[j] * (sx.x * float(dot) - 8.0 * sx.y);
            }
        }
        uint cn = ch + grid;
        if (cn < chunks) LOAD_ROWS(cn);
        uint buf = it & 1u, sg = gl_SubgroupSize, per_row = tpr / sg;
        [[unroll]] for (uint j = 0; j < RJ; ++j) {
            float v = subgroupAdd(acc[j]);
            if (subgroupElect()) part[buf][j][tid / sg] = v;
        }
        barrier();
        if (tid < rpc) {
            uint gr = tid % groups, j = tid / groups;
            float t = 0.0;
            for (uint k = 0u; k < per_row; ++k) t += part[buf][j][gr * per_row + k];
            act[out_base + ch * rpc + gr + groups * j] = t;
        }
        ch = cn;
    }
    #undef LOAD_ROWS
}

// FORM 0: a row group of lpr lanes per row, each on nbl neighbouring blocks, x staged as XMODE says.
void lanes_form_stage(uint s, uint g, uint grid, uint rows, uint cols, uint base, uint in_base, uint out_base) {
    uint tid = gl_LocalInvocationID.x, nb = cols / 32u;
    uint lpr = nb > 32u * MAXB ? 64u : 32u, nbl = nb / lpr, rpc = 256u / lpr, lane = tid % lpr;
    uint chunks = rows / rpc, c = g;
    uint row0 = tid / lpr;   // the lane's row within a chunk
    if (c < chunks) LOAD_CHUNK(q, d, base + (rpc * c + row0) * nb + lane);
    uint t[8];
    [[unroll]] for (uint k = 0; k < PREF; ++k) {
        uint cc = c + grid * (k + 1u);
        if (cc < chunks) {
            uint b0 = base + (rpc * cc + row0) * nb + lane;
            t[k] = wd[b0 >> 1];
            [[unroll]] for (uint i = 0; i < MAXB; ++i) if (i < nbl) t[k] ^= wqu[4u * (b0 + lpr * i)];
        }
    }
    if (MODE == 1u && s > 0u) wait_stage(s, grid);
    [[unroll]] for (uint k = 0; k < PREF; ++k) if (c + grid * (k + 1u) < chunks) sink ^= t[k];
    if (XMODE == 0u || XMODE == 2u) stage_x(in_base, cols);
    if (XMODE == 3u) {
        [[unroll]] for (uint i = 0; i < MAXB; ++i) {
            if (i < nbl) {
                uint b = lane + lpr * i;
                xr_lo[i] = xg[2u * b];
                xr_hi[i] = xg[2u * b + 1u];
                xr_s[i] = xgs[ACT_MAX / 8u + b];
            }
        }
    }
    while (c < chunks) {
        uint cn = c + grid;
        if (PIPE == 1u && cn < chunks) LOAD_CHUNK(q2, d2, base + (rpc * cn + row0) * nb + lane);
        float acc = 0.0;
        DOT_CHUNK(q, d, acc);
        store_row(acc, out_base + rpc * c + row0, lane, lpr, tid);
        c = cn;
        if (c >= chunks) break;
        if (PIPE == 1u) {
            cn = c + grid;
            if (cn < chunks) LOAD_CHUNK(q, d, base + (rpc * cn + row0) * nb + lane);
            acc = 0.0;
            DOT_CHUNK(q2, d2, acc);
            store_row(acc, out_base + rpc * c + row0, lane, lpr, tid);
            c = cn;
        } else {
            LOAD_CHUNK(q, d, base + (rpc * c + row0) * nb + lane);
        }
    }
}

void main() {
    uint g = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x, grid = gl_NumWorkGroups.x;
    uint layer_blocks = 0u;
    for (uint e = 0u; e < p.np; ++e) layer_blocks += p.rows[e] * p.cols[e] / 32u;
    uint s0 = MODE == 0u ? p.stage : 0u, s1 = MODE == 0u ? p.stage + 1u : p.n_stages;
    for (uint s = s0; s < s1; ++s) {
        uint e = s % p.np, rows = p.rows[e], cols = p.cols[e];
        uint base = ((s / p.np) % p.copies) * layer_blocks;
        for (uint f = 0u; f < e; ++f) base += p.rows[f] * p.cols[f] / 32u;
        uint in_base = (s & 1u) * ACT_MAX, out_base = ((s + 1u) & 1u) * ACT_MAX;
        if (FORM == 1u) rows_form_stage(s, g, grid, rows, cols / 32u, base, out_base);
        else lanes_form_stage(s, g, grid, rows, cols, base, in_base, out_base);
        if (MODE == 1u) {
            memoryBarrierBuffer();
            barrier();
            if (tid == 0u) atomicAdd(flags[0], 1u);
        }
        barrier();   // xq / xs / part are the next product's
    }
    if (PREF > 0u && sink == 0x9E3779B9u && p.copies == 0u) act[0] = 1.0;   // never (copies >= 1)
}
