// Quantized KV cache blocks (llamavk/kv_cache.py): ggml's q8_0, q4_0, q4_1, q5_0 and q5_1 layouts,
// the cache a flat array of blocks (row p of a cache of width W elements holds blocks p * W / 32 ..
// (p + 1) * W / 32 - 1; every head_dim is a multiple of 32, so a block never straddles two heads).
// Kernels bind a quantized cache as uint16_t[] (blocks of 34, 18, 20, 22 and 24 bytes: 2-byte aligned
// only). In uint16 words:
//   q8_0: 17 words: f16 d, then 32 int8 q, two per word (low byte first);  x = q * d
//   q4_0:  9 words: f16 d, then 16 bytes; byte j holds element j (low nibble) and j + 16 (high);
//          x = (nibble - 8) * d
//   q4_1: 10 words: f16 d, f16 m, then q4_0's 16 bytes;  x = nibble * d + m
//   q5_0: 11 words: f16 d, 32 bits qh (bit j: element j's fifth bit), q4_0's 16 bytes of low bits;
//          x = (q - 16) * d
//   q5_1: 12 words: f16 d, f16 m, qh, the 16 bytes;  x = q * d + m
// The type is a specialization constant of the including kernel: KV_F16, KV_Q8_0, KV_Q4_0, ...
#define KV_F16 0u
#define KV_Q8_0 1u
#define KV_Q4_0 2u
#define KV_Q4_1 3u
#define KV_Q5_0 4u
#define KV_Q5_1 5u

// uint16 words per block of 32 values
uint kv_block_words(const uint type) {
    return type == KV_Q8_0 ? 17u : type == KV_Q4_0 ? 9u : type == KV_Q4_1 ? 10u : type == KV_Q5_0 ? 11u : 12u;
}
// a block's offset m (q4_1, q5_1), its fifth bits (q5_0, q5_1), the word of its first low-bit byte
bool kv_has_min(const uint type) { return type == KV_Q4_1 || type == KV_Q5_1; }
bool kv_has_qh(const uint type) { return type == KV_Q5_0 || type == KV_Q5_1; }
uint kv_qs_word(const uint type) { return kv_block_words(type) - 8u; }

// roundf (half away from zero) as gguf.quants' np_roundf computes it, exactly in f32: floor(a) +
// floor(2 (a - floor(a))) never rounds an intermediate (a + 0.5 would, just below 0.5).
float kv_roundf(const float x) {
    const float a = abs(x), f = floor(a);
    return sign(x) * (f + floor(2.0 * (a - f)));
}

// The words of one block of 32 values, as ggml (quantize_row_*_ref) and gguf.quants compute them:
// q8_0 d = amax / 127, q = roundf(x / d); q4_0 / q5_0 d = m / -8 / -16 with m the value of largest
// magnitude (the first of equals), q = min(15 / 31, trunc(x / d + 8.5 / 16.5)); q4_1 / q5_1 d =
// (max - min) / 15 / 31, m = min, q = min(15 / 31, trunc((x - min) / d + 0.5)). Each multiplies by
// 1 / d (0 when d = 0), as the references do. Returns the word count.
uint kv_quantize(const uint type, const float v[32], out uint w[17]) {
    for (uint j = 0; j < 17; ++j) w[j] = 0u;
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
    const uint top = type == KV_Q4_0 || type == KV_Q4_1 ? 15u : 31u;
    float d, lo = 0.0, bias;
    if (kv_has_min(type)) {
        float mx = v[0];
        lo = v[0];
        for (uint j = 1; j < 32; ++j) { mx = max(mx, v[j]); lo = min(lo, v[j]); }
        d = (mx - lo) / float(top);
        bias = 0.5;
    } else {
        float m = 0.0, amax = 0.0;
        for (uint j = 0; j < 32; ++j) {
            if (abs(v[j]) > amax) { amax = abs(v[j]); m = v[j]; }
        }
        d = m / -float((top + 1u) / 2u);
        bias = float((top + 1u) / 2u) + 0.5;
    }
    const float id = d != 0.0 ? 1.0 / d : 0.0;
    w[0] = packHalf2x16(vec2(d, 0.0)) & 0xffffu;
    if (kv_has_min(type)) w[1] = packHalf2x16(vec2(lo, 0.0)) & 0xffffu;
    uint qh = 0u;
    const uint qs = kv_qs_word(type);
    for (uint j = 0; j < 8; ++j) {
        uint word = 0u;
        for (uint b = 0; b < 2; ++b) {
            const uint e = 2 * j + b;
            const uint q0 = min(top, uint(trunc((v[e] - lo) * id + bias)));
            const uint q1 = min(top, uint(trunc((v[e + 16] - lo) * id + bias)));
            word |= ((q0 & 15u) | ((q1 & 15u) << 4)) << (8 * b);
            qh |= ((q0 >> 4) << e) | ((q1 >> 4) << (e + 16));
        }
        w[qs + j] = word;
    }
    if (kv_has_qh(type)) {
        w[qs - 2] = qh & 0xffffu;
        w[qs - 1] = qh >> 16;
    }
    return kv_block_words(type);
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
    const uint qs = base + kv_qs_word(type), jb = j % 16, sh = j < 16 ? 0u : 4u;                    \
    const uint w0 = uint(BUF[qs + jb / 2]) >> sh, w1 = uint(BUF[qs + jb / 2 + 1]) >> sh;            \
    vec4 q = vec4(float(w0 & 15u), float((w0 >> 8) & 15u), float(w1 & 15u), float((w1 >> 8) & 15u)); \
    if (kv_has_qh(type)) {                                                                          \
        const uint h = ((uint(BUF[qs - 2]) | (uint(BUF[qs - 1]) << 16)) >> j) & 15u;               \
        q += 16.0 * vec4(float(h & 1u), float((h >> 1) & 1u), float((h >> 2) & 1u), float(h >> 3)); \
    }                                                                                               \
    if (kv_has_min(type))                                                                           \
        return q * d + unpackHalf2x16(uint(BUF[base + 1])).x;                                       \
    return (q - (type == KV_Q4_0 ? 8.0 : 16.0)) * d;                                                \
}

// 8 values at element e (a multiple of 8) as 8 packed halves (the decode kernel's f16 registers).
#define KV_DEQUANT8(NAME, DQ4)                                                                      \
uvec4 NAME(const uint type, const uint e) {                                                         \
    const vec4 a = DQ4(type, e), b = DQ4(type, e + 4);                                              \
    return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));   \
}
