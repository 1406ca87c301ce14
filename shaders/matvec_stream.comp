#version 450
#include "common.glsl"
#extension GL_EXT_control_flow_attributes : require
// Decode matrix-vector product for one token, shaped like a pure streaming read of W:
//
//   y[y_off + r] = resid[y_off + r] + bias[y_off + r] + s * sum_c W[r, c] * x'[c]
//
// with the fused inputs of matvec.comp (read its header): x' = x * nw and s = 1/rms(x) when NORM,
// x' = silu(x) * up when GLU, RESID adds the residual.
//
// Why another matrix-vector kernel: on an H100 a dependent chain of pure reads (one 16-byte load per
// lane per step, every load of a workgroup issued at once, barrier between dispatches) moves a 9.4 MB
// matrix in 7.0 us and a 33 MB one in 14.9 us; matvec.comp takes 11.9 and 23.8, matvec_wide.comp
// (which stages x step by step, between barriers) is no better. So this kernel keeps exactly the read
// shape: every lane issues ALL its weight loads first (C x RJ units, 16-byte loads, neighbouring lanes
// on neighbouring units of one row: a subgroup's load instruction reads 512 contiguous bytes), and
// only then stages x into shared memory -- while those loads are in flight -- and does the arithmetic
// from registers.
//
// Work split (units: Q4_0 / Q8_0 / Q4_1 / Q5_0 / Q5_1 / IQ4_NL / MXFP4 one 32-weight block; Q4_K,
// Q5_K, Q6_K and the lattice types a quarter of a super-block, 64 weights; IQ4_XS and TQ2_0 half a
// super-block, 128 weights; TQ1_0 a whole one; Q3_K, Q2_K a whole one, or half of one with
// HALF_BLOCK: see those types below):
//   TPR lanes per row (a power of two dividing the workgroup; fewer than a subgroup's lanes where
//   rows or their column parts are short), G = WG / TPR row groups (<= 64, RJ <= TPR);
//   lane (g, c) takes units c + TPR * i (i < C) of rows g + G * j (j < RJ); a workgroup covers G * RJ
//   consecutive rows. All of a lane's rows share its units' x (loaded once from shared memory per i).
// x staging: for i < C, the x of units [TPR i, TPR (i + 1)) goes to shared memory (TPR * UNIT values,
// within the device's shared memory: matmul.stream_split), coalesced, with NORM / GLU applied; a lane's vec4 k of unit v sits at slot
// k ^ (v & 7) so that 8 neighbouring lanes reading the same k hit different banks. The NORM sum of
// squares comes from the staging threads and is summed over the workgroup.
// Reduction: subgroupAdd, then across the TPR / subgroup-size subgroups of a row group.
//
// DOT8 (variant *_dp; devices with fast 4x8-bit integer dot products): the arithmetic per weight is
// what bounds the f32 form once the loads stream (an H100 spends as long multiplying a Q4_0 matrix
// as reading it), so x is staged as integers instead: per 32 values, s = max|x| / 127,
// xh = round(x / s) and xl = round((x - s xh) / (s / 254)), both int8; then
// sum q x = s sum q xh + (s / 254) sum q xl, each sum 4 products per OpSDot instruction. The two levels
// keep x to 1 / 64516 of its block's largest value (one int8 level alone loses ~1% of the result).
// Offsets and mins use the exact f32 block sums of x. Word w of a unit's xh / xl holds elements 4w..4w+3.
//
// PAIR (the FFN's gate and up products as one dispatch): binding 7 holds a second matrix P of W's type
// and shape (up), and y[r] = silu(s W[r] . x') * (s P[r] . x'). A lane's first RJ / 2 rows come from
// W, the other RJ / 2 are the same rows of P, so a workgroup writes G * RJ / 2 rows. The down product
// then reads one plain vector instead of staging silu(gate) * up from two.
//
// KSPLIT > 1 (long rows, the FFN down product): the row's units are cut into KSPLIT equal parts, one
// workgroup per (row block, part), so that each stages and reads only its part of x -- a 14336-wide
// row then behaves like the well-streaming 4096-wide ones instead of a few large workgroups per SM.
// Every part but the last stores its partial sums to binding 8 ([KSPLIT][rows], PAIR: then P's) and
// is done. The last part's workgroup reads them until none is the sentinel (SENTINEL, what the buffer
// holds between runs), adds them in order and then its own (the result does not depend on timing),
// puts the sentinels back, applies PAIR's silu, adds bias and residual and writes y. Each sum is one
// 32-bit store that is read whole, so it is its own ready flag: no fence, no counter. (Before: every
// part fenced its stores and counted itself done on an atomic counter, the last to count merged:
// two round trips to L2 per workgroup. 7.2B tg128 on an H100: Q8_0 +3.5%, Q4_K +2%.) The wait cannot
// deadlock: workgroups start in index order, and the last part's partners have lower indices and
// wait for nothing. NORM: every part sums the squares of the whole row.
// PHASE (KSPLIT > 1, where a workgroup cannot wait for another: the host picks it): 0, every part in
// one dispatch as above; 1, parts 0 .. KSPLIT - 2 only (KSPLIT - 1 workgroups per row block); 2, the
// last part only (one per row block), recorded after phase 1 behind a barrier, so its merge finds
// every sum at its first read. Why: llvmpipe ends a shader invocation's loops after 65535 iterations
// in all (LP_MAX_TGSI_LOOP_ITERATIONS, one counter over every loop) -- no hang, but a last part whose
// partners are still running leaves the wait with sentinels as sums (NaN rows), and the partners'
// later stores stay in the scratch for the next product to merge.
// Benchmark only (examples/bench_matvec.py): NO_X skips the x staging (x left as it is in shared
// memory), READ_ONLY also the arithmetic (the loaded words are xor-ed): what the rest costs.
//
// ROPE (the Q/K/V products of a one-token step, llama's RoPE of adjacent pairs, no frequency table):
// the products write what rope_kv.comp would, so that dispatch and its stage go: 1 (Q) y = rotated
// rows, 2 (K) the KV cache (binding 10) row n_past = f16(rotated rows), 3 (V) that row = f16(rows).
// Rows 2i and 2i + 1 sit in lanes tid and tid ^ 1 of one subgroup (G even: the host checks it), so
// the rotation is one shuffle. Bias before the rotation, as in the graph. Positions past n_ctx write
// nothing (as rope_kv.comp).
// STEPS > 1 (C == 1: the host checks it): each workgroup takes STEPS row blocks, b, b + B, b + 2B,...
// (B = workgroups per part), staging x once for all of them, and issues the next block's weight loads
// right after this block's arithmetic, so that they are in flight during its reduction and writes.
// Why: staging x (reading it, the norm, quantising) costs 18-25% of a product when every 16-row
// block does it again, and a block's reduction otherwise leaves its workgroup without loads in flight.
// XFIRST: a lane loads its share of x's first chunk before its weights, and stages it from those
// registers. Why: a load waits behind the lane's earlier loads, so x staged after the weights arrives
// after them, and the whole workgroup waits at the staging barrier with nothing in flight. That is
// the cost of small workgroups that stage x once (the FFN down product's column parts: Q4_0 tg128 on
// the 7.2B, H100, +2.7% and +3.9% in two A/B runs); where the norm weights still wait behind the
// weights or steps amortise the staging (the NORM, ROPE and PAIR products), it loses.
// WAIT / SIGNAL (one-token steps on devices where workgroups start in submission order): stages
// chained without a pipeline barrier. A SIGNAL product's workgroups count themselves done on
// chain[p.signal_slot] once their stores are visible (every workgroup, parts and padding included);
// a WAIT product is recorded right after its producer without a barrier: every workgroup issues its
// first row block's weight loads, one lane polls chain[p.wait_slot] until it reaches p.wait_n, and
// only then are activations read (x, residual, up: through coherent, volatile aliases, since a
// read-only binding may be served by caches that never see other dispatches' writes, and without a
// barrier nothing invalidates them). Why: between barriers the GPU drains the producer's last
// workgroups and launches the next grid with DRAM idle; chained, the next product's weights are in
// flight meanwhile. The counters are zeroed at the start of every step (kernels/chain.py).
// Deadlock-free when the producer's workgroups all start before the product's (submission order).
// ROUTER (variants *_router; one-token steps of a mixture of experts, fusion.fuse_router_into_products):
// the product writing x (the output projection + residual) also computes the MoE router's choice from
// it, so the router's dispatch and its dependent stage go. The router's logits are linear in x:
//   logit_e = (sum_c Wr[e, c] nw[c] x[c]) / rms(x)      (nw: the FFN norm's weights; RNORM)
// so every workgroup that writes final rows of x (the last column part's) adds, per row block, its
// rows' terms for every expert and the rows' sum of squares (column RNE + RSH of the partials), over
// its row blocks, and stores them to binding 18 ([workgroup][columns]); the workgroup that counts
// itself done last on binding 19 (count and continue: no workgroup waits) adds the workgroups' partials
// in a fixed order (the route does not depend on timing; RLOADS loads in flight per thread), picks the
// experts in moe_router.comp's order and writes the route row to binding 20, and puts the count back
// to 0. RTAIL 1 (LLAMAVK_ROUTER_TAIL=rank) picks with every thread at once: each expert's rank among the 32 of its
// group, the RNU best of each group candidates, each candidate's rank among them (its rank among all
// experts), the softmax over the chosen only (renormalized: exp(l - top) / their sum, the same
// weights as the softmax over all then renormalized, but for rounding; ranked by logits, not by
// their exp: rounding can tie two exps the logits do not). Meant to shorten the last workgroup's
// serial tail that every later stage waits for; the host asks for RTAIL 0 (kernels/moe.py), the pick
// of moe_router.comp by one subgroup (a softmax over every expert, then RNU dependent rounds of two
// subgroup reductions each), because RTAIL 1 measured slower on an H100 (docs/PERFORMANCE.md, Tried).
// RSH: qwen35moe's shared-expert gate sigmoid(w_shexp . x') (binding 21) as slot RNU (moe_router.comp
// SHEXP). Bindings 16 Wr (f32, [RNE][rows of the whole matrix]), 17 nw. A thread's router weights of a
// row block (RK x RROWS registers) are loaded ahead: REARLY, the first block's with its matrix loads
// and each next block's after this block's terms (in flight during the next block's arithmetic);
// RAHEAD, every row block's of the workgroup (STEPS x RK x RROWS registers) with the first block's
// matrix loads, so that with WAIT they are in flight while the producer runs and no block waits for
// them (the last block's otherwise arrive after its arithmetic, on every workgroup's critical path);
// else each block's after its arithmetic, in flight during its reduction (fewer registers held
// during the products' loads). nw comes with the bias and residual.
// Q6_K (planar, llamavk/kernels/__init__.py PLANES: per chunk of n super-blocks, every block's ql +
// qh (192 bytes = 12 uvec4s), then every block's 16 int8 scales (one uvec4), then every d (f16)). Why
// planar: a 210-byte block is 2 mod 16 bytes long, so in the GGUF layout its fields sit at 2-byte
// alignment in every other block, and no choice of unit or lanes per row gives aligned 16-byte loads:
// the kept layout costs either narrow loads or (the form before this one) aligned uvec4s around each
// run shifted into place in the arithmetic (up to 14 bytes more per run, selects and 16-bit funnels
// per word, 36 registers per row for 128 weights: ~1.1 TB/s on an H100 where Q5_K streams 1.57).
// Planar, every load is an aligned one of exactly the bytes used, and the unit can be Q5_K's size;
// every other Q6_K kernel reads the planes too (quants.glsl, dequant_f16.comp, matmul_cm2.comp).
// A unit is a quarter of a super-block, 64 weights: of half h (elements 128h + 32r + l, runs r < 4,
// l < 32), the l of 16m .. 16m + 15 (m < 2) of every run: ql bytes 64h + 16m and 64h + 32 + 16m
// (uvec4s 4h + m and 4h + 2 + m of the block: runs 0, 2 as low and high nibbles of the first, 1, 3 of
// the second), qh bytes 128 + 32h + 16m (uvec4 8 + 2h + m: run r's 2 high bits at bits 2r), the 8
// scale bytes of half h (a uvec2: run r's scale is byte 2r + m) and d (16 bits): 3 uvec4s and 2 small
// loads, as Q5_K's 5, 15 registers per row. A quarter of bytes 0..63 (runs 0, 2 in full) would need
// all 32 qh bytes of the half for 16 used (4 uvec4s). Its x is not contiguous: the 64 values are 4
// runs of 16, so the staging puts x element 4k of a chunk (whole halves: TPR is even, parts hold an
// even number of units) into unit 2 (4k / 128) + (4k % 32) / 16, at vec4 4r + (4k % 16) / 4; DOT8
// scales x per 16 values (one run: XG) instead of 32. Element 4w .. 4w + 3 of run r: word w of the
// ql uvec4 r % 2 >> 4 (r / 2), high bits of qh word w >> 2r; weight d * scale[8h + 2r + m] * (q - 32),
// q - 32 as a signed byte in the DOT8 sums.
// Q6K_HALF (kernels stream_h, stream_dp_h: the form before the quarter, for A/B): a unit is half h
// of a super-block (128 weights): its 4 ql uvec4s, 2 qh uvec4s, the 8 scale bytes and d; element 32k
// + l: low 4 bits in ql byte 32 (k % 2) + l >> 4 (k / 2), high 2 bits in qh byte l >> 2k.
// Q5_K (176-byte super-blocks = 11 uvec4s, so every block is 16-byte aligned): a unit is a quarter
// q of a super-block, as Q4_K's (64 weights, sub-blocks 2q and 2q + 1, the head's 6-bit scales and
// mins decoded by q4k_quarter_scales): the head (uvec4 0), the quarter's 32 qs bytes (uvec4s 3 + 2q,
// 4 + 2q) and all 32 qh bytes (uvec4s 1, 2: the quarter's bits 2q, 2q + 1 of every byte), 5 loads.
// The 4 lanes of a block load the same head and qh in one instruction (one transaction: DRAM reads
// each byte once); a half-block unit would issue 7 loads per 128 weights instead of 10, but hold
// 28 registers per row instead of 20, and the Q4_K code (register-lean DOT8 loop) would not apply.
// Element 32s + l: low 4 bits in qs byte 32 (s / 2) + l >> 4 (s % 2), bit 4 = qh byte l >> s;
// weight d sc[s] q - dmin m[s] (DOT8: the mins through the exact f32 sums of x, as Q4_K).
// Q3_K (110-byte super-blocks: a block starts at an even byte offset o = 110 b mod 16): a unit is a
// whole super-block (256 weights). Half a block would need all 32 hmask bytes, its 32 qs bytes and
// the 14 bytes of scales and d -- 78 of the 110 -- at three unaligned places: up to 8 aligned uvec4s
// for 128 weights; for the whole block the lane loads 7 aligned uvec4s for hmask and qs (bytes 0..95:
// o + 96 <= 112; none past the uvec4 holding byte 95, so none past the block's byte 109: at o = 0 the
// 7th would read 2 bytes past it, which past a buffer's end read as 0 or fault, so it repeats the
// 6th), the 12 scale bytes as 4 words (at byte 2 or 4 of them: never past byte 109) and d as a
// 16-bit word (its 32-bit word may end past the block), and only in the arithmetic shifts the words
// into place (selects of the word offset o / 4, a 16-bit funnel for o % 4 == 2). 16
// lanes cover a 4096-wide row. Neighbouring lanes take neighbouring blocks: a load instruction reads
// 16 bytes every 110, the 7 of them every hmask and qs byte once. Element 32s + l: 2 bits in qs byte
// 32 (s / 4) + l >> 2 (s % 4), bit 2 = hmask byte l >> s; weight d (sc[e / 16] - 32) (q - 4), q - 4
// as a signed byte in the DOT8 sums (the offset is the data's: no block sum of x needed).
// Q3_K HALF_BLOCK (variants *_half; kernels/matmul.py stream_half, stream_dp_half): a unit is half h
// of a super-block (128 weights: hmask bits 4h .. 4h + 3 of all 32 bytes, qs bytes 32h .. 32h + 31,
// scales g = 8h .. 8h + 7, d), so a 4096-wide row has 32 lanes and each lane's serial arithmetic per
// row is half the whole block's. The lane loads the 3 aligned uvec4s from the one holding hmask's
// first byte (never past the block's byte 47), the 3 from the one holding its qs run's first byte,
// none past the one holding the run's last (at h = 1, o = 0 the third would end 2 bytes past the
// block: it repeats the second, unused), the scales as 4 words and d as the whole block's: 6 uvec4s,
// 4 words and a 16-bit word per 128 weights (the 2 lanes of a block load the same hmask, scales and
// d in one instruction). The words go into place as the whole block's, then hmask and the scale
// words shift right by 4h, so that the whole block's q3k_word and q3k_scale read the unit as they
// read a block's first half. h rides in bit 0 of wo (o is even).
// Q2_K (stored planar: llamavk/kernels/__init__.py PLANES; per chunk every block's 64 qs bytes, then its
// 16 scale bytes, then its d and dmin): a unit is a whole super-block (its 4 qs uvec4s, the scales'
// uvec4 and the d, dmin word), or half h of one with HALF_BLOCK (variants *_half; kernels/matmul.py
// stream_half, stream_dp_half: 128 weights, elements 128h .. 128h + 127 -- qs bytes 32h .. 32h + 31,
// 2 uvec4s, scale bytes 8h .. 8h + 7, a uvec2, d and dmin), so that a 4096-wide row has 32 lanes and
// each lane's serial arithmetic per row is half the whole block's (which bound that form: ~0.56 TB/s
// on an H100, in the GGUF layout). Element 32s + l: 2 bits in qs byte 32 (s / 4) + l >> 2 (s % 4);
// scale byte e / 16: scale low nibble, min high; weight d sc q - dmin m. DOT8: the mins through the
// exact f32 sums of x's 16-value halves (xsd holds them beside each 32 values' scale and sum). (In
// the GGUF layout, 84-byte blocks at every 4-byte offset of a uvec4, the half form loaded 8 words and
// uvec4s around the run and picked its words by selects of the offset.)
// IQ4_NL, MXFP4 (stored planar as Q4_0: llamavk/kernels/__init__.py PLANAR): Q4_0's unit and loads;
// a weight is its block's scale times a 16-entry table's value at its nibble (quants.glsl: IQ4_NL's
// levels with the f16 d; MXFP4's E2M1 values doubled, int8 0 1 2 3 4 6 8 12 and negatives, with
// 2^(e - 128)), so DOT8 takes the table values as signed bytes (no offset term) and f32 converts
// those bytes. The lookup, per quant byte (two nibbles) from a 512-word shared table (kvt): 4 loads and
// ~10 integer operations per 8 weights (Q4_0: 2), the words as the lookups give them: DOT8's staging
// writes x in their order (stage()). Why not registers: the table as a uvec4 costs a select of the
// word, a shift and masks per weight (~8 operations; the base kernel's per-weight cost), and a
// byte-wise select tree over 4 weights at once 27. Shared loads of the 256-entry table meet a few bank
// conflicts per 32 lanes (random bytes); 16-entry tables, one per byte position (conflict-free, 8
// loads and 8 address computations a word), lost 2-9% on an H200: instructions bound these types.
// Q4_1, Q5_0, Q5_1 (stored planar: llamavk/kernels/__init__.py PLANAR; a block's head, the 4 / 6 / 8
// bytes before its quants, in the head plane): Q4_0's unit and uvec4 of quants, and the head: Q4_1
// one word (d, m), Q5_1 a uvec2 (d, m; qh), Q5_0 three 16-bit words (d, qh: 6-byte heads start at
// every even byte, so no wider load is aligned; a plane of qh words apart from the d plane would
// need a third plane in the upload, and the 16-bit loads of neighbouring lanes read one contiguous
// run anyway). Quants q = the nibble (Q5: | bit 4w + k of qh << 4), 0..31 as signed bytes the same;
// weight d q + m (Q4_1, Q5_1), d (q - 16) (Q5_0). DOT8: the min m and the offset -16 through the
// exact f32 block sum of x (as Q4_0's -8 and Q4_K's mins); the f32 form sums x per block for them.
// Q5's head costs a word or two more registers per unit, counted as Q4_0's (matmul.MATVEC_STREAM_NQ),
// so the rows are Q4_0's (7.2B tg128 on an H200: Q4_1 457, Q5_0 383, Q5_1 386 t/s against Q4_0's ~465).
// IQ4_XS (136-byte super-blocks: d, scales_h, scales_l[4], qs[128]; a block starts at o = 136 b mod
// 16, 0 or 8): a unit is half h of a super-block (128 weights, sub-blocks 4h .. 4h + 3, each as an
// IQ4_NL block: qs bytes 16s + l, low nibble element 32s + l, high 32s + 16 + l, through the same
// table; scale d (ls - 32) from the head's 6-bit fields). The lane loads the uvec4 holding the head
// (o = 0: with the first qs bytes), the 4 aligned uvec4s from the one holding the 64-byte qs run's
// first byte and the run's last 8 bytes as a uvec2 -- none past the block (a whole block of 9
// aligned uvec4s would read 8 bytes past it at o = 0; a 32-weight unit would load 3 times per 16 qs
// bytes): 6 loads per 128 weights, as Q4_K's 3 per 64; the run is in place at o = 8 and 2 words on
// at o = 0 (one select per word).
// The lattice types (IQ2_XXS, IQ3_XXS, IQ2_XS, IQ2_S, IQ3_S, IQ1_S, IQ1_M; stored planar but IQ1_M:
// llamavk/kernels/__init__.py PLANES, quants.glsl): a unit is a quarter super-block, 64 weights, its
// fields an aligned uvec4 or two uvec2s and a few words (wq[..][0], wt), its group's 8 weights two
// grid words from shared memory made signed bytes (iq_unit.glsl says how); DOT8 sums per 16 weights,
// each with its scale (x's 32-value scale holds for a sub-block).
// TQ2_0, TQ1_0 (the ternary types, stored planar: llamavk/kernels/__init__.py PLANES; weights d (q - 1),
// q in 0..2, the -1 through the exact f32 block sums of x): TQ2_0's unit is half h of a block (128
// weights, element 32k + l at bits 2k of byte l: the two uvec4s of its 32 qs bytes and d), TQ1_0's a
// whole block (the qs plane's 3 uvec4s, the qh word and d: base-3 digits, digit j of byte v
// (((v 3^j) mod 256) 3) >> 8, quants.glsl trit_bytes), whose 256 elements are digit j of qs bytes
// 0..31 (elements 32j + l, j < 5), of bytes 32..47 (160 + 16j + l) and of qh (240 + 4j + l): each
// word of x meets one word of digits.
// CLOCK (variants *_clock; the split timeline, llamavk/split/clock.py): binding 12 takes the device clock's
// low 32 bits (clockRealtime2x32EXT) per workgroup, atomically into stamps[8 * p.stamp_slot + 3..7]:
// earliest / latest entry, earliest / latest release of the wait (WAIT; else entry), latest end.
// Specialization: 0 WG, 1 NORM, 2 RESID, 3 GLU, 4 TPR, 5 C, 6 RJ, 7 PAIR, 8 KSPLIT, 9 ROPE, 10 STEPS,
// 11 XFIRST, 12 WAIT, 13 SIGNAL, 14 PHASE; ROUTER: 20 RNE, 21 RNU, 22 RSIG, 23 RRENORM, 24 RSCALE,
// 25 REPS, 26 RNORM, 27 RSH, 28 REARLY, 29 RTAIL, 30 RLOADS, 31 RAHEAD, 32 RBIAS (the router's bias,
// binding 22, added to each logit before the pick: gpt-oss), 33 RSELB (glm4moe: the serial pick ranks
// probability + a bias per expert, binding 23, and weighs by the probability; RTAIL 0 only), 34 RSH1
// (glm4moe's ungated shared expert: slot RNU with id RNE and weight 1, no gate column).
layout(local_size_x_id = 0) in;
layout(constant_id = 0) const uint WG = 512;
layout(constant_id = 1) const bool NORM = false;
layout(constant_id = 2) const bool RESID = false;
layout(constant_id = 3) const bool GLU = false;
layout(constant_id = 4) const uint TPR = 128;
layout(constant_id = 5) const uint C = 1;
layout(constant_id = 6) const uint RJ = 4;
layout(constant_id = 7) const bool PAIR = false;
layout(constant_id = 8) const uint KSPLIT = 1;
layout(constant_id = 9) const uint ROPE = 0;
layout(constant_id = 10) const uint STEPS = 1;
layout(constant_id = 11) const bool XFIRST = false;
layout(constant_id = 12) const bool WAIT = false;
layout(constant_id = 13) const bool SIGNAL = false;
layout(constant_id = 14) const uint PHASE = 0;
const uint RO = PAIR ? RJ / 2 : RJ;   // rows written per lane's row group
const uint WPB = PHASE == 0 ? KSPLIT : (PHASE == 1 ? KSPLIT - 1 : 1);   // workgroups per row block

