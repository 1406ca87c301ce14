#version 450
// One exchange point between devices that share nothing but host memory (split modes, SPEC §5).
//
// flags: one counter per device in a host allocation imported into every device, FLAG_STRIDE words
// apart (own cache line). Signal: after this device's data for the exchange is written (the recorder
// puts a barrier before this dispatch), store value = base + exchange + 1 into my counter, with
// release semantics. Wait: spin until every producer in wait_mask has reached value (acquire); the
// recorder puts a barrier after this dispatch, so later reads of the peers' data see it.
// The host zeroes the counters whenever every device is idle; `base` (from the step parameters)
// keeps values increasing across the micro-batches in flight between two zeroings.
// Bounded: after about max_spins polls status[0] = 2 and the kernel gives up; the host turns that into
// an error, never a hang.
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 1) in;
layout(constant_id = 0) const uint FLAG_STRIDE = 16;
layout(std430, binding = 0) coherent volatile buffer Flags { uint flags[]; };
layout(std430, binding = 1) buffer Status { uint status[]; };
layout(std430, binding = 2) readonly buffer Step { uint step[]; };
layout(push_constant) uniform Push { uint me; uint exchange; uint signal; uint wait_mask; uint max_spins;
                                     uint base_word; } p;

uint load_flag(uint peer) {
    return atomicLoad(flags[peer * FLAG_STRIDE], gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquire);
}

void main() {
    uint value = step[p.base_word] + p.exchange + 1u;
    if (p.signal != 0u)
        atomicStore(flags[p.me * FLAG_STRIDE], value, gl_ScopeDevice, gl_StorageSemanticsBuffer,
                    gl_SemanticsRelease);
    // Nested loops, and a final check rather than trusting the loop bound: llvmpipe silently ends
    // any one loop after 65535 iterations.
    for (uint peer = 0u; peer < 32u; ++peer) {
        if ((p.wait_mask & (1u << peer)) == 0u) continue;
        bool arrived = false;
        for (uint outer = 0u; outer < (p.max_spins >> 20) + 1u && !arrived; ++outer) {
            for (uint middle = 0u; middle < 1024u && !arrived; ++middle) {
                uint inner = 0u;
                while (inner < 1024u && load_flag(peer) < value) ++inner;
                arrived = inner < 1024u;
            }
        }
        if (load_flag(peer) < value) {
            status[0] = 2u;
            status[1] = p.exchange;
            return;
        }
    }
}
