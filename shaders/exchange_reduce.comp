#version 450
#extension GL_EXT_control_flow_attributes : require
// One all-reduce of a matrix-vector step (tensor/graph split modes) in one dispatch: publish my
// counter, wait for the producers' counters, and sum the partials they left in shared host memory:
//   out[t, c] = base[t, c] + sum over p in part_mask of part_p[t, c]      (t < n_tokens, c < n_cols)
// This replaces three dependent dispatches of the general path (copy the partial into host memory,
// exchange_sync.comp, reduce_sum.comp): the product already wrote its partial into its slot.
//
// One workgroup: the wait must read every counter line at most once in the submission (a GPU does
// not re-read host memory it has read; exchange_sync.comp says why), and one waiting lane per
// workgroup would need lines of its own per workgroup. The sum is a few thousand floats in host
// memory, ~1-2 us away over the bus: each of the 1024 lanes issues the loads of U columns of up to
// MAXP parts before it adds any (a loop that adds as it loads waits one bus round trip per column:
// 7.2B tensor tg128 on 2 H100s 201 t/s with 256 lanes looping, against 249 for the three dispatches).
//
// flags / lines / back-off: as exchange_sync.comp (value = step[base_word] + exchange + 1).
// signal = 0 and wait_mask = 0: the sum alone (host-relayed steps, where the submission boundary
// already ordered the devices).
// chain_signal != 0: count myself done on chain[chain_slot] once `out` is visible (kernels/chain.py),
// also after a time-out, so that a chained consumer never waits for ever (the host reports the
// time-out from status[0] = 2 and discards the step).
// chain_wait_n != 0 (-sm graph): recorded right after the product that writes my partial, without a
// barrier; lane 0 first polls chain[chain_wait_slot] until that product's chain_wait_n workgroups have
// counted themselves done (their stores fenced first: matvec_stream.comp SIGNAL), and only then
// publishes my counter. Why: a barrier drains the product's last workgroups and then launches this
// one-workgroup grid; chained, it is resident and polling when the product ends.
// CLOCK (variant exchange_reduce_clock; the split timeline, llamavk/split/clock.py): lane 0 writes the
// device clock's low 32 bits (clockRealtime2x32EXT) to stamps[STAMP_WORDS * stamp_slot + 0, 1, 2]
// when my partial is done and my counter goes out (after the chain wait above), when the peers had
// arrived, and when the sum was written (one workgroup: plain stores).
layout(local_size_x = 1024) in;
#define U 8        // columns per lane per round (up to 8192 columns: one bus round trip; 4 took two
                   // for the 31.5B's 5120)
#define MAXP 4     // parts loaded together (more are added in further rounds)
layout(constant_id = 0) const uint LINES = 256;
layout(constant_id = 1) const uint LINE_WORDS = 32;
layout(constant_id = 2) const uint MAX_GAP = 20000;     // iterations of the back-off loop (~45 us)
// for the first half of the lines; the second half backs off up to SLOW_GAP (a long wait's tail)
const uint SLOW_GAP = 20000u;
layout(std430, binding = 0) coherent volatile buffer Flags { uint flags[]; };
layout(std430, binding = 1) buffer Status { uint status[]; };
layout(std430, binding = 2) readonly buffer Step { uint step[]; };
layout(std430, binding = 3) coherent readonly buffer Parts { float parts[]; };
// coherent: with every stage of a -sm graph step chained (no pipeline barrier in the whole step),
// base (the residual: an earlier exchange point's sum) may have been written after this SM's
// non-coherent cache last held those addresses (the arena reuses them); only a barrier would drop them
layout(std430, binding = 4) coherent readonly buffer Base { float base[]; };
layout(std430, binding = 5) writeonly buffer Out { float outv[]; };
layout(std430, binding = 6) coherent volatile buffer Chain { uint chain[]; };
layout(push_constant) uniform Push {
    uint me; uint exchange; uint signal; uint wait_mask; uint n_devices; uint base_word;
    uint n_tokens; uint n_cols; uint part_mask; uint part_stride; uint has_base;
    uint chain_signal; uint chain_slot; uint chain_wait_slot; uint chain_wait_n;
#ifdef CLOCK
    uint stamp_slot;
#endif
} p;
#ifdef CLOCK
#extension GL_EXT_shader_realtime_clock : require
#define STAMP_WORDS 8
layout(std430, binding = 7) buffer Stamps { uint stamps[]; };
#endif

