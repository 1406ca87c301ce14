#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_shuffle : require
// Products with the experts a token's router chose (decode and small batches of a mixture of
// experts): the matrix-vector form of matmul_id, reading only the chosen experts' rows.
//
// Weights: n_exp experts' matrices of R rows x cols stacked in one chunk (expert e0 first); route
// rows hold per token the n_used chosen expert ids (uint bits) and then their weights.
//
//   plain: y[t, s, r] = sum_c W[id(t, s), r, c] * x'[t(, s), c]
//   PAIR:  y[t, s, r] = silu(W[id(t, s), r] . x') * (P[id(t, s), r] . x')   (gate and up as one product)
//   SUM:   y[t, r] = resid[t, r] + sum_s weight(t, s) * (W[id(t, s), r] . x'[t, s])
// x' = x, or rms_norm(x[t]) * nw (NORM: the norm feeding the product, folded in as in matvec.comp), or
// silu(x) * up (GLU: the SwiGLU feeding the down product). XSLOT: x holds one row per (token, slot)
// (the down product's input), else one per token (gate and up read the token's state).
// A slot whose expert lies outside this chunk [e0, e0 + n_exp) is left to another dispatch.
//
// Work split (units: 32 weights, one block of the 32-blocks or a sub-block of a super-block; Q4_K,
// Q5_K, Q6_K a quarter super-block of 64, KUNIT): TPR lanes per row (a power of two up to the
// subgroup), each taking units c + TPR i (i < C) of RJ rows g + G j (G = S / TPR row groups per
// subgroup); sums meet by xor shuffles over the TPR lanes.
// Preloaded types (QPRELOAD: Q4_0, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, MXFP4): every weight load of a
// lane is issued before any arithmetic, so a subgroup has C x RJ x (PAIR ? 2 : 1) units' loads in
// flight (the memory-level parallelism that streams the weights; loads issued inside the loop wait
// one by one); only they run as a gate/up pair, chained (WAIT / SIGNAL) and with the shared slot.
// - Planar Q4_0 / Q8_0 (QPLANAR): 16-byte quants and the block's scale.
// - Q4_K: sub-blocks 2q and 2q + 1, 32 bytes of quants (their low and high nibbles), loaded as 3
//   uvec4s (the super-block's head: d, dmin, the 12 scale bytes; the quarter's quants), the mins
//   through the sums of x' over each sub-block (w = d sc q - dmin m). Q5_K: the same and the block's
//   32 high-bit bytes (bits 2q and 2q + 1), 5 uvec4s.
// - Q6_K (planar, quants.glsl): matvec_stream.comp's quarter -- of half h, the 16 elements 16m ..
//   16m + 15 of each of the 4 runs of 32 (ql uvec4s 4h + m and 4h + 2 + m, qh uvec4 8 + 2h + m of the
//   block, the half's 8 scale bytes, d), so its x' is 4 pieces of 4 vec4s (xvec4).
// - IQ4_NL (planar as Q4_0: a uvec4 and d) and IQ4_XS (the block's head -- d, scales_h; scales_l --
//   and the sub-block's 16 quant bytes as 3 uvec2s, a 136-byte block being 8-byte aligned): each
//   quant byte's two table values (element l: low nibble, l + 16: high) from a table of the 256
//   bytes' pairs in shared memory (KV_PAIRS: one shared load per two weights, as matmul_coop.comp's
//   runs) where registers selected them one by one. MXFP4 (gpt-oss's experts) loads as IQ4_NL, its E2M1
//   values from their bits as f16s (e2m1_dot, no table), its E8M0 exponent byte for d.
// - The lattice types (IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ1_S, IQ1_M; IQ_UNIT): a quarter
//   super-block's fields as matvec_stream.comp loads them and its groups' weights as signed bytes
//   (iq_unit.glsl: the grid and sign masks in shared memory), a scale per 16 weights.
// H100, 30B-A3B tg128 against these types loaded unit by unit: Q4_K 360-366 -> 409, Q5_K 330-333 ->
// 349-353, Q6_K 330 -> 368-372, IQ4_XS 210 -> 306-312, IQ4_NL 194-195 -> 333-337 (kernels/moe.py).
// Other types dequantize unit by unit (quants.glsl dequant_unit).
// Grids: plain / PAIR: (row blocks of the subgroups' rows, tokens x slots), each subgroup its own rows;
// SUM: (row blocks of SPS * G * RJ rows, tokens), SPS subgroups per slot (the workgroup is n_used x SPS
// subgroups; slot sg / SPS, rows from (sg % SPS) G RJ), the slots' weighted sums added in slot order
// through shared memory (deterministic), then the residual. SPS > 1 where a slot's x row is wide:
// the workgroup's staged rows then serve more weight rows (moe.matvec_id_sum_sps).
// WAIT / SIGNAL (one-token steps, kernels/chain.py; as in matvec_stream.comp): a WAIT product is
// recorded without a barrier after its producer; its workgroups issue their weight loads (the route
// they read was complete before the producer started), then wait in the shader for the producer's
// workgroup count, then read x through coherent aliases. A SIGNAL product's workgroups count
// themselves done once their stores are visible.
// XS > 0: the workgroup's x' rows (one: the token's, or the slot's; SUM of XSLOT rows: the token's
// n_used slots) are staged once into shared memory (XS vec4s), read from global memory coalesced,
// with NORM (the sum of squares summed over the workgroup) or GLU applied. Why: a lane's unit is 8
// consecutive vec4s of x, so reading x straight from memory makes every load instruction of a
// subgroup touch 32 cache lines (stride 128 bytes), x and the norm weights twice the weights' loads
// in number. vec4 e of unit u sits at slot 8 u + (e ^ (u & 7)): the 8 lanes of a quarter-subgroup
// reading one e hit different banks. XS == 0 (rows too wide for shared memory): x from memory.
// SHEXP (the preloaded types -- QPRELOAD --, one chunk; qwen35moe's one-token FFN, fusion.fuse_shared_expert): the
// last of the n_used slots is a shared expert whose matrices are bound apart (9: W, 10: P): its own
// rows (sh_rows) and cols (sh_cols), its route id unread, its route weight the router's
// sigmoid(w_shexp . x'). Per token, outputs (non-SUM) and XSLOT inputs are the routed slots' rows
// (rows / cols each) followed by the shared slot's (sh_rows / sh_cols). Why a slot: the shared
// expert's gate/up, down product and sigmoid gate then cost no dependent stage of their own. The
// slot's code is compiled only into the SHEXP_SLOT variants (mul_mv_id_<type>_shexp): as a
// specialization left false it still cost the routed products 2.5-3% (H100 30B-A3B Q4_K tg128 398
// against 408-410 without it, in alternation, one call).
// RWAIT (with WAIT; the experts' gate/up pair after the output projection that picks the experts,
// matvec_stream.comp ROUTER, kernels/chain.py edge p): the route is the producer's too, so the wait
// comes first and the route is read after it through a coherent alias; then the weight loads.
// BIAS (gpt-oss's per-expert biases, ggml_add_id): W's product of slot s gets row r of bias[id(t, s)]
// (binding 11, f32 [experts][R]) before anything else -- before the unit with PAIR (whose P gets
// binding 12's), before its route weight with SUM. OAI (with PAIR): the unit is swiglu_oai,
// g' sigmoid(alpha g') (u' + 1) with g' = min(g, limit), u' = clamp(u, -limit, limit) (push
// constants), instead of silu(g) u. Both only in the epilogue: the products' loops are unchanged.
// Specialization: 0 workgroup size, 1 TPR, 2 C, 3 RJ, 4 NORM, 5 GLU, 6 SUM, 7 XSLOT, 8 RESID, 9 PAIR,
// 10 WAIT, 11 SIGNAL, 12 XS, 13 RED, 14 SHEXP, 15 RWAIT, 16 XFIRST, 17 BIAS, 18 OAI.
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint TPR = 32;
layout(constant_id = 2) const uint C = 1;
layout(constant_id = 3) const uint RJ = 2;
layout(constant_id = 4) const bool NORM = false;
layout(constant_id = 5) const bool GLU = false;
layout(constant_id = 6) const bool SUM = false;
layout(constant_id = 7) const bool XSLOT = false;
layout(constant_id = 8) const bool RESID = false;
layout(constant_id = 9) const bool PAIR = false;
layout(constant_id = 10) const bool WAIT = false;
layout(constant_id = 11) const bool SIGNAL = false;
layout(constant_id = 12) const uint XS = 0;
layout(constant_id = 13) const uint RED = 1;   // SUM: n_used x rows_per_wg (the host checks <= 2048)
layout(constant_id = 14) const bool SHEXP = false;
layout(constant_id = 15) const bool RWAIT = false;
// XFIRST (XS > 0, no wait, one x row, no GLU: the host checks): a lane loads its share of x (and the
// norm's weights) before its weight loads, and stages x' from those registers (at most XPRE vec4s
// each). Why: a load waits behind the lane's earlier loads, so x read after the weights arrives after
// them and the workgroup's staging barrier waits with nothing in flight (matvec_stream.comp XFIRST).
layout(constant_id = 16) const bool XFIRST = false;
layout(constant_id = 17) const bool BIAS = false;
layout(constant_id = 18) const bool OAI = false;
#define XPRE 4
vec4 xpre[XPRE], npre[XPRE];
const uint NM = PAIR ? 2 : 1;   // matrices per product
const bool SLOT_ROWS = SUM && XSLOT;   // XS: the token's n_used slot rows are staged

