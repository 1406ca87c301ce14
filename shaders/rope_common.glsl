// RoPE angles as ggml's rope_yarn computes them (shared by rope.comp and rope_kv.comp).
//   theta_extrap = pos * base^(-2i/rope_dim) [/ freqs[i]]
//   theta_interp = freq_scale * theta_extrap
//   yarn (ext_factor != 0): theta = mix(theta_interp, theta_extrap, ramp(i) * ext_factor),
//                           mscale = attn_factor * (1 + 0.1 ln(1/freq_scale))
//   else theta = theta_interp, mscale = attn_factor.
// Include after the kernel's push block `p`, whose first fields are (llamavk/kernels/rope.py packs them):
//   uint n_tokens, n_heads, head_dim, rope_dim, neox;
//   float log2_theta_scale, freq_scale, ext_factor, attn_factor, corr_low, corr_high;
// and, with HAS_FREQS, after the freqs[] buffer, and after the step-parameter buffer `step`.

// RoPE position of KV row `row` (= n_past + t). With seq_len = step[4] > 0 the batch holds whole
// sequences back to back (several perplexity chunks at once): row belongs to sequence row / seq_len
// at position row % seq_len. seq_len 0: one sequence, position = row.
uint rope_position(uint row) {
    const uint seq_len = step[4];
    return seq_len > 0 ? row % seq_len : row;
}

// (cos, sin) * mscale of pair i at position pos
vec2 rope_cos_sin(uint i, float pos) {
    float theta_extrap = pos * exp2(p.log2_theta_scale * float(i));
#ifdef HAS_FREQS
    theta_extrap /= freqs[i];
#endif
    float theta = p.freq_scale * theta_extrap;
    float mscale = p.attn_factor;
    if (p.ext_factor != 0.0) {
        const float y = (float(i) - p.corr_low) / max(0.001, p.corr_high - p.corr_low);
        const float ramp_mix = (1.0 - clamp(y, 0.0, 1.0)) * p.ext_factor;
        theta = theta * (1.0 - ramp_mix) + theta_extrap * ramp_mix;
        mscale *= 1.0 + 0.1 * log(1.0 / p.freq_scale);
    }
    // Reduce to [-pi, pi] first (Cody-Waite, 2 pi = C1 + C2 with C1 exact in 8 bits): GPU sin/cos
    // approximations lose accuracy on large arguments (NVIDIA: ~3e-4 at 900 rad).
    const float k = round(theta * 0.15915494309189535);
    theta = fma(-k, 0.0019353071795864769, fma(-k, 6.28125, theta));
    return vec2(cos(theta), sin(theta)) * mscale;
}

// element offsets (within one head) of pair i: normal (2i, 2i+1), neox (i, i + rope_dim/2)
uvec2 rope_pair(uint i) {
    return p.neox != 0 ? uvec2(i, i + p.rope_dim / 2) : uvec2(2 * i, 2 * i + 1);
}
