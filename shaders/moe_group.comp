#version 450
#include "common.glsl"
// Tokens grouped by expert, for the prompt's expert products (matmul_id.comp): one workgroup per
// expert scans every (token, slot) of the batch and lists those that chose it.
//   groups[e] = count; groups[n_expert + e * n_tokens + i] = token * n_used + slot  (i < count)
// A token picks an expert at most once, so n_tokens entries per expert always suffice. The order of
// a list is whatever the atomics give: every entry's output is computed on its own.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Route { float route[]; };
layout(std430, binding = 1) writeonly buffer Groups { uint groups[]; };
layout(push_constant) uniform Push { uint n_tokens; uint n_used; uint n_expert; } p;

shared uint count;

void main() {
    uint e = gl_WorkGroupID.x;
    if (gl_LocalInvocationID.x == 0) count = 0;
    barrier();
    for (uint pair = gl_LocalInvocationID.x; pair < p.n_tokens * p.n_used; pair += 64) {
        uint t = pair / p.n_used, s = pair % p.n_used;
        if (floatBitsToUint(route[t * 2 * p.n_used + s]) == e) {
            uint i = atomicAdd(count, 1);
            groups[p.n_expert + e * p.n_tokens + i] = pair;
        }
    }
    barrier();
    if (gl_LocalInvocationID.x == 0) groups[e] = count;
}
