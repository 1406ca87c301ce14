#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// A Gated DeltaNet layer's one-token step in one dispatch (llamavk/kernels/deltanet.py
// delta_net_step): the causal convolution of the channels a value head reads, the gated delta rule
// over its state, and the gated norm of its output. Per value head h (one workgroup), key head
// kh = gdn_key_head(h) (gdn_common.glsl):
//   q, k, v = silu(conv(the token's raw q (kh), k (kh), v (h) channels, the ring's earlier inputs))
//   q, k L2-normed; S = exp(g) S;  S += k (beta (v - S^T k))^T;  o = S^T q / sqrt(head_dim)
//   out = o / sqrt(mean(o^2) + norm_eps) * w * silu(z)
// with g = softplus(alpha + dt) * A, beta = sigmoid(beta_raw) (gdn_common.glsl), as ssm_conv.comp,
// gdn_recurrent.comp and head_norm.comp (GATE_SILU) compute them one dispatch each.
//
// Conv state (ssm_conv_common.glsl): the token's raw inputs go into the ring slot of its position,
// which no window of this step reads, so no workgroup waits for another. The v channels are written
// by their head's workgroup; the q/k channels of key head kh, which n_v_heads / n_k_heads workgroups
// read, by the first of them alone (gdn_first_reader): every channel is written exactly once.
//
// Threads: (slice, column j), D columns (the whole head: its norm is a workgroup reduction), each
// column cut into SLICES = workgroup size / D row ranges of ROWS registers; S^T k and S^T q are
// column sums reduced across the slices in shared memory.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint D = 128;       // head_dim (push head_dim is the same)
layout(constant_id = 2) const uint ROWS = 16;     // state rows per thread: D <= ROWS * SLICES
layout(std430, binding = 0) readonly buffer Step { uint step[]; };    // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 1) readonly buffer X { float x[]; };          // [(2 Hk + Hv) D]: raw q | k | v
layout(std430, binding = 2) readonly buffer Taps { float taps[]; };    // [channels][d_conv]
layout(std430, binding = 3) buffer Conv { float conv[]; };             // [d_conv][channels], a ring
layout(std430, binding = 4) readonly buffer Alpha { float alpha[]; };  // [Hv]
layout(std430, binding = 5) readonly buffer Beta { float beta[]; };    // [Hv]
layout(std430, binding = 6) readonly buffer Dt { float dt[]; };        // [Hv]
layout(std430, binding = 7) readonly buffer A { float a_log[]; };      // [Hv]: A = -exp(A_log)
layout(std430, binding = 8) buffer State { float state[]; };           // [Hv][D][D]
layout(std430, binding = 9) readonly buffer Z { float z[]; };          // [Hv D]
layout(std430, binding = 10) readonly buffer NormW { float norm_w[]; }; // [D]
layout(std430, binding = 11) writeonly buffer Out { float o[]; };     // [Hv D]
layout(push_constant) uniform Push {
    uint n_k_heads; uint n_v_heads; uint head_dim; uint d_conv; float eps; float norm_eps;
} p;
#include "gdn_common.glsl"
#include "ssm_conv_common.glsl"

shared float qkv[3 * D];                         // this head's q, k, v after the convolution (raw norms)
shared float red_k[gl_WorkGroupSize.x];          // partial column sums of S^T k [slice][column]
shared float red_q[gl_WorkGroupSize.x];          // ... of S^T q
shared float sums[3 * gl_WorkGroupSize.x];       // per-subgroup sums of squares: k, q, output

float silu(float v) { return v / (1.0 + exp(-v)); }

void main() {
    const uint SLICES = gl_WorkGroupSize.x / D;
    const uint h = gl_WorkGroupID.x, kh = gdn_key_head(h);
    const uint tid = gl_LocalInvocationID.x, j = tid % D, slice = tid / D;
    const uint i0 = slice * ROWS;
    const uint NS = gl_WorkGroupSize.x;

    // the state's loads first: in flight while the convolution runs
    const bool fresh = gdn_starts(0);
    float S[ROWS];
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
        const uint i = i0 + r;
        S[r] = (!fresh && i < D) ? state[(h * D + i) * D + j] : 0.0;
    }
    const float decay = exp(gdn_log_decay(alpha[h], dt[h], a_log[h]));
    const float b = gdn_sigmoid(beta[h]);
    const float zj = slice == 0 ? z[h * D + j] : 0.0;
    const float wj = slice == 0 ? norm_w[j] : 0.0;

    // the convolution of q (kh), k (kh), v (h), and the token's raw inputs into the ring
    const uint K = p.d_conv, pos = step[0], spos = conv_seq_pos(0), channels = gdn_row_width();
    const uint here = conv_slot(pos, K) * channels;
    float sk = 0.0, sq = 0.0;
    for (uint e = tid; e < 3 * D; e += NS) {
        const uint which = e / D, i = e % D;    // 0: q, 1: k, 2: v
        const uint c = which == 0 ? gdn_q_at(0, kh) + i : (which == 1 ? gdn_k_at(0, kh) + i : gdn_v_at(0, h) + i);
        const float raw = x[c];
        float acc = taps[c * K + K - 1] * raw;
        [[unroll]] for (uint m = 1; m < MAX_TAPS; ++m)
            if (m < K && m <= spos) acc += taps[c * K + K - 1 - m] * conv[conv_slot(pos - m, K) * channels + c];
        const float v = silu(acc);
        qkv[e] = v;
        if (which == 0) sq += v * v;
        else if (which == 1) sk += v * v;
        if (which == 2 || gdn_first_reader(h)) conv[here + c] = raw;
    }
    sk = subgroupAdd(sk);
    sq = subgroupAdd(sq);
    if (subgroupElect()) {
        sums[gl_SubgroupID] = sk;
        sums[NS + gl_SubgroupID] = sq;
    }
    barrier();
    sk = 0.0;
    sq = 0.0;
    for (uint s = 0; s < gl_NumSubgroups; ++s) {
        sk += sums[s];
        sq += sums[NS + s];
    }
    const float inv_k = inversesqrt(sk + p.eps), inv_q = inversesqrt(sq + p.eps);

    // decay, then S^T k over this thread's rows
    float part = 0.0;
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
        if (i0 + r < D) {
            S[r] *= decay;
            part += S[r] * qkv[D + i0 + r];
        }
    }
    red_k[tid] = part * inv_k;
    barrier();
    float stk = 0.0;
    for (uint s = 0; s < SLICES; ++s) stk += red_k[s * D + j];
    const float delta = b * (qkv[2 * D + j] - stk);
    part = 0.0;
    [[unroll]] for (uint r = 0; r < ROWS; ++r) {
        const uint i = i0 + r;
        if (i < D) {
            S[r] += qkv[D + i] * inv_k * delta;
            part += S[r] * qkv[i];
            state[(h * D + i) * D + j] = S[r];
        }
    }
    red_q[tid] = part * inv_q;
    barrier();

    // the gated norm of the head's output: one workgroup reduction
    float oj = 0.0;
    if (slice == 0) {
        for (uint s = 0; s < SLICES; ++s) oj += red_q[s * D + j];
        oj *= inversesqrt(float(D));
    }
    const float oo = subgroupAdd(oj * oj);
    if (subgroupElect()) sums[2 * NS + gl_SubgroupID] = oo;
    barrier();
    if (slice == 0) {
        float total = 0.0;
        for (uint s = 0; s < gl_NumSubgroups; ++s) total += sums[2 * NS + s];
        o[h * D + j] = oj * inversesqrt(total / float(D) + p.norm_eps) * wj * silu(zj);
    }
}