#if defined(QTYPE_IQ2_XXS) || defined(QTYPE_IQ3_XXS) || defined(QTYPE_IQ2_XS) || defined(QTYPE_IQ2_S) || \
    defined(QTYPE_IQ3_S) || defined(QTYPE_IQ1_S) || defined(QTYPE_IQ1_M)
#define IQ_UNIT 1          // header: the lattice types
#define IQ_GRID_SHARED 1   // quants.glsl's grid read from shared memory (iq_unit.glsl)
#endif
#include "quants.glsl"
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
layout(std430, binding = 2) readonly buffer Route { float route[]; };
layout(std430, binding = 2) volatile coherent buffer RouteC { float routec[]; };   // RWAIT (header)
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer NormW4 { vec4 nw4[]; };
layout(std430, binding = 5) readonly buffer Resid { float resid[]; };
layout(std430, binding = 6) readonly buffer Up4 { vec4 up4[]; };
layout(std430, binding = 7) readonly buffer PairU4 { uvec4 pu4[]; };     // PAIR: the up matrix
layout(std430, binding = 7) readonly buffer PairU32 { uint pu32[]; };
layout(std430, binding = 7) readonly buffer PairF16 { float16_t pf16[]; };
#if defined(QTYPE_IQ4_XS)
layout(std430, binding = 7) readonly buffer PairU2 { uvec2 pu2[]; };
#endif
// WAIT: the activations through coherent aliases (every read after the wait goes to the L2)
layout(std430, binding = 1) volatile coherent buffer X4c { vec4 x4c[]; };
layout(std430, binding = 6) volatile coherent buffer Up4c { vec4 up4c[]; };
// the residual too: with every stage chained (LLAMAVK_CHAIN=1), no barrier may lie between its write
// and this read, and a non-coherent cache may still hold those addresses from earlier in the step
layout(std430, binding = 5) volatile coherent buffer ResidC { float residc[]; };
layout(std430, binding = 8) volatile coherent buffer Chain { uint chain[]; };   // WAIT / SIGNAL: counters
// SHEXP: the shared expert's matrix (W's role) and, with PAIR, its up matrix (P's role)
layout(std430, binding = 9) readonly buffer ShW4 { uvec4 sw4[]; };
layout(std430, binding = 9) readonly buffer ShWF16 { float16_t swf16[]; };
layout(std430, binding = 10) readonly buffer ShP4 { uvec4 sp4[]; };
layout(std430, binding = 10) readonly buffer ShPF16 { float16_t spf16[]; };
layout(std430, binding = 11) readonly buffer BiasW { float bias_w[]; };   // BIAS: [experts][R] of W
layout(std430, binding = 12) readonly buffer BiasP { float bias_p[]; };   // BIAS with PAIR: of P
layout(push_constant) uniform Push {
    uint rows;         // R: rows of one expert
    uint cols;
    uint n_used;       // slots per token
    uint e0;           // first expert of this chunk
    uint n_exp;        // experts in this chunk
    uint rows_per_wg;
    float eps;
    uint wait_slot;    // WAIT: the producer's counter
    uint wait_n;       // WAIT: its workgroups
    uint signal_slot;  // SIGNAL: this product's counter
    uint sh_rows;      // SHEXP: the shared expert's rows
    uint sh_cols;      // SHEXP: and cols
    float alpha;       // OAI: swiglu_oai's alpha
    float limit;       // OAI: and limit
} p;

