#version 450
// Cross-device handshake through shared host memory, on the GPU: write my flag, then spin (bounded)
// until the peer's flag reaches `value`. flags[0] = device A's counter, flags[1] = device B's.
// status[0] = 1 on success, 2 on timeout (the host turns that into an error, never a hang).
#extension GL_KHR_memory_scope_semantics : require
layout(local_size_x = 1) in;
layout(std430, binding = 0) coherent volatile buffer Flags { uint flags[]; };
layout(std430, binding = 1) writeonly buffer Status { uint status[]; };
layout(push_constant) uniform Push { uint me; uint peer; uint value; uint max_spins; } p;

void main() {
    atomicStore(flags[p.me], p.value, gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsRelease);
    uint spins = 0;
    while (atomicLoad(flags[p.peer], gl_ScopeDevice, gl_StorageSemanticsBuffer, gl_SemanticsAcquire) < p.value) {
        if (++spins >= p.max_spins) { status[0] = 2; return; }
    }
    status[0] = 1;
}
