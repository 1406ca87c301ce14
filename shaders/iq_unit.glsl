// The lattice types' 64-weight units for the one-token stream kernel (matvec_stream.comp, which loads
// every weight before its arithmetic): IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M. (The
// expert products, matvec_id.comp, keep their unit-by-unit form for these types: this one measured
// no faster there, docs/PERFORMANCE.md "Tried".)
//
// A unit is a quarter m of a super-block, 64 weights: sub-blocks 2m and 2m + 1 of 4 groups of 8
// weights, a scale per sub-block or per 16 weights (IQ2_XS, IQ2_S). iq_load_unit loads its fields
// from the planes quants.glsl reads (llamavk/kernels/__init__.py PLANES) into q (a uvec4) and t, and d:
//   IQ2_XXS  q: the block's uvec4 m (per sub-block a word of 4 grid indices, one per group, and a
//            word of 4 x 7 sign bits and the scale)
//   IQ3_XXS  q: its uvec4 m of qs (16 indices of 4-weight entries, two per group); t.xy: its
//            sub-blocks' sign-and-scale words
//   IQ2_XS   q: its 8 16-bit (9-bit index | 7 sign bits) words; t.x: its 2 scale bytes
//   IQ2_S    q: its 8 index low bytes (xy) and 8 sign bytes (zw); t.x: its index high bits | its
//            scales << 16
//   IQ3_S    q: its uvec4 of qs; t.xy: its 8 sign bytes; t.z: its qh bytes (the indices' 9th bits) |
//            the block's scale byte of the unit << 16
//   IQ1_S    q.xy: its 8 index low bytes; q.z: its sub-blocks' 16-bit words (3 index bits per group,
//            a 3-bit scale, delta's sign at bit 15)
//   IQ1_M    q.xy: the same; q.z: a nibble per group (3 index bits, delta's sign); q.w: its 16-bit
//            word of 3-bit scales; d from the top nibbles of the block's 4 scale words
// Every workgroup copies the grid (quants.glsl: after the chunk's blocks) into shared memory while its
// first weight loads are in flight (iq_tables_fill), with a table of the sign patterns as byte masks
// (iqs: 128 patterns whose eighth sign makes the count of minus signs even, or IQ2_S's / IQ3_S's 256
// sign bytes). A group's 8 weights are then two grid words (bytes below 128 and above 0) whose bytes
// the mask negates: signed bytes for integer dots or the f32 forms (iq_group), times iq_scale and d.
// IQ1's weight dl (g + delta), g in -1, 0, 1 and delta +-1/8: 8 (g + delta) = 8 g +- 1 is a signed
// byte, so its grid is staged as 8 (g + 1) per byte (0, 8, 16), from which a subtraction without
// borrows gives 8 g + 1 or 8 g - 1, and the scale takes the 1/8.
//
// Include after quants.glsl (IQ_GRID_SHARED defined) and after the kernel's accessors of matrix mi's
// weights (mi a literal at every call, so each load is one buffer's): uvec4 iq_u4(mi, i), uvec2
// iq_u2(mi, i), uint iq_u32(mi, i), uint iq_u16(mi, i), float iq_f16(mi, i) (words of 16, 8, 4, 2
// and 2 bytes).

#if defined(QTYPE_IQ2_S) || defined(QTYPE_IQ3_S)
#define IQ_SIGNS 256u
#elif defined(QTYPE_IQ1_S) || defined(QTYPE_IQ1_M)
#define IQ_SIGNS 0u     // no signs: the grid staged as 8 (g + 1)
#else
#define IQ_SIGNS 128u
#endif
shared uvec2 iqs[max(IQ_SIGNS, 1u)];

// The grid and the sign masks (entry k: k | parity << 7, or the sign byte k, as byte masks, 0xFF
// negative) into shared memory; every thread calls it, a barrier comes before the first use.
void iq_tables_fill(uint tid, uint nthreads) {
#if defined(QTYPE_IQ1_S) || defined(QTYPE_IQ1_M)
    // each byte g (-1, 0, 1) as 8 (g + 1): (g & 0x7F) + 1 cannot carry, the sign bit xor-ed back
    // gives g + 1 (0xFF -> 0x80 ^ 0x80); times 8 stays in the byte
    const uint base = iq_grid_base();
    for (uint k = tid; k < IQ_GRID_WORDS; k += nthreads) {
        uint w = wu32[base + k];
        iq_grid_sh[k] = ((((w & 0x7F7F7F7Fu) + 0x01010101u) ^ (w & 0x80808080u)) << 3);
    }
#else
    iq_grid_stage(tid, nthreads);
#endif
    for (uint k = tid; k < IQ_SIGNS; k += nthreads) {
        uint b = IQ_SIGNS == 128u ? ksigns(k) : k;
        iqs[k] = uvec2(((b & 15u) * 0x00204081u) & 0x01010101u, ((b >> 4) * 0x00204081u) & 0x01010101u) * 255u;
    }
}