// Shared arrays sized by specialization: what a variant does not use takes no shared memory (on
// NVIDIA a kernel's shared memory decides the SM's L1/shared split, and kernels of different splits
// do not share an SM)
shared float red[RED];   // SUM: per slot, the workgroup's rows
shared vec4 xs[XS > 0 ? XS : 1];   // XS: the staged x' rows (header)
shared float red_ss[128];          // XS with NORM: per subgroup, its threads' sums of squares
#if defined(QTYPE_IQ4_NL) || defined(QTYPE_IQ4_XS)
#define KV_PAIRS 1  // the table values from a shared table of byte pairs (header)
#endif
#if defined(QTYPE_MXFP4)
// quant word w's 8 E2M1 weights (bytes 0..3: low nibbles elements 0..3 against xlo, high ones against
// xhi) without a table: nibble s e1 e0 m read as the f16 bits s << 15 | (e1 e0 m) << 9 is its value
// times 2^-14 (quants.glsl e2m1_f16_pair; e = 0 the f16 subnormal m 2^-15), two nibbles a word --
// bytes 0 and 2, then 1 and 3 -- by two shifts and a masked merge each, converted exactly to f32. The
// sum is the doubled table's (mat_e8's scale) times 2^-15. Why: the byte-pair table's shared loads
// (4 per word, random banks) bound the product -- H200, gpt-oss-20b's gate/up experts 47.9 us against
// 33.8 for the same shape in Q4_0.
float e2m1_dot(uint w, vec4 xlo, vec4 xhi) {
    const uint M = 0x0E000E00u, S = 0x80008000u;
    vec2 l02 = unpackHalf2x16(((w << 9) & M) | ((w << 12) & S));
    vec2 l13 = unpackHalf2x16(((w << 1) & M) | ((w << 4) & S));
    vec2 h02 = unpackHalf2x16(((w << 5) & M) | ((w << 8) & S));
    vec2 h13 = unpackHalf2x16(((w >> 3) & M) | (w & S));
    return dot(vec4(l02.x, l13.x, l02.y, l13.y), xlo) + dot(vec4(h02.x, h13.x, h02.y, h13.y), xhi);
}
#endif
#if defined(KV_PAIRS)
shared vec2 kv_pair[256];          // byte (lo | hi << 4) -> (KV[lo], KV[hi]) (header)
// quant word w's 8 weights (bytes 0..3: low nibbles elements 0..3 against xlo, high ones against xhi)
float kv_pair_dot(uint w, vec4 xlo, vec4 xhi) {
    vec2 p0 = kv_pair[w & 0xFFu], p1 = kv_pair[(w >> 8) & 0xFFu];
    vec2 p2 = kv_pair[(w >> 16) & 0xFFu], p3 = kv_pair[w >> 24];
    return dot(vec4(p0.x, p1.x, p2.x, p3.x), xlo) + dot(vec4(p0.y, p1.y, p2.y, p3.y), xhi);
}
#endif

// XS: stage the n4 vec4s of x' from vec4 off4 of x (rows of whole units, side by side); returns the
// whole row's sum of squares (NORM, one row), the same in every thread. Every thread of the workgroup
// calls this.
float stage_x(uint off4, uint n4) {
    uint cols4 = p.cols / 4;
    float ss = 0.0;
    if (XFIRST) {
        [[unroll]] for (uint i = 0; i < XPRE; ++i) {
            uint k = gl_LocalInvocationIndex + gl_WorkGroupSize.x * i;
            if (k < n4) {
                vec4 v = xpre[i];
                if (NORM) { ss += dot(v, v); v *= npre[i]; }
                uint u = k / 8, e = k % 8;
                xs[8 * u + (e ^ (u & 7u))] = v;
            }
        }
    }
    for (uint k = XFIRST ? n4 : gl_LocalInvocationIndex; k < n4; k += gl_WorkGroupSize.x) {
        uint idx = off4 + k;
        vec4 v = WAIT ? x4c[idx] : x4[idx];
        if (NORM) { ss += dot(v, v); v *= nw4[k % cols4]; }
        if (GLU) v = v / (1.0 + exp(min(-v, vec4(80.0)))) * (WAIT ? up4c[idx] : up4[idx]);
        uint u = k / 8, e = k % 8;
        xs[8 * u + (e ^ (u & 7u))] = v;
    }
    if (NORM) {
        ss = subgroupAdd(ss);
        if (subgroupElect()) red_ss[gl_SubgroupID] = ss;
    }
    barrier();
    float total = 0.0;
    if (NORM) for (uint i = 0; i < gl_NumSubgroups; ++i) total += red_ss[i];
    return total;
}

