// Shared by the Gated DeltaNet kernels (gdn_recurrent.comp, gdn_chunk_prep.comp, gdn_chunk_scan.comp).
// Include after the step-parameter buffer `step` and the push block `p`, whose fields include
// n_k_heads, n_v_heads, head_dim.
//
// The layer's input row of token t (x, after the convolution): [q | k | v], q and k n_k_heads heads
// of head_dim, v n_v_heads heads; value head h reads key head h % n_k_heads (llama.cpp's tiled order:
// qwen35, whose converter reorders the value heads), or with GROUPED h / (n_v_heads / n_k_heads) (the
// heads of one key head side by side: qwen3next, whose graph repeats each key head in place).
// The recurrent state of value head h: S[i][j] (key index i, value index j) at (h * D + i) * D + j.
layout(constant_id = 3) const uint GROUPED = 0;

uint gdn_key_head(uint h) { return GROUPED != 0u ? h / (p.n_v_heads / p.n_k_heads) : h % p.n_k_heads; }
// whether value head h is the first of those reading its key head
bool gdn_first_reader(uint h) { return GROUPED != 0u ? h % (p.n_v_heads / p.n_k_heads) == 0u : h < p.n_k_heads; }

uint gdn_row_width() { return (2 * p.n_k_heads + p.n_v_heads) * p.head_dim; }
uint gdn_q_at(uint t, uint kh) { return t * gdn_row_width() + kh * p.head_dim; }
uint gdn_k_at(uint t, uint kh) { return t * gdn_row_width() + (p.n_k_heads + kh) * p.head_dim; }
uint gdn_v_at(uint t, uint h) { return t * gdn_row_width() + (2 * p.n_k_heads + h) * p.head_dim; }

// Whether token t of the batch starts a sequence: position 0, or with a step seq_len L > 0 (whole
// sequences back to back: perplexity's parallel chunks) a multiple of L. The state then restarts at 0.
bool gdn_starts(uint t) {
    const uint pos = step[0] + t, seq_len = step[4];
    return (seq_len > 0 ? pos % seq_len : pos) == 0;
}

// log of the per-token decay: softplus(alpha + dt) * A (A = -exp(A_log) < 0), softplus as ggml's
float gdn_log_decay(float alpha, float dt, float a) {
    const float s = alpha + dt;
    return (s > 20.0 ? s : log(1.0 + exp(s))) * a;
}

float gdn_sigmoid(float x) { return 1.0 / (1.0 + exp(-x)); }