// Quarter m of super-block ib of matrix mi, in a chunk of n blocks (the planes are sized by it).
void iq_load_unit(uint mi, uint ib, uint m, uint n, out uvec4 q, out uvec4 t, out float d) {
    t = uvec4(0u);
#if defined(QTYPE_IQ2_XXS)
    q = iq_u4(mi, 4 * ib + m);
    d = iq_f16(mi, 32 * n + ib);
#elif defined(QTYPE_IQ3_XXS)
    q = iq_u4(mi, 6 * ib + m);
    t.xy = iq_u2(mi, 12 * ib + 8 + m);
    d = iq_f16(mi, 48 * n + ib);
#elif defined(QTYPE_IQ2_XS)
    q = iq_u4(mi, 4 * ib + m);
    t.x = iq_u16(mi, 32 * n + 4 * ib + m);
    d = iq_f16(mi, 36 * n + ib);
#elif defined(QTYPE_IQ2_S)
    uint h16 = 40 * ib + 32 + m;
    q = uvec4(iq_u2(mi, 10 * ib + m), iq_u2(mi, 10 * ib + 4 + m));
    t.x = iq_u16(mi, h16) | (iq_u16(mi, h16 + 4) << 16);
    d = iq_f16(mi, 40 * n + ib);
#elif defined(QTYPE_IQ1_S)
    q = uvec4(iq_u2(mi, 6 * ib + m), iq_u32(mi, 12 * ib + 8 + m), 0u);
    d = iq_f16(mi, 24 * n + ib);
#elif defined(QTYPE_IQ1_M)
    // the block's 56 bytes (8-byte aligned, not planar): qs, qh, the 4 scale words (d in their top nibbles)
    uvec2 sc = iq_u2(mi, 7 * ib + 6);
    q = uvec4(iq_u2(mi, 7 * ib + m), iq_u32(mi, 14 * ib + 8 + m), 0u);
    q.w = (m % 2 == 0 ? (m < 2 ? sc.x : sc.y) : (m < 2 ? sc.x >> 16 : sc.y >> 16)) & 0xFFFFu;
    d = unpackHalf2x16(((sc.x >> 12) & 0xFu) | ((sc.x >> 24) & 0xF0u)
                       | ((sc.y >> 4) & 0xF00u) | ((sc.y >> 16) & 0xF000u)).x;
#else   // IQ3_S: qs at uvec4 4 ib + m; qh, signs, scales at word 16 n + 11 ib
    uint r32 = 16 * n + 11 * ib;
    q = iq_u4(mi, 4 * ib + m);
    t.x = iq_u32(mi, r32 + 2 + 2 * m);
    t.y = iq_u32(mi, r32 + 3 + 2 * m);
    t.z = iq_u16(mi, 2 * r32 + m) | (((iq_u32(mi, r32 + 10) >> (8 * m)) & 0xFFu) << 16);
    d = iq_f16(mi, 54 * n + ib);
#endif
}

// Bytes g (below 128, above 0) negated where the mask byte is 0xFF: ~g + 1 = -g, and no byte
// carries into the next.
uint iq_signed(uint g, uint m) { return (g ^ m) + (m & 0x01010101u); }