// x' of vec4 k of unit u (32 weights) of the x row at vec4 xoff4 (the sum of squares of x goes to ss);
// XS: of the staged row at vec4 xs4
vec4 xvec4(uint xoff4, uint xs4, uint u, uint k, inout float ss) {
    if (XS > 0) {
        uint b = xs4 + 8 * u;
        return xs[b + (k ^ ((b / 8) & 7u))];
    }
    uint kk = 8 * u + k, idx = xoff4 + kk;
    vec4 v = WAIT ? x4c[idx] : x4[idx];
    if (NORM) { ss += dot(v, v); v *= nw4[kk]; }
    if (GLU) v = v / (1.0 + exp(min(-v, vec4(80.0)))) * (WAIT ? up4c[idx] : up4[idx]);
    return v;
}
// x' for the 8 vec4s of unit u (xvec4's, written out: what the Q4_0 / Q8_0 kernels were measured with)
void xunit(uint xoff4, uint xs4, uint u, inout float ss, out vec4 xv[8]) {
    if (XS > 0) {
        uint b = xs4 + 8 * u, sw = (b / 8) & 7u;
        [[unroll]] for (uint k = 0; k < 8; ++k) xv[k] = xs[b + (k ^ sw)];
        return;
    }
    [[unroll]] for (uint k = 0; k < 8; ++k) {
        uint kk = 8 * u + k, idx = xoff4 + kk;
        vec4 v = WAIT ? x4c[idx] : x4[idx];
        if (NORM) { ss += dot(v, v); v *= nw4[kk]; }
        if (GLU) v = v / (1.0 + exp(min(-v, vec4(80.0)))) * (WAIT ? up4c[idx] : up4[idx]);
        xv[k] = v;
    }
}

#include "chain_wait.glsl"

// the sum over this row group's TPR lanes (an xor butterfly within the subgroup)
float lanes_sum(float v) {
    [[unroll]] for (uint m = TPR / 2; m > 0; m /= 2) v += subgroupShuffleXor(v, m);
    return v;
}

#if defined(QTYPE_Q4_0)
#define NQ 1
#elif defined(QTYPE_Q8_0)
#define NQ 2
#elif defined(QTYPE_Q4_K)
#define NQ 3        // the super-block's head, the quarter's 32 quant bytes
#define KUNIT 1
#elif defined(QTYPE_Q5_K)
#define NQ 5        // the head, the quarter's 32 quant bytes, the block's 32 high-bit bytes
#define KUNIT 1
#elif defined(QTYPE_Q6_K)
#define NQ 3        // the quarter's two ql uvec4s and its qh uvec4 (+ scale words and d: wsc, wdk)
#define KUNIT 1
#elif defined(QTYPE_IQ4_NL) || defined(QTYPE_MXFP4)
#define NQ 1        // the block's 16 quant bytes (+ d: wd)
#endif
#if defined(QPLANAR) || defined(KUNIT) || defined(KV_PAIRS) || defined(QTYPE_MXFP4) || defined(IQ_UNIT)
#define QPRELOAD 1  // every weight load issued before the arithmetic (header)
#endif
#if defined(KUNIT) || defined(IQ_UNIT)
#define UNIT_W 64
#else
#define UNIT_W 32
#endif

// The preloaded types' loads of one unit of matrix mi: 0 W, 1 P (the pair's up matrix) of the routed
// experts (bindings 0, 7); 2, 3 the shared expert's (SHEXP, 9, 10). mi is a literal at every call, so
// each load is one buffer's. b: the unit's index in the matrix (row * units per row + unit); nb: the
// blocks of the matrix's chunk (the planar types' planes are sized by it).
#if defined(QTYPE_Q6_K)
layout(std430, binding = 9) readonly buffer ShW32 { uint sw32[]; };
layout(std430, binding = 10) readonly buffer ShP32 { uint sp32[]; };
uint mat_u32(uint mi, uint i) { return mi == 0 ? wu32[i] : mi == 1 ? pu32[i] : mi == 2 ? sw32[i] : sp32[i]; }
#endif
#if defined(QTYPE_IQ4_XS)
layout(std430, binding = 9) readonly buffer ShW2 { uvec2 sw2[]; };
layout(std430, binding = 10) readonly buffer ShP2 { uvec2 sp2[]; };
uvec2 mat_u2(uint mi, uint i) { return mi == 0 ? wiq2[i] : mi == 1 ? pu2[i] : mi == 2 ? sw2[i] : sp2[i]; }
#endif
#if defined(KUNIT) || defined(QTYPE_IQ4_NL) || defined(QTYPE_MXFP4)
uvec4 mat_u4(uint mi, uint i) { return mi == 0 ? wu4[i] : mi == 1 ? pu4[i] : mi == 2 ? sw4[i] : sp4[i]; }
#endif
#if defined(QTYPE_MXFP4)
layout(std430, binding = 7) readonly buffer PairU8 { uint8_t pu8[]; };
layout(std430, binding = 9) readonly buffer ShW8 { uint8_t sw8[]; };
layout(std430, binding = 10) readonly buffer ShP8 { uint8_t sp8[]; };
// MXFP4's E8M0 exponent byte as quants.glsl's q_block_scale reads it (the table holds E2M1 doubled)
float mat_e8(uint mi, uint i) {
    uint e = uint(mi == 0 ? wu8[i] : mi == 1 ? pu8[i] : mi == 2 ? sw8[i] : sp8[i]);
    return uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}
