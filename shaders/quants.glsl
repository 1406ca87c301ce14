// Weight types in their GGUF layout, and dequantization to f32.
//
// Select one type with a define: QTYPE_F32, QTYPE_F16, QTYPE_BF16, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_Q4_1,
// QTYPE_Q5_0, QTYPE_Q5_1, QTYPE_Q2_K, QTYPE_Q3_K, QTYPE_Q4_K, QTYPE_Q5_K, QTYPE_Q6_K, QTYPE_IQ4_NL,
// QTYPE_IQ4_XS, QTYPE_MXFP4, QTYPE_IQ2_XXS, QTYPE_IQ2_XS, QTYPE_IQ2_S, QTYPE_IQ3_XXS, QTYPE_IQ3_S,
// QTYPE_IQ1_S, QTYPE_IQ1_M, QTYPE_TQ1_0, QTYPE_TQ2_0.
// Include after common.glsl. The weight buffer (one chunk of rows, rows contiguous) is declared here on
// binding W_BINDING (default 0), aliased as 8/16/32-bit words so each type reads its blocks with the
// widest loads its block alignment allows (4-byte multiples use uint32; the odd-sized MXFP4 block is
// stored planar, below).
//
// Interface (the same for every type):
//   QK                       elements per block (1 for the float types)
//   QFLOAT                   defined for F32/F16/BF16: cols is any count, units may be partial
//   void dequant_unit(uint row, uint u, uint cols, out vec4 w[8])
//       elements [32u, 32u+32) of chunk-local row `row` (a row has `cols` elements); w[i] holds
//       elements 32u+4i .. 32u+4i+3. Float types return 0 past the end of the row.
//   void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c)   (quant types)
//       a quarter of a unit: a = w[i], c = w[i + 4] (i < 4) -- the matrix-vector kernel gives each
//       thread one quarter so that neighbouring threads read neighbouring words of a block.
// Block layouts (bytes) follow gguf/quants.py (ggml-common.h); Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL,
// MXFP4, Q2_K, Q6_K, the lattice types but IQ1_M and the ternary types are stored planar (below):
//   Q8_0 34: d f16, q int8[32]                      x = d*q
//   Q4_0 18: d, qs[16]   elem j: lo nibble of qs[j], elem j+16: hi nibble      x = d*(q-8)
//   Q4_1 20: d, m, qs[16]                           x = d*q + m
//   Q5_0 22: d, qh u32, qs[16]  bit 4 of elem j = bit j of qh                  x = d*(q-16)
//   Q5_1 24: d, m, qh u32, qs[16]                   x = d*q + m
//   Q2_K 84: scales[16] (lo: scale, hi: min), qs[64], d, dmin; elem e = 32s+l: 2 bits at
//            qs[32*(s/4)+l] >> 2*(s%4); group e/16              x = d*sc*q - dmin*mn
//   Q3_K 110: hmask[32], qs[64], scales[12] (16 x 6 bit, -32), d; low 2 bits as Q2_K, bit 2 =
//            hmask[l] >> s; q = low + 4*hbit - 4                 x = d*sc*q
//   Q4_K 144: d, dmin, scales[12] (8 x 6-bit scale + 8 x 6-bit min), qs[128]; elem 32s+l =
//            qs[32*(s/2)+l] >> 4*(s%2)                           x = d*sc[s]*q - dmin*mn[s]
//   Q5_K 176: d, dmin, scales[12], qh[32], qs[128]; bit 4 = qh[l] >> s
//   Q6_K 210: ql[128], qh[64], scales int8[16], d; elem 128h + 32j + l: low 4 bits =
//            ql[64h + 32(j%2) + l] >> 4*(j/2), high 2 bits = qh[32h + l] >> 2j; q - 32, group e/16
//   IQ4_NL 18: d, qs[16]  nibbles placed as Q4_0's              x = d*KV_IQ4NL[q]
//   IQ4_XS 136: d, scales_h u16, scales_l[4], qs[128]; sub-block s (32 elements) has the 6-bit scale
//            ls = (scales_l nibble s) | (2 bits s of scales_h) << 4; elem 32s+j: lo nibble of
//            qs[16s+j], elem 32s+16+j: hi nibble                 x = d*(ls-32)*KV_IQ4NL[q]
//   MXFP4 17: e (E8M0 exponent byte), qs[16]  nibbles placed as Q4_0's; q is an E2M1 number, the
//            table holds it doubled, so the scale is 2^(e-128)   x = 2^(e-128)*KV_MXFP4[q]
//   IQ2_XXS 66, IQ2_XS 74, IQ2_S 82, IQ3_XXS 98, IQ3_S 110, IQ1_S 50, IQ1_M 56: groups of 8 weights
//            (IQ3: two 4-weight grid entries) as a lattice grid entry (the chunk's GRID_TAIL) times a scale,
//            with sign bits (IQ2, IQ3) or a +-1/8 shift (IQ1); each layout at its iq_head below
//   TQ2_0 66: qs[64] (2-bit q), d; TQ1_0 54: qs[48], qh[4] (base-3 digits), d      x = d*(q-1)
//            (both stored planar: at their section below)

#ifndef W_BINDING
#define W_BINDING 0
#endif

// Weights are read through WU4 / WU32 / WU16 / WU8 / WF16 / WF32 / WIQ2 (an index in words of that
// size). W_TEXELS (the kernels for software devices, matmul_cpu.comp, matvec_cpu.comp): binding W_BINDING
// is a uniform texel buffer of 16-byte texels (vk/kernel.py "t") and every read a texel fetch. Why:
// llvmpipe runs a storage-buffer load with per-lane addresses inside a loop as a loop over the lanes
// (a bounds check and a branch per lane and component, ~700 cycles for 8 lanes), a texel fetch as a
// gather (10x the bytes a second in a loop of 16-byte reads); narrower words take their texel's part.
#if defined(W_TEXELS)
layout(binding = W_BINDING) uniform usamplerBuffer w_texels;
uvec4 WU4(uint i) { return texelFetch(w_texels, int(i)); }
uint WU32(uint i) { return texelFetch(w_texels, int(i >> 2))[i & 3u]; }
uint WU16(uint i) { return (WU32(i >> 1) >> (16u * (i & 1u))) & 0xFFFFu; }
uint WU8(uint i) { return (WU32(i >> 2) >> (8u * (i & 3u))) & 0xFFu; }
float WF16(uint i) { return unpackHalf2x16(WU16(i)).x; }
float WF32(uint i) { return uintBitsToFloat(WU32(i)); }
uvec2 WIQ2(uint i) { uvec4 t = texelFetch(w_texels, int(i >> 1)); return (i & 1u) != 0u ? t.zw : t.xy; }
#else
layout(std430, binding = W_BINDING) readonly buffer WeightU8 { uint8_t wu8[]; };
layout(std430, binding = W_BINDING) readonly buffer WeightU16 { uint16_t wu16[]; };
layout(std430, binding = W_BINDING) readonly buffer WeightU32 { uint wu32[]; };
layout(std430, binding = W_BINDING) readonly buffer WeightF16 { float16_t wf16[]; };
layout(std430, binding = W_BINDING) readonly buffer WeightF32 { float wf32[]; };
layout(std430, binding = W_BINDING) readonly buffer WeightU4 { uvec4 wu4[]; };
#define WU4(i) wu4[i]
#define WU32(i) wu32[i]
#define WU16(i) wu16[i]
#define WU8(i) wu8[i]
#define WF16(i) wf16[i]
#define WF32(i) wf32[i]
#define WIQ2(i) wiq2[i]   // declared at IQ4_XS, its one user
#endif

