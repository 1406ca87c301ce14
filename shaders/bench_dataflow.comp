#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_shader_subgroup_clustered : require
#extension GL_KHR_shader_subgroup_vote : require
#extension GL_KHR_shader_subgroup_shuffle : require
// Benchmark only (benchmarks/bench_dataflow.py): bench_persistent.comp's chain of dependent Q4_0 products
// with no grid barrier. Why: a persistent dispatch that passes from product to product at grid barriers
// idles memory at each (the barrier's round trip, the last round's stragglers): its products, x arriving
// quantized, take ~54-57 us a 7.2B layer (H100) where their bytes take ~41.
//
// Work is cut into tasks: 32 rows (a row chunk) of a product by one part of 1024 columns (K parts a row).
// Task t of the dispatch is workgroup t % grid's, each workgroup taking its tasks in order; tasks go by
// product, and within a product as task_at says (groups of 32 row chunks, each group's merges `lag`
// steps after its other parts). A task needs only the 32 blocks of x its part reads, so it waits for
// those blocks, not for the product before to end; its weight loads are issued first, and the next
// task's right after this one's arithmetic. The last part of a chunk (k = K - 1) adds the other parts'
// partial sums (each stored as one 8-byte word with the product's index: its own ready flag, nothing to
// put back; loaded before the task's turn), quantizes the chunk's 32 sums as one int8 block of the next
// product's x and publishes it. No flag: x is loaded with the task's weights, before knowing it is there,
// and checked on arrival, so that a task makes no round trip to L2 of its own. Each 16-byte word of it
// is stored whole (one store, which an NVIDIA GPU makes visible whole) and tells whether it is there: the
// values' words hold int8 in -127..127 and read 0x80 bytes before (the slot's fill), the scale word
// (s, s * sum) a negative s. Only where a word is not there yet is it polled. No fences: every word that
// is waited for tells by itself that it is there.
// Deadlock-free when every workgroup is resident: a task depends only on tasks of lower index, and each
// workgroup takes its tasks in increasing order. Waits give up after 2^22 polls or soon after another gave
// up (counted in flags[1023]), so a grid that is not resident ends with wrong sums instead of hanging.
// Weights as bench_persistent.comp (quant bytes in wq, f16 scales in wd, w = d (q - 8)) but tiled: a
// task's 32 rows x 32 blocks one after another (row by row), tiles by part, then row chunk; x slot s (the
// input of product s of the dispatch; slot 0 the host's) holds ACT_MAX int8 values and a (s, s * sum)
// pair per 32; y: every merged chunk's f32 sums (product s into half s & 1), for checking.
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dot_ss(uint a, uint b, spirv_literal int packed4x8);   // OpSDotKHR: signed x signed
layout(local_size_x = 256) in;
// BARE (timing only, wrong sums): 1, no task checks its x or merges (every part stores its partial sums);
// 2, no task checks its x; 3, a merge publishes its own part's sums without reading the other parts'
layout(constant_id = 0) const uint BARE = 0;
// XSHARE 1: a task's 32 blocks of x (80 16-byte words: values, then scale pairs) loaded once per workgroup
// by its first 80 invocations, past L1, and handed to the others in shared memory (a barrier a task);
// 0: every lane loads its block through L1 (a line read there before its block was written stays stale
// in L1: every later task of that part on the SM polls it past L1 again)
layout(constant_id = 1) const uint XSHARE = 1;
shared uvec4 xsh[2][80];           // XSHARE: by task parity
const uint RJ = 4;                 // rows per 32-lane row group; 8 row groups: 32 rows a task
const uint ACT_MAX = 32768;
const uint SLOT16 = ACT_MAX / 16u + ACT_MAX / 64u;   // uvec4 per x slot: values, then scale pairs
const uint GIVE_UP = 1u << 22;
const uint MAX_PARTS = 16;          // columns up to 16384
layout(std430, binding = 0) readonly buffer WQ { uvec4 wq[]; };
layout(std430, binding = 1) readonly buffer WD { uint wd[]; };
// x slots: XSHARE 0 reads them through L1, XSHARE 1 past it (coherent); polled past it, written as coherent
layout(std430, binding = 2) readonly buffer XQR { uvec4 xqr[]; };
layout(std430, binding = 2) readonly buffer XSR { vec2 xscr[]; };
layout(std430, binding = 2) coherent volatile buffer XQV { uvec4 xqv[]; };
layout(std430, binding = 2) coherent volatile buffer XSV { vec2 xscv[]; };
layout(std430, binding = 2) coherent buffer XQ { uvec4 xq[]; };
layout(std430, binding = 2) coherent buffer XS { vec2 xsc[]; };
// partial sums: (f32 bits, index of the product that wrote it); the buffer's fill (all ones) is no product's
layout(std430, binding = 3) coherent volatile buffer PS { uvec2 partial[]; };
layout(std430, binding = 4) writeonly buffer Y { float y[]; };
layout(std430, binding = 5) coherent volatile buffer F { uint flags[]; };   // [1023]: waits given up
layout(push_constant) uniform P { uint s0; uint s1; uint copies; uint np; uint rows[6]; uint cols[6]; uint lag;
                                  uint gap; } p;   // gap: iterations of arithmetic between two polls