#endif
#if defined(QTYPE_Q6_K) || defined(QTYPE_IQ4_NL) || defined(IQ_UNIT)
float mat_f16(uint mi, uint i) { return float(mi == 0 ? wf16[i] : mi == 1 ? pf16[i] : mi == 2 ? swf16[i] : spf16[i]); }
#endif
#if defined(IQ_UNIT)
// iq_unit.glsl's accessors of matrix mi: 0 W, 1 P (the pair's up matrix), 2, 3 the shared expert's
layout(std430, binding = 0) readonly buffer WeightU2Lat { uvec2 wl2[]; };
layout(std430, binding = 7) readonly buffer PairU2Lat { uvec2 pl2[]; };
layout(std430, binding = 7) readonly buffer PairU16Lat { uint16_t pl16[]; };
layout(std430, binding = 9) readonly buffer ShW2Lat { uvec2 swl2[]; };
layout(std430, binding = 10) readonly buffer ShP2Lat { uvec2 spl2[]; };
layout(std430, binding = 9) readonly buffer ShW32Lat { uint swl32[]; };
layout(std430, binding = 10) readonly buffer ShP32Lat { uint spl32[]; };
layout(std430, binding = 9) readonly buffer ShW16Lat { uint16_t swl16[]; };
layout(std430, binding = 10) readonly buffer ShP16Lat { uint16_t spl16[]; };
uvec4 iq_u4(uint mi, uint i) { return mi == 0 ? wu4[i] : mi == 1 ? pu4[i] : mi == 2 ? sw4[i] : sp4[i]; }
uvec2 iq_u2(uint mi, uint i) { return mi == 0 ? wl2[i] : mi == 1 ? pl2[i] : mi == 2 ? swl2[i] : spl2[i]; }
uint iq_u32(uint mi, uint i) { return mi == 0 ? wu32[i] : mi == 1 ? pu32[i] : mi == 2 ? swl32[i] : spl32[i]; }
uint iq_u16(uint mi, uint i) { return uint(mi == 0 ? wu16[i] : mi == 1 ? pl16[i] : mi == 2 ? swl16[i] : spl16[i]); }
float iq_f16(uint mi, uint i) { return mat_f16(mi, i); }
#include "iq_unit.glsl"
#endif
// LOAD_UNIT(A, MI) fills the caller's wq[i][A][j] (IQ4_XS: wx; with wd / wsc / wdk) for unit b. A
// macro, not a function with out parameters: those copy whole arrays in and out, and the plain
// variant's SPIR-V would differ from the kernel measured before the shared slot (this form is that
// kernel's, byte for byte past the header).
#if defined(IQ_UNIT)
// quarter b % 4 of super-block b / 4 (iq_unit.glsl)
#define LOAD_UNIT(A, MI) iq_load_unit(MI, b / 4, b % 4, nb, wq[i][A][j][0], wt[i][A][j], wd[i][A][j]);
#elif defined(QTYPE_IQ4_XS)
// sub-block b % 8 of super-block b / 8 (17 uvec2s: the head, then 2 per sub-block)
#define LOAD_UNIT(A, MI) { uint o = 17 * (b / 8), oq = o + 1 + 2 * (b % 8); \
    wx[i][A][j][0] = mat_u2(MI, o); wx[i][A][j][1] = mat_u2(MI, oq); wx[i][A][j][2] = mat_u2(MI, oq + 1); }
#elif defined(QTYPE_IQ4_NL)
// planar: block b's quants (uvec4 b), its f16 d at f16 8 nb + b
#define LOAD_UNIT(A, MI) { wq[i][A][j][0] = mat_u4(MI, b); wd[i][A][j] = mat_f16(MI, 8 * nb + b); }
#elif defined(QTYPE_MXFP4)
// planar: block b's quants (uvec4 b), its exponent byte at byte 16 nb + b
#define LOAD_UNIT(A, MI) { wq[i][A][j][0] = mat_u4(MI, b); wd[i][A][j] = mat_e8(MI, 16 * nb + b); }
#elif defined(QTYPE_Q6_K)
// quarter b % 4 of super-block b / 4 (planar, header): of half h, the l of 16 mm .. 16 mm + 15
#define LOAD_UNIT(A, MI) { uint ib = b / 4, h = (b / 2) % 2, mm = b % 2; \
    uint q0 = 12 * ib + 4 * h + mm, q1 = 12 * ib + 8 + 2 * h + mm, s32 = 48 * nb + 4 * ib + 2 * h; \
    wq[i][A][j][0] = mat_u4(MI, q0); wq[i][A][j][1] = mat_u4(MI, q0 + 2); wq[i][A][j][2] = mat_u4(MI, q1); \
    wsc[i][A][j] = uvec2(mat_u32(MI, s32), mat_u32(MI, s32 + 1)); wdk[i][A][j] = mat_f16(MI, 104 * nb + ib); }
#elif defined(QTYPE_Q5_K)
// quarter b % 4 of super-block b / 4 (176 bytes: 11 uvec4s, the head, 2 of high bits, the quants)
#define LOAD_UNIT(A, MI) { uint o0 = 11 * (b / 4), o1 = o0 + 3 + 2 * (b % 4); \
    wq[i][A][j][3] = mat_u4(MI, o0 + 1); wq[i][A][j][4] = mat_u4(MI, o0 + 2); \
    wq[i][A][j][0] = mat_u4(MI, o0); wq[i][A][j][1] = mat_u4(MI, o1); wq[i][A][j][2] = mat_u4(MI, o1 + 1); }
#elif defined(KUNIT)
// quarter b % 4 of super-block b / 4 (Q4_K 144 bytes: 9 uvec4s, the head first)
#define LOAD_UNIT(A, MI) { uint o0 = 9 * (b / 4), o1 = o0 + 1 + 2 * (b % 4); \
    wq[i][A][j][0] = mat_u4(MI, o0); wq[i][A][j][1] = mat_u4(MI, o1); wq[i][A][j][2] = mat_u4(MI, o1 + 1); }
#endif