#ifdef ROUTER
// ---- ROUTER: constants and buffers (header) ----
layout(constant_id = 20) const uint RNE = 8;          // experts
layout(constant_id = 21) const uint RNU = 2;          // experts chosen per token (<= 32)
layout(constant_id = 22) const bool RSIG = false;     // sigmoid of each logit (else softmax)
layout(constant_id = 23) const bool RRENORM = true;   // the chosen weights divided by their sum
layout(constant_id = 24) const float RSCALE = 1.0;    // and multiplied by this
layout(constant_id = 25) const float REPS = 1e-6;     // the FFN norm's epsilon
layout(constant_id = 26) const bool RNORM = true;     // the FFN norm folded in (else logits of x itself)
layout(constant_id = 27) const bool RSH = false;      // the shared expert's gate as slot RNU
layout(constant_id = 28) const bool REARLY = true;    // router weights loaded with the matrix's (header)
layout(constant_id = 29) const uint RTAIL = 1;        // the pick: 0 serial (one subgroup), 1 by ranks (header)
layout(constant_id = 30) const uint RLOADS = 8;       // partials' vec4 loads in flight per thread (1..16)
layout(constant_id = 31) const bool RAHEAD = false;   // every block's router weights loaded first (header)
layout(constant_id = 32) const bool RBIAS = false;    // the router's bias (binding 22) in each logit
layout(constant_id = 33) const bool RSELB = false;    // the pick's bias per expert (binding 23), RTAIL 0
layout(constant_id = 34) const bool RSH1 = false;     // a shared expert's slot of weight 1 (not with RSH)
const uint RNC = RNE + (RSH ? 1 : 0) + 1;             // partial columns: logits, gate, sum of squares
const uint RNC4 = (RNC + 3) / 4;                      // ... as vec4s (the host checks RNC4 <= WG)
const uint RK = (RNC + WG - 1) / WG;                  // columns per thread
const uint RGS = 32;                                  // RTAIL 1: experts per rank group
const uint RCG = RNU < RGS ? RNU : RGS;               // ... candidates a group gives
const uint RNCAND = ((RNE + RGS - 1) / RGS) * RCG;    // ... candidates in all
const uint RROWS = (WG / TPR) * RJ;                   // rows of a row block (no PAIR with ROUTER)
#define MAX_SUBGROUPS_R 64
layout(std430, binding = 16) readonly buffer RouterW { float rw[]; };
layout(std430, binding = 17) readonly buffer RouterNorm { float rnw[]; };
layout(std430, binding = 18) volatile coherent buffer RouterPart { float rpart[]; };   // [workgroup][RNC4 * 4]
layout(std430, binding = 18) volatile coherent buffer RouterPart4 { vec4 rpart4[]; };
layout(std430, binding = 19) volatile coherent buffer RouterCount { uint rcount[]; };  // 0 between runs
layout(std430, binding = 20) writeonly buffer Route { float route[]; };
layout(std430, binding = 21) readonly buffer RouterShexp { float rshw[]; };
layout(std430, binding = 22) readonly buffer RouterBias { float rbias[]; };
layout(std430, binding = 23) readonly buffer RouterSelBias { float rselb[]; };
shared vec4 rbuf[WG];          // a row block's x (.x), then the partials' slices
shared float rtot[RNC4 * 4];   // the summed columns, then the probabilities
shared uint rpick_id[RNU];
shared float rpick_w[RNU];
shared bool rlast;
shared float rsel[RSELB ? RNE : 1];              // RSELB: what the serial pick ranks
shared uint rkey[RTAIL == 1 ? RNE : 1];          // RTAIL 1: the experts' scores as ordered keys
shared uint rcand_key[RTAIL == 1 ? RNCAND : 1];  // ... the groups' candidates: key, expert
shared uint rcand_id[RTAIL == 1 ? RNCAND : 1];
shared float rsum[MAX_SUBGROUPS_R];              // ... a sum over the workgroup's subgroups
float racc[RK];                // this workgroup's partial of columns tid + WG k
const uint RSTEPS = RAHEAD ? STEPS : 1;
float rwv[RSTEPS][RK][RROWS];  // this thread's router weights of the current row block (RAHEAD: and the next ones')
#endif

#if defined(QTYPE_IQ2_XXS) || defined(QTYPE_IQ3_XXS) || defined(QTYPE_IQ2_XS) || defined(QTYPE_IQ2_S) || \
    defined(QTYPE_IQ3_S) || defined(QTYPE_IQ1_S) || defined(QTYPE_IQ1_M)
