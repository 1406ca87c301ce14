#version 450
#include "common.glsl"
#extension GL_KHR_shader_subgroup_ballot : require
// Mixture-of-experts router, one subgroup per token: the router's logits over n_expert experts ->
// probabilities (softmax, or sigmoid each) -> the n_used most probable experts (ties: the lower id)
// -> their weights: the probabilities, divided by their sum where `norm` is set, times `scale`.
//   out[t] = [id_0 .. id_{n_used-1} (uint bits), weight_0 .. weight_{n_used-1}]
// The probabilities stay in shared memory; each pick is a subgroup max then a subgroup min of the ids
// holding it: no barriers (the workgroup is one subgroup: local size = the subgroup size).
// SELB (glm4moe, DeepSeek-V3's routing): the pick ranks probability + a bias per expert (binding 2),
// the weights stay the probabilities.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SELB = false;
#define MAX_EXPERTS 1024
#define NEG_INF uintBitsToFloat(0xFF800000u)
layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };
layout(std430, binding = 2) readonly buffer SelBias { float selb[]; };
layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_expert;
    uint n_used;
    uint sigmoid;    // 0: softmax over the experts, 1: sigmoid of each logit
    uint norm;       // 1: the chosen weights renormalized to sum 1
    float scale;
} p;

#define MAX_USED 32
shared float prob[MAX_EXPERTS];
shared float key[SELB ? MAX_EXPERTS : 1];   // SELB: what the pick ranks
shared uint pick_id[MAX_USED];
shared float pick_w[MAX_USED];

void main() {
    uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= p.n_tokens) return;   // uniform per workgroup
    uint lane = gl_SubgroupInvocationID, S = gl_SubgroupSize, base = t * p.n_expert;
    float m = -3.4e38;
    for (uint e = lane; e < p.n_expert; e += S) m = max(m, logits[base + e]);
    m = subgroupMax(m);
    float sum = 0.0;
    for (uint e = lane; e < p.n_expert; e += S) {
        float v = logits[base + e];
        v = p.sigmoid != 0 ? 1.0 / (1.0 + exp(-v)) : exp(v - m);
        prob[e] = v;
        sum += v;
    }
    float inv = p.sigmoid != 0 ? 1.0 : 1.0 / subgroupAdd(sum);
    if (SELB) for (uint e = lane; e < p.n_expert; e += S) key[e] = prob[e] * inv + selb[e];
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    float chosen_sum = 0.0;
    for (uint k = 0; k < p.n_used; ++k) {
        // argmax over the experts not chosen yet (chosen ones hold -1: probabilities are >= 0;
        // SELB: -inf, the biased keys may be negative)
        float bv = SELB ? NEG_INF : -2.0;
        uint bi = 0xFFFFFFFFu;
        for (uint e = lane; e < p.n_expert; e += S) {
            float v = SELB ? key[e] : prob[e];
            if (v > bv) { bv = v; bi = e; }   // ascending e: the first of equals stays
        }
        float best = subgroupMax(bv);
        uint id = subgroupMin(bv == best ? bi : 0xFFFFFFFFu);
        float w = (SELB ? prob[min(id, p.n_expert - 1)] : best) * inv;   // (id past the end: NaN scores)
        chosen_sum += w;
        if (lane == 0) { pick_id[k] = id; pick_w[k] = w; }
        if (id % S == lane) {                          // its owner takes it out
            if (SELB) key[id] = NEG_INF; else prob[id] = -1.0;
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
    }
    float f = p.norm != 0 ? p.scale / chosen_sum : p.scale;
    uint ob = t * 2 * p.n_used;
    for (uint k = lane; k < p.n_used; k += S) {
        o[ob + k] = uintBitsToFloat(pick_id[k]);
        o[ob + p.n_used + k] = pick_w[k] * f;
    }
}
