#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// A mixture of experts' router for a few tokens (decode), its top-k included: one workgroup per
// (expert row, token) computes the router logit s * (W[e] . x'[t]) (x' = x * nw, s = 1/rms(x) when
// NORM: the FFN norm folded in); the workgroup that finishes a token last (an atomic count per
// token) picks that token's experts from all its logits as moe_route.comp does, writes the route
// row and resets the count. One dependent stage instead of two (product, then top-k).
//   route[t] = [id_0 .. id_{n_used-1} (uint bits), weight_0 .. weight_{n_used-1}]
// Deterministic: the pick reads the finished logits, whichever workgroup does it.
// Each thread's first RPF weights are loaded before x (they are in flight together). WAIT (one-token
// steps, kernels/chain.py): recorded without a barrier after the product writing x; the workgroup
// waits for that product's workgroup count between its weight loads and its reads of x.
// SHEXP (qwen35moe's shared expert as one more slot, matvec_id.comp SHEXP): one more workgroup per
// token (x = n_expert) computes the shared expert's gate sigmoid(w_shexp . x') (w_shexp f32, binding
// 7) and writes it as the weight of slot n_used, after the picked ones; its id is n_expert. The route
// row is then [id_0 .. id_{n_used-1}, n_expert, weight_0 .. weight_{n_used-1}, gate]. It takes no part
// in the count: the pick does not read it.
// BIAS (gpt-oss): the logits get the router's bias (f32, binding 8) before the pick.
// SHONE (glm4moe's ungated shared expert as one more slot): the pick writes slot n_used with id
// n_expert and weight 1 (no gate, no workgroup of its own; route rows as with SHEXP).
// SELB (glm4moe): the pick ranks probability + a bias per expert (f32, binding 9); the weights stay
// the probabilities (moe_route.comp SELB).
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const bool NORM = false;
layout(constant_id = 2) const bool WAIT = false;
layout(constant_id = 3) const bool SHEXP = false;
layout(constant_id = 4) const bool BIAS = false;
layout(constant_id = 5) const bool SELB = false;
layout(constant_id = 6) const bool SHONE = false;
#define RPF 8
#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer NormW { float nw[]; };
layout(std430, binding = 3) writeonly buffer Route { float route[]; };
layout(std430, binding = 4) volatile coherent buffer Logits { float logits[]; };   // [n_tokens][n_expert]
layout(std430, binding = 5) volatile coherent buffer Count { uint count[]; };      // [n_tokens], 0 between runs
layout(std430, binding = 1) volatile coherent buffer Xc { float xc[]; };           // WAIT: x after the wait
layout(std430, binding = 6) volatile coherent buffer Chain { uint chain[]; };      // WAIT: the step's counters
layout(std430, binding = 7) readonly buffer ShexpW { float shw[]; };               // SHEXP: w_shexp
layout(std430, binding = 8) readonly buffer RBias { float rbias[]; };              // BIAS: per expert
layout(std430, binding = 9) readonly buffer SelBias { float selb[]; };             // SELB: per expert
layout(push_constant) uniform Push {
    uint n_expert; uint cols; uint n_used; uint sigmoid; uint norm; float scale; float eps;
    uint wait_slot; uint wait_n;
} p;

#define MAX_EXPERTS 1024
#define MAX_USED 32
shared float red[64];
shared float red2[64];
shared bool last;
#include "moe_pick.glsl"

// the sum over the workgroup of every thread's v (and w)
vec2 wg_sum(float v, float w) {
    v = subgroupAdd(v);
    w = subgroupAdd(w);
    if (subgroupElect()) { red[gl_SubgroupID] = v; red2[gl_SubgroupID] = w; }
    barrier();
    vec2 s = vec2(0.0);
    for (uint i = 0; i < gl_NumSubgroups; ++i) s += vec2(red[i], red2[i]);
    barrier();
    return s;
}

void main() {
    uint e = gl_WorkGroupID.x, t = gl_WorkGroupID.y, tid = gl_LocalInvocationIndex, WG = gl_WorkGroupSize.x;
    bool shared_gate = SHEXP && e == p.n_expert;   // uniform: this workgroup computes the shared expert's gate
    float wv[RPF];
    [[unroll]] for (uint i = 0; i < RPF; ++i) {
        uint c = tid + WG * i;
        wv[i] = c < p.cols ? (shared_gate ? shw[c] : wfloat(e * p.cols + c)) : 0.0;
    }
    if (WAIT) {   // one lane polls (its count stored where it is never read: the loop must stay)
        if (tid == 0) {
            uint polls = 0u;
            while (chain[p.wait_slot] < p.wait_n) ++polls;
            if (polls == 0xFFFFFFFFu) chain[p.wait_slot + 1] = polls;
        }
        barrier();
    }
    float acc = 0.0, ss = 0.0;
    [[unroll]] for (uint i = 0; i < RPF; ++i) {
        uint c = tid + WG * i;
        if (c < p.cols) {
            float v = WAIT ? xc[t * p.cols + c] : x[t * p.cols + c];
            if (NORM) { ss += v * v; v *= nw[c]; }
            acc += wv[i] * v;
        }
    }
    for (uint c = tid + WG * RPF; c < p.cols; c += WG) {
        float v = WAIT ? xc[t * p.cols + c] : x[t * p.cols + c];
        if (NORM) { ss += v * v; v *= nw[c]; }
        acc += (shared_gate ? shw[c] : wfloat(e * p.cols + c)) * v;
    }
    vec2 s = wg_sum(acc, ss);
    uint half_row = SHEXP || SHONE ? p.n_used + 1 : p.n_used;   // route row: half_row ids, then their weights
    if (shared_gate) {
        if (tid == 0) {
            float logit = NORM ? s.x * inversesqrt(s.y / float(p.cols) + p.eps) : s.x;
            route[t * 2 * half_row + p.n_used] = uintBitsToFloat(p.n_expert);
            route[t * 2 * half_row + half_row + p.n_used] = 1.0 / (1.0 + exp(-logit));
        }
        return;
    }
    if (tid == 0) {
        logits[t * p.n_expert + e] = (NORM ? s.x * inversesqrt(s.y / float(p.cols) + p.eps) : s.x)
                                     + (BIAS ? rbias[e] : 0.0);
        memoryBarrierBuffer();
        last = atomicAdd(count[t], 1u) == p.n_expert - 1;
    }
    barrier();
    if (!last) return;   // uniform: another workgroup picks this token's experts
    memoryBarrierBuffer();
    // the pick, by the first subgroup (moe_pick.glsl)
    if (gl_SubgroupID != 0) return;
    uint lane = gl_SubgroupInvocationID;
    float f = moe_pick(t * p.n_expert, p.n_expert, p.n_used, p.sigmoid != 0, p.norm != 0, p.scale);
    uint ob = t * 2 * half_row;
    for (uint k = lane; k < p.n_used; k += gl_SubgroupSize) {
        route[ob + k] = uintBitsToFloat(pick_id[k]);
        route[ob + half_row + k] = pick_w[k] * f;
    }
    if (SHONE && lane == 0) {
        route[ob + p.n_used] = uintBitsToFloat(p.n_expert);
        route[ob + half_row + p.n_used] = 1.0;
    }
    if (lane == 0) count[t] = 0u;
}