#define IQ_STREAM 1        // header: IQ2_XXS ...
#define IQ_GRID_SHARED 1   // quants.glsl's grid read from shared memory
#endif
#include "quants.glsl"
#extension GL_KHR_shader_subgroup_shuffle : require
#ifdef DOT8
// Integer dot products (SPV_KHR_integer_dot_product, through GL_EXT_spirv_intrinsics since the
// GLSL compiler at hand lacks GL_EXT_integer_dot_product): 4 int8 products summed per instruction.
#extension GL_EXT_spirv_intrinsics : require
spirv_instruction(extensions = ["SPV_KHR_integer_dot_product"], capabilities = [6019, 6018], id = 4450)
int dot_ss(uint a, uint b, spirv_literal int packed4x8);   // OpSDotKHR: signed x signed
#endif
layout(std430, binding = 1) readonly buffer X4 { vec4 x4[]; };
// WAIT: the activations through coherent aliases (header)
layout(std430, binding = 1) volatile coherent buffer X4c { vec4 x4c[]; };
layout(std430, binding = 5) volatile coherent buffer ResidC { float residc[]; };
layout(std430, binding = 6) volatile coherent buffer Up4c { vec4 up4c[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 4) readonly buffer NormW4 { vec4 nw4[]; };
layout(std430, binding = 5) readonly buffer Resid { float resid[]; };
layout(std430, binding = 6) readonly buffer Up4 { vec4 up4[]; };
layout(std430, binding = 7) readonly buffer PairU4 { uvec4 pu4[]; };      // PAIR: the up matrix
layout(std430, binding = 7) readonly buffer PairF16 { float16_t pf16[]; };
#if defined(QTYPE_Q6_K) || defined(QTYPE_Q3_K) || defined(QTYPE_Q2_K) || defined(QTYPE_Q4_1) || defined(QTYPE_Q5_0) || \
    defined(IQ_STREAM) || defined(QTYPE_TQ1_0)
layout(std430, binding = 7) readonly buffer PairU32 { uint pu32[]; };
layout(std430, binding = 7) readonly buffer PairU16 { uint16_t pu16[]; };
#endif
#if defined(QTYPE_MXFP4)
layout(std430, binding = 7) readonly buffer PairU8 { uint8_t pu8[]; };
#endif
// KSPLIT: written by one workgroup, polled by another of the same dispatch (volatile: every read goes
// to memory)
layout(std430, binding = 8) volatile coherent buffer Part { uint part[]; };   // [PAIR + 1][KSPLIT][y_stride]
layout(std430, binding = 9) readonly buffer Step { uint step[]; };      // ROPE: [n_past, n_tokens, n_kv, sync_base, seq_len]
layout(std430, binding = 10) writeonly buffer KVC { float16_t kvc[]; }; // ROPE 2, 3: the K or V cache
layout(std430, binding = 11) volatile coherent buffer Chain { uint chain[]; };   // WAIT / SIGNAL: counters
layout(push_constant) uniform Push {
    uint n_rows;       // rows of this chunk
    uint cols;
    uint y_stride;     // rows of the whole matrix
    uint y_off;        // first row of this chunk in the whole matrix
    uint has_bias;
    uint rows_per_wg;  // G * RJ
    float eps;
    // ROPE (the names rope_common.glsl reads)
    uint head_dim; uint rope_dim; uint neox; uint n_ctx;
    float log2_theta_scale; float freq_scale; float ext_factor; float attn_factor; float corr_low; float corr_high;
    uint wait_slot;    // WAIT: the producer's counter
    uint wait_n;       // WAIT: its workgroups
    uint signal_slot;  // SIGNAL: this product's counter
#ifdef CLOCK
    uint stamp_slot;   // CLOCK: this product's stamps (header)
#endif
} p;
#ifdef CLOCK
#extension GL_EXT_shader_realtime_clock : require
layout(std430, binding = 12) buffer Stamps { uint stamps[]; };
uint clock_release;    // lane 0: when the wait was met
#endif
#include "rope_common.glsl"

#if defined(QTYPE_Q4_0)
#define UNIT 32     // weights per unit
#define NQ 1        // uvec4 loads per unit
#elif defined(QTYPE_Q8_0)
#define UNIT 32
#define NQ 2
#elif defined(QTYPE_Q4_K)
#define UNIT 64
#define NQ 3
#elif defined(QTYPE_Q5_K)
#define UNIT 64
#define NQ 5        // head, qs 2, qh 2 (header: Q5_K)
#elif defined(QTYPE_Q6_K) && defined(Q6K_HALF)
#define UNIT 128    // half a super-block (header: Q6_K, stream_h)
#define NQ 6        // ql 4, qh 2 (the scales and d: wt below)
layout(std430, binding = W_BINDING) readonly buffer WeightU2 { uvec2 wu2[]; };
layout(std430, binding = 7) readonly buffer PairU2 { uvec2 pu2[]; };
#elif defined(QTYPE_Q6_K)
#define UNIT 64     // a quarter of a super-block (header: Q6_K)
#define NQ 3        // ql 2, qh 1 (the scales and d: wt below)
#define Q6K_QUARTER 1
layout(std430, binding = W_BINDING) readonly buffer WeightU2 { uvec2 wu2[]; };
layout(std430, binding = 7) readonly buffer PairU2 { uvec2 pu2[]; };
#elif defined(QTYPE_Q3_K) && defined(HALF_BLOCK)
#define UNIT 128    // half a super-block (header: Q3_K, HALF_BLOCK)
#define NQ 6        // hmask 3, the half's qs 3 (the scales and d: wt, wdh below)
#define NBW 19      // unit words: hmask 8, qs 8, scales 3 (d apart), shifted to the half's bits
#define Q3K_SC 16   // the first scale word among them
#elif defined(QTYPE_Q3_K)
#define UNIT 256    // a whole super-block (header: Q3_K)
#define NQ 7        // hmask and qs (the scales and d: wt, wdh below)
#define NBW 27      // block words used: hmask 8, qs 16, scales 3 (d apart)
#define Q3K_SC 24
#elif defined(QTYPE_Q2_K) && defined(HALF_BLOCK)
#define UNIT 128    // half a super-block (header: Q2_K, HALF_BLOCK)
#define NQ 2        // the half's 2 qs uvec4s (its scales and d, dmin: wsc, wdm below)
layout(std430, binding = W_BINDING) readonly buffer WeightU2 { uvec2 wu2[]; };
layout(std430, binding = 7) readonly buffer PairU2 { uvec2 pu2[]; };
#define NBW 11      // unit words: scales 2, qs 8, d and dmin
#define Q2K_QS 2    // the first qs word among them
#define Q2K_DM 10   // d and dmin
#elif defined(QTYPE_Q2_K)
#define UNIT 256    // a whole super-block (header: Q2_K)
#define NQ 6        // 4 qs uvec4s, the scales' uvec4, d and dmin as a sixth
#define NBW 21      // block words: scales 4, qs 16, d and dmin
#define Q2K_QS 4
#define Q2K_DM 20
#elif defined(QTYPE_IQ4_NL) || defined(QTYPE_MXFP4)
#define UNIT 32     // planar as Q4_0 (header: IQ4_NL, MXFP4)
#define NQ 1
#define KV_TABLE 1  // the weights are table values of the nibbles (kvt below)
#elif defined(QTYPE_IQ4_XS)
#define UNIT 128    // half a super-block (header: IQ4_XS)
#define NQ 5        // the head's uvec4, 4 of qs (and 8 bytes: wt below)
#define KV_TABLE 1
#define Q_TABLE KV_IQ4NL
layout(std430, binding = W_BINDING) readonly buffer WeightU2 { uvec2 wu2[]; };
layout(std430, binding = 7) readonly buffer PairU2 { uvec2 pu2[]; };
#elif defined(QTYPE_Q4_1) || defined(QTYPE_Q5_0) || defined(QTYPE_Q5_1)
#define UNIT 32     // planar as Q4_0, the head apart (header: Q4_1, Q5_0, Q5_1)
#define NQ 1
#define LEGACY_HEAD 1
#if defined(QTYPE_Q5_1)
layout(std430, binding = W_BINDING) readonly buffer WeightU2 { uvec2 wu2[]; };
layout(std430, binding = 7) readonly buffer PairU2 { uvec2 pu2[]; };
#endif
#if defined(QTYPE_Q5_0) || defined(QTYPE_Q5_1)
#define HEAD_QH 1   // the fifth bits, one word per block
#endif
#elif defined(IQ_STREAM)
#define UNIT 64     // a quarter of a super-block (header: IQ2_XXS ...)
#define NQ 1        // the unit's uvec4 (IQ2_S: its two uvec2s; the other fields: wt below)
layout(std430, binding = W_BINDING) readonly buffer WeightU2 { uvec2 wu2[]; };
layout(std430, binding = 7) readonly buffer PairU2 { uvec2 pu2[]; };
#elif defined(QTYPE_TQ2_0)
#define UNIT 128    // half a block (header: TQ2_0)
#define NQ 2
#define TERNARY 1
#elif defined(QTYPE_TQ1_0)
#define UNIT 256    // a whole block (header: TQ2_0)
#define NQ 4        // qs 3 uvec4s, the qh word as a fourth
#define TERNARY 1
#else
#error "matvec_stream.comp: Q4_0, Q8_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_NL, MXFP4, IQ4_XS, a lattice or a ternary type"
#endif
#if defined(QTYPE_Q3_K) && !defined(HALF_BLOCK)
#define WHOLE_BLOCK 1   // a unit is one super-block, at a byte offset wo of its first uvec4
#endif
#if defined(QTYPE_Q4_K) || defined(QTYPE_Q5_K)
#define Q4K_LIKE 1  // a quarter super-block per unit, its scales and mins from the head (no wd)
#endif
#define V4 (UNIT / 4)   // x vec4s per unit
#if defined(Q6K_QUARTER)
#define XG 4            // DOT8: x vec4s per scale s (Q6_K's quarter: 16 values, one of its runs)
#else
#define XG 8            // DOT8: x vec4s per scale s (32 values)
#endif
const uint NPRE = XFIRST ? (TPR * V4 + WG - 1) / WG : 1;   // XFIRST: x vec4s a lane loads first

#ifdef DOT8
// word w of unit v at [w * TPR + v]: neighbouring lanes read neighbouring words
const uint XQ_LEN = V4 * TPR;
shared uint xqh[XQ_LEN];
shared uint xql[XQ_LEN];
#if defined(QTYPE_Q2_K) || defined(QTYPE_Q3_K)
#define HALF_SUMS 1
// per 32 values: (s, sum of x, sums of its halves): Q2_K's min and Q3_K's offset -4 per 16 values
shared vec4 xsd[(UNIT / 32) * TPR];
#else
shared vec2 xsd[(UNIT / (4 * XG)) * TPR];   // per 4 XG values: (s, sum of x)
#endif
#else
const uint XS_LEN = TPR * V4;
shared vec4 xs[XS_LEN];
#endif
#define MAX_SUBGROUPS 64
shared float red[2 * MAX_SUBGROUPS][8];   // two buffers: step s uses half s % 2
shared float red_ss[MAX_SUBGROUPS];
const uint SENTINEL = 0xFFFFFFFFu;   // a NaN no arithmetic here produces; stores map it to another NaN

// KSPLIT: the sum of parts 0 .. KSPLIT - 2 of the value at part[i + k * y_stride], waited for, in
// order, then `own` (the last part's); the sentinels go back for the next run.
float merge_parts(uint i, float own) {
    float sum;
    bool missing;
    do {
        sum = 0.0;
        missing = false;
        for (uint k = 0; k + 1 < KSPLIT; ++k) {
            uint b = part[i + k * p.y_stride];
            missing = missing || b == SENTINEL;
            sum += uintBitsToFloat(b);
        }
    } while (missing);
    for (uint k = 0; k + 1 < KSPLIT; ++k) part[i + k * p.y_stride] = SENTINEL;
    return sum + own;
}

vec4 x_at(uint k) { return WAIT ? x4c[k] : x4[k]; }

// WAIT: one lane polls until the producer's workgroups are all done; every lane calls this.
void wait_for_producer() {
    if (gl_LocalInvocationIndex == 0) {
        // the poll count is stored where it could be observed (never, in practice): a loop with no
        // effect but its own end may be deleted by the compiler (NVIDIA's was: x read at once)
        uint polls = 0u;
        while (chain[p.wait_slot] < p.wait_n) ++polls;
#ifdef CLOCK
        clock_release = clockRealtime2x32EXT().x;
#endif
        if (polls == 0xFFFFFFFFu) chain[p.wait_slot + 1] = polls;
    }
    // No fence here: the activations are read after the count was seen (the barrier orders it), at
    // the L2 where the producer's fence put its stores; a fence would first wait for this lane's
    // weight loads (Q8_0 tg128 on the 7.2B, H100: 249 against 264 t/s with one).
    barrier();
}

uint not_sentinel(float v) {
    uint b = floatBitsToUint(v);
    return b == SENTINEL ? 0x7FC00000u : b;
}

// Stage the vec4 k of the current x chunk (its fused input v: x' of the header) into shared memory.
void stage(uint k, vec4 v) {
#if defined(Q6K_QUARTER)
    // element 4k of the chunk: run j = (4k % 128) / 32 of half 4k / 128, l = 4k % 32; units 2 (4k / 128)
    // and the next take l < 16 and l >= 16 of each run (header: Q6_K)
    uint unit = 2 * (k >> 5) + ((k >> 2) & 1u), e = 4 * ((k >> 3) & 3u) + (k & 3u);
#else
    uint unit = k / V4, e = k % V4;
#endif
#ifdef DOT8
    // the 8 vec4s of a 32-value block are in 8 neighbouring lanes: max and sum by xor-shuffles
    float amax = max(max(abs(v.x), abs(v.y)), max(abs(v.z), abs(v.w)));
    float bsum = (v.x + v.y) + (v.z + v.w);
#if defined(HALF_SUMS)
    float hsum = 0.0;   // the sum of the 16 values of this vec4's half of the block
#endif
    [[unroll]] for (uint m = 1; m < XG; m *= 2) {
#if defined(HALF_SUMS)
        if (m == 4) hsum = bsum;
#endif
        amax = max(amax, subgroupShuffleXor(amax, m));
        bsum += subgroupShuffleXor(bsum, m);
    }
    float sc = amax / 127.0, inv = amax > 0.0 ? 127.0 / amax : 0.0;
    vec4 h = round(v * inv);
    vec4 l = clamp(round((v - h * sc) * (254.0 * inv)), -127.0, 127.0);
#if defined(KV_TABLE)
    uint hw = pack32(i8vec4(h)), lw = pack32(i8vec4(l));
    // kv_words' order (no merges after the lookups): block word w < 4 holds elements 4w, 4w + 1,
    // 16 + 4w, 16 + 4w + 1, word 4 + w elements 4w + 2, 4w + 3, 16 + 4w + 2, 16 + 4w + 3; word e ^ 4's
    // elements are in the lane 4 away
    uint hp = subgroupShuffleXor(hw, 4u), lp = subgroupShuffleXor(lw, 4u);
    bool first = (e & 4u) == 0u;
    hw = first ? (hw & 0xFFFFu) | (hp << 16) : (hp >> 16) | (hw & 0xFFFF0000u);
    lw = first ? (lw & 0xFFFFu) | (lp << 16) : (lp >> 16) | (lw & 0xFFFF0000u);
    xqh[e * TPR + unit] = hw;
    xql[e * TPR + unit] = lw;
#else
    xqh[e * TPR + unit] = pack32(i8vec4(h));
    xql[e * TPR + unit] = pack32(i8vec4(l));
#endif
#if defined(HALF_SUMS)
    float hsum2 = subgroupShuffleXor(hsum, 4u);   // lane e % 8 == 0 holds the first half's, +4 the second's
    if (e % 8 == 0) xsd[(e / 8) * TPR + unit] = vec4(sc, bsum, hsum, hsum2);
#else
    if (e % XG == 0) xsd[(e / XG) * TPR + unit] = vec2(sc, bsum);
#endif
#else
    xs[unit * V4 + (e ^ (unit & 7u))] = v;
#endif
}

// x' from v = x at vec4 index kk of the row (the sum of squares of x goes to ss)
vec4 fuse(vec4 v, uint kk, inout float ss) {
    if (NORM) { if (KSPLIT == 1) ss += dot(v, v); v *= nw4[kk]; }
    if (GLU) v = v / (1.0 + exp(-v)) * (WAIT ? up4c[kk] : up4[kk]);   // silu(gate) * up; exp(-v) -> inf gives -0
    return v;
}

#if defined(QTYPE_IQ4_NL) || defined(QTYPE_MXFP4)
// IQ4_NL, MXFP4: block b's scale (quants.glsl), and P's (PAIR: binding 7)
float block_scale(uint b) { return q_block_scale(b); }
#if defined(QTYPE_IQ4_NL)
float pair_block_scale(uint b) { return float(pf16[8 * q_chunk_blocks + b]); }
#else
float pair_block_scale(uint b) {
    uint e = uint(pu8[16 * q_chunk_blocks + b]);
    return uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23);
}
#endif
#endif