shared float vals[2][32];   // by task parity
shared uint words[8];
shared float red[256];             // row sums where a subgroup is narrower than 32 lanes

// A product's shape and where its weights, partial sums and x slots start.
struct Stage { uint s, parts, chunks, nbr, base, pbase, first, ntasks; };

Stage stage_at(uint s, uint first) {
    Stage st;
    uint e = s % p.np, layer_blocks = 0u, before = 0u, pbase = 0u;
    for (uint f = 0u; f < p.np; ++f) {
        uint blocks = p.rows[f] * p.cols[f] / 32u;
        layer_blocks += blocks;
        if (f < e) { before += blocks; pbase += p.rows[f] * (p.cols[f] / 1024u); }
    }
    st.s = s;
    st.nbr = p.cols[e] / 32u;
    st.parts = p.cols[e] / 1024u;
    st.chunks = p.rows[e] / 32u;
    st.base = ((s / p.np) % p.copies) * layer_blocks + before;
    st.pbase = pbase;
    st.first = first;
    st.ntasks = st.parts * st.chunks;
    return st;
}

// Task i of a product: its part k and row chunk c. Chunks come in groups of 32 (the rows one part of the
// next product's x reads). The order goes by steps: step j holds parts 0 .. K - 2 of group j (part by
// part), then the merging part K - 1 of group j - lag; so a merge comes lag steps after the parts it
// adds, and a group's merges one step after the group before's: the next product's part 0 can start
// long before this product ends. lag 0: each group's merges right after its other parts.
void task_at(Stage st, uint i, out uint k, out uint c) {
    uint groups = st.chunks / 32u, lag = min(p.lag, groups), a = 32u * (st.parts - 1u), m = 32u;
    if (i < lag * a) {                                   // steps before the first merge
        k = (i % a) / 32u;
        c = 32u * (i / a) + i % 32u;
        return;
    }
    i -= lag * a;
    if (i < (groups - lag) * (a + m)) {                  // steps with both
        uint j = lag + i / (a + m), off = i % (a + m);
        if (off < a) { k = off / 32u; c = 32u * j + off % 32u; }
        else { k = st.parts - 1u; c = 32u * (j - lag) + off - a; }
        return;
    }
    i -= (groups - lag) * (a + m);                       // the last lag groups' merges
    k = st.parts - 1u;
    c = 32u * (groups - lag) + i;
}

// Advances st to the product holding task t (t >= st.first); false past the dispatch's last product.
bool seek(inout Stage st, uint t) {
    while (t >= st.first + st.ntasks) {
        if (st.s + 1u >= p.s1) return false;
        st = stage_at(st.s + 1u, st.first + st.ntasks);
    }
    return true;
}

uint spin = 1u;   // the pause's arithmetic, kept alive by an impossible store

bool gave_up(inout uint n) {
    for (uint w = 0u; w < p.gap; ++w) spin = spin * 1664525u + 1013904223u;   // fewer requests for one line
    return ++n >= GIVE_UP || ((n & 1023u) == 0u && flags[1023] != 0u);
}

