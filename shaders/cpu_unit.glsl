// The 32 weights of unit u of a chunk-local row (a row of `cols` weights), for the kernels shaped for
// software devices (matmul_cpu.comp, matvec_cpu.comp): float types in 16-byte loads (quants.glsl's
// dequant_unit reads them one element a load, and llvmpipe runs each load as a loop over the lanes).
// Needs quants.glsl (QTYPE_*, wu4, dequant_unit); cols a multiple of 32.
void load_unit(uint row, uint u, uint cols, out vec4 w[8]) {
#if defined(QTYPE_F32)
    uint b = (row * cols + 32 * u) / 4;
    [[unroll]] for (uint k = 0; k < 8; ++k) w[k] = uintBitsToFloat(wu4[b + k]);
#elif defined(QTYPE_F16) || defined(QTYPE_BF16)
    uint b = (row * cols + 32 * u) / 8;
    [[unroll]] for (uint k = 0; k < 4; ++k) {
        uvec4 q = wu4[b + k];
#if defined(QTYPE_F16)
        w[2 * k] = vec4(unpackHalf2x16(q.x), unpackHalf2x16(q.y));
        w[2 * k + 1] = vec4(unpackHalf2x16(q.z), unpackHalf2x16(q.w));
#else
        w[2 * k] = uintBitsToFloat(uvec4(q.x << 16, q.x & 0xFFFF0000u, q.y << 16, q.y & 0xFFFF0000u));
        w[2 * k + 1] = uintBitsToFloat(uvec4(q.z << 16, q.z & 0xFFFF0000u, q.w << 16, q.w & 0xFFFF0000u));
#endif
    }
#else
    dequant_unit(row, u, cols, w);
#endif
}