#if defined(LEGACY_HEAD)
// Q4_1, Q5_0, Q5_1 (header): block b's head from the head plane, and P's (PAIR: binding 7), as
// (d | m << 16, qh): Q4_1 one word (d, m), Q5_0 three 16-bit words (d, qh), Q5_1 a uvec2 (d, m; qh)
#if defined(QTYPE_Q4_1)
uvec2 block_head(uint b) { return uvec2(wu32[4 * q_chunk_blocks + b], 0u); }
uvec2 pair_block_head(uint b) { return uvec2(pu32[4 * q_chunk_blocks + b], 0u); }
#elif defined(QTYPE_Q5_0)
uvec2 block_head(uint b) {
    uint h = 8 * q_chunk_blocks + 3 * b;
    return uvec2(uint(wu16[h]), uint(wu16[h + 1]) | (uint(wu16[h + 2]) << 16));
}
uvec2 pair_block_head(uint b) {
    uint h = 8 * q_chunk_blocks + 3 * b;
    return uvec2(uint(pu16[h]), uint(pu16[h + 1]) | (uint(pu16[h + 2]) << 16));
}
#else
uvec2 block_head(uint b) { return wu2[2 * q_chunk_blocks + b]; }
uvec2 pair_block_head(uint b) { return pu2[2 * q_chunk_blocks + b]; }
#endif

// The quants of elements 4w..4w+3 (lo) and 16+4w..16+4w+3 (hi) of a block, one per byte: its quant
// word w's nibbles and, HEAD_QH, bits 4w.. and 16+4w.. of qh as their bit 4.
void legacy_words(uint qw, uint qh, uint w, out uint lo, out uint hi) {
    lo = qw & 0x0F0F0F0Fu;
    hi = (qw >> 4) & 0x0F0F0F0Fu;
#if defined(HEAD_QH)
    lo |= spread4(qh >> (4 * w)) << 4;
    hi |= spread4(qh >> (16 + 4 * w)) << 4;
#endif
}
#endif

#if defined(IQ_STREAM)
// matrix mi's words for iq_unit.glsl: 0 W (binding 0), 1 P (the pair's up matrix, 7)
uvec4 iq_u4(uint mi, uint i) { return mi == 0 ? wu4[i] : pu4[i]; }
uvec2 iq_u2(uint mi, uint i) { return mi == 0 ? wu2[i] : pu2[i]; }
uint iq_u32(uint mi, uint i) { return mi == 0 ? wu32[i] : pu32[i]; }
uint iq_u16(uint mi, uint i) { return uint(mi == 0 ? wu16[i] : pu16[i]); }
float iq_f16(uint mi, uint i) { return float(mi == 0 ? wf16[i] : pf16[i]); }
#include "iq_unit.glsl"
#endif

// A lane's weights of the current row block (loaded by load_weights) and its row sums.
uvec4 wq[C][RJ][NQ];
#if defined(QTYPE_Q6_K)
uvec3 wt[C][RJ];   // the 8 scale bytes of the unit's half of the super-block, d (f16 bits)
#elif defined(QTYPE_Q3_K) && defined(HALF_BLOCK)
uint wo[C][RJ];    // the block's byte offset in its uvec4 (110 b mod 16: even), | the half h (bit 0)
uvec4 wt[C][RJ];   // the 4 words holding its scales
uint wdh[C][RJ];   // d (f16 bits)
#elif defined(QTYPE_Q3_K)
uint wo[C][RJ];    // the block's byte offset in its uvec4 (110 b mod 16)
uvec4 wt[C][RJ];   // the 4 words holding its scales
uint wdh[C][RJ];   // d (f16 bits)
#elif defined(QTYPE_Q2_K) && defined(HALF_BLOCK)
uvec2 wsc[C][RJ];  // the half's 8 scale bytes
uint wdm[C][RJ];   // d and dmin
#elif defined(QTYPE_Q2_K)
#elif defined(QTYPE_IQ4_XS)
uint wo[C][RJ];    // the block's byte offset in its uvec4 (136 b mod 16: 0 or 8)
uvec2 wt[C][RJ];   // the last 8 bytes of the unit's qs run
#elif defined(LEGACY_HEAD)
uvec2 wh[C][RJ];   // the block's head: d | m << 16 (Q4_1, Q5_1; Q5_0 d), qh (Q5_0, Q5_1)
#elif defined(IQ_STREAM)
uvec4 wt[C][RJ];   // the unit's fields beside wq (header): IQ3_XXS its sign-and-scale words; IQ2_XS its scale
                   // bytes; IQ2_S its qh | scales << 16; IQ3_S its sign words, qh | scale byte << 16
float wd[C][RJ];
#elif !defined(Q4K_LIKE)
float wd[C][RJ];
#endif
float acc[RJ];

// Every weight load of this lane for the row block starting at row0 (rows past the end read the last
// row); with PAIR, loads j >= RO are row j - RO of P. u0: first unit of the workgroup's part.
void load_weights(uint row0, uint u0, uint n_units, uint row_units, uint g, uint c, uint G) {
    [[unroll]] for (uint i = 0; i < C; ++i) {
        uint u = c + TPR * i;
        if (u < n_units) {
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint row = min(row0 + g + G * (j % RO), p.n_rows - 1);
                bool second = j >= RO;   // a constant once the loop is unrolled
#if defined(QTYPE_Q4_K)
                uint ib = row * (row_units / 4) + (u0 + u) / 4;
                uint o0 = 9 * ib, o1 = 9 * ib + 1 + 2 * ((u0 + u) % 4);
                if (second) { wq[i][j][0] = pu4[o0]; wq[i][j][1] = pu4[o1]; wq[i][j][2] = pu4[o1 + 1]; }
                else { wq[i][j][0] = wu4[o0]; wq[i][j][1] = wu4[o1]; wq[i][j][2] = wu4[o1 + 1]; }
#elif defined(QTYPE_Q5_K)
                // quarter q of super-block ib (11 uvec4s): the head, its 32 qs bytes, the 32 qh bytes
                uint ib = row * (row_units / 4) + (u0 + u) / 4;
                uint o0 = 11 * ib, o1 = 11 * ib + 3 + 2 * ((u0 + u) % 4);
                if (second) {
                    wq[i][j][0] = pu4[o0]; wq[i][j][1] = pu4[o1]; wq[i][j][2] = pu4[o1 + 1];
                    wq[i][j][3] = pu4[o0 + 1]; wq[i][j][4] = pu4[o0 + 2];
                } else {
                    wq[i][j][0] = wu4[o0]; wq[i][j][1] = wu4[o1]; wq[i][j][2] = wu4[o1 + 1];
                    wq[i][j][3] = wu4[o0 + 1]; wq[i][j][4] = wu4[o0 + 2];
                }
#elif defined(QTYPE_Q6_K)
                // planar (header: Q6_K): super-block ib's ql + qh at uvec4 12 ib, its half h's scale
                // bytes at uvec2 24 n + 2 ib + h, d at f16 104 n + ib (n: the chunk's blocks)
#if defined(Q6K_HALF)
                uint uu = u0 + u, ib = row * (row_units / 2) + uu / 2, h = uu % 2;
                uint q0 = 12 * ib + 4 * h, q1 = 12 * ib + 8 + 2 * h;   // ql 4, qh 2
#else
                uint uu = u0 + u, ib = row * (row_units / 4) + uu / 4, h = (uu / 2) % 2, m = uu % 2;
                uint q0 = 12 * ib + 4 * h + m, q1 = 12 * ib + 8 + 2 * h + m;   // ql runs at q0, q0 + 2; qh q1
#endif
                uint s2 = 24 * q_chunk_blocks + 2 * ib + h, d16 = 104 * q_chunk_blocks + ib;
                if (second) {
#if defined(Q6K_HALF)
                    [[unroll]] for (uint k = 0; k < 4; ++k) wq[i][j][k] = pu4[q0 + k];
                    [[unroll]] for (uint k = 0; k < 2; ++k) wq[i][j][4 + k] = pu4[q1 + k];
#else
                    wq[i][j][0] = pu4[q0]; wq[i][j][1] = pu4[q0 + 2]; wq[i][j][2] = pu4[q1];
#endif
                    wt[i][j] = uvec3(pu2[s2], uint(pu16[d16]));
                } else {
#if defined(Q6K_HALF)
                    [[unroll]] for (uint k = 0; k < 4; ++k) wq[i][j][k] = wu4[q0 + k];
                    [[unroll]] for (uint k = 0; k < 2; ++k) wq[i][j][4 + k] = wu4[q1 + k];
#else
                    wq[i][j][0] = wu4[q0]; wq[i][j][1] = wu4[q0 + 2]; wq[i][j][2] = wu4[q1];
#endif
                    wt[i][j] = uvec3(wu2[s2], uint(wu16[d16]));
                }
#elif defined(QTYPE_Q3_K) && defined(HALF_BLOCK)
                // half h of super-block ib at byte bb (header: Q3_K, HALF_BLOCK): hmask from the 3 aligned
                // uvec4s from the one holding its first byte, the half's qs run from the 3 from the one
                // holding its first byte, none past the one holding its last (h = 1 at o = 0 repeats the
                // second, unused); the scales and d as the whole block's
                uint uu = u0 + u, ib = row * (row_units / 2) + uu / 2, h = uu % 2, bb = 110 * ib;
                uint m0 = bb >> 4, q0 = (bb + 32 + 32 * h) >> 4, q1 = (bb + 63 + 32 * h) >> 4;
                uint s0 = (bb + 94) >> 2, d16 = (bb + 108) >> 1;
                if (second) {
                    [[unroll]] for (uint k = 0; k < 3; ++k) wq[i][j][k] = pu4[m0 + k];
                    [[unroll]] for (uint k = 0; k < 3; ++k) wq[i][j][3 + k] = pu4[min(q0 + k, q1)];
                    wt[i][j] = uvec4(pu32[s0], pu32[s0 + 1], pu32[s0 + 2], pu32[s0 + 3]);
                    wdh[i][j] = uint(pu16[d16]);
                } else {
                    [[unroll]] for (uint k = 0; k < 3; ++k) wq[i][j][k] = wu4[m0 + k];
                    [[unroll]] for (uint k = 0; k < 3; ++k) wq[i][j][3 + k] = wu4[min(q0 + k, q1)];
                    wt[i][j] = uvec4(wu32[s0], wu32[s0 + 1], wu32[s0 + 2], wu32[s0 + 3]);
                    wdh[i][j] = uint(wu16[d16]);
                }
                wo[i][j] = (bb & 15u) | h;
#elif defined(QTYPE_Q3_K)
                // super-block ib at byte bb (header: Q3_K): hmask and qs (bytes 0..95) from 7 aligned
                // uvec4s, none past the one holding byte 95 (o = 0: the 7th repeats it, unused); the
                // scales from 4 words (bytes 94 or 92 .. 109 or 107), d as a 16-bit word
                uint ib = row * row_units + u0 + u, bb = 110 * ib;
                uint q0 = bb >> 4, q1 = (bb + 95) >> 4, s0 = (bb + 94) >> 2, d16 = (bb + 108) >> 1;
                if (second) {
                    [[unroll]] for (uint k = 0; k < NQ; ++k) wq[i][j][k] = pu4[min(q0 + k, q1)];
                    wt[i][j] = uvec4(pu32[s0], pu32[s0 + 1], pu32[s0 + 2], pu32[s0 + 3]);
                    wdh[i][j] = uint(pu16[d16]);
                } else {
                    [[unroll]] for (uint k = 0; k < NQ; ++k) wq[i][j][k] = wu4[min(q0 + k, q1)];
                    wt[i][j] = uvec4(wu32[s0], wu32[s0 + 1], wu32[s0 + 2], wu32[s0 + 3]);
                    wdh[i][j] = uint(wu16[d16]);
                }
                wo[i][j] = bb & 15u;
#elif defined(QTYPE_Q2_K) && defined(HALF_BLOCK)
                // half h of super-block ib (planar, header: Q2_K): its 2 qs uvec4s, its scales' uvec2, d and dmin
                uint uu = u0 + u, ib = row * (row_units / 2) + uu / 2, h = uu % 2, n = q_chunk_blocks;
                uint q0 = 4 * ib + 2 * h, s2 = 8 * n + 2 * ib + h, dm = 20 * n + ib;
                wq[i][j][0] = second ? pu4[q0] : wu4[q0];
                wq[i][j][1] = second ? pu4[q0 + 1] : wu4[q0 + 1];
                wsc[i][j] = second ? pu2[s2] : wu2[s2];
                wdm[i][j] = second ? pu32[dm] : wu32[dm];
#elif defined(QTYPE_Q2_K)
                // super-block ib (planar, header: Q2_K): its 4 qs uvec4s, its scales' uvec4, d and dmin
                uint ib = row * row_units + u0 + u, n = q_chunk_blocks, dm = 20 * n + ib;
                [[unroll]] for (uint k = 0; k < 4; ++k) wq[i][j][k] = second ? pu4[4 * ib + k] : wu4[4 * ib + k];
                wq[i][j][4] = second ? pu4[4 * n + ib] : wu4[4 * n + ib];
                wq[i][j][5] = uvec4(second ? pu32[dm] : wu32[dm], 0u, 0u, 0u);
#elif defined(QTYPE_IQ4_XS)
                // half h of super-block ib at byte bb (header: IQ4_XS): the uvec4 holding the head, the
                // 4 aligned uvec4s from the one holding the run's first byte, its last 8 bytes
                uint uu = u0 + u, ib = row * (row_units / 2) + uu / 2, h = uu % 2;
                uint bb = 136 * ib, hq = bb >> 4, q0 = (bb + 8 + 64 * h) >> 4, e8 = (bb + 64 + 64 * h) >> 3;
                if (second) {
                    wq[i][j][0] = pu4[hq];
                    [[unroll]] for (uint k = 0; k < 4; ++k) wq[i][j][1 + k] = pu4[q0 + k];
                    wt[i][j] = pu2[e8];
                } else {
                    wq[i][j][0] = wu4[hq];
                    [[unroll]] for (uint k = 0; k < 4; ++k) wq[i][j][1 + k] = wu4[q0 + k];
                    wt[i][j] = wu2[e8];
                }
                wo[i][j] = bb & 15u;
#elif defined(IQ_STREAM)
                // quarter uu % 4 of super-block ib (iq_unit.glsl)
                uint uu = u0 + u, ib = row * (row_units / 4) + uu / 4;
                iq_load_unit(second ? 1 : 0, ib, uu % 4, q_chunk_blocks, wq[i][j][0], wt[i][j], wd[i][j]);
#elif defined(QTYPE_TQ2_0)
                // half h of block ib (header: TQ2_0): 2 uvec4s of the qs plane, d
                uint uu = u0 + u, ib = row * (row_units / 2) + uu / 2, q0 = 4 * ib + 2 * (uu % 2);
                uint d16 = 32 * q_chunk_blocks + ib;
                wq[i][j][0] = second ? pu4[q0] : wu4[q0];
                wq[i][j][1] = second ? pu4[q0 + 1] : wu4[q0 + 1];
                wd[i][j] = float(second ? pf16[d16] : wf16[d16]);
#elif defined(QTYPE_TQ1_0)
                // block ib (header: TQ2_0): 3 uvec4s of the qs plane, its qh word, d
                uint ib = row * row_units + u0 + u, n = q_chunk_blocks, h32 = 12 * n + ib, d16 = 26 * n + ib;
                [[unroll]] for (uint k = 0; k < 3; ++k) wq[i][j][k] = second ? pu4[3 * ib + k] : wu4[3 * ib + k];
                wq[i][j][3] = uvec4(second ? pu32[h32] : wu32[h32], 0u, 0u, 0u);
                wd[i][j] = float(second ? pf16[d16] : wf16[d16]);
#elif defined(LEGACY_HEAD)
                // block b's uvec4 of quants (Q4_0's), its head from the head plane
                uint b = row * row_units + u0 + u;
                if (second) { wq[i][j][0] = pu4[b]; wh[i][j] = pair_block_head(b); }
                else { wq[i][j][0] = wu4[b]; wh[i][j] = block_head(b); }
#else
                uint b = row * row_units + u0 + u;
                if (second) {
                    [[unroll]] for (uint k = 0; k < NQ; ++k) wq[i][j][k] = pu4[NQ * b + k];
#if defined(KV_TABLE)
                    wd[i][j] = pair_block_scale(b);
#else
                    wd[i][j] = float(pf16[QD_PLANE * q_chunk_blocks + b]);
#endif
                } else {
                    [[unroll]] for (uint k = 0; k < NQ; ++k) wq[i][j][k] = wu4[NQ * b + k];
                    wd[i][j] = block_scale(b);
                }
#endif
            }
        }
    }
}

