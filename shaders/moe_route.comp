#version 450
#include "common.glsl"
#extension GL_KHR_shader_subgroup_ballot : require
// Mixture-of-experts router, one subgroup per token: the router's logits over n_expert experts ->
// probabilities (softmax, or sigmoid each) -> the n_used most probable experts (ties: the lower id)
// -> their weights: the probabilities, divided by their sum where `norm` is set, times `scale`.
//   out[t] = [id_0 .. id_{n_used-1} (uint bits), weight_0 .. weight_{n_used-1}]
// The pick: moe_pick.glsl (the workgroup is one subgroup: local size = the subgroup size).
// SELB (glm4moe, DeepSeek-V3's routing): the pick ranks probability + a bias per expert (binding 2),
// the weights stay the probabilities.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool SELB = false;
#define MAX_EXPERTS 1024
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
#include "moe_pick.glsl"

void main() {
    uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= p.n_tokens) return;   // uniform per workgroup
    float f = moe_pick(t * p.n_expert, p.n_expert, p.n_used, p.sigmoid != 0, p.norm != 0, p.scale);
    uint ob = t * 2 * p.n_used;
    for (uint k = gl_SubgroupInvocationID; k < p.n_used; k += gl_SubgroupSize) {
        o[ob + k] = uintBitsToFloat(pick_id[k]);
        o[ob + p.n_used + k] = pick_w[k] * f;
    }
}