// Planar types (Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, IQ4_NL, MXFP4) are repacked at upload
// (llamavk/kernels/__init__.py PLANAR) into two planes per chunk: all blocks' quants (16-byte aligned,
// read as uvec4), then all blocks' heads, the bytes before the quants in a GGUF block (f16 d; Q4_1 d,
// m; Q5_0 d, qh; Q5_1 d, m, qh; MXFP4: one exponent byte); Q6_K into three (PLANES: ql + qh, scales,
// d; at Q6_K below). Each kernel sets q_chunk_blocks (blocks in its chunk) first thing in main().
// QPLANAR marks the types that the matrix-vector kernels read with code of their own (Q4_0, Q8_0);
// the other planar types go through dequant_part like every other type.
uint q_chunk_blocks = 0;

// Integer -> float without int-to-float conversion instructions (a quarter-rate unit on NVIDIA that
// bounds the whole kernel otherwise): with 0x4B000000 (2^23) as exponent bits, a float's mantissa is
// the integer itself, so OR + one subtraction gives it. Q4_0: q - 8; Q8_0: signed byte (b ^ 0x80) - 128.
const uint MAGIC = 0x4B000000u;
vec4 nibbles_lo(uint q) {   // low nibbles of bytes 0..3, minus 8
    return vec4(uintBitsToFloat(MAGIC | (q & 0xFu)), uintBitsToFloat(MAGIC | ((q >> 8) & 0xFu)),
                uintBitsToFloat(MAGIC | ((q >> 16) & 0xFu)), uintBitsToFloat(MAGIC | ((q >> 24) & 0xFu))) - 8388616.0;
}
vec4 nibbles_hi(uint q) {   // high nibbles of bytes 0..3, minus 8
    return vec4(uintBitsToFloat(MAGIC | ((q >> 4) & 0xFu)), uintBitsToFloat(MAGIC | ((q >> 12) & 0xFu)),
                uintBitsToFloat(MAGIC | ((q >> 20) & 0xFu)), uintBitsToFloat(MAGIC | (q >> 28))) - 8388616.0;
}
vec4 sbytes_fast(uint q) {  // bytes 0..3 as signed int8
    q ^= 0x80808080u;
    return vec4(uintBitsToFloat(MAGIC | (q & 0xFFu)), uintBitsToFloat(MAGIC | ((q >> 8) & 0xFFu)),
                uintBitsToFloat(MAGIC | ((q >> 16) & 0xFFu)), uintBitsToFloat(MAGIC | (q >> 24))) - 8388736.0;
}

vec4 ubytes_fast(uint q) {  // bytes 0..3 as unsigned values
    return vec4(uintBitsToFloat(MAGIC | (q & 0xFFu)), uintBitsToFloat(MAGIC | ((q >> 8) & 0xFFu)),
                uintBitsToFloat(MAGIC | ((q >> 16) & 0xFFu)), uintBitsToFloat(MAGIC | (q >> 24))) - 8388608.0;
}

// Two small unsigned fields at bits 0 and 16 of `bits` (each < 1024) as an f16 pair minus off: with
// f16 1024's exponent bits OR-ed in, each half reads 1024 + field exactly (dequant_run_f16)
f16vec2 f16_pair(uint bits, float off) { return unpackFloat2x16(bits | 0x64006400u) - f16vec2(off); }

// Positional magic (matvec_wide.comp DQ 1, matvec_stream.comp): the field of w selected by mask m (at
// bit p, p + width <= 23) minus off: (w & m) | 2^23 as float is 2^23 + q * 2^p, one fma gives q - off.
float fld(uint w, uint m, float inv_scale, float off) {
    return fma(uintBitsToFloat((w & m) | MAGIC), inv_scale, -off);
}
// Nibbles of bytes 0..3 of w minus off: lo = low nibbles, hi = high nibbles (DQ 1).
void nib_fma(uint w, float off, out vec4 lo, out vec4 hi) {
    uint h = w >> 12;   // bits 20..31 -> 8..19
    lo = vec4(fld(w, 0xFu, 1.0, 8388608.0 + off), fld(w, 0xF00u, 1.0 / 256.0, 32768.0 + off),
              fld(w, 0xF0000u, 1.0 / 65536.0, 128.0 + off), fld(h, 0xF000u, 1.0 / 4096.0, 2048.0 + off));
    hi = vec4(fld(w, 0xF0u, 1.0 / 16.0, 524288.0 + off), fld(w, 0xF000u, 1.0 / 4096.0, 2048.0 + off),
              fld(h, 0xF00u, 1.0 / 256.0, 32768.0 + off), fld(h, 0xF0000u, 1.0 / 65536.0, 128.0 + off));
}
// Signed bytes 0..3 of w (DQ 1): (b ^ 0x80) - 128, the xor folded into the and|or.
vec4 sbytes_fma(uint w) {
    uint h = w >> 16;
    return vec4(uintBitsToFloat((w & 0xFFu) ^ (MAGIC | 0x80u)) - 8388736.0,
                fma(uintBitsToFloat((w & 0xFF00u) ^ (MAGIC | 0x8000u)), 1.0 / 256.0, -32896.0),
                uintBitsToFloat((h & 0xFFu) ^ (MAGIC | 0x80u)) - 8388736.0,
                fma(uintBitsToFloat((h & 0xFF00u) ^ (MAGIC | 0x8000u)), 1.0 / 256.0, -32896.0));
}

// Q4_K super-block head hd (its first uvec4: d, dmin, the 12 scale bytes) -> the scales (dl) and mins
// (ml) of sub-blocks 2q and 2q + 1, quarter q of the block (6-bit fields decoded from registers).
void q4k_quarter_scales(uvec4 hd, uint q, out vec2 dl, out vec2 ml) {
    vec2 dm = unpackHalf2x16(hd.x);
    uint sh = 16 * (q & 1u);   // byte 2q mod 4 of the scale words
    uint a = hd.y >> sh, bz = hd.z >> sh, cw = hd.w >> sh;
    uint sc16 = q < 2 ? a & 0x3F3Fu : (cw & 0x0F0Fu) | ((a >> 2) & 0x3030u);
    uint mn16 = q < 2 ? bz & 0x3F3Fu : ((cw >> 4) & 0x0F0Fu) | ((bz >> 2) & 0x3030u);
    dl = dm.x * vec2(sc16 & 0xFFu, sc16 >> 8);
    ml = dm.y * vec2(mn16 & 0xFFu, mn16 >> 8);
}

float half_bits(uint h) { return unpackHalf2x16(h).x; }
// Two 16-bit words (little endian) as one 32-bit word.
uint u32_at16(uint i) { return uint(WU16(i)) | (uint(WU16(i + 1)) << 16); }
// The four bytes of a word as floats (byte 0 first).
vec4 bytes4(uint q) { return vec4(unpack8(q)); }
vec4 sbytes4(uint q) { return vec4(unpack8(int(q))); }
// Bits 0..3 of h spread to bit 0 of bytes 0..3.
uint spread4(uint h) { return ((h & 0xFu) * 0x00204081u) & 0x01010101u; }

#if defined(QTYPE_F32) || defined(QTYPE_F16) || defined(QTYPE_BF16)
#define QFLOAT 1
#define QK 1

float wfloat(uint i) {
#if defined(QTYPE_F32)
    return WF32(i);
#elif defined(QTYPE_F16)
    return float(WF16(i));
#else
    return uintBitsToFloat(uint(WU16(i)) << 16);
#endif
}

void dequant_unit(uint row, uint u, uint cols, out vec4 w[8]) {
    uint c0 = 32 * u;
    uint base = row * cols + c0;
    if (c0 + 32 <= cols) {
        [[unroll]] for (uint i = 0; i < 8; ++i)
            w[i] = vec4(wfloat(base + 4 * i), wfloat(base + 4 * i + 1), wfloat(base + 4 * i + 2), wfloat(base + 4 * i + 3));
    } else {
        [[unroll]] for (uint i = 0; i < 8; ++i) {
            [[unroll]] for (uint j = 0; j < 4; ++j) {
                uint c = 4 * i + j;
                w[i][j] = c0 + c < cols ? wfloat(base + c) : 0.0;
            }
        }
    }
}

