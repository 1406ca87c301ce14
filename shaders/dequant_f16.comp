#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Rows of a weight chunk dequantized to f16 rows [rows][cols] (kernels/matmul.py mul_mm_cm2d: a
// prompt product then runs matmul_cm2.comp's F16 form on them, with no per-element decode function).
//
// Rows are contiguous blocks, so the rows to dequantize are blocks [blk0, blk0 + n) of the chunk and
// the output is their elements in order: the shader never needs rows or cols. One output unit is 8
// consecutive elements, one 16-byte store (a uvec4 of packed halves); thread t of a workgroup writes
// units base + t, base + 256 + t, ... (NPT of them), so every store instruction of a subgroup writes
// one contiguous run (the f16 writes are ~3/4 of the pass's traffic). Each unit reads its block's
// bytes with the widest aligned load its layout has: neighbouring lanes read neighbouring bytes of
// the same blocks (Q4_0: 4 lanes share one uvec4; K-quants: a subgroup of 32 lanes is one
// super-block, its header a broadcast load), so a subgroup's loads cover whole contiguous sectors.
//
// Q4_0, Q8_0, Q6_K (planar, quants.glsl) and Q4_K have code of their own (integers to floats by
// the magic-exponent trick: no conversion instructions); the other quantized types go through
// quants.glsl's dequant_part, two quarters per unit. Values are computed in f32 (as gguf.quants
// does) and rounded to f16 once.
layout(local_size_x = 256) in;
layout(constant_id = 0) const uint NPT = 4;   // units per thread

#include "quants.glsl"

layout(std430, binding = 0) readonly buffer WeightU2 { uvec2 wu2[]; };   // 8-byte aligned quants
layout(std430, binding = 1) restrict writeonly buffer Out { uvec4 out4[]; };
layout(push_constant) uniform Push {
    uint chunk_blocks;   // blocks of the whole chunk (the planar types' scale plane follows them)
    uint blk0;           // first block of the rows dequantized
    uint n_out;          // units (8 elements) to write
} p;

// Bytes 0..3 of q as floats (each < 2^23): the byte is the mantissa of 2^23 + byte.
vec4 bytes_magic(uint q, float off) {
    return vec4(uintBitsToFloat(MAGIC | (q & 0xFFu)), uintBitsToFloat(MAGIC | ((q >> 8) & 0xFFu)),
                uintBitsToFloat(MAGIC | ((q >> 16) & 0xFFu)), uintBitsToFloat(MAGIC | (q >> 24))) - (8388608.0 + off);
}

uvec4 pack8(vec4 a, vec4 b) {
    return uvec4(packHalf2x16(a.xy), packHalf2x16(a.zw), packHalf2x16(b.xy), packHalf2x16(b.zw));
}

