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
// ~1.3 ns a line, and 8192 lines written one per invocation by many workgroups at once (`spread`, the
// form before) put the peer's line anywhere in that drain (2x H200 ping-pong, benchmarks/bench_hop.py:
// an exchange point with 8192 lines 14.9 us in rounds against 19.2 spread; 5.6 with 256 lines).
// Wait (invocation 0): for each producer in wait_mask, read its lines one by one until one holds
// >= value. Polls are spaced out more and more, up to MAX_GAP, so LINES polls cover a peer that is
// milliseconds behind (layer mode: a whole block of layers; the recorder gives it more lines and a
// smaller MAX_GAP, so a device wakes within a few us of its peer, and SLOW_GAP past half the lines);
// then status[0] = 2 and the host reports an error.
// Hold (p.hold != 0; layer mode's devices whose block is done, waiting at the hand-over into the last
// device): the dispatch has more workgroups, and every one but the first keeps its SM busy, polling
// hold_word in device memory until the first, once its wait is over (or has given up), writes the
// exchange's value there. A GPU left with one busy SM for a millisecond starts its next block slower
// (4x H200, -sm layer: a hop cost ~30 us where one device ran nearly every layer, 45-55 us split
// evenly, where the first device sat at this wait for half the step). The holders' polls are bounded.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint LINES = 256;
layout(constant_id = 1) const uint LINE_WORDS = 32;
layout(constant_id = 2) const uint MAX_GAP = 20000;     // iterations of the back-off loop (~45 us)
// for the first half of the lines; the second half backs off up to SLOW_GAP (a long wait's tail)
const uint SLOW_GAP = 20000u;
layout(std430, binding = 0) coherent volatile buffer Flags { uint flags[]; };
layout(std430, binding = 1) buffer Status { uint status[]; };
layout(std430, binding = 2) readonly buffer Step { uint step[]; };
layout(std430, binding = 3) coherent volatile buffer Hold { uint hold_word[]; };
layout(push_constant) uniform Push { uint me; uint exchange; uint signal; uint wait_mask; uint n_devices;
                                     uint base_word; uint hold; } p;
const uint HOLD_POLLS = 1u << 24;   // a holder's bound (~5 s of device-memory polls)

bool wait_peers(uint value);

uint line(uint device, uint i) {
    return ((p.exchange * p.n_devices + device) * LINES + i) * LINE_WORDS;
}

void main() {
    uint value = step[p.base_word] + p.exchange + 1u;
    uint i = gl_GlobalInvocationID.x;
    if (p.signal != 0u)
        for (uint k = i; k < LINES; k += gl_NumWorkGroups.x * gl_WorkGroupSize.x) flags[line(p.me, k)] = value;
    if (p.hold != 0u && gl_WorkGroupID.x != 0u) {
        if (gl_LocalInvocationIndex == 0u) {
            uint polls = 0u;
            while (hold_word[0] < value && polls < HOLD_POLLS) ++polls;
            if (polls == 0xFFFFFFFFu) hold_word[1] = polls;   // observable: the loop is not deleted
        }
        return;
    }
    if (i != 0u) return;
    bool ok = wait_peers(value);
    if (p.hold != 0u) hold_word[0] = value;
    if (!ok) {
        status[0] = 2u;
        status[1] = p.exchange;
    }
}

// Invocation 0: every producer in wait_mask, one after the other (false: one never came).
bool wait_peers(uint value) {
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
            status[2] = noise;
            return false;
        }
    }
    return true;
}