#if defined(QTYPE_Q6_K)
// (q | 0x80) - 32 never borrows across bytes, ^ 0x80 makes it q - 32: 4 quants as signed bytes q - 32
uint q6k_sub32(uint q) {
    return ((q | 0x80808080u) - 0x20202020u) ^ 0x80808080u;
}

// Scale g (< 8) of the 8 scale bytes of the unit's half (wt.xy) as a float
float q6k_scale(uvec3 t, uint g) {
    return float(bitfieldExtract(int(g < 4u ? t.x : t.y), int(8 * (g % 4)), 8));
}
#if defined(Q6K_HALF)
// stream_h (header: Q6_K): signed bytes q - 32 of the unit's elements 32k + 4l .. 32k + 4l + 3 (l <
// 8): 4 low bits from ql word 8 (k % 2) + l (nibble k / 2), 2 high bits from qh word l (bits 2k).
uint q6k_word(uint i, uint j, uint k, uint l) {
    uint qlw = wq[i][j][2 * (k % 2) + l / 4][l % 4], qhw = wq[i][j][4 + l / 4][l % 4];
    return q6k_sub32(((qlw >> (4 * (k / 2))) & 0x0F0F0F0Fu) | (((qhw >> (2 * k)) & 0x03030303u) << 4));
}
#else
// Quarter (header: Q6_K): the quants q (0..63) of run r's elements 4w .. 4w + 3 (r, w < 4), one per
// byte: low 4 bits from ql run r % 2 (nibble r / 2), high 2 bits from qh (bits 2r). DOT8 takes q and
// the offset -32 through the f32 sum of the run's 16 values of x.
uint q6k_quants(uint i, uint j, uint r, uint w) {
    uint qlw = wq[i][j][r % 2][w], qhw = wq[i][j][2][w];
    return ((qlw >> (4 * (r / 2))) & 0x0F0F0F0Fu) | (((qhw >> (2 * r)) & 0x03030303u) << 4);
}

// The same as signed bytes q - 32 (the f32 form).
uint q6k_word(uint i, uint j, uint r, uint w) {
    return q6k_sub32(q6k_quants(i, j, r, w));
}
#endif
#endif

#if defined(QTYPE_Q5_K)
// Q5_K (header): bit 4 of the quarter q's quants from qh word hw (bytes l .. l + 3: bit 2q for
// sub-block 2q, the low nibbles lo, bit 2q + 1 for sub-block 2q + 1, the high nibbles hi).
void q5k_high_bits(uint hw, uint q, inout uint lo, inout uint hi) {
    uint h = hw >> (2 * q);
    lo |= (h & 0x01010101u) << 4;
    hi |= (h & 0x02020202u) << 3;
}
#endif

#if defined(WHOLE_BLOCK)
// Words k < NBW of the super-block loaded for unit i, row j, shifted into place: the word offset
// wo / 4 picked by selects (a register array indexed by a lane's value would go to local memory),
// Q3_K's odd half-word (wo % 4 == 2) by a 16-bit funnel (its scales from wt).
void block_words(uint i, uint j, out uint bw[NBW]) {
    uint o = wo[i][j], a = o >> 2;
    uint r[4 * NQ];
    [[unroll]] for (uint k = 0; k < 4 * NQ; ++k) r[k] = wq[i][j][k / 4][k % 4];
    bool half_word = (o & 2u) != 0u;
    [[unroll]] for (uint k = 0; k < 24; ++k) {   // hmask, qs
        uint m0 = a < 2u ? (a == 0u ? r[k] : r[k + 1]) : (a == 2u ? r[k + 2] : r[k + 3]);
        uint m1 = a < 2u ? (a == 0u ? r[k + 1] : r[k + 2]) : (a == 2u ? r[k + 3] : r[k + 4]);
        bw[k] = half_word ? (m0 >> 16) | (m1 << 16) : m0;
    }
    uvec4 t = wt[i][j];   // scales at byte 2 (half_word) or 4 of t
    bw[24] = half_word ? (t.x >> 16) | (t.y << 16) : t.y;
    bw[25] = half_word ? (t.y >> 16) | (t.z << 16) : t.z;
    bw[26] = half_word ? (t.z >> 16) | (t.w << 16) : t.w;
}
#endif

#if defined(QTYPE_Q2_K)
// Words k < NBW of the (half) super-block loaded for unit i, row j: its scale words, its qs words, d
// and dmin (planar: each load in place).
void block_words(uint i, uint j, out uint bw[NBW]) {
#if defined(HALF_BLOCK)
    bw[0] = wsc[i][j].x;
    bw[1] = wsc[i][j].y;
    bw[Q2K_DM] = wdm[i][j];
#else
    [[unroll]] for (uint k = 0; k < 4; ++k) bw[k] = wq[i][j][4][k];
    bw[Q2K_DM] = wq[i][j][5].x;
#endif
    [[unroll]] for (uint k = 0; k < Q2K_DM - Q2K_QS; ++k) bw[Q2K_QS + k] = wq[i][j][k / 4][k % 4];
}
#endif

#if defined(QTYPE_Q3_K) && defined(HALF_BLOCK)
// Words k < NBW of the half super-block loaded for unit i, row j, in place: hmask and the half's qs
// run (each from its 3 uvec4s by selects of the word offset and a 16-bit funnel for o % 4 == 2, as
// the whole block's) and the scales; hmask and scales shifted right by 4h, so that the half's bits
// sit where the whole block's first half has them (hmask bits 4h + s of each byte at bit s, the
// scales' nibble h at bits 0..3, their high bits 4h .. 4h + 3 at bits 0..3 of bytes 8..11): the
// whole block's q3k_word and q3k_scale then read the unit.
void block_words(uint i, uint j, out uint bw[NBW]) {
    uint o = wo[i][j] & 14u, a = o >> 2, sh = 4u * (wo[i][j] & 1u);
    bool half_word = (o & 2u) != 0u;
    uint r[24];
    [[unroll]] for (uint k = 0; k < 24; ++k) r[k] = wq[i][j][k / 4][k % 4];
    [[unroll]] for (uint t = 0; t < 2; ++t) {   // hmask, qs: 12 raw words each
        [[unroll]] for (uint k = 0; k < 8; ++k) {
            uint b = 12 * t + k;
            uint m0 = a < 2u ? (a == 0u ? r[b] : r[b + 1]) : (a == 2u ? r[b + 2] : r[b + 3]);
            uint m1 = a < 2u ? (a == 0u ? r[b + 1] : r[b + 2]) : (a == 2u ? r[b + 3] : r[b + 4]);
            uint w = half_word ? (m0 >> 16) | (m1 << 16) : m0;
            bw[8 * t + k] = t == 0 ? w >> sh : w;
        }
    }
    uvec4 t = wt[i][j];   // scales at byte 2 (half_word) or 4 of t
    bw[Q3K_SC] = (half_word ? (t.x >> 16) | (t.y << 16) : t.y) >> sh;
    bw[Q3K_SC + 1] = (half_word ? (t.y >> 16) | (t.z << 16) : t.z) >> sh;
    bw[Q3K_SC + 2] = (half_word ? (t.z >> 16) | (t.w << 16) : t.w) >> sh;
}
#endif

#if defined(QTYPE_Q3_K)
// Q3_K (header): the quants q (0..7) of the unit's elements 32s + 4w .. 32s + 4w + 3 (s < UNIT / 32,
// w < 8), one per byte: 2 low bits from qs, bit 2 from hmask. A weight is d scale (q - 4): DOT8 takes
// q and the offset through the f32 sum of the 16 values of x a scale covers (HALF_SUMS).
uint q3k_quants(uint bw[NBW], uint s, uint w) {
    uint lo = (bw[8 + 8 * (s / 4) + w] >> (2 * (s % 4))) & 0x03030303u;
    uint hb = (bw[w] >> s) & 0x01010101u;
    return lo | (hb << 2);
}

// The same as signed bytes q - 4 (the f32 form): (q | 0x80) - 4 never borrows across bytes, ^ 0x80
// makes it q - 4.
uint q3k_word(uint bw[NBW], uint s, uint w) {
    return ((q3k_quants(bw, s, w) | 0x80808080u) - 0x04040404u) ^ 0x80808080u;
}

// Scale g (< UNIT / 16: elements 16g .. 16g + 15): low 4 bits in scale byte g % 8 (nibble g / 8),
// high 2 bits in byte 8 + g % 4 (bits 2 (g / 4)); minus 32.
float q3k_scale(uint bw[NBW], uint g) {
    uint lo = (bw[Q3K_SC + (g % 8) / 4] >> (8 * (g % 4) + 4 * (g / 8))) & 0xFu;
    uint hi = (bw[Q3K_SC + 2] >> (8 * (g % 4) + 2 * (g / 4))) & 0x3u;
    return float(int(lo | (hi << 4)) - 32);
}
#endif

#if defined(QTYPE_Q2_K)
// Q2_K (header): the 2-bit quants of the unit's elements 32s + 4w .. 32s + 4w + 3 (s < UNIT / 32,
// w < 8), one per byte.
uint q2k_word(uint bw[NBW], uint s, uint w) {
    return (bw[Q2K_QS + 8 * (s / 4) + w] >> (2 * (s % 4))) & 0x03030303u;
}

// Scale byte g (< UNIT / 16: elements 16g .. 16g + 15): the scale in its low nibble, the min in its high.
uint q2k_scale_min(uint bw[NBW], uint g) {
    return (bw[g / 4] >> (8 * (g % 4))) & 0xFFu;
}
#endif

#if defined(KV_TABLE)
// IQ4_NL, MXFP4 (header): entry b of kvt (b < 256: a quant byte, two nibbles) holds the table values
// of its low nibble in byte 0 and of its high nibble in byte 2; entry 256 + b the same shifted to
// bytes 1 and 3. Written by every workgroup while its first weight loads are in flight; read after
// the x staging's barrier.
shared uint kvt[512];
void kv_table_fill() {
    for (uint b = gl_LocalInvocationIndex; b < 256u; b += WG) {
        uint e = (uint(kv_lookup(Q_TABLE, b & 15u)) & 0xFFu) | ((uint(kv_lookup(Q_TABLE, b >> 4)) & 0xFFu) << 16);
        kvt[b] = e;
        kvt[256u + b] = e << 8;
    }
}

// The 8 weights of quant word qw (bytes 4w..4w+3 of a block) as signed bytes, lo against x's word w
// and hi against its word 4 + w. DOT8: in the staging's order (stage()), as the lookups give them:
// lo = elements 4w, 4w + 1, 16 + 4w, 16 + 4w + 1, hi = 4w + 2, 4w + 3, 16 + 4w + 2, 16 + 4w + 3. The
// f32 form: lo = elements 4w..4w+3 (low nibbles), hi = elements 16+4w..16+4w+3 (high nibbles).
void kv_words(uint qw, out uint lo, out uint hi) {
    uint a = kvt[qw & 0xFFu] | kvt[256u + ((qw >> 8) & 0xFFu)];    // lo0 lo1 hi0 hi1
    uint b = kvt[(qw >> 16) & 0xFFu] | kvt[256u + (qw >> 24)];     // lo2 lo3 hi2 hi3
#if defined(DOT8)
    lo = a;
    hi = b;
#else
    lo = (a & 0xFFFFu) | (b << 16);
    hi = (a >> 16) | (b & 0xFFFF0000u);
#endif
}
#endif

#if defined(QTYPE_IQ4_XS)
// IQ4_XS (header): the 16 qs words of unit i, row j in place (word 4t + w: bytes 4w..4w+3 of
// sub-block t), picked by a select of the block's offset; d and the sub-blocks' 6-bit scales words.
void iq4xs_unit(uint i, uint j, out uint qw[16], out uint hw0, out uint hw1) {
    bool at8 = wo[i][j] != 0u;
    uvec4 hd = wq[i][j][0];
    hw0 = at8 ? hd.z : hd.x;   // d | scales_h << 16
    hw1 = at8 ? hd.w : hd.y;   // scales_l
    uint r[18];
    [[unroll]] for (uint k = 0; k < 16; ++k) r[k] = wq[i][j][1 + k / 4][k % 4];
    r[16] = wt[i][j].x;
    r[17] = wt[i][j].y;
    [[unroll]] for (uint k = 0; k < 16; ++k) qw[k] = at8 ? r[k] : r[k + 2];
}

// Sub-block s (< 8) of the super-block: d (ls - 32), ls = scales_l nibble s | scales_h bits 2s << 4.
float iq4xs_scale(uint hw0, uint hw1, uint s) {
    uint ls = ((hw1 >> (4 * s)) & 0xFu) | (((hw0 >> (16 + 2 * s)) & 3u) << 4);
    return unpackHalf2x16(hw0).x * float(int(ls) - 32);
}
#endif


#if defined(TERNARY)
// q (0..2, one per byte) of the unit's elements 32g + 4w .. 32g + 4w + 3 (g < UNIT / 32, w < 8), unit
// i, row j (header: TQ2_0)
uint tq_word(uint i, uint j, uint g, uint w) {
#if defined(QTYPE_TQ2_0)
    return (wq[i][j][w / 4][w % 4] >> (2 * g)) & 0x03030303u;
#else
    if (g < 5) return trit_bytes(wq[i][j][w / 4][w % 4], g);      // qs bytes 0..31, digit g
    if (g < 7) return trit_bytes(wq[i][j][2][w % 4], 2 * (g - 5) + w / 4);   // bytes 32..47: 16 a digit
    return w < 4 ? trit_bytes(wq[i][j][2][w], 4) : trit_bytes(wq[i][j][3].x, w - 4);   // then qh's 4 digits
#endif
}
#endif

// acc[j] += the products of this lane's unit i (of x chunk i, staged) with its loaded weights.
void accumulate(uint i, uint u0, uint n_units, uint c) {
    uint u = c + TPR * i;
    if (u >= n_units) return;
#if defined(READ_ONLY)
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        uint a = 0u;
        [[unroll]] for (uint k = 0; k < NQ; ++k) a ^= wq[i][j][k].x ^ wq[i][j][k].y ^ wq[i][j][k].z ^ wq[i][j][k].w;
#if defined(LEGACY_HEAD)
        a ^= wh[i][j].x ^ wh[i][j].y;
#endif
#if defined(Q4K_LIKE) || defined(QTYPE_Q6_K) || defined(QTYPE_Q2_K) || defined(WHOLE_BLOCK) || defined(HALF_BLOCK) || \
    defined(QTYPE_IQ4_XS) || defined(LEGACY_HEAD)
        acc[j] += float(a & 1u);
#else
        acc[j] += float(a & 1u) + wd[i][j];
#endif
    }