shared bool arrived_all;

uint line(uint device, uint i) {
    return ((p.exchange * p.n_devices + device) * LINES + i) * LINE_WORDS;
}

// Lane 0: read each producer's lines one by one until one holds `value` (bounded).
bool wait_for_producers(uint value) {
    uint noise = value;
    for (uint peer = 0u; peer < 32u; ++peer) {
        if ((p.wait_mask & (1u << peer)) == 0u) continue;
        bool arrived = false;
        for (uint k = 0u; k < LINES && !arrived; ++k) {
            arrived = flags[line(peer, k)] >= value;
            uint gap = k < 32u ? 0u : min(64u << min((k - 32u) / 16u, 20u),
                                           k < LINES / 2u ? MAX_GAP : max(MAX_GAP, SLOW_GAP));
            for (uint j = 0u; j < gap && !arrived; ++j) noise = noise * 1664525u + 1013904223u;
        }
        if (!arrived) {
            status[0] = 2u;
            status[1] = p.exchange;
            status[2] = noise;
            return false;
        }
    }
    return true;
}

void main() {
    uint tid = gl_LocalInvocationIndex;
    uint value = step[p.base_word] + p.exchange + 1u;
    if (p.chain_wait_n != 0u) {
        if (tid == 0u) {
            // the poll count is stored where it could be observed (never, in practice): a loop with
            // no effect but its own end may be deleted by the compiler (matvec_stream.comp)
            uint polls = 0u;
            while (chain[p.chain_wait_slot] < p.chain_wait_n) ++polls;
            if (polls == 0xFFFFFFFFu) chain[p.chain_wait_slot + 1u] = polls;
        }
        memoryBarrierBuffer();
        barrier();
    }
#ifdef CLOCK
    if (tid == 0u) stamps[STAMP_WORDS * p.stamp_slot] = clockRealtime2x32EXT().x;
#endif
    if (p.signal != 0u) {
        for (uint i = tid; i < LINES; i += gl_WorkGroupSize.x) flags[line(p.me, i)] = value;
    }
    if (tid == 0u) arrived_all = wait_for_producers(value);
#ifdef CLOCK
    if (tid == 0u) stamps[STAMP_WORDS * p.stamp_slot + 1u] = clockRealtime2x32EXT().x;
#endif
    memoryBarrierBuffer();
    barrier();
    if (arrived_all) {
        const uint n = p.n_tokens * p.n_cols, WG = gl_WorkGroupSize.x;
        for (uint i0 = tid; i0 < n; i0 += WG * U) {
            float acc[U];
            [[unroll]] for (uint u = 0; u < U; ++u) {
                uint i = i0 + WG * u;
                acc[u] = (p.has_base != 0u && i < n) ? base[i] : 0.0;
            }
            uint mask = p.part_mask;
            while (mask != 0u) {
                uint pi[MAXP];
                uint np = 0u;
                [[unroll]] for (uint q = 0; q < MAXP; ++q) {
                    pi[q] = mask != 0u ? findLSB(mask) : 0u;
                    if (mask != 0u) { mask &= mask - 1u; ++np; }
                }
                float v[MAXP][U];
                [[unroll]] for (uint q = 0; q < MAXP; ++q)
                    [[unroll]] for (uint u = 0; u < U; ++u) {
                        uint i = i0 + WG * u;
                        v[q][u] = (q < np && i < n) ? parts[pi[q] * p.part_stride + i] : 0.0;
                    }
                [[unroll]] for (uint q = 0; q < MAXP; ++q)
                    [[unroll]] for (uint u = 0; u < U; ++u) acc[u] += v[q][u];
            }
            [[unroll]] for (uint u = 0; u < U; ++u) {
                uint i = i0 + WG * u;
                if (i < n) outv[i] = acc[u];
            }
        }
    }
#ifdef CLOCK
    barrier();      // every lane's part of the sum written
    if (tid == 0u) stamps[STAMP_WORDS * p.stamp_slot + 2u] = clockRealtime2x32EXT().x;
#endif
    if (p.chain_signal != 0u) {
        memoryBarrierBuffer();
        barrier();
        if (tid == 0u) atomicAdd(chain[p.chain_slot], 1u);
    }
}
