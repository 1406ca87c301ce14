#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// The gated delta rule token by token (decode, short batches; llamavk/kernels/deltanet.py):
//   per token t and value head h (key head kh = gdn_key_head(h)), q and k L2-normed (x / sqrt(|x|^2 + eps)),
//   S = exp(g) S;  S += k (beta (v - S^T k))^T;  out = S^T q / sqrt(head_dim)
// g = softplus(alpha + dt) * A and beta = sigmoid(beta_raw) per (token, value head). The state
// restarts at 0 where a token starts a sequence (gdn_common.glsl).
// Grid (value heads, head_dim / COLS); a workgroup holds COLS columns of its head's state, each column
// cut into SLICES row ranges held in registers, one thread per (slice, column): S^T k and S^T q are
// sums over a column, reduced across the slices in shared memory.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint COLS = 32;
layout(std430, binding = 0) readonly buffer Step { uint step[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };            // [n_tokens][(2 Hk + Hv) D]
layout(std430, binding = 2) readonly buffer Alpha { float alpha[]; };    // [n_tokens][Hv]
layout(std430, binding = 3) readonly buffer Beta { float beta[]; };      // [n_tokens][Hv]
layout(std430, binding = 4) readonly buffer Dt { float dt[]; };          // [Hv]
layout(std430, binding = 5) readonly buffer A { float a_log[]; };        // [Hv]: A = -exp(A_log)
layout(std430, binding = 6) buffer State { float state[]; };             // [Hv][D][D]
layout(std430, binding = 7) writeonly buffer Out { float o[]; };        // [n_tokens][Hv D]
layout(push_constant) uniform Push { uint n_tokens; uint n_k_heads; uint n_v_heads; uint head_dim; float eps; } p;
#include "gdn_common.glsl"

#define MAX_D 256           // models/hybrid.py MAX_SSM_HEAD
#define MAX_ROWS 32         // rows of a column per thread: head_dim <= MAX_ROWS * SLICES

shared float kq[2 * MAX_D];                 // this token's k, then q (raw)
shared float red[gl_WorkGroupSize.x];       // partial column sums [slice][column]
shared float sq[2 * gl_WorkGroupSize.x];    // per-subgroup sums of squares of k and q

void main() {
    const uint SLICES = gl_WorkGroupSize.x / COLS;
    const uint h = gl_WorkGroupID.x, D = p.head_dim, kh = gdn_key_head(h);
    const uint tid = gl_LocalInvocationID.x, jl = tid % COLS, slice = tid / COLS;
    const uint j = gl_WorkGroupID.y * COLS + jl;
    const bool live = j < D;
    const uint rows = (D + SLICES - 1) / SLICES, i0 = slice * rows;
    const float scale = inversesqrt(float(D));
    const float dth = dt[h], ah = a_log[h];

    float S[MAX_ROWS];
    const bool fresh = gdn_starts(0);
    [[unroll]] for (uint r = 0; r < MAX_ROWS; ++r) {
        const uint i = i0 + r;
        S[r] = (!fresh && live && r < rows && i < D) ? state[(h * D + i) * D + j] : 0.0;
    }
    for (uint t = 0; t < p.n_tokens; ++t) {
        // this token's k and q, and their squared norms
        float sk = 0.0, sqq = 0.0;
        for (uint i = tid; i < D; i += gl_WorkGroupSize.x) {
            const float kv = x[gdn_k_at(t, kh) + i], qv = x[gdn_q_at(t, kh) + i];
            kq[i] = kv;
            kq[MAX_D + i] = qv;
            sk += kv * kv;
            sqq += qv * qv;
        }
        sk = subgroupAdd(sk);
        sqq = subgroupAdd(sqq);
        if (subgroupElect()) {
            sq[gl_SubgroupID] = sk;
            sq[gl_WorkGroupSize.x + gl_SubgroupID] = sqq;
        }
        barrier();
        sk = 0.0;
        sqq = 0.0;
        for (uint s = 0; s < gl_NumSubgroups; ++s) {
            sk += sq[s];
            sqq += sq[gl_WorkGroupSize.x + s];
        }
        const float inv_k = inversesqrt(sk + p.eps), inv_q = inversesqrt(sqq + p.eps);
        const float decay = exp(gdn_log_decay(alpha[t * p.n_v_heads + h], dth, ah));
        const float b = gdn_sigmoid(beta[t * p.n_v_heads + h]);
        if (gdn_starts(t)) {
            [[unroll]] for (uint r = 0; r < MAX_ROWS; ++r) S[r] = 0.0;
        }
        // decay, then S^T k over this thread's rows
        float part = 0.0;
        [[unroll]] for (uint r = 0; r < MAX_ROWS; ++r) {
            if (r < rows && i0 + r < D) {
                S[r] *= decay;
                part += S[r] * kq[i0 + r];
            }
        }
        red[tid] = part * inv_k;
        barrier();
        float stk = 0.0;
        for (uint s = 0; s < SLICES; ++s) stk += red[s * COLS + jl];
        const float v = live ? x[gdn_v_at(t, h) + j] : 0.0;
        const float delta = b * (v - stk);
        barrier();                            // every column read red: reuse it
        part = 0.0;
        [[unroll]] for (uint r = 0; r < MAX_ROWS; ++r) {
            if (r < rows && i0 + r < D) {
                S[r] += kq[i0 + r] * inv_k * delta;
                part += S[r] * kq[MAX_D + i0 + r];
            }
        }
        red[tid] = part * inv_q;
        barrier();
        if (slice == 0 && live) {
            float acc = 0.0;
            for (uint s = 0; s < SLICES; ++s) acc += red[s * COLS + jl];
            o[t * p.n_v_heads * D + h * D + j] = acc * scale;
        }
        barrier();                            // kq, red and sq are the next token's
    }
    [[unroll]] for (uint r = 0; r < MAX_ROWS; ++r) {
        const uint i = i0 + r;
        if (live && r < rows && i < D) state[(h * D + i) * D + j] = S[r];
    }
}