#elif defined(QTYPE_Q8_0)
#define QK 32
#define QPLANAR 1
// planar: qs plane 32 bytes per block, then the d plane (f16), which starts at f16 index QD_PLANE * blocks
#define QD_PLANE 16
float block_scale(uint b) { return float(WF16(QD_PLANE * q_chunk_blocks + b)); }
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint b = row * (cols / QK) + u;
    float d = block_scale(b);
    a = d * sbytes_fast(WU32(8 * b + i));
    c = d * sbytes_fast(WU32(8 * b + 4 + i));
}
// dequant_run (matmul_coop.comp): weights 16h .. 16h + 15 of unit u of a row as 4 vec4s, from one
// aligned 16-byte load of the quants and the scale (dequant_part takes 8 weights from two words)
#define HAS_DEQUANT_RUN 1
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uint b = row * (cols / QK) + u;
    float d = block_scale(b);
    uvec4 q = WU4(2 * b + h);
    [[unroll]] for (uint k = 0; k < 4; ++k) w[k] = d * sbytes_fast(q[k]);
}
// dequant_run_f16 (matmul_coop.comp): the same run as packed f16 pairs in the order (0, 2), (1, 3) of
// each 4 weights (the kernel multiplies x's 4 columns in that order too): a byte pair is one and-or
// with f16 1024's exponent bits (1024 + byte exactly), so two weights take 3 packed f16 operations
// and no conversion instructions. Exact: q is exact in f16 and d q is rounded once, as the f32 path
// rounds its exact product to f16.
#define HAS_RUN_F16 1
void dequant_run_f16(uint row, uint u, uint h, uint cols, out uvec2 w[4]) {
    uint b = row * (cols / QK) + u;
    f16vec2 d = f16vec2(WF16(QD_PLANE * q_chunk_blocks + b));
    uvec4 q = WU4(2 * b + h) ^ uvec4(0x80808080u);   // signed byte s as s + 128
    [[unroll]] for (uint k = 0; k < 4; ++k) {
        f16vec2 a = f16_pair(q[k] & 0x00FF00FFu, 1152.0);
        f16vec2 c = f16_pair((q[k] >> 8) & 0x00FF00FFu, 1152.0);
        w[k] = uvec2(packFloat2x16(a * d), packFloat2x16(c * d));
    }
}

#elif defined(QTYPE_Q4_0)
#define QK 32
#define QPLANAR 1
// planar: qs plane 16 bytes per block (one uvec4), then the d plane (f16), at f16 index QD_PLANE * blocks
#define QD_PLANE 8
float block_scale(uint b) { return float(WF16(QD_PLANE * q_chunk_blocks + b)); }
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint b = row * (cols / QK) + u;
    float d = block_scale(b);
    uint q = WU32(4 * b + i);
    a = d * nibbles_lo(q);
    c = d * nibbles_hi(q);
}
#define HAS_DEQUANT_RUN 1   // weights 16h .. 16h + 15: nibble h of the block's 16 bytes
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uint b = row * (cols / QK) + u;
    float d = block_scale(b);
    uvec4 q = WU4(b);
    [[unroll]] for (uint k = 0; k < 4; ++k) w[k] = d * nibbles_lo(q[k] >> (4u * h));
}
#define HAS_RUN_F16 1   // as Q8_0's: nibble h of bytes (0, 2) and (1, 3) of each word
void dequant_run_f16(uint row, uint u, uint h, uint cols, out uvec2 w[4]) {
    uint b = row * (cols / QK) + u;
    f16vec2 d = f16vec2(WF16(QD_PLANE * q_chunk_blocks + b));
    uvec4 q = WU4(b) >> (4u * h);
    [[unroll]] for (uint k = 0; k < 4; ++k) {
        f16vec2 a = f16_pair(q[k] & 0x000F000Fu, 1032.0);
        f16vec2 c = f16_pair((q[k] >> 8) & 0x000F000Fu, 1032.0);
        w[k] = uvec2(packFloat2x16(a * d), packFloat2x16(c * d));
    }
}

#elif defined(QTYPE_Q4_1)
#define QK 32
// planar: qs plane 16 bytes per block (one uvec4), then the head plane (d, m: one word per block, at
// word index 4 * blocks)
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint b = row * (cols / QK) + u;
    vec2 dm = unpackHalf2x16(WU32(4 * q_chunk_blocks + b));
    uint q = WU32(4 * b + i);
    a = dm.x * bytes4(q & 0x0F0F0F0Fu) + dm.y;
    c = dm.x * bytes4((q >> 4) & 0x0F0F0F0Fu) + dm.y;
}
#define HAS_DEQUANT_RUN 1
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uint b = row * (cols / QK) + u;
    vec2 dm = unpackHalf2x16(WU32(4 * q_chunk_blocks + b));
    uvec4 q = WU4(b);
    [[unroll]] for (uint k = 0; k < 4; ++k) w[k] = dm.x * ubytes_fast((q[k] >> (4u * h)) & 0x0F0F0F0Fu) + dm.y;
}

#elif defined(QTYPE_Q5_0)
#define QK 32
// planar: qs plane 16 bytes per block, then the head plane, 6 bytes per block (d, qh: 16-bit words
// 3b .. 3b + 2 of the plane, which starts at 16-bit index 8 * blocks; a 6-byte head starts at every
// even byte offset, so 16-bit loads)
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint b = row * (cols / QK) + u;
    uint h = 8 * q_chunk_blocks + 3 * b;
    float d = half_bits(WU16(h));
    uint qh = u32_at16(h + 1);
    uint q = WU32(4 * b + i);
    uint lo = (q & 0x0F0F0F0Fu) | (spread4(qh >> (4 * i)) << 4);
    uint hi = ((q >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * i)) << 4);
    a = d * (bytes4(lo) - 16.0);
    c = d * (bytes4(hi) - 16.0);
}
#define HAS_DEQUANT_RUN 1   // element 16h + 4k + j: nibble h of byte 4k + j, bit 4 = qh bit 16h + 4k + j
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uint b = row * (cols / QK) + u;
    uint hd = 8 * q_chunk_blocks + 3 * b;
    float d = half_bits(WU16(hd));
    uint qh = u32_at16(hd + 1) >> (16u * h);
    uvec4 q = WU4(b);
    [[unroll]] for (uint k = 0; k < 4; ++k)
        w[k] = d * (ubytes_fast(((q[k] >> (4u * h)) & 0x0F0F0F0Fu) | (spread4(qh >> (4 * k)) << 4)) - 16.0);
}

#elif defined(QTYPE_Q5_1)
#define QK 32
// planar: qs plane 16 bytes per block, then the head plane (d, m; qh: two words per block, at word
// index 4 * blocks)
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint b = row * (cols / QK) + u;
    uint h = 4 * q_chunk_blocks + 2 * b;
    vec2 dm = unpackHalf2x16(WU32(h));
    uint qh = WU32(h + 1);
    uint q = WU32(4 * b + i);
    uint lo = (q & 0x0F0F0F0Fu) | (spread4(qh >> (4 * i)) << 4);
    uint hi = ((q >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * i)) << 4);
    a = dm.x * bytes4(lo) + dm.y;
    c = dm.x * bytes4(hi) + dm.y;
}
#define HAS_DEQUANT_RUN 1
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uint b = row * (cols / QK) + u;
    uint hd = 4 * q_chunk_blocks + 2 * b;
    vec2 dm = unpackHalf2x16(WU32(hd));
    uint qh = WU32(hd + 1) >> (16u * h);
    uvec4 q = WU4(b);
    [[unroll]] for (uint k = 0; k < 4; ++k)
        w[k] = dm.x * ubytes_fast(((q[k] >> (4u * h)) & 0x0F0F0F0Fu) | (spread4(qh >> (4 * k)) << 4)) + dm.y;
}