bool has_not_ready_byte(uvec4 v) {   // a 0x80 byte: a values word before its store
    uvec4 z = v ^ 0x80808080u;
    uvec4 t = (z - 0x01010101u) & ~z & 0x80808080u;
    return (t.x | t.y | t.z | t.w) != 0u;
}

// Where part kk's sum of row r of row group `group` of chunk c lies.
uint part_at(Stage st, uint kk, uint c, uint r) {
    return st.pbase + kk * st.chunks * 32u + c * 32u + (gl_LocalInvocationID.x >> 5) * RJ + r;
}

// XSHARE: where word q of the x of part k of slot s lies (values' words 0-63, then the scale pairs' 64-79)
uint x_word(uint s, uint k, uint q) {
    return s * SLOT16 + (q < 64u ? 64u * k + q : ACT_MAX / 16u + 16u * k + q - 64u);
}

bool x_word_ready(uvec4 w, uint q) {
    return q < 64u ? !has_not_ready_byte(w) : uintBitsToFloat(w.x) >= 0.0 && uintBitsToFloat(w.z) >= 0.0;
}

// Sum over the 32 lanes of this invocation's row group; every invocation of the workgroup calls it.
float row_group_sum(float v) {
    if (gl_SubgroupSize >= 32u) return subgroupClusteredAdd(v, 32u);
    uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    float t = 0.0;
    for (uint k = 0u; k < 32u; ++k) t += red[(tid & ~31u) + k];
    barrier();
    return t;
}

