#version 450
#include "common.glsl"
// Mixture-of-experts router, one workgroup per token: the router's logits over n_expert experts ->
// probabilities (softmax, or sigmoid each) -> the n_used most probable experts (ties: the lower id)
// -> their weights: the probabilities, divided by their sum where NORM is set, times `scale`.
//   out[t] = [id_0 .. id_{n_used-1} (uint bits), weight_0 .. weight_{n_used-1}]
// The probabilities stay in shared memory; each of the n_used picks is a workgroup-wide argmax.
layout(local_size_x = 64) in;
#define WG 64
#define MAX_EXPERTS 1024
#define MAX_USED 32
layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) writeonly buffer Out { float o[]; };
layout(push_constant) uniform Push {
    uint n_tokens;
    uint n_expert;
    uint n_used;
    uint sigmoid;    // 0: softmax over the experts, 1: sigmoid of each logit
    uint norm;       // 1: the chosen weights renormalized to sum 1
    float scale;
} p;

shared float prob[MAX_EXPERTS];
shared float red_v[WG];
shared uint red_i[WG];
shared uint chosen[MAX_USED];
shared float chosen_p[MAX_USED];

// workgroup-wide reduction: red_v[0] = max, or sum (SUM_MODE), of every thread's v
float reduce(float v, bool sum_mode) {
    uint tid = gl_LocalInvocationID.x;
    red_v[tid] = v;
    barrier();
    for (uint s = WG / 2; s > 0; s >>= 1) {
        if (tid < s) red_v[tid] = sum_mode ? red_v[tid] + red_v[tid + s] : max(red_v[tid], red_v[tid + s]);
        barrier();
    }
    float r = red_v[0];
    barrier();
    return r;
}

void main() {
    uint t = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (t >= p.n_tokens) return;   // uniform per workgroup
    uint tid = gl_LocalInvocationID.x, base = t * p.n_expert;
    float m = -3.4e38;
    for (uint e = tid; e < p.n_expert; e += WG) {
        float v = logits[base + e];
        prob[e] = v;
        m = max(m, v);
    }
    if (p.sigmoid == 0) {
        m = reduce(m, false);
        float s = 0.0;
        for (uint e = tid; e < p.n_expert; e += WG) {
            float v = exp(prob[e] - m);
            prob[e] = v;
            s += v;
        }
        s = reduce(s, true);
        for (uint e = tid; e < p.n_expert; e += WG) prob[e] /= s;
    } else {
        for (uint e = tid; e < p.n_expert; e += WG) prob[e] = 1.0 / (1.0 + exp(-prob[e]));
    }
    barrier();
    for (uint k = 0; k < p.n_used; ++k) {
        // argmax over the experts not chosen yet (chosen ones hold -1: probabilities are >= 0)
        float bv = -2.0;
        uint bi = 0xFFFFFFFFu;
        for (uint e = tid; e < p.n_expert; e += WG) {
            float v = prob[e];
            if (v > bv) { bv = v; bi = e; }   // ascending e: the first of equals stays
        }
        red_v[tid] = bv;
        red_i[tid] = bi;
        barrier();
        for (uint s = WG / 2; s > 0; s >>= 1) {
            if (tid < s) {
                float ov = red_v[tid + s];
                uint oi = red_i[tid + s];
                if (ov > red_v[tid] || (ov == red_v[tid] && oi < red_i[tid])) { red_v[tid] = ov; red_i[tid] = oi; }
            }
            barrier();
        }
        if (tid == 0) {
            chosen[k] = red_i[0];
            chosen_p[k] = red_v[0];
            prob[red_i[0]] = -1.0;
        }
        barrier();
    }
    if (tid == 0) {
        float s = 0.0;
        for (uint k = 0; k < p.n_used; ++k) s += chosen_p[k];
        float f = p.norm != 0 ? p.scale / s : p.scale;
        uint ob = t * 2 * p.n_used;
        for (uint k = 0; k < p.n_used; ++k) {
            o[ob + k] = uintBitsToFloat(chosen[k]);
            o[ob + p.n_used + k] = chosen_p[k] * f;
        }
    }
}