#elif defined(DOT8)
#if defined(TERNARY)
    // per 32 values of x (its scale and exact sum: the -1), every row's sums at once
    float t[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) t[j] = 0.0;
    [[unroll]] for (uint g = 0; g < UNIT / 32; ++g) {
        vec2 sd = xsd[g * TPR + c];
        int hs[RJ], ls[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) { hs[j] = 0; ls[j] = 0; }
        [[unroll]] for (uint w = 0; w < 8; ++w) {
            uint xa = xqh[(8 * g + w) * TPR + c], xb = xql[(8 * g + w) * TPR + c];
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint q = tq_word(i, j, g, w);
                hs[j] += dot_ss(q, xa, 0);
                ls[j] += dot_ss(q, xb, 0);
            }
        }
        [[unroll]] for (uint j = 0; j < RJ; ++j) t[j] += sd.x * (float(hs[j]) + float(ls[j]) * (1.0 / 254.0)) - sd.y;
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += wd[i][j] * t[j];
#elif defined(IQ_STREAM)
    // one group (2 words of x, each level) at a time, every row's sums at once; a scale per 32 weights
    float t[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) t[j] = 0.0;
    [[unroll]] for (uint s = 0; s < 2; ++s) {
        float sx = xsd[s * TPR + c].x;
        [[unroll]] for (uint h = 0; h < 2; ++h) {   // 16 weights: IQ2_XS's and IQ2_S's scales
            int hs[RJ], ls[RJ];
            [[unroll]] for (uint j = 0; j < RJ; ++j) { hs[j] = 0; ls[j] = 0; }
            [[unroll]] for (uint l = 2 * h; l < 2 * h + 2; ++l) {
                uint w = 8 * s + 2 * l;
                uint xa = xqh[w * TPR + c], xb = xql[w * TPR + c];
                uint xc = xqh[(w + 1) * TPR + c], xd = xql[(w + 1) * TPR + c];
                [[unroll]] for (uint j = 0; j < RJ; ++j) {
                    uint lo, hi;
#if defined(QTYPE_IQ1_S)
                    iq1s_group_staged(wq[i][j][0], s, l, lo, hi);   // the offset below
#else
                    iq_group(wq[i][j][0], wt[i][j], s, l, lo, hi);
#endif
                    hs[j] += dot_ss(lo, xa, 0) + dot_ss(hi, xc, 0);
                    ls[j] += dot_ss(lo, xb, 0) + dot_ss(hi, xd, 0);
                }
            }
            [[unroll]] for (uint j = 0; j < RJ; ++j)
                t[j] += iq_scale(wq[i][j][0], wt[i][j], s, h) * (sx * (float(hs[j]) + float(ls[j]) * (1.0 / 254.0)));
        }
#if defined(QTYPE_IQ1_S)
        // the sub-block's offset (one scale, one delta for its 32 weights) through its f32 sum of x
        float xsum = xsd[s * TPR + c].y;
        [[unroll]] for (uint j = 0; j < RJ; ++j)
            t[j] -= iq_scale(wq[i][j][0], wt[i][j], s, 0) * iq1s_offset(wq[i][j][0], s) * xsum;
#endif
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += wd[i][j] * t[j];
#elif defined(QTYPE_IQ4_XS)
    // one word of x (each level, low and high nibbles) at a time, every row's sums at once; a scale
    // per 32 weights, no offset
    uint h = (u0 + u) % 2;
    uint qw[RJ][16], hw0[RJ], hw1[RJ];
    float t[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) { iq4xs_unit(i, j, qw[j], hw0[j], hw1[j]); t[j] = 0.0; }
    [[unroll]] for (uint s = 0; s < 4; ++s) {
        float sx = xsd[s * TPR + c].x;
        int hs[RJ], ls[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) { hs[j] = 0; ls[j] = 0; }
        [[unroll]] for (uint w = 0; w < 4; ++w) {
            uint xa = xqh[(8 * s + w) * TPR + c], xb = xql[(8 * s + w) * TPR + c];
            uint xc = xqh[(8 * s + 4 + w) * TPR + c], xd = xql[(8 * s + 4 + w) * TPR + c];
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint lo, hi;
                kv_words(qw[j][4 * s + w], lo, hi);
                hs[j] += dot_ss(lo, xa, 0) + dot_ss(hi, xc, 0);
                ls[j] += dot_ss(lo, xb, 0) + dot_ss(hi, xd, 0);
            }
        }
        [[unroll]] for (uint j = 0; j < RJ; ++j)
            t[j] += iq4xs_scale(hw0[j], hw1[j], 4 * h + s) * (sx * (float(hs[j]) + float(ls[j]) * (1.0 / 254.0)));
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += t[j];
#elif defined(QTYPE_Q6_K) && defined(Q6K_HALF)
    // the unit's quants as signed bytes q - 32, 4 per word against x's words; group sums per 16
    // weights (one scale each)
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        float tj = 0.0;
        [[unroll]] for (uint k = 0; k < 4; ++k) {
            vec2 sd = xsd[k * TPR + c];
            [[unroll]] for (uint g = 0; g < 2; ++g) {
                int hs = 0, ls = 0;
                [[unroll]] for (uint l = 0; l < 4; ++l) {
                    uint w = 8 * k + 4 * g + l, qs = q6k_word(i, j, k, 4 * g + l);
                    hs += dot_ss(qs, xqh[w * TPR + c], 0);
                    ls += dot_ss(qs, xql[w * TPR + c], 0);
                }
                tj += q6k_scale(wt[i][j], 2 * k + g) * (sd.x * (float(hs) + float(ls) * (1.0 / 254.0)));
            }
        }
        acc[j] += unpackHalf2x16(wt[i][j].z).x * tj;
    }
#elif defined(QTYPE_Q6_K)
    // one run r (16 values, its own x scale and weight scale 2r + m) at a time, every row's sums at
    // once; the quants q as bytes, the offset -32 through the run's exact f32 sum of x
    uint m = (u0 + u) % 2;
    float t[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) t[j] = 0.0;
    [[unroll]] for (uint r = 0; r < 4; ++r) {
        vec2 sd = xsd[r * TPR + c];
        int hs[RJ], ls[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) { hs[j] = 0; ls[j] = 0; }
        [[unroll]] for (uint w = 0; w < 4; ++w) {
            uint xa = xqh[(4 * r + w) * TPR + c], xb = xql[(4 * r + w) * TPR + c];
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint qs = q6k_quants(i, j, r, w);
                hs[j] += dot_ss(qs, xa, 0);
                ls[j] += dot_ss(qs, xb, 0);
            }
        }
        [[unroll]] for (uint j = 0; j < RJ; ++j)
            t[j] += q6k_scale(wt[i][j], 2 * r + m)
                    * (sd.x * (float(hs[j]) + float(ls[j]) * (1.0 / 254.0)) - 32.0 * sd.y);
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += unpackHalf2x16(wt[i][j].z).x * t[j];
#elif defined(QTYPE_Q3_K)
    // one word of x (each level) at a time, every row's sums at once; a scale per 16 weights, the
    // offset -4 through the exact f32 sum of those 16 values of x
    uint bw[RJ][NBW];
    float t[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) { block_words(i, j, bw[j]); t[j] = 0.0; }
    [[unroll]] for (uint s = 0; s < UNIT / 32; ++s) {
        vec4 sd = xsd[s * TPR + c];
        [[unroll]] for (uint g = 0; g < 2; ++g) {
            int hs[RJ], ls[RJ];
            [[unroll]] for (uint j = 0; j < RJ; ++j) { hs[j] = 0; ls[j] = 0; }
            [[unroll]] for (uint l = 0; l < 4; ++l) {
                uint w = 4 * g + l, xa = xqh[(8 * s + w) * TPR + c], xb = xql[(8 * s + w) * TPR + c];
                [[unroll]] for (uint j = 0; j < RJ; ++j) {
                    uint qw = q3k_quants(bw[j], s, w);
                    hs[j] += dot_ss(qw, xa, 0);
                    ls[j] += dot_ss(qw, xb, 0);
                }
            }
            float xsum = g == 0 ? sd.z : sd.w;
            [[unroll]] for (uint j = 0; j < RJ; ++j)
                t[j] += q3k_scale(bw[j], 2 * s + g)
                        * (sd.x * (float(hs[j]) + float(ls[j]) * (1.0 / 254.0)) - 4.0 * xsum);
        }
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += unpackHalf2x16(wdh[i][j]).x * t[j];
#elif defined(QTYPE_Q2_K)
    // one word of x (each level) at a time, every row's sums at once; per 16 weights a scale and a
    // min, the min through the exact f32 sum of those 16 values of x
    uint bw[RJ][NBW];
    float t[RJ], tm[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) { block_words(i, j, bw[j]); t[j] = 0.0; tm[j] = 0.0; }
    [[unroll]] for (uint s = 0; s < UNIT / 32; ++s) {
        vec4 sd = xsd[s * TPR + c];
        [[unroll]] for (uint g = 0; g < 2; ++g) {
            int hs[RJ], ls[RJ];
            [[unroll]] for (uint j = 0; j < RJ; ++j) { hs[j] = 0; ls[j] = 0; }
            [[unroll]] for (uint l = 0; l < 4; ++l) {
                uint w = 4 * g + l, xa = xqh[(8 * s + w) * TPR + c], xb = xql[(8 * s + w) * TPR + c];
                [[unroll]] for (uint j = 0; j < RJ; ++j) {
                    uint qw = q2k_word(bw[j], s, w);
                    hs[j] += dot_ss(qw, xa, 0);
                    ls[j] += dot_ss(qw, xb, 0);
                }
            }
            float xsum = g == 0 ? sd.z : sd.w;
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint sm = q2k_scale_min(bw[j], 2 * s + g);
                t[j] += float(sm & 0xFu) * (sd.x * (float(hs[j]) + float(ls[j]) * (1.0 / 254.0)));
                tm[j] += float(sm >> 4) * xsum;
            }
        }
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        vec2 dm = unpackHalf2x16(bw[j][Q2K_DM]);
        acc[j] += dm.x * t[j] - dm.y * tm[j];
    }
#elif defined(Q4K_LIKE)
    // one word of x (each level, each sub-block) at a time, every row's sums at once: 4 words of x
    // live instead of the unit's 32
    uint q = (u0 + u) % 4;
    int h0[RJ], l0[RJ], h1[RJ], l1[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) { h0[j] = 0; l0[j] = 0; h1[j] = 0; l1[j] = 0; }
    [[unroll]] for (uint w = 0; w < 8; ++w) {
        uint xa = xqh[w * TPR + c], xb = xql[w * TPR + c], xc = xqh[(8 + w) * TPR + c], xd = xql[(8 + w) * TPR + c];
        [[unroll]] for (uint j = 0; j < RJ; ++j) {
            uint qw = wq[i][j][1 + w / 4][w % 4];
            uint lo = qw & 0x0F0F0F0Fu, hi = (qw >> 4) & 0x0F0F0F0Fu;
#if defined(QTYPE_Q5_K)
            q5k_high_bits(wq[i][j][3 + w / 4][w % 4], q, lo, hi);
#endif
            h0[j] += dot_ss(lo, xa, 0); l0[j] += dot_ss(lo, xb, 0);
            h1[j] += dot_ss(hi, xc, 0); l1[j] += dot_ss(hi, xd, 0);
        }
    }
    vec2 sd0 = xsd[c], sd1 = xsd[TPR + c];
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        vec2 dl, ml;
        q4k_quarter_scales(wq[i][j][0], q, dl, ml);
        float t0 = sd0.x * (float(h0[j]) + float(l0[j]) * (1.0 / 254.0));
        float t1 = sd1.x * (float(h1[j]) + float(l1[j]) * (1.0 / 254.0));
        acc[j] += (dl.x * t0 - ml.x * sd0.y) + (dl.y * t1 - ml.y * sd1.y);
    }
#else
    uint xh[V4], xl[V4];
    [[unroll]] for (uint w = 0; w < V4; ++w) { xh[w] = xqh[w * TPR + c]; xl[w] = xql[w * TPR + c]; }
    vec2 sd0 = xsd[c];
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        int hs = 0, ls = 0;
        [[unroll]] for (uint w = 0; w < 4; ++w) {
#if defined(QTYPE_Q4_0)
            uint qw = wq[i][j][0][w];
            uint lo = qw & 0x0F0F0F0Fu, hi = (qw >> 4) & 0x0F0F0F0Fu;   // elements 4w.., 16+4w..
#elif defined(KV_TABLE)
            uint lo, hi;   // the table values, no offset
            kv_words(wq[i][j][0][w], lo, hi);
#elif defined(LEGACY_HEAD)
            uint lo, hi;   // q: 0..15 (Q4_1), 0..31 (Q5_0, Q5_1)
            legacy_words(wq[i][j][0][w], wh[i][j].y, w, lo, hi);
#else
            uint lo = wq[i][j][0][w], hi = wq[i][j][1][w];             // elements 4w.., 16+4w..
#endif
            hs += dot_ss(lo, xh[w], 0) + dot_ss(hi, xh[4 + w], 0);
            ls += dot_ss(lo, xl[w], 0) + dot_ss(hi, xl[4 + w], 0);
        }
        float t = sd0.x * (float(hs) + float(ls) * (1.0 / 254.0));
#if defined(QTYPE_Q4_0)
        t -= 8.0 * sd0.y;
#endif
#if defined(LEGACY_HEAD)
        // the offset (Q5_0) and the min (Q4_1, Q5_1) through the exact f32 block sum of x
        vec2 dm = unpackHalf2x16(wh[i][j].x);
#if defined(QTYPE_Q5_0)
        acc[j] += dm.x * (t - 16.0 * sd0.y);
#else
        acc[j] += dm.x * t + dm.y * sd0.y;
#endif
#else
        acc[j] += wd[i][j] * t;
#endif
    }
#endif
#else
    uint sw = c & 7u;
#if defined(TERNARY)
    [[unroll]] for (uint g = 0; g < UNIT / 32; ++g) {
        float tg[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] = 0.0;
        [[unroll]] for (uint w = 0; w < 8; ++w) {
            vec4 xa = xs[c * V4 + ((8 * g + w) ^ sw)];
            [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] += dot(ubytes_fast(tq_word(i, j, g, w)) - 1.0, xa);
        }
        [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += wd[i][j] * tg[j];
    }
#elif defined(IQ_STREAM)
    [[unroll]] for (uint s = 0; s < 4; ++s) {   // 16 weights at a time: sub-block s / 2, half s % 2
        float tg[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] = 0.0;
        [[unroll]] for (uint l = 2 * (s % 2); l < 2 * (s % 2) + 2; ++l) {
            uint w = 8 * (s / 2) + 2 * l;
            vec4 xa = xs[c * V4 + (w ^ sw)], xc = xs[c * V4 + ((w + 1) ^ sw)];
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint lo, hi;
                iq_group(wq[i][j][0], wt[i][j], s / 2, l, lo, hi);
                tg[j] += dot(sbytes_fma(lo), xa) + dot(sbytes_fma(hi), xc);
            }
        }
        [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += wd[i][j] * iq_scale(wq[i][j][0], wt[i][j], s / 2, s % 2) * tg[j];
    }
#elif defined(QTYPE_IQ4_XS)
    uint h = (u0 + u) % 2;
    uint qw[RJ][16], hw0[RJ], hw1[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) iq4xs_unit(i, j, qw[j], hw0[j], hw1[j]);
    [[unroll]] for (uint s = 0; s < 4; ++s) {
        float tg[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] = 0.0;
        [[unroll]] for (uint w = 0; w < 4; ++w) {
            vec4 xa = xs[c * V4 + ((8 * s + w) ^ sw)], xc = xs[c * V4 + ((8 * s + 4 + w) ^ sw)];
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint lo, hi;
                kv_words(qw[j][4 * s + w], lo, hi);
                tg[j] += dot(sbytes_fma(lo), xa) + dot(sbytes_fma(hi), xc);
            }
        }
        [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += iq4xs_scale(hw0[j], hw1[j], 4 * h + s) * tg[j];
    }
#elif defined(QTYPE_Q6_K) && defined(Q6K_HALF)
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        float tj = 0.0;
        [[unroll]] for (uint k = 0; k < 4; ++k) {
            [[unroll]] for (uint g = 0; g < 2; ++g) {
                float t = 0.0;
                [[unroll]] for (uint l = 0; l < 4; ++l) {
                    uint w = 8 * k + 4 * g + l;
                    t += dot(sbytes_fma(q6k_word(i, j, k, 4 * g + l)), xs[c * V4 + (w ^ sw)]);
                }
                tj += q6k_scale(wt[i][j], 2 * k + g) * t;
            }
        }
        acc[j] += unpackHalf2x16(wt[i][j].z).x * tj;
    }
