#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Gated DeltaNet's causal short convolution with carried state, then SiLU (llamavk/kernels/deltanet.py):
//   out[t, c] = silu(sum_j w[c, j] * x_{t - (d_conv - 1) + j}[c]),  j < d_conv (tap d_conv - 1: token t)
// Inputs before the batch come from the layer's conv state (the last d_conv - 1 inputs seen, oldest
// first); inputs before the start of the token's sequence are 0. A token starts a sequence at
// position 0: n_past + t == 0, or with a step seq_len L > 0 (several sequences back to back), at
// (n_past + t) % L == 0. After the batch the state holds its last d_conv - 1 inputs.
// One thread per channel, every token in order (its window in registers).
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 1) readonly buffer X { float x[]; };         // [n_tokens][channels]
layout(std430, binding = 2) readonly buffer W { float w[]; };         // [channels][d_conv]
layout(std430, binding = 3) buffer State { float state[]; };          // [d_conv - 1][channels]
layout(std430, binding = 4) writeonly buffer Out { float o[]; };     // [n_tokens][channels]
layout(push_constant) uniform Push { uint n_tokens; uint channels; uint d_conv; } p;

#define MAX_HIST 15        // d_conv <= 16 (models/hybrid.py MAX_CONV)

void main() {
    const uint c = gl_GlobalInvocationID.x;
    if (c >= p.channels) return;
    const uint nh = p.d_conv - 1;
    const uint n_past = step[0], seq_len = step[4];
    float hist[MAX_HIST];
    float taps[MAX_HIST];
    const uint pos0 = seq_len > 0 ? n_past % seq_len : n_past;
    [[unroll]] for (uint j = 0; j < MAX_HIST; ++j) {
        hist[j] = (j < nh && pos0 != 0) ? state[j * p.channels + c] : 0.0;
        taps[j] = j < nh ? w[c * p.d_conv + j] : 0.0;
    }
    const float tap_now = w[c * p.d_conv + nh];
    for (uint t = 0; t < p.n_tokens; ++t) {
        const uint pos = n_past + t;
        if ((seq_len > 0 ? pos % seq_len : pos) == 0) {
            [[unroll]] for (uint j = 0; j < MAX_HIST; ++j) hist[j] = 0.0;
        }
        const float xt = x[t * p.channels + c];
        float acc = tap_now * xt;
        [[unroll]] for (uint j = 0; j < MAX_HIST; ++j) acc += taps[j] * hist[j];
        o[t * p.channels + c] = acc / (1.0 + exp(-acc));
        // shift the window: hist[nh - 1] becomes this token
        [[unroll]] for (uint j = 0; j + 1 < MAX_HIST; ++j) hist[j] = (j + 1 < nh) ? hist[j + 1] : (j + 1 == nh ? xt : 0.0);
        if (nh == MAX_HIST) hist[MAX_HIST - 1] = xt;
    }
    [[unroll]] for (uint j = 0; j < MAX_HIST; ++j)
        if (j < nh) state[j * p.channels + c] = hist[j];
}
