#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Benchmark only (examples/bench_chain.py): one stage of a chain of dependent dispatches that each
// stream a weight-sized buffer, the way a decode step's products follow each other. Every lane issues
// its U 16-byte loads at once (neighbouring lanes on neighbouring addresses), combines them with the
// previous stage's output and writes one word per workgroup: the fastest a product of that size can
// be between two barriers.
// MODE 0: the recorder puts a barrier between stages. MODE 1 / 2: no barriers; a stage's workgroups
// wait for a counter that every workgroup of the previous stage increments (loads issued before /
// after the wait). The wait gives up after 2^24 polls and counts that in flags[1023].
// MODE 3: barriers as MODE 0, but a fixed grid whose workgroups loop over the stage's p.chunks chunks
// (g, g + grid, ...): no tail of partly filled waves, the floor a persistent product could reach.
// MODE 4 / 5: one dispatch runs all p.stage stages on a grid that must be resident at once (a
// persistent kernel). Stages come in layers of p.np, stage s being entry e = s % p.np of its layer
// (p.pc[e] chunks), layer (s / p.np) % p.prev_groups of the weight copies laid out one after another;
// its workgroups wait for flags[0] to count every workgroup of the stages before (MODE 4: the stage's
// first loads issued before that wait, as such a kernel could prefetch across its grid barrier;
// MODE 5: after it).
// MODE 6: MODE 1's counter waits (no barriers, loads before the wait) on MODE 3's fixed grid looping
// over the chunks: with a grid of at most half what the device holds at once, a stage's workgroups are
// all resident while its producer runs, as a persistent kernel's would be, but each stage is a
// dispatch of its own.
// MODE 7: a streamer beside MODE 1's stages (one dispatch recorded before them, no barriers): its
// workgroups read the stages' weights ahead of them into L2, p.in_off chunks at most past the chunks
// the stages have finished (flags, as MODE 1 counts them), DEPTH chunks a workgroup in flight. The
// stages then find their weights in L2, and memory keeps streaming while a stage waits for the one
// before. Push: p.stage stages, p.prev_groups weight copies, p.out_off chunks in all, p.chunks chunks a
// layer of p.np stages of p.pc[e] chunks.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint U = 4;
layout(constant_id = 1) const uint MODE = 0;
layout(constant_id = 2) const uint DEPTH = 1;
// MODE 7's way of pulling a chunk into L2: 0 loads (DEPTH chunks' worth of registers), 1 a
// compare-and-swap that never changes a word, 2 an atomic OR of 0, 3 an atomic add of 0 (1-3 return
// nothing to the lane, so nothing waits for them), one every STRIDE words
layout(constant_id = 3) const uint PREF = 0;
layout(constant_id = 4) const uint STRIDE = 8;
layout(std430, binding = 0) readonly buffer W { uvec4 w[]; };
layout(std430, binding = 1) coherent buffer IO { uint io[]; };              // [stage][workgroup]
layout(std430, binding = 2) coherent volatile buffer F { uint flags[]; };   // [stage] counters
layout(std430, binding = 3) buffer WA { uint wa[]; };   // MODE 7: W again, for PREF's atomics
layout(push_constant) uniform P { uint stage; uint prev_groups; uint in_off; uint out_off; uint chunks;
                                  uint np; uint pc[8]; } p;   // MODE 4 / 5: a layer's stages' chunks
shared uint s_in;


shared bool s_late;

void stream() {
    uint t = gl_LocalInvocationID.x, g = gl_WorkGroupID.x, grid = gl_NumWorkGroups.x;
    uint total = p.out_off, lc = p.chunks, cur = 0u, done = 0u;
    uvec4 r[U * DEPTH];
    uvec4 acc = uvec4(0u);
    for (uint q = g; q < total; q += grid * DEPTH) {
        uint last = min(q + (DEPTH - 1u) * grid, total - 1u);
        if (t == 0u) {
            uint n = 0u, progress;
            for (;;) {
                while (cur < p.stage && flags[cur] >= p.pc[cur % p.np]) { done += p.pc[cur % p.np]; ++cur; }
                progress = done + (cur < p.stage ? flags[cur] : 0u);
                if (progress + p.in_off > last || ++n == (1u << 24)) break;
            }
            // chunks the stages have finished already are not read again (flags[1021] counts them)
            s_late = progress > q;
            atomicAdd(flags[s_late ? 1021 : 1020], 1u);
        }
        barrier();
        bool late = s_late;
        barrier();
        if (late) continue;
        [[unroll]] for (uint d = 0; d < DEPTH; ++d) {
            uint c = min(q + d * grid, total - 1u);
            uint chunk = ((c / lc) % p.prev_groups) * lc + c % lc;
            if (PREF == 0u) {
                uint base = chunk * 256u * U + t;
                [[unroll]] for (uint j = 0; j < U; ++j) r[d * U + j] = w[base + j * 256u];
            } else {
                for (uint i = t * STRIDE; i < 1024u * U; i += 256u * STRIDE) {
                    uint a = chunk * 1024u * U + i;
                    if (PREF == 1u) atomicCompSwap(wa[a], 0x7fc00001u, 0x7fc00001u);
                    if (PREF == 2u) atomicOr(wa[a], 0u);
                    if (PREF == 3u) atomicAdd(wa[a], 0u);
                }
            }
        }
        if (PREF == 0u) { [[unroll]] for (uint j = 0; j < U * DEPTH; ++j) acc ^= r[j]; }
    }
    // never true in practice; keeps the loads
    if (acc.x == 0x9e3779b9u && acc.y == 0x7f4a7c15u) atomicAdd(flags[1022], 1u);
}

