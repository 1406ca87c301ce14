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

// Division as IEEE rounds it: Vulkan lets 1 / b and a / b be 2.5 ULP off (a driver may compute a / 127
// as a * (1 / 127)), and a scale or level at a rounding boundary would then differ from the
// references'. One Newton step from the approximate reciprocal, then the quotient corrected by its
// exact remainder (fma), give the correctly rounded results (finite, normal operands).
float kv_recip(const float b) {
    const float r = 1.0 / b;
    return fma(fma(-b, r, 1.0), r, r);
}
float kv_div(const float a, const float b) {
    const float r = kv_recip(b);
    precise const float q = a * r;
    return fma(fma(-q, b, a), r, q);
}

// A block's statistics, one value at a time: (largest magnitude, the first value of that magnitude,
// max, min); start from vec4(0, 0, v0, v0).
vec4 kv_scan(const vec4 st, const float x) {
    const bool larger = abs(x) > st.x;
    return vec4(larger ? abs(x) : st.x, larger ? x : st.y, max(st.z, x), min(st.w, x));
}

// A block's scale d, its offset lo (q4_1, q5_1; 0 otherwise) and the bias added before truncating,
// from its statistics, as ggml (quantize_row_*_ref) and gguf.quants compute them: q8_0 d = amax / 127;
// q4_0 / q5_0 d = m / -8 / -16 with m the value of largest magnitude (the first of equals), bias
// 8.5 / 16.5; q4_1 / q5_1 d = (max - min) / 15 / 31, lo = min, bias 0.5.
vec3 kv_scale(const uint type, const vec4 st) {
    if (type == KV_Q8_0) return vec3(kv_div(st.x, 127.0), 0.0, 0.0);
    const uint top = type == KV_Q4_0 || type == KV_Q4_1 ? 15u : 31u;
    if (kv_has_min(type)) return vec3(kv_div(st.z - st.w, float(top)), st.w, 0.5);
    return vec3(kv_div(st.y, -float((top + 1u) / 2u)), 0.0, float((top + 1u) / 2u) + 0.5);
}

// 1 / d, 0 when d = 0: the references multiply by it
float kv_inverse(const float d) { return d != 0.0 ? kv_recip(d) : 0.0; }

// The level of x in a block of scale s and inverse id: q8_0 roundf(x / d) as its byte; the others
// min(15 / 31, trunc((x - lo) / d + bias)). precise: no fused multiply-add (the references round the
// product, then the sum).
uint kv_level(const uint type, const float x, const vec3 s, const float id) {
    precise const float y = type == KV_Q8_0 ? x * id : (x - s.y) * id + s.z;
    if (type == KV_Q8_0) return uint(int(kv_roundf(y))) & 0xffu;
    const uint top = type == KV_Q4_0 || type == KV_Q4_1 ? 15u : 31u;
    return min(top, uint(trunc(y)));
}

// A 4/5-bit block's low-bit word j of elements a = 2j, b = 2j + 1 (low nibbles) and c = 2j + 16,
// d = 2j + 17 (high nibbles)
uint kv_low_word(const uint type, const float a, const float b, const float c, const float d, const vec3 s,
                 const float id) {
    return (kv_level(type, a, s, id) & 15u) | ((kv_level(type, c, s, id) & 15u) << 4) |
           ((kv_level(type, b, s, id) & 15u) << 8) | ((kv_level(type, d, s, id) & 15u) << 12);
}

// The words of one block of 32 values, one thread for all. Returns the word count.
uint kv_quantize(const uint type, const float v[32], out uint w[17]) {
    for (uint j = 0; j < 17; ++j) w[j] = 0u;
    vec4 st = vec4(0.0, 0.0, v[0], v[0]);
    for (uint j = 0; j < 32; ++j) st = kv_scan(st, v[j]);
    const vec3 s = kv_scale(type, st);
    const float id = kv_inverse(s.x);
    w[0] = packHalf2x16(vec2(s.x, 0.0)) & 0xffffu;
    if (type == KV_Q8_0) {
        for (uint j = 0; j < 16; ++j)
            w[1 + j] = kv_level(type, v[2 * j], s, id) | (kv_level(type, v[2 * j + 1], s, id) << 8);
        return 17u;
    }
    if (kv_has_min(type)) w[1] = packHalf2x16(vec2(s.y, 0.0)) & 0xffffu;
    const uint qs = kv_qs_word(type);
    for (uint j = 0; j < 8; ++j)
        w[qs + j] = kv_low_word(type, v[2 * j], v[2 * j + 1], v[2 * j + 16], v[2 * j + 17], s, id);
    if (kv_has_qh(type)) {   // the fifth bits: bit e of word qs - 2 + h is element 16 h + e's
        for (uint h = 0; h < 2; ++h) {
            uint bits = 0u;
            for (uint e = 0; e < 16; ++e) bits |= (kv_level(type, v[16 * h + e], s, id) >> 4) << e;
            w[qs - 2 + h] = bits;
        }
    }
    return kv_block_words(type);
}

// KV_STORE_COOP(NAME, BUF) defines void NAME(type, src, blk, l): one block written by 16 threads
// (l < 16), the 32 values in the including kernel's shared float kv_vals[] at src, block blk of the
// uint16_t[] buffer BUF. Each thread scans the 32 values for the block's scale itself, then writes its
// word(s) as kv_quantize computes them: thread l the q8_0 level pair l (word l + 1) or the low-bit word
// l (l < 8), threads 8 and 9 the fifth bits' halves, thread 0 the scale (and offset).
#define KV_STORE_COOP(NAME, BUF)                                                                     \
void NAME(const uint type, const uint src, const uint blk, const uint l) {                           \
    vec4 st = vec4(0.0, 0.0, kv_vals[src], kv_vals[src]);                                            \
    for (uint j = 0; j < 32; ++j) st = kv_scan(st, kv_vals[src + j]);                                \
    const vec3 s = kv_scale(type, st);                                                               \
    const float id = kv_inverse(s.x);                                                                \
    const uint base = blk * kv_block_words(type), qs = kv_qs_word(type);                             \
    if (l == 0u) {                                                                                   \
        BUF[base] = uint16_t(packHalf2x16(vec2(s.x, 0.0)));                                          \
        if (kv_has_min(type)) BUF[base + 1] = uint16_t(packHalf2x16(vec2(s.y, 0.0)));                \
    }                                                                                                \
    if (type == KV_Q8_0) {                                                                           \
        BUF[base + 1 + l] = uint16_t(kv_level(type, kv_vals[src + 2 * l], s, id) |                   \
                                     (kv_level(type, kv_vals[src + 2 * l + 1], s, id) << 8));        \
    } else if (l < 8u) {                                                                             \
        const uint e = src + 2 * l;                                                                  \
        BUF[base + qs + l] = uint16_t(kv_low_word(type, kv_vals[e], kv_vals[e + 1], kv_vals[e + 16],  \
                                                  kv_vals[e + 17], s, id));                          \
    } else if (kv_has_qh(type) && l < 10u) {                                                         \
        uint bits = 0u;                                                                              \
        for (uint e = 0; e < 16; ++e) bits |= (kv_level(type, kv_vals[src + 16 * (l - 8) + e], s, id) >> 4) << e; \
        BUF[base + qs - 10 + l] = uint16_t(bits);                                                    \
    }                                                                                                \
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
