#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Gated DeltaNet's causal short convolution with carried state, then SiLU (llamavk/kernels/deltanet.py):
//   out[t, c] = silu(sum_j w[c, j] * x_{t - (d_conv - 1) + j}[c]),  j < d_conv (tap d_conv - 1: token t)
// Inputs before the batch come from the layer's conv state; inputs before the start of the token's
// sequence are 0. A token starts a sequence at position 0: n_past + t == 0, or with a step seq_len
// L > 0 (several sequences back to back), at (n_past + t) % L == 0.
// The state is a ring of d_conv slots ([d_conv][channels], ssm_conv_common.glsl): the input at
// position pos lives in slot pos % d_conv. After the batch the slots of its last d_conv - 1
// positions hold their inputs (those of its last sequence). One slot more than the window needs, so
// that a one-token step writes a slot no reader of that step reads (gdn_decode.comp: several
// workgroups read the same channels while one of them writes them).
//
// Tokens in parallel: a workgroup takes CHANNELS consecutive channels (a subgroup's coalesced row) for
// TOKENS tokens (grid y), TOKEN_LANES at a time, each output from its own d_conv loads (L1 serves the
// overlap). A 512-token prompt of 8192 channels is 2048 workgroups of 8 steps, not a 512-step loop per
// thread (H100, per layer: 261 us that way, 90 us with one workgroup per 32 channels for every token).
// Only the first token block reads the old state (d_conv - 1 < TOKENS): its workgroup also writes the
// new state, after a barrier that separates those reads from the writes.
#define CHANNELS 32
#define TOKEN_LANES 8
#define TOKENS 64
layout(local_size_x = 256) in;   // CHANNELS * TOKEN_LANES
layout(std430, binding = 0) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 1) readonly buffer X { float x[]; };         // [n_tokens][channels]
layout(std430, binding = 2) readonly buffer W { float w[]; };         // [channels][d_conv]
layout(std430, binding = 3) buffer State { float state[]; };          // [d_conv][channels], a ring
layout(std430, binding = 4) writeonly buffer Out { float o[]; };     // [n_tokens][channels]
layout(push_constant) uniform Push { uint n_tokens; uint channels; uint d_conv; } p;

#include "ssm_conv_common.glsl"

// The input k tokens before token t in channel c, as token t's window sees it (0 before its sequence).
float input_before(uint t, uint k, uint c) {
    if (k > conv_seq_pos(t)) return 0.0;
    return t >= k ? x[(t - k) * p.channels + c] : state[conv_slot(step[0] + t - k, p.d_conv) * p.channels + c];
}

void main() {
    const uint lane = gl_LocalInvocationID.x % CHANNELS, tl = gl_LocalInvocationID.x / CHANNELS;
    const uint c = gl_WorkGroupID.x * CHANNELS + lane;
    const bool live = c < p.channels;
    const bool first = gl_WorkGroupID.y == 0;        // uniform: the block that owns the state
    const uint t0 = gl_WorkGroupID.y * TOKENS, t_end = min(p.n_tokens, t0 + TOKENS);
    const uint nh = p.d_conv - 1;
    float taps[MAX_TAPS];
    [[unroll]] for (uint j = 0; j < MAX_TAPS; ++j) taps[j] = (live && j < p.d_conv) ? w[c * p.d_conv + j] : 0.0;
    // the new state before the barrier: its inputs may come from the old state, and a slot written
    // may be one that a token's window reads (the ring's slots come round every d_conv positions)
    const uint last = p.n_tokens - 1;
    float keep[2];
    [[unroll]] for (uint i = 0; i < 2; ++i) {
        const uint j = tl + i * TOKEN_LANES;      // the input j tokens before the last one
        keep[i] = (first && live && j < nh) ? input_before(last, j, c) : 0.0;
    }
    if (live) {
        for (uint t = t0 + tl; t < t_end; t += TOKEN_LANES) {
            float acc = 0.0;
            [[unroll]] for (uint j = 0; j < MAX_TAPS; ++j)
                if (j < p.d_conv) acc += taps[j] * input_before(t, nh - j, c);
            o[t * p.channels + c] = acc / (1.0 + exp(-acc));
        }
    }
    if (!first) return;
    barrier();   // every read of the old state (this workgroup's, the only reader) is done
    [[unroll]] for (uint i = 0; i < 2; ++i) {
        const uint j = tl + i * TOKEN_LANES;
        // positions before the last token's sequence are never read: left as they are
        if (live && j < nh && j <= conv_seq_pos(last))
            state[conv_slot(step[0] + last - j, p.d_conv) * p.channels + c] = keep[i];
    }
}