#elif defined(QTYPE_Q6_K)
    // run r of the quarter (16 values: x vec4s 4r .. 4r + 3, weight scale 2r + m), every row at once
    uint m = (u0 + u) % 2;
    float t[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) t[j] = 0.0;
    [[unroll]] for (uint r = 0; r < 4; ++r) {
        float tg[RJ];
        [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] = 0.0;
        [[unroll]] for (uint w = 0; w < 4; ++w) {
            vec4 xv = xs[c * V4 + ((4 * r + w) ^ sw)];
            [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] += dot(sbytes_fma(q6k_word(i, j, r, w)), xv);
        }
        [[unroll]] for (uint j = 0; j < RJ; ++j) t[j] += q6k_scale(wt[i][j], 2 * r + m) * tg[j];
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += unpackHalf2x16(wt[i][j].z).x * t[j];
#elif defined(QTYPE_Q3_K)
    uint bw[RJ][NBW];
    float t[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) { block_words(i, j, bw[j]); t[j] = 0.0; }
    [[unroll]] for (uint s = 0; s < UNIT / 32; ++s) {
        [[unroll]] for (uint g = 0; g < 2; ++g) {
            float tg[RJ];
            [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] = 0.0;
            [[unroll]] for (uint l = 0; l < 4; ++l) {
                uint w = 4 * g + l;
                vec4 xv = xs[c * V4 + ((8 * s + w) ^ sw)];
                [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] += dot(sbytes_fma(q3k_word(bw[j], s, w)), xv);
            }
            [[unroll]] for (uint j = 0; j < RJ; ++j) t[j] += q3k_scale(bw[j], 2 * s + g) * tg[j];
        }
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += unpackHalf2x16(wdh[i][j]).x * t[j];
#elif defined(QTYPE_Q2_K)
    uint bw[RJ][NBW];
    float t[RJ], tm[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) { block_words(i, j, bw[j]); t[j] = 0.0; tm[j] = 0.0; }
    [[unroll]] for (uint s = 0; s < UNIT / 32; ++s) {
        [[unroll]] for (uint g = 0; g < 2; ++g) {
            float tg[RJ], sx = 0.0;
            [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] = 0.0;
            [[unroll]] for (uint l = 0; l < 4; ++l) {
                uint w = 4 * g + l;
                vec4 xv = xs[c * V4 + ((8 * s + w) ^ sw)];
                sx += (xv.x + xv.y) + (xv.z + xv.w);
                [[unroll]] for (uint j = 0; j < RJ; ++j) tg[j] += dot(sbytes_fma(q2k_word(bw[j], s, w)), xv);
            }
            [[unroll]] for (uint j = 0; j < RJ; ++j) {
                uint sm = q2k_scale_min(bw[j], 2 * s + g);
                t[j] += float(sm & 0xFu) * tg[j];
                tm[j] += float(sm >> 4) * sx;
            }
        }
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        vec2 dm = unpackHalf2x16(bw[j][Q2K_DM]);
        acc[j] += dm.x * t[j] - dm.y * tm[j];
    }
#elif defined(Q4K_LIKE)
    // sub-blocks 2q (low nibbles) and 2q + 1 (high nibbles) of quarter q = u % 4; x vec4s w, 8 + w
    uint q = (u0 + u) % 4;
    float t0[RJ], t1[RJ], sx0 = 0.0, sx1 = 0.0;
    [[unroll]] for (uint j = 0; j < RJ; ++j) { t0[j] = 0.0; t1[j] = 0.0; }
    [[unroll]] for (uint w = 0; w < 8; ++w) {
        vec4 xa = xs[c * V4 + (w ^ sw)], xc = xs[c * V4 + ((8 + w) ^ sw)];
        sx0 += (xa.x + xa.y) + (xa.z + xa.w);
        sx1 += (xc.x + xc.y) + (xc.z + xc.w);
        [[unroll]] for (uint j = 0; j < RJ; ++j) {
            vec4 a, cc;
#if defined(QTYPE_Q5_K)
            uint qw = wq[i][j][1 + w / 4][w % 4];
            uint lo = qw & 0x0F0F0F0Fu, hi = (qw >> 4) & 0x0F0F0F0Fu;
            q5k_high_bits(wq[i][j][3 + w / 4][w % 4], q, lo, hi);
            a = sbytes_fma(lo);   // 0..31: as signed bytes the same
            cc = sbytes_fma(hi);
#else
            nib_fma(wq[i][j][1 + w / 4][w % 4], 0.0, a, cc);
#endif
            t0[j] += dot(a, xa);
            t1[j] += dot(cc, xc);
        }
    }
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        vec2 dl, ml;
        q4k_quarter_scales(wq[i][j][0], q, dl, ml);
        acc[j] += (dl.x * t0[j] - ml.x * sx0) + (dl.y * t1[j] - ml.y * sx1);
    }
#else
    // block u: quants of elements 4w..4w+3 and 16+4w..16+4w+3 in word w (Q4_0: low and high
    // nibbles; Q8_0: words w and 4 + w); x vec4s w and 4 + w
    float tq[RJ];
    [[unroll]] for (uint j = 0; j < RJ; ++j) tq[j] = 0.0;
#if defined(LEGACY_HEAD)
    float sx = 0.0;   // the block's sum of x (the min: Q4_1, Q5_1; the offset: Q5_0)
#endif
    [[unroll]] for (uint w = 0; w < 4; ++w) {
        vec4 xa = xs[c * V4 + (w ^ sw)], xc = xs[c * V4 + ((4 + w) ^ sw)];
#if defined(LEGACY_HEAD)
        sx += ((xa.x + xa.y) + (xa.z + xa.w)) + ((xc.x + xc.y) + (xc.z + xc.w));
#endif
        [[unroll]] for (uint j = 0; j < RJ; ++j) {
            vec4 a, cc;
#if defined(QTYPE_Q4_0)
            nib_fma(wq[i][j][0][w], 8.0, a, cc);
#elif defined(KV_TABLE)
            uint lo, hi;
            kv_words(wq[i][j][0][w], lo, hi);
            a = sbytes_fma(lo);
            cc = sbytes_fma(hi);
#elif defined(LEGACY_HEAD)
            uint lo, hi;
            legacy_words(wq[i][j][0][w], wh[i][j].y, w, lo, hi);
            a = sbytes_fma(lo);   // 0..31: as signed bytes the same
            cc = sbytes_fma(hi);
#else
            a = sbytes_fma(wq[i][j][0][w]);
            cc = sbytes_fma(wq[i][j][1][w]);
#endif
            tq[j] += dot(a, xa) + dot(cc, xc);
        }
    }
#if defined(LEGACY_HEAD)
    [[unroll]] for (uint j = 0; j < RJ; ++j) {
        vec2 dm = unpackHalf2x16(wh[i][j].x);
#if defined(QTYPE_Q5_0)
        acc[j] += dm.x * (tq[j] - 16.0 * sx);
#else
        acc[j] += dm.x * tq[j] + dm.y * sx;
#endif
    }
#else
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += wd[i][j] * tq[j];
#endif
#endif
#endif
}

#ifdef ROUTER
// ---- ROUTER: a row block's terms, then the last workgroup's pick (header) ----
// Loads this thread's router weights (columns tid + WG k) of the row block from row0 into rwv[t]
// (a constant once the callers' loops are unrolled: a register array indexed by a variable would go
// to local memory).
void router_load(uint t, uint row0) {
    uint tid = gl_LocalInvocationIndex;
    [[unroll]] for (uint k = 0; k < RK; ++k) {
        uint e = tid + WG * k;
        [[unroll]] for (uint i = 0; i < RROWS; ++i) {
            uint r = p.y_off + min(row0 + i, p.n_rows - 1);
            rwv[t][k][i] = e < RNE ? rw[e * p.y_stride + r] : (RSH && e == RNE ? rshw[r] : 0.0);
        }
    }
}

// RAHEAD: every row block's router weights of this workgroup (blocks blk, blk + stride, ...; those
// past the end read the last row), rwv[t] for its t-th block.
void router_load_ahead(uint blk, uint stride) {
    [[unroll]] for (uint t = 0; t < RSTEPS; ++t) router_load(t, (blk + t * stride) * p.rows_per_wg);
}

// RAHEAD: the next block's weights to rwv[0] once this block's terms are added.
void router_shift() {
    [[unroll]] for (uint t = 0; t + 1 < RSTEPS; ++t)
        [[unroll]] for (uint k = 0; k < RK; ++k)
            [[unroll]] for (uint i = 0; i < RROWS; ++i) rwv[t][k][i] = rwv[t + 1][k][i];
}

// Adds the terms of the block's rows (from row0) to racc: v is this thread's row of x (0 past the
// end), rn its norm weight.
void router_block(uint row0, float v, float rn) {
    uint tid = gl_LocalInvocationIndex;
    if (tid < RROWS) rbuf[tid].xy = vec2(v, RNORM ? v * rn : v);   // x, x' (moe_router.comp's order)
    barrier();
    uint nr = min(RROWS, p.n_rows - row0);
    [[unroll]] for (uint k = 0; k < RK; ++k) {
        uint e = tid + WG * k;
        float s = 0.0;
        if (e < RNC - 1) {   // a logit (or the shared expert's gate): W[e] . x' over these rows
            [[unroll]] for (uint i = 0; i < RROWS; ++i) if (i < nr) s += rwv[0][k][i] * rbuf[i].y;
        } else if (e == RNC - 1) {   // the sum of squares
            for (uint i = 0; i < nr; ++i) s += rbuf[i].x * rbuf[i].x;
        }
        racc[k] += s;
    }
    barrier();   // rbuf holds the next block's x next
}

// RTAIL 1: a score as a key whose unsigned order is the scores' (larger score, larger key), -0
// as +0, NaN below every number (1): no key is 0, the empty candidate's.
uint rscore_key(float v) {
    uint b = floatBitsToUint(v);
    if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 1u;
    if ((b & 0x7FFFFFFFu) == 0u) b = 0u;
    return (b & 0x80000000u) != 0u ? ~b : b | 0x80000000u;
}

// RTAIL 0: the pick by the first subgroup, moe_router.comp's: the summed columns (rtot) scaled, a
// softmax over every expert, then RNU rounds of a subgroup max (each lane reads and writes only its
// own experts' rtot, i = lane + S k, but for the picks' broadcast).
void router_pick_serial(uint half_row) {
    if (gl_SubgroupID != 0) return;
    uint lane = gl_SubgroupInvocationID, S = gl_SubgroupSize;
    float inv_rms = RNORM ? inversesqrt(rtot[RNC - 1] / float(p.y_stride) + REPS) : 1.0;
    float m = -3.4e38;
    for (uint i = lane; i < RNE; i += S) {
        float l = rtot[i] * inv_rms + (RBIAS ? rbias[i] : 0.0);
        rtot[i] = l;
        m = max(m, l);
    }
    m = subgroupMax(m);
    float sum = 0.0;
    for (uint i = lane; i < RNE; i += S) {
        float v = rtot[i];
        v = RSIG ? 1.0 / (1.0 + exp(-v)) : exp(v - m);
        rtot[i] = v;
        sum += v;
    }
    float inv = RSIG ? 1.0 : 1.0 / subgroupAdd(sum);
    if (RSELB) {   // every lane reads the chosen ones' probabilities below
        for (uint i = lane; i < RNE; i += S) rsel[i] = rtot[i] * inv + rselb[i];
        subgroupMemoryBarrierShared();
        subgroupBarrier();
    }
    float chosen_sum = 0.0;
    for (uint k = 0; k < RNU; ++k) {
        float bv = RSELB ? uintBitsToFloat(0xFF800000u) : -2.0;
        uint bi = 0xFFFFFFFFu;
        for (uint i = lane; i < RNE; i += S) {
            float v = RSELB ? rsel[i] : rtot[i];
            if (v > bv) { bv = v; bi = i; }   // ascending i: the first of equals stays
        }
        float best = subgroupMax(bv);
        uint id = subgroupMin(bv == best ? bi : 0xFFFFFFFFu);
        float w = (RSELB ? rtot[min(id, RNE - 1)] : best) * inv;
        chosen_sum += w;
        if (lane == 0) { rpick_id[k] = id; rpick_w[k] = w; }
        if (id % S == lane) {   // its owner takes it out (probabilities are >= 0; RSELB: keys -inf)
            if (RSELB) rsel[id] = uintBitsToFloat(0xFF800000u); else rtot[id] = -1.0;
        }
        subgroupMemoryBarrierShared();
        subgroupBarrier();
    }
    float f = RRENORM ? RSCALE / chosen_sum : RSCALE;
    for (uint k = lane; k < RNU; k += S) {
        route[k] = uintBitsToFloat(rpick_id[k]);
        route[half_row + k] = rpick_w[k] * f;
    }
    if (RSH && lane == 0) {   // the shared expert's gate (moe_router.comp SHEXP)
        float logit = rtot[RNE] * inv_rms;
        route[RNU] = uintBitsToFloat(RNE);
        route[half_row + RNU] = 1.0 / (1.0 + exp(-logit));
    }
    if (RSH1 && lane == 0) {  // an ungated shared expert (moe_router.comp SHONE)
        route[RNU] = uintBitsToFloat(RNE);
        route[half_row + RNU] = 1.0;
    }
    if (lane == 0) rcount[0] = 0u;
}

