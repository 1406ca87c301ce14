// The experts' pick of one token by one subgroup (moe_route.comp, moe_router.comp): the router's
// logits logits[base ..] over n_expert experts -> probabilities (softmax, or sigmoid each) -> the
// n_used most probable (ties: the lower id; SELB: ranked by probability + selb[e], DeepSeek-V3's
// choice, glm4moe) -> pick_id / pick_w, the weights the probabilities. Returns the factor of the
// weights: 1 / their sum where `norm` (renormalized), times `scale`.
// The includer declares logits[] and selb[] (SELB), MAX_EXPERTS, MAX_USED and the const bool SELB.
// The probabilities stay in shared memory; each pick is a subgroup max then a subgroup min of the ids
// holding it: no workgroup barriers.
#define NEG_INF uintBitsToFloat(0xFF800000u)
shared float prob[MAX_EXPERTS];
shared float key[SELB ? MAX_EXPERTS : 1];   // SELB: what the pick ranks
shared uint pick_id[MAX_USED];
shared float pick_w[MAX_USED];

float moe_pick(uint base, uint n_expert, uint n_used, bool sigmoid, bool norm, float scale) {
    uint lane = gl_SubgroupInvocationID, S = gl_SubgroupSize;
    float m = -3.4e38;
    for (uint e = lane; e < n_expert; e += S) m = max(m, logits[base + e]);
    m = subgroupMax(m);
    float sum = 0.0;
    for (uint e = lane; e < n_expert; e += S) {
        float v = logits[base + e];
        v = sigmoid ? 1.0 / (1.0 + exp(-v)) : exp(v - m);
        prob[e] = v;
        sum += v;
    }
    float inv = sigmoid ? 1.0 : 1.0 / subgroupAdd(sum);
    if (SELB) for (uint e = lane; e < n_expert; e += S) key[e] = prob[e] * inv + selb[e];
    subgroupMemoryBarrierShared();
    subgroupBarrier();
    float chosen_sum = 0.0;
    for (uint k = 0; k < n_used; ++k) {
        // argmax over the experts not chosen yet (chosen ones hold -1: probabilities are >= 0;
        // SELB: -inf, the biased keys may be negative)
        float bv = SELB ? NEG_INF : -2.0;
        uint bi = 0xFFFFFFFFu;
        for (uint e = lane; e < n_expert; e += S) {
            float v = SELB ? key[e] : prob[e];
            if (v > bv) { bv = v; bi = e; }   // ascending e: the first of equals stays
        }
        float best = subgroupMax(bv);
        uint id = subgroupMin(bv == best ? bi : 0xFFFFFFFFu);
        float w = (SELB ? prob[min(id, n_expert - 1)] : best) * inv;   // (id past the end: NaN scores)
        chosen_sum += w;
        if (lane == 0) { pick_id[k] = id; pick_w[k] = w; }
        if (id % S == lane) {                          // its owner takes it out
            if (SELB) key[id] = NEG_INF; else prob[id] = -1.0;
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
    }
    return norm ? scale / chosen_sum : scale;
}