#elif defined(QTYPE_Q2_K)
#define QK 256
// planar (llamavk/kernels/__init__.py PLANES): qs at word 16 b, the 16 scale bytes at word 16 n + 4 b,
// d and dmin at word 20 n + b
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint ib = row * (cols / QK) + u / 8, s = u % 8, n = q_chunk_blocks;
    vec2 dm = unpackHalf2x16(WU32(20 * n + ib));
    uint sc = WU32(16 * n + 4 * ib + s / 2) >> (16 * (s % 2));   // scale bytes 2s, 2s+1
    vec2 dl = dm.x * vec2(sc & 0xFu, (sc >> 8) & 0xFu);
    vec2 ml = dm.y * vec2((sc >> 4) & 0xFu, (sc >> 12) & 0xFu);
    uint qb = 16 * ib + (s / 4) * 8;
    uint shift = 2 * (s % 4);
    a = dl.x * bytes4((WU32(qb + i) >> shift) & 0x03030303u) - ml.x;
    c = dl.y * bytes4((WU32(qb + i + 4) >> shift) & 0x03030303u) - ml.y;
}

#elif defined(QTYPE_Q3_K)
#define QK 256
int q3k_scale(uint b8, uint i) {
    uint lo = (uint(WU8(b8 + 96 + i % 8)) >> (4 * (i / 8))) & 0xFu;
    uint hi = (uint(WU8(b8 + 104 + i % 4)) >> (2 * (i / 4))) & 0x3u;
    return int(lo | (hi << 4)) - 32;
}
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint ib = row * (cols / QK) + u / 8, s = u % 8;
    uint b = ib * 55;  // 110 bytes = 55 words of 16 bits
    float d = half_bits(WU16(b + 54));
    vec2 dl = d * vec2(q3k_scale(2 * b, 2 * s), q3k_scale(2 * b, 2 * s + 1));
    uint qb = b + 16 + (s / 4) * 16;
    uint shift = 2 * (s % 4);
    [[unroll]] for (uint k = 0; k < 2; ++k) {
        uint low = (u32_at16(qb + 2 * (i + 4 * k)) >> shift) & 0x03030303u;
        uint hb = (u32_at16(b + 2 * (i + 4 * k)) >> s) & 0x01010101u;
        vec4 q = bytes4(low | (hb << 2)) - 4.0;
        if (k == 0) a = dl.x * q; else c = dl.y * q;
    }
}

#elif defined(QTYPE_Q4_K) || defined(QTYPE_Q5_K)
#define QK 256
// 6-bit scale and min of sub-block j (0..7) from the 12 packed bytes at byte offset b8 + 4.
vec2 k_scale_min(uint b8, uint j) {
    uint s8 = b8 + 4;
    uint sc, mn;
    if (j < 4) {
        sc = uint(WU8(s8 + j)) & 63u;
        mn = uint(WU8(s8 + j + 4)) & 63u;
    } else {
        uint md = uint(WU8(s8 + j + 4));
        sc = (md & 0xFu) | ((uint(WU8(s8 + j - 4)) >> 6) << 4);
        mn = (md >> 4) | ((uint(WU8(s8 + j)) >> 6) << 4);
    }
    return vec2(sc, mn);
}
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint ib = row * (cols / QK) + u / 8, s = u % 8;
#if defined(QTYPE_Q4_K)
    uint b = ib * 36;  // 144 bytes
    uint qb = b + 4 + (s / 2) * 8;
#else
    uint b = ib * 44;  // 176 bytes
    uint qb = b + 12 + (s / 2) * 8;
#endif
    vec2 dm = unpackHalf2x16(WU32(b));
    vec2 smn = k_scale_min(4 * b, s);
    float dl = dm.x * smn.x, ml = dm.y * smn.y;
    uint shift = 4 * (s % 2);
    [[unroll]] for (uint k = 0; k < 2; ++k) {
        uint j = i + 4 * k;
        uint q = (WU32(qb + j) >> shift) & 0x0F0F0F0Fu;
#if defined(QTYPE_Q5_K)
        q |= ((WU32(b + 4 + j) >> s) & 0x01010101u) << 4;
#endif
        if (k == 0) a = dl * bytes4(q) - ml; else c = dl * bytes4(q) - ml;
    }
}
// Weights 16h .. 16h + 15 of sub-block s = u % 8: the head (one uvec4: d, dmin, 12 scale bytes), the
// 16 qs bytes of the run (nibble s % 2) and, Q5_K, the 16 qh bytes beside them (bit s): 2 or 3 aligned
// 16-byte loads (dequant_part: 5-6 narrow ones per 8 weights, the packed scales decoded from bytes).
// (Loading the head once per super-block in matmul_coop.comp instead: no faster on an H100, for
// these f32 runs or the f16 ones below. In the 30B-A3B's Q4_K expert products at 512 tokens, 44 ms,
// a constant scale and min instead of the head's cut them to 22.5 ms and the head's (d, dmin)
// without the 6-bit fields to 37.5: the per-run scale work, not the head's load, is what Q4_K has
// beyond Q4_0.)
#define HAS_DEQUANT_RUN 1
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uint ib = row * (cols / QK) + u / 8, s = u % 8;
#if defined(QTYPE_Q4_K)
    uint b4 = 9 * ib;    // 144 bytes = 9 uvec4s: head, qs
    uvec4 q = WU4(b4 + 1 + 2 * (s / 2) + h);
#else
    uint b4 = 11 * ib;   // 176 bytes = 11 uvec4s: head, qh (2), qs
    uvec4 q = WU4(b4 + 3 + 2 * (s / 2) + h);
    uvec4 qh = WU4(b4 + 1 + h);
#endif
    vec2 dl, ml;
    q4k_quarter_scales(WU4(b4), s / 2, dl, ml);
    float d = (s & 1u) != 0u ? dl.y : dl.x, m = (s & 1u) != 0u ? ml.y : ml.x;
    [[unroll]] for (uint k = 0; k < 4; ++k) {
        uint v = (q[k] >> (4u * (s & 1u))) & 0x0F0F0F0Fu;
#if defined(QTYPE_Q5_K)
        v |= ((qh[k] >> s) & 0x01010101u) << 4;
#endif
        w[k] = d * ubytes_fast(v) - m;
    }
}
// Sub-block s's (d sc, dmin mn) of head hd as f16: the 6-bit scale and min as an f16 pair (1024 + v,
// exact), times the head's (d, dmin), itself an f16 pair: one packed product, rounded once as the f32
// product (exact) is when it is rounded to f16, and no conversion instructions.
f16vec2 q4k_sub_scale16(uvec4 hd, uint s) {
    const uint j = 8u * (s & 3u);
    uint scmn;   // sc in the low half, mn in the high
    if (s < 4u) {
        scmn = ((hd.y >> j) & 63u) | (((hd.z >> j) & 63u) << 16);
    } else {
        const uint md = hd.w >> j;
        scmn = ((md & 15u) | (((hd.y >> (j + 6u)) & 3u) << 4)) | ((((md >> 4) & 15u) | (((hd.z >> (j + 6u)) & 3u) << 4)) << 16);
    }
    return unpackFloat2x16(hd.x) * f16_pair(scmn, 1024.0);
}
// The same run as packed f16 pairs (dequant_run_f16 at Q8_0): q exact, then one f16 fma with the
// sub-block's scale and min, themselves rounded to f16 (q4k_sub_scale16), where the f32 path rounds
// only the result: a weight may differ in its last bit (the kernel multiplies f16 weights either way).
// dequant_run_f16_sb: the same by super-block U and sub-block s (matmul_coop.comp SB_STEPS unrolls the
// 8 steps of a super-block, so s is a constant there: the head's fields and the quants' offset fold).
#define HAS_RUN_F16 1
#define HAS_RUN_F16_SB 1
void dequant_run_f16_sb(uint row, uint U, uint s, uint h, uint cols, out uvec2 w[4]) {
    uint ib = row * (cols / QK) + U;
#if defined(QTYPE_Q4_K)
    uint b4 = 9 * ib;
    uvec4 q = WU4(b4 + 1 + 2 * (s / 2) + h);
#else
    uint b4 = 11 * ib;
    uvec4 q = WU4(b4 + 3 + 2 * (s / 2) + h);
    uvec4 qh = WU4(b4 + 1 + h);
#endif
    const f16vec2 dm = q4k_sub_scale16(WU4(b4), s);
    f16vec2 d = f16vec2(dm.x), m = f16vec2(-dm.y);
    q >>= 4u * (s & 1u);
    [[unroll]] for (uint k = 0; k < 4; ++k) {
#if defined(QTYPE_Q5_K)
        const uint v = (q[k] & 0x0F0F0F0Fu) | (((qh[k] >> s) & 0x01010101u) << 4), pm = 0x001F001Fu;
#else
        const uint v = q[k], pm = 0x000F000Fu;   // the pairs' mask drops the other nibbles
#endif
        f16vec2 a = f16_pair(v & pm, 1024.0);
        f16vec2 c = f16_pair((v >> 8) & pm, 1024.0);
        w[k] = uvec2(packFloat2x16(fma(a, d, m)), packFloat2x16(fma(c, d, m)));
    }
}
void dequant_run_f16(uint row, uint u, uint h, uint cols, out uvec2 w[4]) {
    dequant_run_f16_sb(row, u / 8, u % 8, h, cols, w);
}

