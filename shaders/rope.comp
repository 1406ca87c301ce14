#version 450
#include "common.glsl"
// Rotary position embedding, in place on x = [n_tokens][n_heads * head_dim].
// One thread per rotated pair; grid (ceil(n_heads * rope_dim/2 / WG), n_tokens).
// Position of token t = n_past + t, n_past read from the step-parameter buffer at execution time.
//   normal (llama): pairs (2i, 2i+1);  neox (qwen2/qwen3): pairs (i, i + rope_dim/2)
// Only the first rope_dim dims of a head turn. Angles as ggml's rope_yarn computes them:
//   theta_extrap = pos * base^(-2i/rope_dim) [/ freqs[i]]
//   theta_interp = freq_scale * theta_extrap
//   yarn (ext_factor != 0): theta = mix(theta_interp, theta_extrap, ramp(i) * ext_factor),
//                           mscale = attn_factor * (1 + 0.1 ln(1/freq_scale))
//   else theta = theta_interp, mscale = attn_factor.
layout(local_size_x_id = 0) in;
layout(std430, binding = 0) readonly buffer Step { uint step[]; };   // [n_past, n_tokens, n_kv, 0]
#ifdef HAS_FREQS
layout(std430, binding = 1) readonly buffer Freqs { float freqs[]; }; // rope_freqs: per-frequency divisors
layout(std430, binding = 2) buffer X { float x[]; };
#else
layout(std430, binding = 1) buffer X { float x[]; };
#endif
layout(push_constant) uniform Push {
    uint n_tokens; uint n_heads; uint head_dim; uint rope_dim; uint neox;
    float log2_theta_scale;   // log2(base^(-2/rope_dim))
    float freq_scale; float ext_factor; float attn_factor; float corr_low; float corr_high;
} p;

void main() {
    const uint half_dim = p.rope_dim / 2;
    const uint j = gl_GlobalInvocationID.x;        // pair index within the token
    const uint t = gl_WorkGroupID.y;
    if (j >= p.n_heads * half_dim || t >= p.n_tokens) return;
    const uint head = j / half_dim;
    const uint i = j - head * half_dim;
    const float pos = float(step[0] + t);

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
    const float c = cos(theta) * mscale;
    const float s = sin(theta) * mscale;

    const uint base = t * p.n_heads * p.head_dim + head * p.head_dim;
    const uint i0 = p.neox != 0 ? base + i : base + 2 * i;
    const uint i1 = p.neox != 0 ? i0 + half_dim : i0 + 1;
    const float x0 = x[i0];
    const float x1 = x[i1];
    x[i0] = x0 * c - x1 * s;
    x[i1] = x0 * s + x1 * c;
}