// Group l (< 4) of sub-block s (< 2) of the unit (q, t): its 8 weights as signed bytes (lo: weights
// 0..3, hi: 4..7).
void iq_group(uvec4 q, uvec4 t, uint s, uint l, out uint lo, out uint hi) {
#if defined(QTYPE_IQ2_XXS)
    uint gi = (q[2 * s] >> (8 * l)) & 0xFFu, sg = (q[2 * s + 1] >> (7 * l)) & 127u;
    uint g0 = iq_grid(2u * gi), g1 = iq_grid(2u * gi + 1u);
#elif defined(QTYPE_IQ3_XXS)
    uint iw = q[2 * s + l / 2] >> (16 * (l % 2)), sg = (t[s] >> (7 * l)) & 127u;
    uint g0 = iq_grid(iw & 0xFFu), g1 = iq_grid((iw >> 8) & 0xFFu);
#elif defined(QTYPE_IQ2_XS)
    uint v = q[2 * s + l / 2] >> (16 * (l % 2)), gi = v & 511u, sg = (v >> 9) & 127u;
    uint g0 = iq_grid(2u * gi), g1 = iq_grid(2u * gi + 1u);
#elif defined(QTYPE_IQ2_S)
    uint gi = ((q[s] >> (8 * l)) & 0xFFu) | (((t.x >> (8 * s + 2 * l)) & 3u) << 8), sg = (q[2 + s] >> (8 * l)) & 0xFFu;
    uint g0 = iq_grid(2u * gi), g1 = iq_grid(2u * gi + 1u);
#elif defined(QTYPE_IQ3_S)
    uint iw = q[2 * s + l / 2] >> (16 * (l % 2)), hb = t.z >> (8 * s + 2 * l), sg = (t[s] >> (8 * l)) & 0xFFu;
    uint g0 = iq_grid((iw & 0xFFu) | ((hb & 1u) << 8)), g1 = iq_grid(((iw >> 8) & 0xFFu) | ((hb & 2u) << 7));
#endif
#if defined(QTYPE_IQ1_S) || defined(QTYPE_IQ1_M)
#if defined(QTYPE_IQ1_S)
    uint qh = q.z >> (16 * s), hi3 = (qh >> (3 * l)) & 7u;
    bool neg = (qh & 0x8000u) != 0u;
#else
    uint nib = q.z >> (4 * (4 * s + l)), hi3 = nib & 7u;
    bool neg = (nib & 8u) != 0u;
#endif
    uint gi = ((q[s] >> (8 * l)) & 0xFFu) | (hi3 << 8);
    uint k = neg ? 0x09090909u : 0x07070707u;   // 8 (g + 1) - 9 = 8 g - 1, - 7 = 8 g + 1
    lo = ((iq_grid(2u * gi) | 0x80808080u) - k) ^ 0x80808080u;
    hi = ((iq_grid(2u * gi + 1u) | 0x80808080u) - k) ^ 0x80808080u;
#else
    uvec2 m = iqs[sg];
    lo = iq_signed(g0, m.x);
    hi = iq_signed(g1, m.y);
#endif
}

#if defined(QTYPE_IQ1_S)
// IQ1_S's group l of sub-block s as staged, 8 (g + 1) a byte (0, 8, 16): iq_group's bytes plus the
// sub-block's offset iq1s_offset, 9 (delta -1/8) or 7 (+1/8), which integer dots can take through the
// sum of x instead (two operations a word fewer).
void iq1s_group_staged(uvec4 q, uint s, uint l, out uint lo, out uint hi) {
    uint gi = ((q[s] >> (8 * l)) & 0xFFu) | (((q.z >> (16 * s + 3 * l)) & 7u) << 8);
    lo = iq_grid(2u * gi);
    hi = iq_grid(2u * gi + 1u);
}
float iq1s_offset(uvec4 q, uint s) { return ((q.z >> (16 * s)) & 0x8000u) != 0u ? 9.0 : 7.0; }
#endif

// The scale of groups 2h, 2h + 1 of sub-block s (d apart): (0.5 + 4 bits) / 4 (IQ3_XXS / 2), IQ3_S
// 1 + 2 x 4 bits, IQ1 (1 + 2 x 3 bits) / 8
float iq_scale(uvec4 q, uvec4 t, uint s, uint h) {
#if defined(QTYPE_IQ2_XXS)
    return (0.5 + float(q[2 * s + 1] >> 28)) * 0.25;
#elif defined(QTYPE_IQ3_XXS)
    return (0.5 + float(t[s] >> 28)) * 0.5;
#elif defined(QTYPE_IQ2_XS)
    return (0.5 + float((t.x >> (8 * s + 4 * h)) & 15u)) * 0.25;
#elif defined(QTYPE_IQ2_S)
    return (0.5 + float((t.x >> (16 + 8 * s + 4 * h)) & 15u)) * 0.25;
#elif defined(QTYPE_IQ1_S)
    return float(2u * ((q.z >> (16 * s + 12)) & 7u) + 1u) * 0.125;   // the weights' bytes are 8 (g + delta)
#elif defined(QTYPE_IQ1_M)
    return float(2u * ((q.w >> (3 * (2 * s + h))) & 7u) + 1u) * 0.125;
#else
    return float(1u + 2u * ((t.z >> (16 + 4 * s)) & 15u));
#endif
}