#elif defined(QTYPE_Q6_K)
#define QK 256
// planar in three planes (llamavk/kernels/__init__.py PLANES): ql + qh 192 bytes per block (48 words),
// then the int8 scales 16 bytes per block (from byte 192 * blocks), then d (f16, from f16 index 104 * blocks)
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint ib = row * (cols / QK) + u / 8, s = u % 8;
    uint b = ib * 48;  // 192 bytes = 48 words
    uint h = s / 4, j = s % 4;
    float d = half_bits(WU16(104 * q_chunk_blocks + ib));
    uint b8 = 192 * q_chunk_blocks + 16 * ib + 2 * s;  // int8 scales of groups 2s, 2s+1
    vec2 dl = d * vec2(int(int8_t(WU8(b8))), int(int8_t(WU8(b8 + 1))));
    uint lb = b + 16 * h + 8 * (j % 2);
    uint hb = b + 32 + 8 * h;
    uint lshift = 4 * (j / 2), hshift = 2 * j;
    [[unroll]] for (uint k = 0; k < 2; ++k) {
        uint j = i + 4 * k;
        uint q = ((WU32(lb + j) >> lshift) & 0x0F0F0F0Fu) | (((WU32(hb + j) >> hshift) & 0x03030303u) << 4);
        if (k == 0) a = dl.x * (bytes4(q) - 32.0); else c = dl.y * (bytes4(q) - 32.0);
    }
}
// Weights 16h .. 16h + 15 of sub-block s = 4H + j (elements 128H + 32j + l): 16 ql bytes (nibble j / 2),
// 16 qh bytes (bits 2j), one int8 scale (group 2s + h) and d: 2 aligned 16-byte loads and 2 small ones
#define HAS_DEQUANT_RUN 1
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uint ib = row * (cols / QK) + u / 8, s = u % 8, H = s / 4, j = s % 4;
    uvec4 ql = WU4(12 * ib + 4 * H + 2 * (j % 2) + h);
    uvec4 qh = WU4(12 * ib + 8 + 2 * H + h);
    float d = half_bits(WU16(104 * q_chunk_blocks + ib))
            * float(int(int8_t(WU8(192 * q_chunk_blocks + 16 * ib + 2 * s + h))));
    [[unroll]] for (uint k = 0; k < 4; ++k) {
        uint v = ((ql[k] >> (4u * (j / 2))) & 0x0F0F0F0Fu) | (((qh[k] >> (2u * j)) & 0x03030303u) << 4);
        w[k] = d * (ubytes_fast(v) - 32.0);
    }
}
#define HAS_RUN_F16 1   // as Q4_K's: q - 32 exact, the scale d * scale rounded to f16
#define HAS_RUN_F16_SB 1
void dequant_run_f16_sb(uint row, uint U, uint s, uint h, uint cols, out uvec2 w[4]) {
    uint ib = row * (cols / QK) + U, H = s / 4, j = s % 4;
    uvec4 ql = WU4(12 * ib + 4 * H + 2 * (j % 2) + h);
    uvec4 qh = WU4(12 * ib + 8 + 2 * H + h);
    f16vec2 d = f16vec2(half_bits(WU16(104 * q_chunk_blocks + ib))
                        * float(int(int8_t(WU8(192 * q_chunk_blocks + 16 * ib + 2 * s + h)))));
    [[unroll]] for (uint k = 0; k < 4; ++k) {
        uint v = ((ql[k] >> (4u * (j / 2))) & 0x0F0F0F0Fu) | (((qh[k] >> (2u * j)) & 0x03030303u) << 4);
        f16vec2 a = f16_pair(v & 0x00FF00FFu, 1056.0);
        f16vec2 c = f16_pair((v >> 8) & 0x00FF00FFu, 1056.0);
        w[k] = uvec2(packFloat2x16(a * d), packFloat2x16(c * d));
    }
}
void dequant_run_f16(uint row, uint u, uint h, uint cols, out uvec2 w[4]) {
    dequant_run_f16_sb(row, u / 8, u % 8, h, cols, w);
}

#elif defined(QTYPE_IQ4_NL) || defined(QTYPE_IQ4_XS) || defined(QTYPE_MXFP4)
// 4-bit indices into a table of 16 signed 8-bit values, packed 4 per word (entry n in byte n % 4 of
// word n / 4): the lookup stays in registers (a dynamically indexed constant array would go through
// local memory), at the cost of a few integer operations per weight.
int kv_lookup(uvec4 table, uint n) { return bitfieldExtract(int(table[n >> 2]), int(8u * (n & 3u)), 8); }
// Four indices, one in each byte of q (each < 16), as their table values.
vec4 kv_lookup4(uvec4 table, uint q) {
    return vec4(kv_lookup(table, q & 0xFFu), kv_lookup(table, (q >> 8) & 0xFFu),
                kv_lookup(table, (q >> 16) & 0xFFu), kv_lookup(table, q >> 24));
}
// IQ4_NL's (and IQ4_XS's) non-linear levels -127 -104 -83 -65 -49 -35 -22 -10 1 13 25 38 53 69 89 113
const uvec4 KV_IQ4NL = uvec4(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);
// MXFP4: the E2M1 values doubled, 0 1 2 3 4 6 8 12 and their negatives (index 8, -0, is 0)
const uvec4 KV_MXFP4 = uvec4(0x03020100u, 0x0C080604u, 0xFDFEFF00u, 0xF4F8FAFCu);

#if defined(WANT_RUN_TABLE) && (defined(QTYPE_IQ4_NL) || defined(QTYPE_IQ4_XS))
// dequant_run_f16 of the table types (matmul_coop.comp defines WANT_RUN_TABLE): a table in shared
// memory from a byte of two indices (lo | hi << 4) to the f16 pair (KV[lo], KV[hi]), so two weights of
// a run -- columns (0, 2) or (1, 3) of 4, at bits 0 and 16 or 8 and 24 of a quant word -- cost one
// shared load and one packed multiply instead of a table select and a conversion each.
// run_table_fill: every thread of the workgroup, then a barrier before the first run.
#define RUN_TABLE 1
shared uint run_table[256];
void run_table_fill(uint tid, uint nthreads) {
    for (uint i = tid; i < 256u; i += nthreads)
        run_table[i] = packFloat2x16(f16vec2(float(kv_lookup(KV_IQ4NL, i & 15u)), float(kv_lookup(KV_IQ4NL, i >> 4))));
}
// the runs' pairs from quant word w (its wanted nibbles at bits 8j .. 8j + 3), times d
uvec2 run_pairs(uint w, f16vec2 d) {
    return uvec2(packFloat2x16(unpackFloat2x16(run_table[(w & 0xFu) | ((w >> 12) & 0xF0u)]) * d),
                 packFloat2x16(unpackFloat2x16(run_table[((w >> 8) & 0xFu) | ((w >> 20) & 0xF0u)]) * d));
}
#endif