void main() {
    uint grid = gl_NumWorkGroups.x, tid = gl_LocalInvocationID.x, lane = tid & 31u, group = tid >> 5;
    uint t = gl_WorkGroupID.x;
    Stage st = stage_at(p.s0, 0u);
    if (!seek(st, t)) return;
    uvec4 qv[RJ], lo, hi;
    float dv[RJ];
    vec2 sx;
    uvec4 xw;   // XSHARE: word tid of the task's x
    uvec2 pn[2] = uvec2[2](uvec2(0u), uvec2(0u));   // a merging task's other parts' sums (subgroups of 32)
    // the task's weights, then its block of x (block 32k + lane of slot s; XSHARE: word tid of the task's
    // x), all in flight together
    #define LOAD_TASK(ST, T) { \
        uint i_ = (T) - (ST).first, k_, c_; \
        task_at((ST), i_, k_, c_); \
        uint u_ = (ST).base + (k_ * (ST).chunks + c_) * 1024u + group * RJ * 32u + lane; \
        [[unroll]] for (uint j = 0; j < RJ; ++j) { \
            qv[j] = wq[u_ + j * 32u]; \
            dv[j] = unpackHalf2x16(wd[(u_ + j * 32u) >> 1])[lane & 1u]; \
        } \
        if (XSHARE == 1u) { \
            if (tid < 80u) xw = xq[x_word((ST).s, k_, tid)]; \
        } else { \
            uint b_ = 32u * k_ + lane; \
            lo = xqr[(ST).s * SLOT16 + 2u * b_]; \
            hi = xqr[(ST).s * SLOT16 + 2u * b_ + 1u]; \
            sx = xscr[(ST).s * (SLOT16 * 2u) + ACT_MAX / 8u + b_]; \
        } }
    // a merging task's other parts' sums, issued after the task before is done with pn
    #define LOAD_PARTS(ST, T) { \
        uint k_, c_; \
        task_at((ST), (T) - (ST).first, k_, c_); \
        if (gl_SubgroupSize == 32u && k_ > 0u && k_ + 1u == (ST).parts && BARE != 1u && BARE != 3u) { \
            [[unroll]] for (uint h = 0; h < 2u; ++h) \
                if (lane % 16u < k_) pn[h] = partial[part_at((ST), lane % 16u, c_, 2u * h + lane / 16u)]; \
        } }
    LOAD_TASK(st, t);
    LOAD_PARTS(st, t);
    for (uint it = 0u; true; ++it) {
        uint k, c, s = st.s;
        task_at(st, t - st.first, k, c);
        if (XSHARE == 1u) {
            if (tid < 80u) {
                uint n = 0u;
                while ((BARE == 0u || BARE == 3u) && !x_word_ready(xw, tid)) {
                    if (gave_up(n)) { atomicAdd(flags[1023], 1u); break; }
                    xw = xqv[x_word(s, k, tid)];
                }
                xsh[it & 1u][tid] = xw;
            }
            barrier();
            lo = xsh[it & 1u][2u * lane];
            hi = xsh[it & 1u][2u * lane + 1u];
            uvec4 sw = xsh[it & 1u][64u + lane / 2u];
            sx = uintBitsToFloat((lane & 1u) == 0u ? sw.xy : sw.zw);
        }
        uint blk = 32u * k + lane, xv_at = s * SLOT16 + 2u * blk, xs_at = s * (SLOT16 * 2u) + ACT_MAX / 8u + blk;
        bool there = sx.x >= 0.0 && !has_not_ready_byte(lo) && !has_not_ready_byte(hi);
        if (XSHARE == 0u && (BARE == 0u || BARE == 3u) && !subgroupAll(there)) {
            uint n = 0u;
            while (sx.x < 0.0 || has_not_ready_byte(lo) || has_not_ready_byte(hi)) {
                if (gave_up(n)) { atomicAdd(flags[1023], 1u); break; }
                lo = xqv[xv_at];
                hi = xqv[xv_at + 1u];
                sx = xscv[xs_at];
            }
        }
        float acc[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) {
            int dot = 0;
            [[unroll]] for (uint w = 0; w < 4u; ++w) {
                dot += dot_ss(qv[j][w] & 0x0F0F0F0Fu, lo[w], 0);
                dot += dot_ss((qv[j][w] >> 4) & 0x0F0F0F0Fu, hi[w], 0);
            }
            acc[j] = dv[j] * (sx.x * float(dot) - 8.0 * sx.y);
        }
        Stage cur = st;
        uint tn = t + grid;
        bool more = seek(st, tn);
        if (more) LOAD_TASK(st, tn);   // in flight through this task's sums and stores
        float mine = 0.0;              // lane j < RJ: row j's sum over this part
        [[unroll]] for (uint j = 0; j < RJ; ++j) {
            float v = row_group_sum(acc[j]);
            if (lane == j) mine = v;
        }
        uint row = c * 32u + group * RJ + lane;   // lane < RJ
        uint rows = cur.chunks * 32u;
        if (k + 1u < cur.parts || BARE == 1u) {
            if (lane < RJ) partial[cur.pbase + k * rows + row] = uvec2(floatBitsToUint(mine), s);
        } else {
            if (gl_SubgroupSize == 32u) {
                // the other parts' sums over the row group's lanes (loaded with the task's weights): lane l took
                // part l % 16 of row l / 16 and of row 2 + l / 16, so that 16-lane clusters add a row's parts
                float r[2];
                [[unroll]] for (uint h = 0; h < 2u; ++h) {
                    uint kk = lane % 16u;
                    float v = 0.0;
                    if (kk < k && BARE != 3u) {
                        uint n = 0u;
                        while (pn[h].y != s) {
                            if (gave_up(n)) { atomicAdd(flags[1023], 1u); break; }
                            pn[h] = partial[part_at(cur, kk, c, 2u * h + lane / 16u)];
                        }
                        v = uintBitsToFloat(pn[h].x);
                    }
                    r[h] = subgroupClusteredAdd(v, 16u);
                }
                // rows 0-3's sums sit in lanes 0, 16 (r[0]) and 0, 16 (r[1]): every lane shuffles, lanes 0-3
                // keep theirs
                float s0 = subgroupShuffle(r[0], 16u), s1 = subgroupShuffle(r[1], 0u), s2 = subgroupShuffle(r[1], 16u);
                mine += lane == 0u ? r[0] : lane == 1u ? s0 : lane == 2u ? s1 : s2;
                if (lane < RJ) vals[it & 1u][group * RJ + lane] = abs(mine) < 3.0e38 ? mine : 0.0;
            } else if (lane < RJ) {
                // the other parts' sums, every load issued before any is looked at
                uvec2 v[MAX_PARTS - 1];
                [[unroll]] for (uint kk = 0; kk < MAX_PARTS - 1; ++kk)
                    if (kk < k && BARE != 3u) v[kk] = partial[cur.pbase + kk * rows + row];
                [[unroll]] for (uint kk = 0; kk < MAX_PARTS - 1; ++kk) {
                    if (kk < k && BARE != 3u) {
                        uint at = cur.pbase + kk * rows + row, n = 0u;
                        while (v[kk].y != s) {
                            if (gave_up(n)) { atomicAdd(flags[1023], 1u); break; }
                            v[kk] = partial[at];
                        }
                        mine += uintBitsToFloat(v[kk].x);
                    }
                }
                // never publish inf or NaN: a NaN scale reads "not there"
                vals[it & 1u][group * RJ + lane] = abs(mine) < 3.0e38 ? mine : 0.0;
            }
            barrier();
            // the chunk's 32 sums: y, and block c of slot s + 1 (stored as two whole 16-byte words, then the scale)
            uint out_at = (s + 1u) * SLOT16 + 2u * c, sc_at = (s + 1u) * (SLOT16 * 2u) + ACT_MAX / 8u + c;
            if (gl_SubgroupSize == 32u) {
                if (tid < 32u) {
                    float v = vals[it & 1u][tid];
                    y[(s & 1u) * ACT_MAX + c * 32u + tid] = v;
                    float amax = subgroupClusteredMax(abs(v), 32u);
                    int q = int(round(v * (amax > 0.0 ? 127.0 / amax : 0.0)));
                    int sum = subgroupClusteredAdd(q, 32u);
                    uint word = subgroupClusteredOr((uint(q) & 0xFFu) << (8u * (tid & 3u)), 4u);
                    uvec4 w4 = uvec4(subgroupShuffle(word, (tid & 16u)), subgroupShuffle(word, (tid & 16u) + 4u),
                                     subgroupShuffle(word, (tid & 16u) + 8u), subgroupShuffle(word, (tid & 16u) + 12u));
                    // each word tells by itself whether it is there: no order among the three stores
                    if ((tid & 15u) == 0u) xq[out_at + tid / 16u] = w4;
                    if (tid == 0u) xsc[sc_at] = vec2(amax / 127.0, amax / 127.0 * float(sum));
                }
            } else {
                if (tid < 32u) y[(s & 1u) * ACT_MAX + c * 32u + tid] = vals[it & 1u][tid];
                float amax = 0.0;
                for (uint u = 0u; u < 32u; ++u) amax = max(amax, abs(vals[it & 1u][u]));
                if (tid < 8u) {
                    float inv = amax > 0.0 ? 127.0 / amax : 0.0;
                    uint b4 = 4u * tid;
                    ivec4 q4 = ivec4(round(vec4(vals[it & 1u][b4], vals[it & 1u][b4 + 1u], vals[it & 1u][b4 + 2u],
                                                vals[it & 1u][b4 + 3u]) * inv));
                    words[tid] = (uint(q4.x) & 0xFFu) | ((uint(q4.y) & 0xFFu) << 8) | ((uint(q4.z) & 0xFFu) << 16)
                                 | (uint(q4.w) << 24);
                }
                barrier();
                if (tid < 2u) xq[out_at + tid] = uvec4(words[4u * tid], words[4u * tid + 1u], words[4u * tid + 2u],
                                                       words[4u * tid + 3u]);
                memoryBarrierBuffer();
                barrier();
                if (tid == 0u) {
                    int sum = 0;
                    for (uint u = 0u; u < 8u; ++u) {
                        int w = int(words[u]);
                        sum += bitfieldExtract(w, 0, 8) + bitfieldExtract(w, 8, 8) + bitfieldExtract(w, 16, 8)
                               + bitfieldExtract(w, 24, 8);
                    }
                    xsc[sc_at] = vec2(amax / 127.0, amax / 127.0 * float(sum));
                }
            }
            if (XSHARE == 0u || gl_SubgroupSize != 32u) barrier();   // words (and without XSHARE's barrier a
                                                                      // task, vals) are the next merge's
        }
        if (!more) break;
        LOAD_PARTS(st, tn);
        t = tn;
    }
    #undef LOAD_TASK
    #undef LOAD_PARTS
    if (spin == 0u && p.copies == 0u) flags[0] = spin;   // never (copies >= 1)
}
