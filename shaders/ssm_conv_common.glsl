// Shared by the causal convolution's kernels (ssm_conv.comp, gdn_decode.comp). Include after the
// step-parameter buffer `step` ([n_past, n_tokens, n_kv, sync_base, seq_len]).
//
// The layer's conv state is a ring of d_conv slots of `channels` floats: the input at absolute
// position pos (n_past + t) lives in slot pos % d_conv. A token's window reads the slots of the
// d_conv - 1 positions before it; a one-token step writes the slot of its own position, which that
// step's window does not read, so readers and the writer of a channel need no ordering.

#define MAX_TAPS 16        // models/hybrid.py MAX_CONV

// Token t's position in its sequence (0: it starts one; with seq_len L > 0, every L positions).
uint conv_seq_pos(uint t) {
    const uint pos = step[0] + t, seq_len = step[4];
    return seq_len > 0 ? pos % seq_len : pos;
}

uint conv_slot(uint pos, uint d_conv) { return pos % d_conv; }