// RTAIL 1: the pick by ranks, every thread of the workgroup at once (header: ROUTER). rbuf holds the
// nsl slices of the summed partials. The experts' scores (logits; RSIG: their sigmoids) are ranked:
// larger first, of equals the lower expert first (moe_router.comp's order). A top-RNU expert is among
// the RCG best of its group of RGS experts, so each group's best are the candidates and an expert's
// rank among all candidates is its rank among all experts: RGS + RNCAND compares per thread instead
// of RNU dependent rounds of subgroup reductions. The softmax only over the chosen: renormalized,
// softmax(l)_i / sum_chosen softmax(l)_j = exp(l_i - m) / sum_chosen exp(l_j - m), m the top logit.
void router_pick_ranks(uint nsl, uint half_row) {
    uint tid = gl_LocalInvocationIndex;
    // every thread sums the sum of squares' slices itself (the order of the columns' sums: the same
    // float), so that the logits need no barrier more
    float inv_rms = 1.0;
    if (RNORM) {
        const uint q = RNC - 1;
        float t = 0.0;
        for (uint k = 0; k < nsl; ++k) t += rbuf[q / 4 + RNC4 * k][q % 4];
        inv_rms = inversesqrt(t / float(p.y_stride) + REPS);
    }
    for (uint e = tid; e + 1 < RNC; e += WG) {   // the experts' logits and the shared gate's
        float t = 0.0;
        for (uint k = 0; k < nsl; ++k) t += rbuf[e / 4 + RNC4 * k][e % 4];
        float l = t * inv_rms + (RBIAS && e < RNE ? rbias[e] : 0.0);
        float sc = RSIG && e < RNE ? 1.0 / (1.0 + exp(-l)) : l;
        rtot[e] = sc;
        if (e < RNE) rkey[e] = rscore_key(sc);
    }
    for (uint c = tid; c < RNCAND; c += WG) { rcand_key[c] = 0u; rcand_id[c] = 0xFFFFFFFFu; }
    barrier();
    // rank within the group: the experts before e that score as high, those after that score higher
    for (uint e = tid; e < RNE; e += WG) {
        uint ke = rkey[e], lo = e - e % RGS, r = 0u;
        [[unroll]] for (uint i = 0; i < RGS; ++i) {
            uint j = lo + i;
            if (j < RNE) r += uint(rkey[j] > (j < e ? ke - 1u : ke));
        }
        if (r < RCG) {
            rcand_key[(e / RGS) * RCG + r] = ke;
            rcand_id[(e / RGS) * RCG + r] = e;
        }
    }
    barrier();
    // rank among the candidates (empty slots: key 0, below every expert's)
    for (uint c = tid; c < RNCAND; c += WG) {
        uint kc = rcand_key[c], ic = rcand_id[c], r = 0u;
        for (uint d = 0; d < RNCAND; ++d) {
            uint kd = rcand_key[d], id = rcand_id[d];
            r += uint(kd > kc || (kd == kc && id < ic));
        }
        if (ic != 0xFFFFFFFFu && r < RNU) { rpick_id[r] = ic; rpick_w[r] = rtot[ic]; }
    }
    barrier();
    float m = rpick_w[0];   // softmax: the top logit
    float total = 0.0;      // softmax, not renormalized: sum over every expert of exp(l - m)
    if (!RSIG && !RRENORM) {
        float s = 0.0;
        for (uint e = tid; e < RNE; e += WG) s += exp(rtot[e] - m);
        s = subgroupAdd(s);
        if (gl_SubgroupInvocationID == 0) rsum[gl_SubgroupID] = s;
        barrier();
        for (uint k = 0; k < gl_NumSubgroups; ++k) total += rsum[k];
    }
    for (uint k = tid; k < RNU; k += WG) {
        float chosen = 0.0;   // the chosen scores' sum (softmax: of their exp), in rank order
        if (RRENORM) for (uint i = 0; i < RNU; ++i) chosen += RSIG ? rpick_w[i] : exp(rpick_w[i] - m);
        float v = RSIG ? rpick_w[k] : exp(rpick_w[k] - m);
        route[k] = uintBitsToFloat(rpick_id[k]);
        route[half_row + k] = v * (RRENORM ? RSCALE / chosen : (RSIG ? RSCALE : RSCALE / total));
    }
    if (tid == 0) {
        if (RSH || RSH1) {   // the shared expert's slot (moe_router.comp SHEXP, SHONE)
            route[RNU] = uintBitsToFloat(RNE);
            route[half_row + RNU] = RSH ? 1.0 / (1.0 + exp(-rtot[RNE])) : 1.0;
        }
        rcount[0] = 0u;
    }
}

// Stores this workgroup's partials (it is writer widx of n_writers); the last to count itself done
// adds them all (workgroup order: the same sums every run) and writes the route row.
void router_finish(uint widx, uint n_writers) {
    uint tid = gl_LocalInvocationIndex;
    [[unroll]] for (uint k = 0; k < RK; ++k) {
        uint e = tid + WG * k;
        if (e < RNC4 * 4) rpart[widx * RNC4 * 4 + e] = e < RNC ? racc[k] : 0.0;
    }
    memoryBarrierBuffer();
    barrier();
    if (tid == 0) rlast = atomicAdd(rcount[0], 1u) == n_writers - 1;
    barrier();
    if (!rlast) return;   // uniform: another workgroup picks
    memoryBarrierBuffer();
    // column c4 (4 of them) over the workgroups sl, sl + nsl, ..., then the nsl slices in order
    uint nsl = WG / RNC4, c4 = tid % RNC4, sl = tid / RNC4;
    vec4 acc4 = vec4(0.0);
    if (sl < nsl) {
        for (uint w0 = sl; w0 < n_writers; w0 += RLOADS * nsl) {   // RLOADS loads in flight, added in order
            vec4 a[RLOADS];
            [[unroll]] for (uint j = 0; j < RLOADS; ++j) {
                uint w = w0 + j * nsl;
                a[j] = w < n_writers ? rpart4[w * RNC4 + c4] : vec4(0.0);
            }
            [[unroll]] for (uint j = 0; j < RLOADS; ++j) acc4 += a[j];
        }
    }
    rbuf[tid] = acc4;
    barrier();
    uint half_row = RSH || RSH1 ? RNU + 1 : RNU;   // route row: half_row ids, then their weights
    if (RTAIL == 1) {
        router_pick_ranks(nsl, half_row);
        return;
    }
    if (tid < RNC4) {
        vec4 t = vec4(0.0);
        for (uint k = 0; k < nsl; ++k) t += rbuf[tid + RNC4 * k];
        rtot[4 * tid] = t.x; rtot[4 * tid + 1] = t.y; rtot[4 * tid + 2] = t.z; rtot[4 * tid + 3] = t.w;
    }
    barrier();
    router_pick_serial(half_row);
}
// ---- end ROUTER ----
#endif

void product() {
    uint row_units = p.cols / UNIT;
    uint n_units = row_units / KSPLIT;   // units of this workgroup's part of the row
    q_chunk_blocks = p.n_rows * (p.cols / QK);
    uint wg = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    uint ks = PHASE == 2 ? KSPLIT - 1 : wg % WPB;
    wg /= WPB;
    uint wg_stride = gl_NumWorkGroups.x * gl_NumWorkGroups.y / WPB;   // row blocks between steps
    uint n_blocks = (p.n_rows + p.rows_per_wg - 1) / p.rows_per_wg;
    if (wg >= n_blocks) return;          // a 2-D grid's padding (the whole workgroup; SIGNAL counts it)
    uint u0 = ks * n_units;              // first unit of the part
    uint tid = gl_LocalInvocationIndex, G = gl_WorkGroupSize.x / TPR;
    uint g = tid / TPR, c = tid % TPR;
    uint S = gl_SubgroupSize, sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
    uint per_row = max(TPR / S, 1u);     // subgroups per row group (TPR < S: 1, and red[] per row group)
#ifdef ROUTER
    [[unroll]] for (uint k = 0; k < RK; ++k) racc[k] = 0.0;
#endif

    // 0. XFIRST: this lane's share of x's first chunk, loaded before the weights (header); with WAIT
    //    that is after the wait, so the weights follow the wait too
    if (WAIT && XFIRST) wait_for_producer();
    vec4 xpre[NPRE];
    if (XFIRST) {
        uint n40 = min(TPR * V4, n_units * V4), kx0 = u0 * V4;
        [[unroll]] for (uint r = 0; r < NPRE; ++r) {
            uint k = tid + r * WG;
            xpre[r] = k < n40 ? x_at(kx0 + k) : vec4(0.0);
        }
    }
    // 1. Every weight load of the first row block, before anything else.
    uint blk = wg;
    load_weights(blk * p.rows_per_wg, u0, n_units, row_units, g, c, G);
#ifdef ROUTER
    bool rwrite = KSPLIT == 1 || ks == KSPLIT - 1;   // ROUTER: this workgroup writes rows of x
    if (RAHEAD && rwrite) router_load_ahead(blk, wg_stride);
    else if (REARLY && rwrite) router_load(0, blk * p.rows_per_wg);
#endif
#if defined(KV_TABLE)
    kv_table_fill();   // read after the staging barrier below
#endif
#if defined(IQ_STREAM)
    iq_tables_fill(gl_LocalInvocationIndex, WG);  // read after the staging barrier below
#endif
    if (WAIT && !XFIRST) wait_for_producer();

    // 2. Per x chunk: stage it (the loads above are in flight meanwhile), then multiply from registers.
    [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] = 0.0;
    float ss = 0.0, scale = 1.0;
    if (NORM && KSPLIT > 1)   // the sum of squares is over the whole row, not just this part
        for (uint k = tid; k < row_units * V4; k += gl_WorkGroupSize.x) { vec4 v = x_at(k); ss += dot(v, v); }
    [[unroll]] for (uint i = 0; i < C; ++i) {
        if (i > 0) barrier();
        uint k0 = TPR * i * V4, n4 = min(TPR * V4, n_units * V4 - k0), kx = u0 * V4 + k0;
#if !defined(NO_X) && !defined(READ_ONLY)
        if (XFIRST && i == 0) {
            [[unroll]] for (uint r = 0; r < NPRE; ++r) {
                uint k = tid + r * WG;
                if (k < n4) stage(k, fuse(xpre[r], kx + k, ss));
            }
        } else {
            for (uint k = tid; k < n4; k += WG)
                stage(k, fuse(x_at(kx + k), kx + k, ss));
        }
#endif
        barrier();
        accumulate(i, u0, n_units, c);
    }
    if (NORM) ss = subgroupAdd(ss);
    if (NORM && lane == 0) red_ss[sg] = ss;

    for (uint s = 0; s < STEPS; ++s) {
        if (s > 0) {   // x is staged (C == 1)
            [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] = 0.0;
            accumulate(0, u0, n_units, c);
        }
        // the next block's loads go out now: in flight during this block's reduction
        uint next = blk + wg_stride;
        bool more = s + 1 < STEPS && next < n_blocks;
        if (more) load_weights(next * p.rows_per_wg, u0, n_units, row_units, g, c, G);
#ifdef ROUTER
        if (!RAHEAD && !REARLY && rwrite) router_load(0, blk * p.rows_per_wg);   // in flight during the reduction
#endif
        uint row0 = blk * p.rows_per_wg, rb = (s % 2) * MAX_SUBGROUPS;
        uint gg = tid % G, j = tid / G;   // this thread's output row: row0 + gg + G * j
        uint out_row = p.y_off + row0 + gg + G * j;
        bool mine = tid < G * RO && row0 + gg + G * j < p.n_rows;
        bool write = KSPLIT == 1 || ks == KSPLIT - 1;   // column parts: the last part writes y
        // bias and residual loaded now: in flight during the reduction (and the merge of parts)
        float b_add = 0.0, r_add = 0.0;
        if (mine && write) {
            if (p.has_bias != 0) b_add = bias[out_row];
            if (RESID) r_add = WAIT ? residc[out_row] : resid[out_row];
        }
#ifdef ROUTER
        float r_nw = mine && write && RNORM ? rnw[out_row] : 0.0;   // ROUTER: the FFN norm's weight
#endif

        // 3. Reduce: within the subgroup, then over the TPR / S subgroups of a row group (the sum of
        //    squares over the whole workgroup, once). TPR < S: a subgroup holds S / TPR row groups,
        //    each summed by an xor butterfly over its TPR lanes.
        if (TPR >= S) {
            [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] = subgroupAdd(acc[j]);
            if (lane == 0) {
                [[unroll]] for (uint j = 0; j < RJ; ++j) red[rb + sg][j] = acc[j];
            }
        } else {
            [[unroll]] for (uint m = TPR / 2; m > 0; m /= 2) {
                [[unroll]] for (uint j = 0; j < RJ; ++j) acc[j] += subgroupShuffleXor(acc[j], m);
            }
            if (c == 0) {
                [[unroll]] for (uint j = 0; j < RJ; ++j) red[rb + g][j] = acc[j];
            }
        }
        barrier();
        float v = 0.0, v2 = 0.0;
        if (tid < G * RO) {
            for (uint k = 0; k < per_row; ++k) v += red[rb + gg * per_row + k][j];
            if (PAIR) for (uint k = 0; k < per_row; ++k) v2 += red[rb + gg * per_row + k][RO + j];
            if (NORM) {
                if (s == 0) {
                    float s2 = 0.0;
                    for (uint k = 0; k < gl_NumSubgroups; ++k) s2 += red_ss[k];
                    scale = inversesqrt(s2 / float(p.cols) + p.eps);
                }
                v *= scale;
                v2 *= scale;
            }
        }
        if (KSPLIT > 1) {
            // Column parts (header): the last part adds the others' sums to its own.
            uint pair_off = KSPLIT * p.y_stride;   // PAIR: P's sums after W's
            if (mine && !write) {
                part[ks * p.y_stride + out_row] = not_sentinel(v);
                if (PAIR) part[pair_off + ks * p.y_stride + out_row] = not_sentinel(v2);
            }
            if (mine && write) {
                v = merge_parts(out_row, v);
                if (PAIR) v2 = merge_parts(pair_off + out_row, v2);
            }
        }
        if (write) {
            if (mine) {
                if (PAIR) v = v / (1.0 + exp(-v)) * v2;   // silu(gate) * up
                if (p.has_bias != 0) v += b_add;
                if (RESID) v += r_add;
            }
            if (ROPE == 0) {
                if (mine) y[out_row] = v;
            } else {
                // RoPE: both lanes of a pair take part in the shuffle (G * RO is even)
                uint pos = step[0];
                if (ROPE != 3) {
                    float other = subgroupShuffleXor(v, 1u);
                    uint d = out_row % p.head_dim;
                    if (d < p.rope_dim) {
                        vec2 cs = rope_cos_sin(d / 2, float(rope_position(pos)));
                        v = (d % 2 == 0) ? v * cs.x - other * cs.y : other * cs.y + v * cs.x;
                    }
                }
                if (mine) {
                    if (ROPE == 1) y[out_row] = v;
                    else if (pos < p.n_ctx) kvc[pos * p.y_stride + out_row] = float16_t(v);
                }
            }
        }
#ifdef ROUTER
        if (write) {   // ROUTER: this block's rows of x are final
            router_block(row0, mine ? v : 0.0, r_nw);
            if (RAHEAD) router_shift();
            else if (REARLY && more) router_load(0, next * p.rows_per_wg);
        }
#endif
        if (!more) break;
        blk = next;
    }
#ifdef ROUTER
    if (rwrite) router_finish(wg, min(wg_stride, n_blocks));
#endif
}

void main() {
#ifdef CLOCK
    uint clock_entry = clockRealtime2x32EXT().x;
    clock_release = clock_entry;
#endif
    product();
    if (SIGNAL) {   // every store of this workgroup visible, then one count (header)
        memoryBarrierBuffer();
        barrier();
        if (gl_LocalInvocationIndex == 0) atomicAdd(chain[p.signal_slot], 1u);
    }
#ifdef CLOCK
    barrier();
    if (gl_LocalInvocationIndex == 0) {
        uint s = 8u * p.stamp_slot, t_end = clockRealtime2x32EXT().x;
        atomicMin(stamps[s + 3u], clock_entry); atomicMax(stamps[s + 4u], clock_entry);
        atomicMin(stamps[s + 5u], clock_release); atomicMax(stamps[s + 6u], clock_release);
        atomicMax(stamps[s + 7u], t_end);
    }
#endif
}