#if defined(QTYPE_IQ4_NL) || defined(QTYPE_MXFP4)
#define QK 32
// planar: qs plane 16 bytes per block (one uvec4), then the scale plane: IQ4_NL f16 (at f16 index
// 8 * blocks), MXFP4 one E8M0 byte (at byte index 16 * blocks)
#if defined(QTYPE_IQ4_NL)
#define Q_TABLE KV_IQ4NL
float q_block_scale(uint b) { return float(WF16(8 * q_chunk_blocks + b)); }
#else
#define Q_TABLE KV_MXFP4
// 2^(e-128) as gguf's e8m0_to_fp32_half builds it: a normal float for e >= 2, a denormal below
float q_block_scale(uint b) {
    uint e = uint(WU8(16 * q_chunk_blocks + b));
    return uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}
#endif
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint b = row * (cols / QK) + u;
    float d = q_block_scale(b);
    uint q = WU32(4 * b + i);
    a = d * kv_lookup4(Q_TABLE, q & 0x0F0F0F0Fu);
    c = d * kv_lookup4(Q_TABLE, (q >> 4) & 0x0F0F0F0Fu);
}
#define HAS_DEQUANT_RUN 1
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uint b = row * (cols / QK) + u;
    float d = q_block_scale(b);
    uvec4 q = WU4(b);
    [[unroll]] for (uint k = 0; k < 4; ++k) w[k] = d * kv_lookup4(Q_TABLE, (q[k] >> (4u * h)) & 0x0F0F0F0Fu);
}
#if defined(QTYPE_MXFP4)
// The same run as packed f16 pairs (matmul_coop.comp's order (0, 2), (1, 3)), without a table: an E2M1
// nibble s e1 e0 m read as the f16 bits s << 15 | (e1 e0 m) << 9 is its value times 2^-14 -- e > 0
// gives exponent e - 15 and mantissa m / 2, e = 0 the subnormal m 2^-15 -- so one packed multiply by
// 2^14 (exact) and one by the block's 2^(e8 - 127) (f16; the f32 path's product rounds to the same
// f16 wherever the weight is a normal f16). Two nibbles of one word per pair: bits 0 and 16, 8 and 24.
#define HAS_RUN_F16 1
uint e2m1_f16_pair(uint n) { return ((n & 0x00070007u) << 9) | ((n & 0x00080008u) << 12); }
void dequant_run_f16(uint row, uint u, uint h, uint cols, out uvec2 w[4]) {
    uint b = row * (cols / QK) + u;
    const f16vec2 d = f16vec2(2.0 * q_block_scale(b)), e2m1 = f16vec2(16384.0);   // 2^(e8 - 127), 2^14
    uvec4 q = (WU4(b) >> (4u * h)) & 0x0F0F0F0Fu;
    [[unroll]] for (uint k = 0; k < 4; ++k)
        w[k] = uvec2(packFloat2x16(unpackFloat2x16(e2m1_f16_pair(q[k])) * e2m1 * d),
                     packFloat2x16(unpackFloat2x16(e2m1_f16_pair(q[k] >> 8)) * e2m1 * d));
}
#elif defined(RUN_TABLE)
#define HAS_RUN_F16 1   // IQ4_NL (f16 d: d KV rounded once, as the f32 path)
void dequant_run_f16(uint row, uint u, uint h, uint cols, out uvec2 w[4]) {
    uint b = row * (cols / QK) + u;
    f16vec2 d = f16vec2(WF16(8 * q_chunk_blocks + b));
    uvec4 q = WU4(b) >> (4u * h);
    [[unroll]] for (uint k = 0; k < 4; ++k) w[k] = run_pairs(q[k], d);
}
#endif

#else   // IQ4_XS
#define QK 256
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    uint ib = row * (cols / QK) + u / 8, s = u % 8;
    uint b = ib * 34;  // 136 bytes = 34 words of 32 bits: d | scales_h << 16, scales_l[4], qs[128]
    uint w0 = WU32(b);
    uint ls = ((WU32(b + 1) >> (4 * s)) & 0xFu) | (((w0 >> (16 + 2 * s)) & 3u) << 4);
    float dl = half_bits(w0) * float(int(ls) - 32);
    uint q = WU32(b + 2 + 4 * s + i);
    a = dl * kv_lookup4(KV_IQ4NL, q & 0x0F0F0F0Fu);
    c = dl * kv_lookup4(KV_IQ4NL, (q >> 4) & 0x0F0F0F0Fu);
}
// Runs (dequant_run above): a 136-byte block is 8-byte aligned, so the head (d | scales_h << 16,
// scales_l) is one 8-byte load and sub-block s's 16 qs bytes (from byte 8 + 16 s) two more.
#if !defined(W_TEXELS)
layout(std430, binding = W_BINDING) readonly buffer WeightU2Iq { uvec2 wiq2[]; };
#endif
#define HAS_DEQUANT_RUN 1
float iq4xs_run_head(uint ib, uint s, out uvec2 q0, out uvec2 q1) {
    const uint b2 = 17 * ib;   // 136 bytes = 17 uvec2s
    const uvec2 hd = WIQ2(b2);
    q0 = WIQ2(b2 + 1 + 2 * s);
    q1 = WIQ2(b2 + 2 + 2 * s);
    const uint ls = ((hd.y >> (4 * s)) & 0xFu) | (((hd.x >> (16 + 2 * s)) & 3u) << 4);
    return half_bits(hd.x) * float(int(ls) - 32);
}
void dequant_run(uint row, uint u, uint h, uint cols, out vec4 w[4]) {
    uvec2 q0, q1;
    const float dl = iq4xs_run_head(row * (cols / QK) + u / 8, u % 8, q0, q1);
    const uint sh = 4u * h;
    w[0] = dl * kv_lookup4(KV_IQ4NL, (q0.x >> sh) & 0x0F0F0F0Fu);
    w[1] = dl * kv_lookup4(KV_IQ4NL, (q0.y >> sh) & 0x0F0F0F0Fu);
    w[2] = dl * kv_lookup4(KV_IQ4NL, (q1.x >> sh) & 0x0F0F0F0Fu);
    w[3] = dl * kv_lookup4(KV_IQ4NL, (q1.y >> sh) & 0x0F0F0F0Fu);
}
#if defined(RUN_TABLE)
#define HAS_RUN_F16 1   // the sub-block's scale d (ls - 32) rounded to f16 first
#define HAS_RUN_F16_SB 1   // by super-block U and sub-block s, as Q4_K's
void dequant_run_f16_sb(uint row, uint U, uint s, uint h, uint cols, out uvec2 w[4]) {
    uvec2 q0, q1;
    const f16vec2 d = f16vec2(iq4xs_run_head(row * (cols / QK) + U, s, q0, q1));
    const uint sh = 4u * h;
    w[0] = run_pairs(q0.x >> sh, d);
    w[1] = run_pairs(q0.y >> sh, d);
    w[2] = run_pairs(q1.x >> sh, d);
    w[3] = run_pairs(q1.y >> sh, d);
}
void dequant_run_f16(uint row, uint u, uint h, uint cols, out uvec2 w[4]) {
    dequant_run_f16_sb(row, u / 8, u % 8, h, cols, w);
}
#endif
#endif

#elif defined(QTYPE_IQ2_XXS) || defined(QTYPE_IQ2_XS) || defined(QTYPE_IQ2_S) || defined(QTYPE_IQ3_XXS) || \
      defined(QTYPE_IQ3_S) || defined(QTYPE_IQ1_S) || defined(QTYPE_IQ1_M)