void main() {
    if (RWAIT) wait_for_producer();   // the route is the producer's (header)
    q_chunk_blocks = p.n_exp * p.rows * (p.cols / QK);
    uint S = gl_SubgroupSize, lane = gl_SubgroupInvocationID, sg = gl_SubgroupID;
    uint G = S / TPR, g = lane / TPR, c = lane % TPR;
    uint t, s, r0, rsub = 0;   // rsub (SUM): the subgroup's first row within the workgroup's
    if (SUM) {
        uint sps = gl_NumSubgroups / p.n_used;   // subgroups per slot (header)
        t = gl_WorkGroupID.y;
        s = sg / sps;
        rsub = (sg % sps) * G * RJ;
        r0 = gl_WorkGroupID.x * p.rows_per_wg + rsub;
    } else {
        t = gl_WorkGroupID.y / p.n_used;
        s = gl_WorkGroupID.y % p.n_used;
        r0 = gl_WorkGroupID.x * p.rows_per_wg + sg * G * RJ;
    }
    uint rbase = t * 2 * p.n_used;
    uint e = floatBitsToUint(RWAIT ? routec[rbase + s] : route[rbase + s]);
#if defined(QPRELOAD) && defined(SHEXP_SLOT)
    bool sh = SHEXP && s == p.n_used - 1;   // the shared expert's slot (uniform per subgroup)
#else
    const bool sh = false;
#endif
    uint rows_s = sh ? p.sh_rows : p.rows, cols_s = sh ? p.sh_cols : p.cols;
    bool mine = s < p.n_used && (sh || (e >= p.e0 && e < p.e0 + p.n_exp)) && r0 < rows_s;   // uniform per subgroup
    // per token: the routed slots' rows (rows of output or cols of input each), then the shared one's
    uint tok_out = SHEXP ? (p.n_used - 1) * p.rows + p.sh_rows : p.n_used * p.rows;
    uint tok_in = SHEXP ? (p.n_used - 1) * p.cols + p.sh_cols : p.n_used * p.cols;
    uint xoff4 = (XSLOT ? t * tok_in + s * p.cols : t * p.cols) / 4;
    uint n_units = cols_s / UNIT_W;

    float acc[NM][RJ], ss = 0.0;
    [[unroll]] for (uint m = 0; m < NM; ++m)
        [[unroll]] for (uint j = 0; j < RJ; ++j) acc[m][j] = 0.0;
    uint wrow[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j)
        wrow[j] = (sh ? 0 : (e - p.e0) * p.rows) + min(r0 + g + G * j, rows_s - 1);

    if (XFIRST) {   // x (and the norm's weights) before the weight loads (header)
        [[unroll]] for (uint i = 0; i < XPRE; ++i) {
            uint k = gl_LocalInvocationIndex + gl_WorkGroupSize.x * i;
            if (k < p.cols / 4) {
                xpre[i] = x4[xoff4 + k];
                if (NORM) npre[i] = nw4[k];
            }
        }
    }
#if defined(QPRELOAD)
    // every weight load first (header), then (WAIT) the producer, then the arithmetic
#if defined(QTYPE_IQ4_XS)
    uvec2 wx[C][NM][RJ][3];   // the head, the sub-block's quant bytes
#elif defined(IQ_UNIT)
    uvec4 wq[C][NM][RJ][1], wt[C][NM][RJ];   // iq_unit.glsl's q and t
#else
    uvec4 wq[C][NM][RJ][NQ];
#endif
#if defined(QPLANAR) || defined(QTYPE_IQ4_NL) || defined(QTYPE_MXFP4) || defined(IQ_UNIT)
    float wd[C][NM][RJ];
#elif defined(QTYPE_Q6_K)
    uvec2 wsc[C][NM][RJ];   // the half's 8 scale bytes
    float wdk[C][NM][RJ];
#endif
    if (mine) {
        [[unroll]] for (uint i = 0; i < C; ++i) {
            uint u = min(c + TPR * i, n_units - 1);
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint b = wrow[j] * n_units + u;
#if !defined(QPLANAR)
#if defined(QTYPE_Q6_K) || defined(QTYPE_IQ4_NL) || defined(QTYPE_MXFP4) || defined(IQ_UNIT)
                // the planar types' planes are sized by the blocks of the chunk, or of the shared matrix
                uint nb = sh ? p.sh_rows * (cols_s / QK) : q_chunk_blocks;
#endif
                if (sh) {
                    LOAD_UNIT(0, 2);
                    if (PAIR) LOAD_UNIT(NM - 1, 3);
                } else {
                    LOAD_UNIT(0, 0);
                    if (PAIR) LOAD_UNIT(NM - 1, 1);
                }
#else
                if (sh) {   // the shared expert's matrices: one expert, planes of its own size
                    uint sd = QD_PLANE * p.sh_rows * n_units;
                    [[unroll]] for (uint k = 0; k < NQ; ++k) wq[i][0][j][k] = sw4[NQ * b + k];
                    wd[i][0][j] = float(swf16[sd + b]);
                    if (PAIR) {
                        [[unroll]] for (uint k = 0; k < NQ; ++k) wq[i][NM - 1][j][k] = sp4[NQ * b + k];
                        wd[i][NM - 1][j] = float(spf16[sd + b]);
                    }
                } else {
                    [[unroll]] for (uint k = 0; k < NQ; ++k) wq[i][0][j][k] = wu4[NQ * b + k];
                    wd[i][0][j] = block_scale(b);
                    if (PAIR) {
                        [[unroll]] for (uint k = 0; k < NQ; ++k) wq[i][NM - 1][j][k] = pu4[NQ * b + k];
                        wd[i][NM - 1][j] = float(pf16[QD_PLANE * q_chunk_blocks + b]);
                    }
                }
#endif
            }
        }
    }
#endif
#if defined(KV_PAIRS)
    for (uint i = gl_LocalInvocationIndex; i < 256u; i += gl_WorkGroupSize.x)
        kv_pair[i] = vec2(kv_lookup(KV_IQ4NL, i & 15u), kv_lookup(KV_IQ4NL, i >> 4));
    barrier();
#endif
#if defined(IQ_UNIT)
    iq_tables_fill(gl_LocalInvocationIndex, gl_WorkGroupSize.x);
    barrier();