void main() {
    uint t = gl_LocalInvocationID.x, g = gl_WorkGroupID.x;
    uvec4 r[U];
    if (MODE == 7u) { stream(); return; }
    if (MODE == 6u) {
        bool has = g < p.chunks;
        if (has) { [[unroll]] for (uint j = 0; j < U; ++j) r[j] = w[g * 256u * U + t + j * 256u]; }
        if (p.stage > 0u && t == 0u) {
            uint n = 0u;
            while (flags[p.stage - 1u] < p.prev_groups && n < (1u << 24)) ++n;
            if (n == (1u << 24)) atomicAdd(flags[1023], 1u);
        }
        if (t == 0u) s_in = io[p.in_off + (g % p.prev_groups)];
        barrier();
        uvec4 a = uvec4(s_in);
        if (has) { [[unroll]] for (uint j = 0; j < U; ++j) a ^= r[j]; }
        for (uint c = g + gl_NumWorkGroups.x; c < p.chunks; c += gl_NumWorkGroups.x) {
            [[unroll]] for (uint j = 0; j < U; ++j) r[j] = w[c * 256u * U + t + j * 256u];
            [[unroll]] for (uint j = 0; j < U; ++j) a ^= r[j];
        }
        uint v = subgroupXor(a.x ^ a.y ^ a.z ^ a.w);
        if (gl_SubgroupInvocationID == 0u) atomicXor(io[p.out_off + g], v);
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) atomicAdd(flags[p.stage], 1u);
        return;
    }
    if (MODE == 3u) {
        if (t == 0u) s_in = io[p.in_off + (g % p.prev_groups)];
        barrier();
        uvec4 a = uvec4(s_in);
        for (uint c = g; c < p.chunks; c += gl_NumWorkGroups.x) {
            [[unroll]] for (uint j = 0; j < U; ++j) r[j] = w[c * 256u * U + t + j * 256u];
            [[unroll]] for (uint j = 0; j < U; ++j) a ^= r[j];
        }
        uint v = subgroupXor(a.x ^ a.y ^ a.z ^ a.w);
        if (gl_SubgroupInvocationID == 0u) atomicXor(io[p.out_off + g], v);
        return;
    }
    if (MODE >= 4u) {
        uint grid = gl_NumWorkGroups.x, stride = 256u * U, layer_chunks = 0u;
        for (uint e = 0u; e < p.np; ++e) layer_chunks += p.pc[e];
        for (uint s = 0u; s < p.stage; ++s) {
            uint e = s % p.np, chunks = p.pc[e], first = ((s / p.np) % p.prev_groups) * layer_chunks;
            for (uint f = 0u; f < e; ++f) first += p.pc[f];
            uint wbase = first * stride + t;
            bool has = g < chunks;
            if (MODE == 4u && has) { [[unroll]] for (uint j = 0; j < U; ++j) r[j] = w[wbase + g * stride + j * 256u]; }
            if (s > 0u && t == 0u) {
                uint n = 0u;
                while (flags[0] < grid * s && n < (1u << 24)) ++n;
                if (n == (1u << 24)) atomicAdd(flags[1023], 1u);
            }
            // another workgroup's word of the stage before: the dependency a product has on all of x
            if (t == 0u) s_in = io[s * 4096u + (g + 1u) % grid];
            barrier();
            uvec4 a = uvec4(s_in);
            if (MODE == 5u && has) { [[unroll]] for (uint j = 0; j < U; ++j) r[j] = w[wbase + g * stride + j * 256u]; }
            if (has) { [[unroll]] for (uint j = 0; j < U; ++j) a ^= r[j]; }
            for (uint c = g + grid; c < chunks; c += grid) {
                [[unroll]] for (uint j = 0; j < U; ++j) r[j] = w[wbase + c * stride + j * 256u];
                [[unroll]] for (uint j = 0; j < U; ++j) a ^= r[j];
            }
            uint v = subgroupXor(a.x ^ a.y ^ a.z ^ a.w);
            if (gl_SubgroupInvocationID == 0u) atomicXor(io[(s + 1u) * 4096u + g], v);
            memoryBarrierBuffer();
            barrier();
            if (t == 0u) atomicAdd(flags[0], 1u);
        }
        return;
    }
    uint base = g * 256u * U + t;
    if (MODE != 2u) { [[unroll]] for (uint j = 0; j < U; ++j) r[j] = w[base + j * 256u]; }
    if (MODE != 0u && p.stage > 0u) {
        if (t == 0u) {
            uint n = 0u;
            while (flags[p.stage - 1u] < p.prev_groups && n < (1u << 24)) ++n;
            if (n == (1u << 24)) atomicAdd(flags[1023], 1u);
        }
        barrier();
    }
    if (t == 0u) s_in = io[p.in_off + (g % p.prev_groups)];
    barrier();
    if (MODE == 2u) { [[unroll]] for (uint j = 0; j < U; ++j) r[j] = w[base + j * 256u]; }
    uvec4 a = uvec4(s_in);
    [[unroll]] for (uint j = 0; j < U; ++j) a ^= r[j];
    uint v = subgroupXor(a.x ^ a.y ^ a.z ^ a.w);
    if (gl_SubgroupInvocationID == 0u) atomicXor(io[p.out_off + g], v);
    if (MODE != 0u) {
        memoryBarrierBuffer();
        barrier();
        if (t == 0u) atomicAdd(flags[p.stage], 1u);
    }
}