// The lattice types (layouts in the header): a 256-weight super-block in groups of 8 weights, each
// group one entry of a grid with signs and a scale. Blocks are 2 mod 4 bytes long (IQ1_M's 56 aside),
// so fields are read as bytes and 16-bit words. iq_head(b, g) reads group g's scale, signs and grid
// indices from super-block b of the chunk; iq_half / iq_group make its weights from them.
// IQ2_XXS, IQ3_XXS, IQ2_XS, IQ2_S, IQ3_S and IQ1_S are stored planar (llamavk/kernels/__init__.py PLANES):
// per chunk, planes of every block's fields, d last, so that the one-token kernel reads a 64-weight
// unit's fields with aligned uvec4 / uvec2 loads (matvec_stream.comp IQ2_XXS); each iq_head below
// says where its fields are.
// The grid (up to 2048 entries of 8 signed bytes) follows the chunk's blocks in its buffer, from the
// first 4-byte boundary (llamavk/kernels/__init__.py GRID_TAIL_ALIGN): a constant array that large
// would be copied into every invocation's private memory wherever it is indexed by a variable
// (llvmpipe takes seconds per dispatch), and a buffer of its own would be one more binding in every
// kernel. Entry i of an 8-byte grid is words 2i, 2i + 1 (bytes 0..3, 4..7); of a 4-byte grid word i.
// IQ_GRID_SHARED (a kernel that copies the grid into shared memory first, iq_grid_stage): read there.
#define QK 256
#define IQ_LATTICE 1
uint wbyte(uint p) { return uint(WU8(p)); }
uint whalf(uint p) { return uint(WU16(p >> 1)); }            // p even
uint wword(uint p) { return u32_at16(p >> 1); }              // p even
// IQ2_XXS, IQ2_XS, IQ3_XXS keep 7 sign bits per group; the eighth makes the count of minus signs even
uint ksigns(uint k) { return k | ((bitCount(k) & 1u) << 7); }
// v, the 4 weights of half h of a group whose 8 sign bits are `bits` (bit j: weight j negative), with
// their signs: the bits xor-ed into the floats' sign bits. Here and in iq_weights no integer goes
// through the (quarter-rate) conversion unit: the grid's bytes take the MAGIC trick.
vec4 signed4(vec4 v, uint bits, uint h) {
    const uint b = bits >> (4u * h);
    return uintBitsToFloat(floatBitsToUint(v) ^ (uvec4(b, b >> 1, b >> 2, b >> 3) << 31));
}
// A group: its scale, sign bits (IQ2, IQ3) or shift (IQ1, delta), grid entry (IQ3: entries, one a half).
struct IqGroup { float d; uint signs; float delta; uint i0; uint i1; };
#if defined(QTYPE_IQ2_XXS)
#define IQ_BYTES 66     // d, then per 32 weights 4 grid indices and a word: 4 x 7 sign bits, a 4-bit scale
#define IQ_GRID_WORDS 512u
// planar: the 64 bytes after d at word 16 b, d at f16 index 32 n + b
IqGroup iq_head(uint b, uint g) {
    const uint s = g / 4u, l = g % 4u;
    const uint aux = WU32(16u * b + 2u * s + 1u);
    const float db = half_bits(uint(WU16(32u * q_chunk_blocks + b))) * (0.5 + float(aux >> 28)) * 0.25;
    return IqGroup(db, ksigns((aux >> (7u * l)) & 127u), 0.0, (WU32(16u * b + 2u * s) >> (8u * l)) & 0xFFu, 0u);
}
#elif defined(QTYPE_IQ2_XS)
#define IQ_BYTES 74     // d, 32 x (9-bit grid index | 7 sign bits << 9), 16 4-bit scales
#define IQ_GRID_WORDS 1024u
// planar: the 64 bytes of indices and signs at byte 64 b, the 8 scale bytes at 64 n + 8 b, d at f16 36 n + b
IqGroup iq_head(uint b, uint g) {
    const uint n = q_chunk_blocks, q = uint(WU16(32u * b + g));
    const uint sc = (wbyte(64u * n + 8u * b + g / 4u) >> (4u * ((g / 2u) % 2u))) & 15u;
    return IqGroup(half_bits(uint(WU16(36u * n + b))) * (0.5 + float(sc)) * 0.25, ksigns(q >> 9), 0.0, q & 511u, 0u);
}
#elif defined(QTYPE_IQ2_S)
#define IQ_BYTES 82     // d, qs[32] (grid index low bytes), signs[32], qh[8] (2 high bits each), scales[8]
#define IQ_GRID_WORDS 2048u
// planar: the 80 bytes after d at byte 80 b (qs, signs, qh, scales), d at f16 40 n + b
IqGroup iq_head(uint b, uint g) {
    const uint B = 80u * b;
    const uint idx = wbyte(B + g) | (((wbyte(B + 64u + g / 4u) >> (2u * (g % 4u))) & 3u) << 8);
    const uint sc = (wbyte(B + 72u + g / 4u) >> (4u * ((g / 2u) % 2u))) & 15u;
    return IqGroup(half_bits(uint(WU16(40u * q_chunk_blocks + b))) * (0.5 + float(sc)) * 0.25, wbyte(B + 32u + g),
                   0.0, idx, 0u);
}
#elif defined(QTYPE_IQ3_XXS)
#define IQ_BYTES 98     // d, qs[64] (a grid index per 4 weights), per 32 weights a word as IQ2_XXS's
#define IQ_GRID_WORDS 256u
// planar: the 96 bytes after d (qs, then the 8 words) at word 24 b, d at f16 index 48 n + b
IqGroup iq_head(uint b, uint g) {
    const uint s = g / 4u, l = g % 4u;
    const uint aux = WU32(24u * b + 16u + s);
    const float db = half_bits(uint(WU16(48u * q_chunk_blocks + b))) * (0.5 + float(aux >> 28)) * 0.5;
    const uint idx = uint(WU16(48u * b + g));                // the group's two indices, one per half
    return IqGroup(db, ksigns((aux >> (7u * l)) & 127u), 0.0, idx & 0xFFu, idx >> 8);
}
#elif defined(QTYPE_IQ3_S)
#define IQ_BYTES 110    // d, qs[64], qh[8] (the 9th index bits), signs[32], scales[4] (per 32 weights)
#define IQ_GRID_WORDS 512u
// planar: qs at byte 64 b, the other 44 bytes (qh, signs, scales) at 64 n + 44 b, d at f16 54 n + b
IqGroup iq_head(uint b, uint g) {
    const uint n = q_chunk_blocks, R = 64u * n + 44u * b;
    const uint idx = uint(WU16(32u * b + g));                // indices 2g, 2g + 1: their 9th bits in qh
    const uint hb = wbyte(R + g / 4u) >> (2u * (g % 4u));
    const uint s = g / 4u;
    const uint sc = (wbyte(R + 40u + s / 2u) >> (4u * (s % 2u))) & 15u;
    return IqGroup(half_bits(uint(WU16(54u * n + b))) * float(1u + 2u * sc), wbyte(R + 8u + g), 0.0,
                   (idx & 0xFFu) | ((hb & 1u) << 8), (idx >> 8) | ((hb & 2u) << 7));
}
#elif defined(QTYPE_IQ1_S)
#define IQ_BYTES 50     // d, qs[32], per 32 weights a 16-bit word: 4 x 3 index bits, a 3-bit scale, delta's sign
#define IQ_GRID_WORDS 4096u
// planar: the 48 bytes after d (qs, qh) at byte 48 b, d at f16 24 n + b
IqGroup iq_head(uint b, uint g) {
    const uint B = 48u * b;
    const uint qh = whalf(B + 32u + 2u * (g / 4u));
    const uint idx = wbyte(B + g) | (((qh >> (3u * (g % 4u))) & 7u) << 8);
    const float dl = half_bits(uint(WU16(24u * q_chunk_blocks + b))) * float(2u * ((qh >> 12) & 7u) + 1u);
    return IqGroup(dl, 0u, (qh & 0x8000u) != 0u ? -0.125 : 0.125, idx, 0u);
}
#else   // IQ1_M
#define IQ_BYTES 56     // qs[32], qh[16] (a nibble per group: 3 index bits, delta's sign), 16 3-bit scales
                        // in 4 16-bit words whose top nibbles hold the f16 d