#if defined(QTYPE_Q4_0)
// block b: 16 quant bytes (one uvec4); unit k (elements 8k..8k+7): low (k < 2) or high nibbles of
// bytes 8 (k % 2) .. + 7
uvec4 dequant8(uint o) {
    const uint b = p.blk0 + (o >> 2), k = o & 3u;
    const uvec4 q = wu4[b];
    const float d = float(wf16[QD_PLANE * p.chunk_blocks + b]);
    const uint sh = 4u * (k >> 1);
    const uint q0 = ((k & 1u) == 0u ? q.x : q.z) >> sh, q1 = ((k & 1u) == 0u ? q.y : q.w) >> sh;
    return pack8(d * bytes_magic(q0 & 0x0F0F0F0Fu, 8.0), d * bytes_magic(q1 & 0x0F0F0F0Fu, 8.0));
}
#elif defined(QTYPE_Q8_0)
// block b: 32 signed quant bytes; unit k: bytes 8k .. 8k + 7
uvec4 dequant8(uint o) {
    const uint b = p.blk0 + (o >> 2), k = o & 3u;
    const uvec2 q = wu2[4u * b + k];
    const float d = float(wf16[QD_PLANE * p.chunk_blocks + b]);
    return pack8(d * sbytes_fast(q.x), d * sbytes_fast(q.y));
}
#elif defined(QTYPE_Q4_K)
// 144-byte super-block b (words 36 b ..): head uvec4 (d, dmin, 12 bytes of 6-bit scales and mins),
// 128 quant bytes from byte 16. Unit r (0..31) = elements 8r .. 8r + 7 of sub-block s = r / 4:
// nibble s % 2 of quant bytes 32 (s / 2) + 8 (r % 4) .. + 7; x = d sc[s] q - dmin mn[s]
uvec4 dequant8(uint o) {
    const uint b = p.blk0 + (o >> 5), r = o & 31u, s = r >> 2;
    const uvec4 hd = wu4[9u * b];
    const uvec2 q = wu2[18u * b + 2u + 4u * (s >> 1) + (r & 3u)];
    // sub-block s: scale and min in the low 6 bits of bytes s and s + 4 (s < 4); else 4 bits from
    // byte s + 4 (low: scale, high: min) and the top 2 bits of bytes s - 4 and s
    const uint j = 8u * (s & 3u);
    uint sc, mn;
    if (s < 4u) {
        sc = (hd.y >> j) & 63u;
        mn = (hd.z >> j) & 63u;
    } else {
        const uint md = hd.w >> j;
        sc = (md & 15u) | (((hd.y >> (j + 6u)) & 3u) << 4);
        mn = ((md >> 4) & 15u) | (((hd.z >> (j + 6u)) & 3u) << 4);
    }
    const vec2 dm = unpackHalf2x16(hd.x);
    const float dl = dm.x * float(sc), ml = dm.y * float(mn);
    const uint sh = 4u * (s & 1u);
    return pack8(dl * bytes_magic((q.x >> sh) & 0x0F0F0F0Fu, 0.0) - ml,
                 dl * bytes_magic((q.y >> sh) & 0x0F0F0F0Fu, 0.0) - ml);
}
#elif defined(QTYPE_Q6_K)
// Planar (quants.glsl, llamavk/kernels/__init__.py PLANES): super-block b's ql[128] and qh[64] at
// byte 192 b, its int8 scales[16] at byte 192 n + 16 b, d (f16) at f16 index 104 n + b (n: the
// chunk's blocks). Unit r = elements e = 8r .. 8r + 7, e = 128 h + 32 j + l: low 4 bits
// ql[64 h + 32 (j % 2) + l] >> 4 (j / 2), high 2 bits qh[32 h + l] >> 2 j; x = d scale[e / 16] (q - 32).
// The 8 bytes of each run are one aligned uvec2.
uvec4 dequant8(uint o) {
    const uint b = p.blk0 + (o >> 5), r = o & 31u;
    const uint h = r >> 4, j = (r >> 2) & 3u, l0 = r & 3u;
    const uvec2 lo = wu2[24u * b + 8u * h + 4u * (j & 1u) + l0] >> (4u * (j >> 1));
    const uvec2 hi = wu2[24u * b + 16u + 4u * h + l0] >> (2u * j);
    const float dl = half_bits(uint(wu16[104u * q_chunk_blocks + b]))
                   * float(int(int8_t(wu8[192u * q_chunk_blocks + 16u * b + (r >> 1)])));
    const uint q0 = (lo.x & 0x0F0F0F0Fu) | ((hi.x & 0x03030303u) << 4);
    const uint q1 = (lo.y & 0x0F0F0F0Fu) | ((hi.y & 0x03030303u) << 4);
    return pack8(dl * bytes_magic(q0, 32.0), dl * bytes_magic(q1, 32.0));
}
#elif defined(QFLOAT)
#error "dequant_f16.comp: float weights need no dequantization"
#else
// Every other quantized type: quants.glsl's dequant_part gives quarter i of a 32-element unit u as
// a = elements 4i..4i+3 and c = 16+4i..16+4i+3; unit k (8 elements) is quarters 2 (k % 2) and
// 2 (k % 2) + 1, their a (k < 2) or c. Row 0 with the blocks counted from the chunk's start.
uvec4 dequant8(uint o) {
    const uint u = p.blk0 * (QK / 32u) + (o >> 2), k = o & 3u;
    vec4 a0, c0, a1, c1;
    dequant_part(0u, u, 2u * (k & 1u), QK, a0, c0);
    dequant_part(0u, u, 2u * (k & 1u) + 1u, QK, a1, c1);
    return k < 2u ? pack8(a0, a1) : pack8(c0, c1);
}
#endif

// Every unit's loads and arithmetic first, then the stores (all NPT units' loads in flight at once;
// units past the end compute the last one again, so that no load depends on a branch).
void main() {
    q_chunk_blocks = p.chunk_blocks;
    const uint wg = gl_WorkGroupID.x + gl_NumWorkGroups.x * gl_WorkGroupID.y;
    const uint base = wg * (256u * NPT) + gl_LocalInvocationID.x;
    uvec4 v[NPT];
    [[unroll]] for (uint i = 0; i < NPT; ++i)
        v[i] = dequant8(min(base + 256u * i, p.n_out - 1u));
    [[unroll]] for (uint i = 0; i < NPT; ++i) {
        const uint o = base + 256u * i;
        if (o < p.n_out)
            out4[o] = v[i];
    }
}