#endif
    if (WAIT && !RWAIT) wait_for_producer();
    float ss_all = 0.0;
    if (XS > 0) ss_all = stage_x(SLOT_ROWS ? t * tok_in / 4 : xoff4, (SLOT_ROWS ? tok_in : p.cols) / 4);
    uint xs4 = SLOT_ROWS ? s * p.cols / 4 : 0;
    if (mine) {
#if defined(IQ_UNIT)
        [[unroll]] for (uint i = 0; i < C; ++i) {
            uint u = c + TPR * i;
            if (u < n_units) {
                // sub-blocks 2q and 2q + 1 of the quarter: x' units 2u and 2u + 1 (32 weights each)
                vec4 xv[2][8];
                xunit(xoff4, xs4, 2 * u, ss, xv[0]);
                xunit(xoff4, xs4, 2 * u + 1, ss, xv[1]);
                [[unroll]] for (uint m = 0; m < NM; ++m) {
                    [[unroll]] for (uint j = 0; j < RJ; ++j) {
                        float tot = 0.0;
                        [[unroll]] for (uint sb = 0; sb < 2; ++sb) {
                            [[unroll]] for (uint h = 0; h < 2; ++h) {   // 16 weights: IQ2_XS's and IQ2_S's scales
                                float t = 0.0;
                                [[unroll]] for (uint l = 2 * h; l < 2 * h + 2; ++l) {
                                    uint lo, hi;
                                    iq_group(wq[i][m][j][0], wt[i][m][j], sb, l, lo, hi);
                                    t += dot(sbytes_fma(lo), xv[sb][2 * l]) + dot(sbytes_fma(hi), xv[sb][2 * l + 1]);
                                }
                                tot += iq_scale(wq[i][m][j][0], wt[i][m][j], sb, h) * t;
                            }
                        }
                        acc[m][j] += wd[i][m][j] * tot;
                    }
                }
            }
        }
#elif defined(QTYPE_IQ4_XS)
        [[unroll]] for (uint i = 0; i < C; ++i) {
            uint u = c + TPR * i;
            if (u < n_units) {
                vec4 xv[8];
                xunit(xoff4, xs4, u, ss, xv);
                const uint s = u % 8;
                [[unroll]] for (uint m = 0; m < NM; ++m) {
                    [[unroll]] for (uint j = 0; j < RJ; ++j) {
                        uvec2 hd = wx[i][m][j][0];
                        uint ls = ((hd.y >> (4 * s)) & 0xFu) | (((hd.x >> (16 + 2 * s)) & 3u) << 4);
                        float t = 0.0;
                        [[unroll]] for (uint k = 0; k < 4; ++k) {
                            uint w = wx[i][m][j][1 + k / 2][k % 2];
                            t += kv_pair_dot(w, xv[k], xv[4 + k]);
                        }
                        acc[m][j] += half_bits(hd.x) * float(int(ls) - 32) * t;
                    }
                }
            }
        }
#elif defined(QTYPE_IQ4_NL) || defined(QTYPE_MXFP4)
        [[unroll]] for (uint i = 0; i < C; ++i) {
            uint u = c + TPR * i;
            if (u < n_units) {
                vec4 xv[8];
                xunit(xoff4, xs4, u, ss, xv);
                [[unroll]] for (uint m = 0; m < NM; ++m) {
                    [[unroll]] for (uint j = 0; j < RJ; ++j) {
                        float t = 0.0;
                        [[unroll]] for (uint k = 0; k < 4; ++k) {
                            uint w = wq[i][m][j][0][k];
#if defined(QTYPE_MXFP4)
                            t += e2m1_dot(w, xv[k], xv[4 + k]);
#else
                            t += kv_pair_dot(w, xv[k], xv[4 + k]);
#endif
                        }
#if defined(QTYPE_MXFP4)
                        t *= 32768.0;   // 2^15: the doubled table's scale (e2m1_dot)
#endif
                        acc[m][j] += wd[i][m][j] * t;
                    }
                }
            }
        }
#elif defined(QTYPE_Q6_K)
        [[unroll]] for (uint i = 0; i < C; ++i) {
            uint u = c + TPR * i;
            if (u < n_units) {
                // of half h, run r's vec4s 4 mm .. 4 mm + 3: x' unit 8 (u / 4) + 4h + r
                uint h = (u / 2) % 2, mm = u % 2, u0 = 8 * (u / 4) + 4 * h;
                vec4 xr[4][4];
                [[unroll]] for (uint r = 0; r < 4; ++r)
                    [[unroll]] for (uint w = 0; w < 4; ++w) xr[r][w] = xvec4(xoff4, xs4, u0 + r, 4 * mm + w, ss);
                [[unroll]] for (uint m = 0; m < NM; ++m) {
                    [[unroll]] for (uint j = 0; j < RJ; ++j) {
                        float tot = 0.0;
                        [[unroll]] for (uint r = 0; r < 4; ++r) {
                            float t = 0.0;
                            [[unroll]] for (uint w = 0; w < 4; ++w) {
                                uint q = ((wq[i][m][j][r % 2][w] >> (4u * (r / 2))) & 0x0F0F0F0Fu)
                                       | (((wq[i][m][j][2][w] >> (2u * r)) & 0x03030303u) << 4);
                                t += dot(ubytes_fast(q) - 32.0, xr[r][w]);
                            }
                            const uint sb = 2 * r + mm;   // the run's int8 scale
                            tot += float(bitfieldExtract(int(wsc[i][m][j][sb / 4]), int(8 * (sb % 4)), 8)) * t;
                        }
                        acc[m][j] += wdk[i][m][j] * tot;
                    }
                }
            }
        }
#elif defined(KUNIT)
        [[unroll]] for (uint i = 0; i < C; ++i) {
            uint u = c + TPR * i;
            if (u < n_units) {
                // sub-blocks 2q and 2q + 1 of the quarter: x' units 2u and 2u + 1 (32 weights each)
                vec4 xv[8], xw[8];
                xunit(xoff4, xs4, 2 * u, ss, xv);
                xunit(xoff4, xs4, 2 * u + 1, ss, xw);
                float s0 = 0.0, s1 = 0.0;   // the sub-blocks' sums of x' (their mins' terms)
                [[unroll]] for (uint k = 0; k < 8; ++k) { s0 += dot(xv[k], vec4(1.0)); s1 += dot(xw[k], vec4(1.0)); }
                [[unroll]] for (uint m = 0; m < NM; ++m) {
                    [[unroll]] for (uint j = 0; j < RJ; ++j) {
                        vec2 dl, ml;
                        q4k_quarter_scales(wq[i][m][j][0], u % 4, dl, ml);
                        float t0 = 0.0, t1 = 0.0;
                        [[unroll]] for (uint k = 0; k < 8; ++k) {
                            vec4 lo, hi;
#if defined(QTYPE_Q5_K)
                            uint wqs = wq[i][m][j][1 + k / 4][k % 4], wh = wq[i][m][j][3 + k / 4][k % 4] >> (2u * (u % 4));
                            lo = ubytes_fast((wqs & 0x0F0F0F0Fu) | ((wh & 0x01010101u) << 4));
                            hi = ubytes_fast(((wqs >> 4) & 0x0F0F0F0Fu) | (((wh >> 1) & 0x01010101u) << 4));
#else
                            nib_fma(wq[i][m][j][1 + k / 4][k % 4], 0.0, lo, hi);
#endif
                            t0 += dot(lo, xv[k]);
                            t1 += dot(hi, xw[k]);
                        }
                        acc[m][j] += dl.x * t0 + dl.y * t1 - ml.x * s0 - ml.y * s1;
                    }
                }
            }
        }
#elif defined(QPLANAR)
        [[unroll]] for (uint i = 0; i < C; ++i) {
            uint u = c + TPR * i;
            if (u < n_units) {
                vec4 xv[8];
                xunit(xoff4, xs4, u, ss, xv);
                [[unroll]] for (uint m = 0; m < NM; ++m) {
                    [[unroll]] for (uint j = 0; j < RJ; ++j) {
                        float tq = 0.0;
                        [[unroll]] for (uint w = 0; w < 4; ++w) {
                            vec4 a, cc;
#if defined(QTYPE_Q4_0)
                            nib_fma(wq[i][m][j][0][w], 8.0, a, cc);
#else
                            a = sbytes_fma(wq[i][m][j][0][w]);
                            cc = sbytes_fma(wq[i][m][j][1][w]);
#endif
                            tq += dot(a, xv[w]) + dot(cc, xv[4 + w]);
                        }
                        acc[m][j] += wd[i][m][j] * tq;
                    }
                }
            }
        }
#elif defined(QFLOAT)
        for (uint u = c; u < n_units; u += TPR) {
            vec4 xv[8];
            xunit(xoff4, xs4, u, ss, xv);
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint base = wrow[j] * p.cols + 32 * u;
                [[unroll]] for (uint k = 0; k < 8; ++k) {
                    uint o = base + 4 * k;
                    acc[0][j] += dot(vec4(wfloat(o), wfloat(o + 1), wfloat(o + 2), wfloat(o + 3)), xv[k]);
                }
            }
        }
