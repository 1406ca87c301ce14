// Quantized KV cache blocks (llamavk/kv_cache.py): ggml's q8_0 and q4_0 layouts, the cache a flat
// array of blocks (row p of a cache of width W elements holds blocks p * W / 32 .. (p + 1) * W / 32 - 1;
// every head_dim is a multiple of 32, so a block never straddles two heads). Kernels bind a quantized
// cache as uint16_t[] (blocks are 34 and 18 bytes: 2-byte aligned only):
//   q8_0: 17 words: f16 d, then 32 int8 q, two per word (low byte first);  x = q * d
//   q4_0:  9 words: f16 d, then 16 bytes; byte j holds element j (low nibble) and j + 16 (high);
//          x = (nibble - 8) * d
// The type is a specialization constant of the including kernel: KV_F16, KV_Q8_0, KV_Q4_0.
#define KV_F16 0u
#define KV_Q8_0 1u
#define KV_Q4_0 2u

// uint16 words per block of 32 values
uint kv_block_words(const uint type) { return type == KV_Q8_0 ? 17u : 9u; }

// roundf (half away from zero) as gguf.quants' np_roundf computes it, exactly in f32: floor(a) +
// floor(2 (a - floor(a))) never rounds an intermediate (a + 0.5 would, just below 0.5).
float kv_roundf(const float x) {
    const float a = abs(x), f = floor(a);
    return sign(x) * (f + floor(2.0 * (a - f)));
}

// The words of one block of 32 values, as ggml (quantize_row_q8_0_ref / q4_0_ref) and
// gguf.quants compute them: q8_0 d = amax / 127, q = roundf(x / d); q4_0 d = m / -8 with m the
// value of largest magnitude (the first of equals), q = min(15, trunc(x / d + 8.5)). Both multiply
// by 1 / d (0 when d = 0), as the references do. Returns the word count.
uint kv_quantize(const uint type, const float v[32], out uint w[17]) {
    if (type == KV_Q8_0) {
        float amax = 0.0;
        for (uint j = 0; j < 32; ++j) amax = max(amax, abs(v[j]));
        const float d = amax / 127.0;
        const float id = d != 0.0 ? 1.0 / d : 0.0;
        w[0] = packHalf2x16(vec2(d, 0.0)) & 0xffffu;
        for (uint j = 0; j < 16; ++j) {
            const int q0 = int(kv_roundf(v[2 * j] * id)), q1 = int(kv_roundf(v[2 * j + 1] * id));
            w[1 + j] = (uint(q0) & 0xffu) | ((uint(q1) & 0xffu) << 8);
        }
        return 17u;
    }
    float m = 0.0, amax = 0.0;
    for (uint j = 0; j < 32; ++j) {
        if (abs(v[j]) > amax) { amax = abs(v[j]); m = v[j]; }
    }
    const float d = m / -8.0;
    const float id = d != 0.0 ? 1.0 / d : 0.0;
    w[0] = packHalf2x16(vec2(d, 0.0)) & 0xffffu;
    for (uint j = 0; j < 8; ++j) {
        uint word = 0u;
        for (uint b = 0; b < 2; ++b) {
            const uint e = 2 * j + b;
            const uint lo = min(15u, uint(trunc(v[e] * id + 8.5)));
            const uint hi = min(15u, uint(trunc(v[e + 16] * id + 8.5)));
            word |= (lo | (hi << 4)) << (8 * b);
        }
        w[1 + j] = word;
    }
    for (uint j = 9; j < 17; ++j) w[j] = 0u;
    return 9u;
}

// 4 values of a quantized cache at element e (a multiple of 4), read from the uint16_t[] buffer BUF.
#define KV_DEQUANT4(NAME, BUF)                                                                      \
vec4 NAME(const uint type, const uint e) {                                                          \
    const uint words = kv_block_words(type), blk = e / 32, j = e % 32;                              \
    const uint base = blk * words;                                                                  \
    const float d = unpackHalf2x16(uint(BUF[base])).x;                                              \
    if (type == KV_Q8_0) {                                                                          \
        const uint w0 = uint(BUF[base + 1 + j / 2]), w1 = uint(BUF[base + 2 + j / 2]);              \
        return vec4(float(int(w0 << 24) >> 24), float(int(w0 << 16) >> 24),                          \
                    float(int(w1 << 24) >> 24), float(int(w1 << 16) >> 24)) * d;                    \
    }                                                                                               \
    const uint jb = j % 16, sh = j < 16 ? 0u : 4u;                                                  \
    const uint w0 = uint(BUF[base + 1 + jb / 2]) >> sh, w1 = uint(BUF[base + 2 + jb / 2]) >> sh;    \
    return (vec4(float(w0 & 15u), float((w0 >> 8) & 15u), float(w1 & 15u), float((w1 >> 8) & 15u))  \
            - 8.0) * d;                                                                             \
}

// 8 values at element e (a multiple of 8) as 8 packed halves (the decode kernel's f16 registers).
#define KV_DEQUANT8(NAME, DQ4)                                                                      \
uvec4 NAME(const uint type, const uint e) {                                                         \
    const vec4 a = DQ4(type, e), b = DQ4(type, e + 4);                                              \
    return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));   \
}
