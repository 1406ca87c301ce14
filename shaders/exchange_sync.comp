#version 450
// One exchange point between devices that share nothing but host memory (split modes, SPEC §5).
//
// A GPU's reads of host memory are cached for the rest of its submission (measured on H200: a
// kernel polling one word never sees another device's or the host's later write, with atomic or
// volatile loads alike), while its writes reach host memory at once. So every counter is written
// to LINES separate cache lines and a waiting device reads each line at most once: poll i reads
// line i, which it has never read in this submission, so it comes from host memory.
//
// flags: [exchange][device][line] counters, LINE_WORDS apart. value = base + 1, base from the step
// parameters (the host increases it every step, so counters never need zeroing).
// Signal: write value into my LINES lines for this exchange; the recorder puts a barrier before the
// dispatch, so this device's data for the exchange is in host memory first. The lines go out in
// rounds of the workgroup's 256 invocations from line 0 on (one workgroup: the recorder's default),
// so the first lines, where a waiting peer's polls are, reach host memory first: the writes drain at
// ~1.3 ns a line, and 8192 lines written one per invocation by 32 workgroups at once (`spread`, the
// form before) put the peer's line anywhere in that drain (2x H200 ping-pong, benchmarks/bench_hop.py:
// 16.9 us an exchange point with 8192 lines against 5.7 with 256).
// Wait (invocation 0): for each producer in wait_mask, read its lines one by one until one holds
// >= value. Polls are spaced out more and more, up to MAX_GAP, so LINES polls cover a peer that is
// milliseconds behind (layer mode: a whole block of layers; the recorder gives it more lines and a
// smaller MAX_GAP, so a device wakes within a few us of its peer, and SLOW_GAP past half the lines);
// then status[0] = 2 and the host reports an error.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint LINES = 256;
layout(constant_id = 1) const uint LINE_WORDS = 32;
layout(constant_id = 2) const uint MAX_GAP = 20000;     // iterations of the back-off loop (~45 us)
// for the first half of the lines; the second half backs off up to SLOW_GAP (a long wait's tail)
const uint SLOW_GAP = 20000u;
layout(std430, binding = 0) coherent volatile buffer Flags { uint flags[]; };
layout(std430, binding = 1) buffer Status { uint status[]; };
layout(std430, binding = 2) readonly buffer Step { uint step[]; };
layout(push_constant) uniform Push { uint me; uint exchange; uint signal; uint wait_mask; uint n_devices;
                                     uint base_word; } p;

uint line(uint device, uint i) {
    return ((p.exchange * p.n_devices + device) * LINES + i) * LINE_WORDS;
}

void main() {
    uint value = step[p.base_word] + p.exchange + 1u;
    uint i = gl_GlobalInvocationID.x;
    if (p.signal != 0u)
        for (uint k = i; k < LINES; k += gl_NumWorkGroups.x * gl_WorkGroupSize.x) flags[line(p.me, k)] = value;
    if (i != 0u) return;
    uint noise = value;
    for (uint peer = 0u; peer < 32u; ++peer) {
        if ((p.wait_mask & (1u << peer)) == 0u) continue;
        bool arrived = false;
        for (uint k = 0u; k < LINES && !arrived; ++k) {
            arrived = flags[line(peer, k)] >= value;
            // back-off: back to back for the first 32 polls, then doubling gaps up to MAX_GAP
            uint gap = k < 32u ? 0u : min(64u << min((k - 32u) / 16u, 20u),
                                           k < LINES / 2u ? MAX_GAP : max(MAX_GAP, SLOW_GAP));
            for (uint j = 0u; j < gap && !arrived; ++j) noise = noise * 1664525u + 1013904223u;
        }
        if (!arrived) {
            status[0] = 2u;
            status[1] = p.exchange;
            status[2] = noise;
            return;
        }
    }
}
