// The 32 weights of unit u of a chunk-local row (a row of `cols` weights), for the kernels shaped for
// software devices (matmul_cpu.comp, matvec_cpu.comp): float types in 16-byte loads (quants.glsl's
// dequant_unit reads them one element a load, and llvmpipe runs each load as a loop over the lanes).
// Needs quants.glsl (QTYPE_*, wu4, dequant_unit); cols a multiple of 32.
void load_unit(uint row, uint u, uint cols, out vec4 w[8]) {
#if defined(QTYPE_F32)
    uint b = (row * cols + 32 * u) / 4;
    [[unroll]] for (uint k = 0; k < 8; ++k) w[k] = uintBitsToFloat(WU4(b + k));
#elif defined(QTYPE_F16) || defined(QTYPE_BF16)
    uint b = (row * cols + 32 * u) / 8;
    [[unroll]] for (uint k = 0; k < 4; ++k) {
        uvec4 q = WU4(b + k);
#if defined(QTYPE_F16)
        w[2 * k] = vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y));
        w[2 * k + 1] = vec4(unpackHalf2x16(q.z), unpackHalf2x16(q.w));
#else
        w[2 * k] = uintBitsToFloat(uvec4(q.x << 16, q.x & 0xFFFF0000u, q.y << 16, q.y & 0xFFFF0000u));
        w[2 * k + 1] = uintBitsToFloat(uvec4(q.z << 16, q.z & 0xFFFF0000u, q.w << 16, q.w & 0xFFFF0000u));
#endif
    }
#elif defined(QTYPE_Q4_0) || defined(QTYPE_Q4_1) || defined(QTYPE_Q8_0)
    // the quants and the head loaded once each (dequant_unit's two runs, dequant_run, load both twice:
    // here each load is a loop over the lanes), then dequant_run's arithmetic
    uint b = row * (cols / QK) + u;
#if defined(QTYPE_Q4_0)
    float d = block_scale(b);
    uvec4 q = WU4(b);
    [[unroll]] for (uint k = 0; k < 4; ++k) { w[k] = d * nibbles_lo(q[k]); w[k + 4] = d * nibbles_lo(q[k] >> 4); }
#elif defined(QTYPE_Q4_1)
    vec2 dm = unpackHalf2x16(WU32(4 * q_chunk_blocks + b));
    uvec4 q = WU4(b);
    [[unroll]] for (uint k = 0; k < 4; ++k) {
        w[k] = dm.x * ubytes_fast(q[k] & 0x0F0F0F0Fu) + dm.y;
        w[k + 4] = dm.x * ubytes_fast((q[k] >> 4) & 0x0F0F0F0Fu) + dm.y;
    }
#else
    float d = block_scale(b);
    uvec4 q0 = WU4(2 * b), q1 = WU4(2 * b + 1);
    [[unroll]] for (uint k = 0; k < 4; ++k) { w[k] = d * sbytes_fast(q0[k]); w[k + 4] = d * sbytes_fast(q1[k]); }
#endif
#else
    dequant_unit(row, u, cols, w);
#endif
}