#define IQ_GRID_WORDS 4096u
IqGroup iq_head(uint b, uint g) {
    const uint B = b * IQ_BYTES;
    const uint s0 = whalf(B + 48u), s1 = whalf(B + 50u), s2 = whalf(B + 52u), s3 = whalf(B + 54u);
    const uint d16 = (s0 >> 12) | ((s1 >> 8) & 0xF0u) | ((s2 >> 4) & 0xF00u) | (s3 & 0xF000u);
    const uint t = g / 2u;                                   // a scale per 16 weights
    const uint sc = (whalf(B + 48u + 2u * (t / 4u)) >> (3u * (t % 4u))) & 7u;
    const uint nib = (wbyte(B + 32u + g / 2u) >> (4u * (g % 2u))) & 15u;
    return IqGroup(half_bits(d16) * float(2u * sc + 1u), 0u, (nib & 8u) != 0u ? -0.125 : 0.125,
                   wbyte(B + g) | ((nib & 7u) << 8), 0u);
}
#endif
// the grid's first word in the chunk's buffer
uint iq_grid_base() { return (q_chunk_blocks * IQ_BYTES + 3u) >> 2; }
#if defined(IQ_GRID_SHARED)
shared uint iq_grid_sh[IQ_GRID_WORDS];
#define iq_grid(i) iq_grid_sh[i]
#else
#define iq_grid(i) WU32(iq_grid_base() + (i))
#endif
// weights 4h .. 4h + 3 of a group
vec4 iq_weights(IqGroup q, uint h) {
#if defined(QTYPE_IQ1_S) || defined(QTYPE_IQ1_M)
    return q.d * (sbytes_fast(iq_grid(2u * q.i0 + h)) + q.delta);
#elif defined(QTYPE_IQ3_XXS) || defined(QTYPE_IQ3_S)
    return q.d * signed4(ubytes_fast(iq_grid(h == 0u ? q.i0 : q.i1)), q.signs, h);
#else
    return q.d * signed4(ubytes_fast(iq_grid(2u * q.i0 + h)), q.signs, h);
#endif
}
vec4 iq_half(uint b, uint g, uint h) { return iq_weights(iq_head(b, g), h); }
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    const uint b = row * (cols / QK) + u / 8u, g = 4u * (u % 8u) + i / 2u;
    a = iq_half(b, g, i % 2u);          // elements 4i .. 4i + 3 of the unit
    c = iq_half(b, g + 2u, i % 2u);     // elements 16 + 4i ..
}
// Weights 8q .. 8q + 7 of chunk-local row `row` (q counts groups of 8 along the row), one group's
// fields read once: the matrix-vector kernel's unit for these types (matvec.comp IQ_LATTICE).
void dequant_group(uint row, uint q, uint cols, out vec4 a, out vec4 c) {
    const IqGroup h = iq_head(row * (cols / QK) + q / 32u, q % 32u);
    a = iq_weights(h, 0u);
    c = iq_weights(h, 1u);
}
#if defined(IQ_GRID_SHARED)
// Every invocation of the workgroup, then a barrier before the first iq_grid.
void iq_grid_stage(uint tid, uint nthreads) {
    const uint base = iq_grid_base();
    for (uint i = tid; i < IQ_GRID_WORDS; i += nthreads) iq_grid_sh[i] = WU32(base + i);
}
#endif

#elif defined(QTYPE_TQ2_0) || defined(QTYPE_TQ1_0)
// The ternary types (llama.cpp's TQ1_0 / TQ2_0: TriLM and BitNet b1.58 weights), x = d (q - 1) with
// q in 0..2 (TQ2_0's 2-bit fields allow 3: 2d, which llama.cpp decodes the same way). 256-weight
// blocks of 66 / 54 bytes, stored planar (llamavk/kernels/__init__.py PLANES): per chunk every
// block's qs (TQ1_0: then every qh word), then every d, so that the one-token kernel reads them as
// aligned uvec4s (matvec_stream.comp TQ2_0).
#define QK 256
#if defined(QTYPE_TQ2_0)
// qs[64], d: element 128c + 32k + l is bits 2k, 2k + 1 of qs[32c + l]. Planar: qs at 16-bit word 32 b,
// d at f16 32 n + b.
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    const uint blk = row * (cols / QK) + u / 8u, b = 32u * blk;
    const float d = half_bits(uint(WU16(32u * q_chunk_blocks + blk)));
    const uint q0 = b + 16u * ((u % 8u) / 4u) + 2u * i, sh = 2u * (u % 4u);
    a = d * (ubytes_fast((u32_at16(q0) >> sh) & 0x03030303u) - 1.0);
    c = d * (ubytes_fast((u32_at16(q0 + 8u) >> sh) & 0x03030303u) - 1.0);
}
#else
// qs[48], qh[4], d: base-3 digits, five per qs byte and four per qh byte, digit j of byte v being
// (((v * 3^j) mod 256) * 3) >> 8. Elements 32j + l (j < 5, l < 32): digit j of qs[l]; 160 + 16j + l
// (j < 5, l < 16): of qs[32 + l]; 240 + 4j + l (j < 4): of qh[l].
// digit j of each of the 4 bytes of w, one per byte: the even and the odd bytes each in two 16-bit
// lanes, where byte * 3^j (<= 255 * 81) and its low byte * 3 cannot carry into the next lane
uint trit_bytes(uint w, uint j) {
    const uint m = (j == 0u ? 1u : j == 1u ? 3u : j == 2u ? 9u : j == 3u ? 27u : 81u);
    const uint e = ((((w & 0x00FF00FFu) * m) & 0x00FF00FFu) * 3u >> 8) & 0x00030003u;
    const uint o = (((((w >> 8) & 0x00FF00FFu) * m) & 0x00FF00FFu) * 3u >> 8) & 0x00030003u;
    return e | (o << 8);
}
// the same minus 1, as floats: no branch on the unit (neighbouring lanes take different units) and no
// integer-to-float conversion (MAGIC)
vec4 trits4(uint w, uint j) { return ubytes_fast(trit_bytes(w, j)) - 1.0; }
// Planar: qs (48 bytes) at 16-bit word 24 b, qh (4) at 24 n + 2 b, d at f16 26 n + b.
void dequant_part(uint row, uint u, uint i, uint cols, out vec4 a, out vec4 c) {
    const uint blk = row * (cols / QK) + u / 8u, b = 24u * blk, s = u % 8u, n = q_chunk_blocks;
    const float d = half_bits(uint(WU16(26u * n + blk)));
    // s < 5: qs[0..31], digit s; 5, 6: qs[32..47], digits 2 (s - 5) and the next; 7: qs[32..47]
    // digit 4, then qh[0..3] digit i
    const bool lo = s < 5u;
    const uint wa = lo ? b + 2u * i : b + 16u + 2u * i;
    const uint wc = lo ? b + 8u + 2u * i : s == 7u ? 24u * n + 2u * blk : wa;
    const uint ja = lo ? s : s == 7u ? 4u : 2u * (s - 5u);
    const uint jc = lo ? s : s == 7u ? i : ja + 1u;
    a = d * trits4(u32_at16(wa), ja);
    c = d * trits4(u32_at16(wc), jc);
}
#endif

#else
#error "quants.glsl: define one QTYPE_*"
#endif

#if defined(HAS_DEQUANT_RUN)
// The 32 weights of unit u as its two runs (wide loads: get_rows, matmul, matmul_small, matvec_id)
void dequant_unit(uint row, uint u, uint cols, out vec4 w[8]) {
    vec4 a[4], c[4];
    dequant_run(row, u, 0u, cols, a);
    dequant_run(row, u, 1u, cols, c);
    [[unroll]] for (uint k = 0; k < 4; ++k) { w[k] = a[k]; w[k + 4] = c[k]; }
}
#elif !defined(QFLOAT)
void dequant_unit(uint row, uint u, uint cols, out vec4 w[8]) {
    [[unroll]] for (uint i = 0; i < 4; ++i) dequant_part(row, u, i, cols, w[i], w[i + 4]);
}
#endif