#else
        for (uint u = c; u < n_units; u += TPR) {
            vec4 xv[8];
            xunit(xoff4, xs4, u, ss, xv);
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                vec4 w[8];
                dequant_unit(wrow[j], u, p.cols, w);
                [[unroll]] for (uint k = 0; k < 8; ++k) acc[0][j] += dot(w[k], xv[k]);
            }
        }
#endif
    }
    float scale = 1.0;
    if (NORM) scale = inversesqrt((XS > 0 ? ss_all : lanes_sum(ss)) / float(p.cols) + p.eps);
    [[unroll]] for (uint m = 0; m < NM; ++m)
        [[unroll]] for (uint j = 0; j < RJ; ++j) acc[m][j] = lanes_sum(acc[m][j]) * scale;

    if (SUM) {
        // each slot's rows to shared memory (0 where this chunk lacks its expert), then per row the
        // weighted slots in order and the residual
        float wt = s < p.n_used ? (RWAIT ? routec[rbase + p.n_used + s] : route[rbase + p.n_used + s]) : 0.0;
        if (c == 0) {
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint row = r0 + g + G * j;
                float v = acc[0][j];
                if (BIAS && mine && row < p.rows) v += bias_w[e * p.rows + row];
                red[s * p.rows_per_wg + rsub + g + G * j] = mine ? v * wt : 0.0;
            }
        }
        barrier();
        uint rw = r0 - rsub;   // the workgroup's first row
        for (uint i = gl_LocalInvocationIndex; i < p.rows_per_wg && rw + i < p.rows; i += gl_WorkGroupSize.x) {
            float v = 0.0;
            for (uint k = 0; k < p.n_used; ++k) v += red[k * p.rows_per_wg + i];
            uint o = t * p.rows + rw + i;
            if (RESID) v += WAIT ? residc[o] : resid[o];
            y[o] = v;
        }
    } else if (mine && c == 0) {
        [[unroll]] for (uint j = 0; j < RJ; ++j) {
            uint row = r0 + g + G * j;
            if (row < rows_s) {
                float v = acc[0][j];
                if (BIAS) v += bias_w[e * p.rows + row];
                if (PAIR && OAI) {
                    float gv = min(v, p.limit), uv = acc[NM - 1][j] + (BIAS ? bias_p[e * p.rows + row] : 0.0);
                    v = gv / (1.0 + exp(min(-p.alpha * gv, 80.0))) * (clamp(uv, -p.limit, p.limit) + 1.0);
                } else if (PAIR) {
                    v = v / (1.0 + exp(min(-v, 80.0))) * (acc[NM - 1][j] + (BIAS ? bias_p[e * p.rows + row] : 0.0));
                }
                uint o = t * tok_out + s * p.rows + row;
                if (RESID) v += WAIT ? residc[o] : resid[o];
                y[o] = v;
            }
        }
    }
    if (SIGNAL) {   // every store of this workgroup visible, then one count
        memoryBarrierBuffer();
        barrier();
        if (gl_LocalInvocationIndex == 0) atomicAdd(chain[p.signal_slot], 1u);
    }
}
