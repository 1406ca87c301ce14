#!/usr/bin/env python3
"""Mutation check (issue 29): how many small, realistic bugs do the tests catch?

Each mutant below replaces one exact piece of text in one file (Python or GLSL) of a copy of this
tree, rebuilds the SPIR-V of every kernel that includes a mutated shader (shaders/build.py, needs
glslc), runs the tests chosen to catch it, and counts it killed when they fail. The kill rate is
printed at the end; docs/TESTING.md lists the mutants and the last measured result. Not part of
`make test`: it runs the chosen tests once per mutant (~20 minutes on 2 cores).

    .venv/bin/python scripts/mutation_check.py            # every mutant
    .venv/bin/python scripts/mutation_check.py -k rope    # mutants whose name contains "rope"
    .venv/bin/python scripts/mutation_check.py --list

A mutant whose text no longer occurs in its file (the code moved on) is reported STALE and makes the
script exit non-zero, as does a surviving mutant: update the mutant or strengthen the tests. A
mutated shader whose SPIR-V comes out unchanged is reported EQUIVALENT (the compiler removed it).
The tests chosen must pass on the unmutated copy first (the baseline), or nothing is measured.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


DRY_TESTS = ("tests/test_sampling_dry.py", "tests/test_sampling_llamacpp.py", "-k", "dry")


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str                   # file, relative to the repository root
    old: str                    # exact text, occurring once in the file
    new: str
    tests: tuple[str, ...]      # pytest arguments: the tests that should catch it
    why: str                    # the bug it stands for


ORACLE = "tests/test_llamacpp_oracle.py"
ENGINE = "tests/test_engine.py"
KERNELS = "tests/test_kernels_matmul.py"
STREAM_TYPES = "tests/test_kernels_matvec_stream_types.py"
OPS = "tests/test_kernels_ops.py"

MUTANTS = [
    # -- Python: sampling, perplexity, KL divergence, tokenizer -------------------------------------
    Mutant("sampling-temperature-multiplies", "llamavk/sampling.py",
           "c.vals = c.vals / F32(self.p.temp)", "c.vals = c.vals * F32(self.p.temp)",
           ("tests/test_sampling.py",), "temperature applied the wrong way round"),
    Mutant("sampling-top-k-one-more", "llamavk/sampling.py",
           "k = min(self.p.top_k, c.vals.size)", "k = min(self.p.top_k + 1, c.vals.size)",
           ("tests/test_sampling.py",), "top-k keeps k + 1 candidates"),
    Mutant("sampling-top-p-one-short", "llamavk/sampling.py",
           "c.take(np.arange(_count_to(np.cumsum(probs, dtype=F32), self.p.top_p, strict=False)))",
           "c.take(np.arange(max(1, _count_to(np.cumsum(probs, dtype=F32), self.p.top_p, strict=False) - 1)))",
           ("tests/test_sampling.py",), "top-p stops one token before reaching p"),
    Mutant("sampling-min-p-absolute", "llamavk/sampling.py",
           "floor = (c.vals[0] if c.ordered else c.vals.max()) + np.log(F32(self.p.min_p))",
           "floor = np.log(F32(self.p.min_p))",
           ("tests/test_sampling.py",), "min-p as an absolute threshold, not relative to the top token"),
    Mutant("sampling-typical-least-first", "llamavk/sampling.py",
           "order = np.argsort(np.abs(surprise - entropy), kind=\"stable\")",
           "order = np.argsort(-np.abs(surprise - entropy), kind=\"stable\")",
           ("tests/test_sampling.py",), "typical keeps the least typical tokens"),
    Mutant("sampling-frequency-once", "llamavk/sampling.py",
           "(n * F32(p.frequency_penalty) + F32(p.presence_penalty))",
           "(F32(p.frequency_penalty) + F32(p.presence_penalty))",
           ("tests/test_sampling.py",), "the frequency penalty once, not per occurrence"),
    Mutant("sampling-xtc-drops-all-above", "llamavk/sampling.py",
           "c.take(np.arange(last, c.vals.size))", "c.take(np.arange(last + 1, c.vals.size))",
           ("tests/test_sampling.py",), "XTC drops the least likely of the top choices too"),
    Mutant("sampling-mirostat-mu-wrong-way", "llamavk/sampling.py",
           "self._mu = F32(self._mu - F32(p.mirostat_eta)", "self._mu = F32(self._mu + F32(p.mirostat_eta)",
           ("tests/test_sampling.py",), "Mirostat moves mu away from the target surprise"),
    Mutant("sampling-order-ignored", "llamavk/sampling.py",
           "        for step in p.samplers:", "        for step in CHAIN:",
           ("tests/test_sampling.py",), "--samplers' order not followed: always the default chain"),
    Mutant("dry-next-token-off-by-one", "llamavk/sampling_dry.py",
           "t = toks[n - 2 - i]", "t = toks[n - 1 - i]",
           DRY_TESTS, "DRY penalizes the repeat's last token instead of the one that would extend it"),
    Mutant("dry-breaker-cap-whole-distance", "llamavk/sampling_dry.py",
           "limit = i - longest", "limit = i",
           DRY_TESTS, "a breaker's tail not counted: repeats capped one tail too long"),
    Mutant("dry-breaker-token-penalized", "llamavk/sampling.py",
           "if self.dry.single_token_breaker(t):\n                continue", "pass",
           DRY_TESTS, "tokens that are breakers by themselves penalized too"),
    Mutant("dry-exponent-one-more", "llamavk/sampling_dry.py",
           "exponent = length - self.allowed", "exponent = length - self.allowed + 1",
           DRY_TESTS, "DRY's exponent counts the allowed length one short"),
    Mutant("dry-tail-with-last-head-byte", "llamavk/sampling_dry.py",
           "tail_ids(s[n:])", "tail_ids(s[n - 1:])",
           DRY_TESTS, "a breaker's tail tokenized from the head's last byte"),
    Mutant("dry-greedy-skipped", "llamavk/sampling.py",
           "            self._dry(c)\n            return int(np.argmax(c.vals))",
           "            return int(np.argmax(c.vals))",
           DRY_TESTS, "greedy sampling leaves DRY out"),
    Mutant("dry-prompt-not-seen", "llamavk/sampling.py",
           "            self.dry.accept(t)\n", "            pass\n",
           DRY_TESTS, "DRY's window starts empty: the prompt's repeats not seen"),
    Mutant("reverse-prompt-no-slack", "llamavk/reverse_prompt.py",
           "SLACK = 2 ", "SLACK = 0 ",
           ("tests/test_reverse_prompt.py", "tests/test_sampling_llamacpp.py", "-k", "reverse"),
           "a reverse prompt seen only at the very end of the text"),
    Mutant("logit-bias-replaces", "llamavk/sampling.py",
           "            x[t] += F32(b)", "            x[t] = F32(b)",
           ("tests/test_sampling_llamacpp.py", "-k", "logit_bias"),
           "the bias replaces the logit instead of adding to it"),
    Mutant("kv-override-only-adds", "llamavk/kv_override.py",
           "        out[key] = value", "        out.setdefault(key, value)",
           ("tests/test_model_overrides.py", "tests/test_sampling_llamacpp.py", "-k", "override"),
           "--override-kv adds missing keys but replaces none"),
    Mutant("rope-scaling-none-scales", "llamavk/rope_options.py",
           "    if kind == \"none\":\n        freq_scale = 1.0\n", "",
           ("tests/test_model_overrides.py", "tests/test_sampling_llamacpp.py", "-k", "rope"),
           "--rope-scaling none leaves the frequency scale as given"),
    Mutant("grammar-first-draw-kept", "llamavk/sampling.py",
           "if g is None or g.allows(token):", "if g is None or token >= 0:",
           ("tests/test_sampling_llamacpp.py", "-k", "grammar"), "the grammar never refuses the chain's first draw"),
    Mutant("grammar-mask-skips-refused-prefix", "llamavk/grammar.py",
           "            else:\n                refused.extend(ids[i:j])\n", "",
           ("tests/test_grammar.py",), "the mask leaves out the tokens of a prefix no stack takes"),
    Mutant("grammar-partial-any", "llamavk/grammar.py",
           "        if n_remain < 0 or (n_remain == 1 and value < 2):\n            return False\n",
           "        return True\n",
           ("tests/test_grammar.py",), "any incomplete character continues the grammar"),
    Mutant("sampling-draw-words-swapped", "llamavk/cpp_random.py",
           "r = (float(w0) + float(w1) * _TWO_32) / _TWO_64", "r = (float(w1) + float(w0) * _TWO_32) / _TWO_64",
           ("tests/test_sampling_llamacpp.py",), "the draw's two words in the other order (not libstdc++'s double)"),
    Mutant("perplexity-uncertainty-count", "llamavk/perplexity.py",
           "math.sqrt(var / (count - 1))", "math.sqrt(var / count)",
           ("tests/test_perplexity.py", "-k", "by_hand"), "the uncertainty divides by count, not count - 1"),
    Mutant("perplexity-window-one-early", "llamavk/perplexity.py",
           "first = n_ctx // 2\n", "first = n_ctx // 2 - 1\n",
           ("tests/test_perplexity.py", "-k", "by_hand"), "scoring starts one token early"),
    Mutant("kld-direction", "llamavk/kld_stats.py",
           "terms = np.exp(base) * ((base - x) + norm[:, None])",
           "terms = np.exp(x - norm[:, None]) * ((x - norm[:, None]) - base)",
           ("tests/test_kld.py", "-k", "statistics"), "KL(Q || base) instead of KL(base || Q)"),
    Mutant("kld-delta-p-sign", "llamavk/kld_stats.py",
           "p_diff = np.exp(-nll) - np.exp(-nll_base)", "p_diff = np.exp(-nll_base) - np.exp(-nll)",
           ("tests/test_kld.py", "-k", "statistics"), "Δp = p_base - p_Q"),
    Mutant("kld-uncertainty-over-n", "llamavk/kld_stats.py",
           "float(np.sqrt(var / (n - 1)))", "float(np.sqrt(var / n))",
           ("tests/test_kld.py", "-k", "statistics"), "the statistics' uncertainties divide by n, not n - 1"),
    Mutant("tokenizer-spm-rightmost-tie", "llamavk/tokenizer/spm.py",
           "heapq.heappush(heap, (-scores[tid], left, right, len(joined)))",
           "heapq.heappush(heap, (-scores[tid], -left, right, len(joined)))",
           ("tests/test_tokenizer.py", "-k", "spm"), "SPM merges the rightmost pair on equal scores"),
    Mutant("tokenizer-bpe-rank-order", "llamavk/tokenizer/bpe.py",
           "ranks.setdefault((m[:pos], m[pos + 1:]), i)", "ranks.setdefault((m[:pos], m[pos + 1:]), -i)",
           ("tests/test_tokenizer.py", "-k", "smollm2_basic or matches_hf"), "BPE merges the last-listed pair first"),
    # -- Python: split planning, graph, fusion, architectures ---------------------------------------
    Mutant("split-partition-floor", "llamavk/split/base.py",
           "round(acc * units) * granularity", "int(acc * units) * granularity",
           ("tests/test_split.py", "-k", "partition"), "device shares cut by floor instead of round"),
    Mutant("split-tensor-bias-first-part", "llamavk/split/tensor.py",
           "[extra[0].gathered(0, rs)] if extra", "[extra[0]] if extra",
           ("tests/test_split.py", "-k", "matches_none and qwen2 and tensor"),
           "the Q/K/V bias not cut: every device adds the bias's first rows"),
    Mutant("graph-reads-forget-fused-operands", "llamavk/graph.py",
           "extra = tuple(v for v in self.attrs.values() if isinstance(v, Tensor))", "extra = ()",
           (ENGINE, "-k", "greedy_decode"), "fused operands (residual, glu, norm) not seen as reads: freed early"),
    Mutant("forward-ffn-uses-attn-norm", "llamavk/models/forward.py",
           'vec(g, b + "ffn_norm.weight", E, "ffn_norm", i)', 'vec(g, b + "attn_norm.weight", E, "attn_norm", i)',
           (ENGINE, "-k", "logits_match and q8_0"), "the FFN norm reads the attention norm's weight"),
    Mutant("fusion-norm-drops-bias", "llamavk/fusion.py",
           "u.inputs = (u.inputs[0], x) + u.inputs[2:]", "u.inputs = (u.inputs[0], x)",
           (ENGINE, "-k", "greedy_decode and qwen2"), "folding the norm into Q/K/V products loses their biases"),
    Mutant("fusion-glu-gate-up-swapped", "llamavk/fusion.py",
           "gate, up = op.inputs\n", "up, gate = op.inputs\n",
           (ENGINE, "-k", "greedy_decode"), "the decode down product reads silu(up) * gate"),
    Mutant("qwen2-rope-not-neox", "llamavk/models/qwen2.py",
           "rope_neox=True", "rope_neox=False",
           (ORACLE, "-k", "qwen2"), "qwen2 with llama's RoPE pairs (reference.py reads the same flag)"),
    Mutant("qwen3-qk-norm-after-rope", "llamavk/models/blocks.py",
           """    if cfg.qk_norm:
        q = g.head_norm(q, vec(g, b + "attn_q_norm.weight", D, "q_norm", i), cfg.n_head, cfg.rms_eps)
        k = g.head_norm(k, vec(g, b + "attn_k_norm.weight", D, "k_norm", i), cfg.n_head_kv, cfg.rms_eps)
    q = g.rope(q, cfg.n_head)
    k = g.rope(k, cfg.n_head_kv)
""", """    q = g.rope(q, cfg.n_head)
    k = g.rope(k, cfg.n_head_kv)
    if cfg.qk_norm:
        q = g.head_norm(q, vec(g, b + "attn_q_norm.weight", D, "q_norm", i), cfg.n_head, cfg.rms_eps)
        k = g.head_norm(k, vec(g, b + "attn_k_norm.weight", D, "k_norm", i), cfg.n_head_kv, cfg.rms_eps)
""", (ORACLE, "-k", "qwen3"), "qwen3's QK norm after RoPE instead of before"),
    Mutant("qwen2-no-q-bias", "llamavk/models/blocks.py",
           'bias("q", q_out, "q_bias")', "None",
           (ORACLE, "-k", "qwen2"), "qwen2's Q bias left out"),
    Mutant("moe-route-not-renormalised", "shaders/moe_route.comp",
           "float f = p.norm != 0 ? p.scale / chosen_sum : p.scale;", "float f = p.scale;",
           (ORACLE, "-k", "qwen3moe"), "prompt routing: the chosen experts' weights not renormalised to sum 1"),
    Mutant("moe-router-not-renormalised", "shaders/moe_router.comp",
           "float f = p.norm != 0 ? p.scale / chosen_sum : p.scale;", "float f = p.scale;",
           ("tests/test_moe.py", "-k", "router or decode"),
           "decode routing: the chosen experts' weights not renormalised to sum 1"),
    Mutant("shexp-gate-without-sigmoid", "shaders/moe_router.comp",
           "route[t * 2 * half_row + half_row + p.n_used] = 1.0 / (1.0 + exp(-logit));",
           "route[t * 2 * half_row + half_row + p.n_used] = 1.0 / (1.0 + exp(logit));",
           ("tests/test_moe_shexp.py",), "decode: the shared expert's gate sigmoid(-w . x')"),
    Mutant("mvid-sum-subgroup-rows-overlap", "shaders/matvec_id.comp",
           "red[s * p.rows_per_wg + rsub + g + G * j]", "red[s * p.rows_per_wg + g + G * j]",
           ("tests/test_moe.py", "-k", "subgroups_per_slot"),
           "decode: a slot's second subgroup writes its rows over the first's (several subgroups a slot)"),
    Mutant("mvid-e2m1-sign-bit-misplaced", "shaders/matvec_id.comp",
           "vec2 l13 = unpackHalf2x16(((w << 1) & M) | ((w << 4) & S));",
           "vec2 l13 = unpackHalf2x16(((w << 1) & M) | ((w << 3) & S));",
           ("tests/test_moe.py", "-k", "MXFP4"),
           "decode: MXFP4 experts' odd low nibbles take the wrong bit for their sign"),
    Mutant("stream-q6k-offset-31", "shaders/matvec_stream.comp",
           "* (sd.x * (float(hs[j]) + float(ls[j]) * (1.0 / 254.0)) - 32.0 * sd.y);",
           "* (sd.x * (float(hs[j]) + float(ls[j]) * (1.0 / 254.0)) - 31.0 * sd.y);",
           ("tests/test_kernels_matvec_stream_types.py", "-k", "stream_dp and Q6_K"),
           "decode: Q6_K's offset through x's run sums taken as -31"),
    Mutant("stream-q3k-half-sums-swapped", "shaders/matvec_stream.comp",
           "float xsum = g == 0 ? sd.z : sd.w;\n            [[unroll]] for (uint j = 0; j < RJ; ++j)\n"
           "                t[j] += q3k_scale",
           "float xsum = g == 0 ? sd.w : sd.z;\n            [[unroll]] for (uint j = 0; j < RJ; ++j)\n"
           "                t[j] += q3k_scale",
           ("tests/test_kernels_matvec_stream_types.py", "-k", "stream_dp and Q3_K"),
           "decode: Q3_K's offset through the other half's sum of x"),
    Mutant("stream-kv-staged-order-unswapped", "shaders/matvec_stream.comp",
           "hw = first ? (hw & 0xFFFFu) | (hp << 16) : (hp >> 16) | (hw & 0xFFFF0000u);",
           "hw = first ? hw : hw;",
           ("tests/test_kernels_matvec_stream_types.py", "-k", "stream_dp and IQ4_NL"),
           "decode: IQ4_NL's high level of x staged in element order, not the lookups' byte order"),
    Mutant("stream-iq1s-delta-sign-flipped", "shaders/iq_unit.glsl",
           "return ((q.z >> (16 * s)) & 0x8000u) != 0u ? 9.0 : 7.0;",
           "return ((q.z >> (16 * s)) & 0x8000u) != 0u ? 7.0 : 9.0;",
           ("tests/test_kernels_matvec_stream_types.py", "-k", "stream_dp and IQ1_S"),
           "decode: IQ1_S's sub-block offset with its delta's sign flipped"),
    Mutant("shexp-slot-rows-of-the-experts", "shaders/matvec_id.comp",
           "uint o = t * tok_out + s * p.rows + row;", "uint o = (t * p.n_used + s) * p.rows + row;",
           ("tests/test_moe_shexp.py",), "decode: the shared slot's outputs laid out as if as wide as the experts'"),
    Mutant("router-fold-drops-last-partial", "shaders/matvec_stream.comp",
           "a[j] = w < n_writers ? rpart4[w * RNC4 + c4] : vec4(0.0);",
           "a[j] = w + 1 < n_writers ? rpart4[w * RNC4 + c4] : vec4(0.0);",
           ("tests/test_router_fold.py", "-k", "router_in_product"),
           "router in the product: the last workgroup's sum leaves out one workgroup's partials"),
    Mutant("router-fold-norm-weight-missing", "shaders/matvec_stream.comp",
           "rbuf[tid].xy = vec2(v, RNORM ? v * rn : v);", "rbuf[tid].xy = vec2(v, v);",
           ("tests/test_router_fold.py", "-k", "router_in_product"),
           "router in the product: the FFN norm's weights left out of x'"),
    # -- GLSL: weight decoding per type ---------------------------------------------------------------
    Mutant("q4_0-offset-7", "shaders/quants.glsl",
           "((q >> 24) & 0xFu))) - 8388616.0;", "((q >> 24) & 0xFu))) - 8388615.0;",
           (KERNELS, "-k", "Q4_0"), "Q4_0 low nibbles minus 7 instead of 8"),
    Mutant("q8_0-sign-of-byte-3", "shaders/quants.glsl",
           "q ^= 0x80808080u;", "q ^= 0x00808080u;",
           (KERNELS, "-k", "Q8_0"), "Q8_0's fourth byte of a word read unsigned"),
    Mutant("q4_k-scale-top-bits", "shaders/quants.glsl",
           "sc = (md & 0xFu) | ((uint(wu8[s8 + j - 4]) >> 6) << 4);", "sc = (md & 0xFu);",
           (ENGINE, "-k", "logits_match and q4_k"), "Q4_K scales 4-7 lose their top 2 bits (model level)"),
    Mutant("q4_k-stream-scale-top-bits", "shaders/quants.glsl",
           "| ((a >> 2) & 0x3030u);", "| ((a >> 4) & 0x3030u);",
           (ENGINE, "-k", "stream_kernel and q4_k"), "the one-token kernel's Q4_K scales 4-7: top bits misplaced"),
    Mutant("q6_k-offset-31", "shaders/quants.glsl",
           "else c = dl.y * (bytes4(q) - 32.0);", "else c = dl.y * (bytes4(q) - 31.0);",
           (KERNELS, "-k", "Q6_K"), "Q6_K's second half minus 31"),
    Mutant("q5_0-high-bit-shift", "shaders/quants.glsl",
           "uint b = (row * (cols / QK) + u) * 11;  // 22 bytes\n    float d = half_bits(wu16[b]);\n"
           "    uint qh = u32_at16(b + 1);\n    uint q = u32_at16(b + 3 + 2 * i);\n"
           "    uint lo = (q & 0x0F0F0F0Fu) | (spread4(qh >> (4 * i)) << 4);\n"
           "    uint hi = ((q >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * i)) << 4);",
           "uint b = (row * (cols / QK) + u) * 11;  // 22 bytes\n    float d = half_bits(wu16[b]);\n"
           "    uint qh = u32_at16(b + 1);\n    uint q = u32_at16(b + 3 + 2 * i);\n"
           "    uint lo = (q & 0x0F0F0F0Fu) | (spread4(qh >> (4 * i)) << 4);\n"
           "    uint hi = ((q >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (12 + 4 * i)) << 4);",
           (KERNELS, "-k", "Q5_0"), "Q5_0's fifth bits of the high nibbles from the wrong half of qh"),
    Mutant("q3_k-scale-high-bits", "shaders/quants.glsl",
           "uint hi = (uint(wu8[b8 + 104 + i % 4]) >> (2 * (i / 4))) & 0x3u;",
           "uint hi = (uint(wu8[b8 + 104 + i % 4]) >> (2 * (i % 4))) & 0x3u;",
           (KERNELS, "-k", "Q3_K"), "Q3_K's 6-bit scales: top bits from the wrong pair"),
    Mutant("iq-ksigns-no-parity", "shaders/quants.glsl",
           "uint ksigns(uint k) { return k | ((bitCount(k) & 1u) << 7); }",
           "uint ksigns(uint k) { return k; }",
           (KERNELS, "-k", "IQ2_XXS or IQ3_XXS"),
           "IQ2_XXS / IQ3_XXS: the eighth sign (the parity of the seven) left positive"),
    Mutant("iq3_s-ninth-bit-of-the-other-half", "shaders/quants.glsl",
           "(idx & 0xFFu) | ((hb & 1u) << 8), (idx >> 8) | ((hb & 2u) << 7));",
           "(idx & 0xFFu) | ((hb & 2u) << 7), (idx >> 8) | ((hb & 1u) << 8));",
           (KERNELS, "-k", "IQ3_S"), "IQ3_S: the two grid indices' 9th bits swapped"),
    Mutant("iq1_m-scale-nibbles-reversed", "shaders/quants.glsl",
           "const uint d16 = (s0 >> 12) | ((s1 >> 8) & 0xF0u) | ((s2 >> 4) & 0xF00u) | (s3 & 0xF000u);",
           "const uint d16 = (s3 >> 12) | ((s2 >> 8) & 0xF0u) | ((s1 >> 4) & 0xF00u) | (s0 & 0xF000u);",
           (KERNELS, "-k", "IQ1_M"), "IQ1_M: its f16 d assembled from the scale words in the wrong order"),
    Mutant("iq1-delta-sign", "shaders/quants.glsl",
           "return IqGroup(dl, 0u, (qh & 0x8000u) != 0u ? -0.125 : 0.125, idx, 0u);",
           "return IqGroup(dl, 0u, (qh & 0x8000u) != 0u ? 0.125 : -0.125, idx, 0u);",
           (KERNELS, "-k", "IQ1_S"), "IQ1_S: the shift's sign bit read the other way"),
    Mutant("tq1_0-qh-digit-of-the-unit", "shaders/quants.glsl",
           "const uint jc = lo ? s : s == 7u ? i : ja + 1u;",
           "const uint jc = lo ? s : s == 7u ? 4u : ja + 1u;",
           (KERNELS, "-k", "TQ1_0"), "TQ1_0: the last 16 weights all from one base-3 digit of qh"),
    Mutant("iq-stream-signs-ignored", "shaders/iq_unit.glsl",
           "uint iq_signed(uint g, uint m) { return (g ^ m) + (m & 0x01010101u); }",
           "uint iq_signed(uint g, uint m) { return g; }",
           (STREAM_TYPES, "-k", "products and (IQ2_XXS or IQ3_S)"),
           "the lattice types' one-token stream form: every weight positive"),
    Mutant("iq1-stream-delta-sign", "shaders/iq_unit.glsl",
           "uint k = neg ? 0x09090909u : 0x07070707u;", "uint k = neg ? 0x07070707u : 0x09090909u;",
           (STREAM_TYPES, "-k", "products and IQ1"), "IQ1_S / IQ1_M's stream form: the shift's sign the other way"),
    Mutant("tq1_0-stream-digit-pair", "shaders/matvec_stream.comp",
           "trit_bytes(wq[i][j][2][w % 4], 2 * (g - 5) + w / 4)", "trit_bytes(wq[i][j][2][w % 4], 2 * (g - 5))",
           (STREAM_TYPES, "-k", "products and TQ1_0"),
           "TQ1_0's stream form: bytes 32..47's second digit of a pair read as the first"),
    Mutant("iq-expert-group-x-swapped", "shaders/matvec_id.comp",
           "t += dot(sbytes_fma(lo), xv[sb][2 * l]) + dot(sbytes_fma(hi), xv[sb][2 * l + 1]);",
           "t += dot(sbytes_fma(lo), xv[sb][2 * l + 1]) + dot(sbytes_fma(hi), xv[sb][2 * l]);",
           ("tests/test_moe.py", "-k", "decode and IQ2_XXS"),
           "the lattice types' expert products pair a group's halves with the other half of x"),
    Mutant("iq-grid-tail-unaligned", "llamavk/kernels/__init__.py",
           "return -(-block_bytes // GRID_TAIL_ALIGN) * GRID_TAIL_ALIGN",
           "return block_bytes",
           (KERNELS, "-k", "IQ2_XXS"), "the lattice grid written right after the blocks, not where kernels read it"),
    Mutant("iq-matvec-group-x-shifted", "shaders/matvec.comp",
           "vec4 xa = xin(t, 2 * q, ss[t]), xc = xin(t, 2 * q + 1, ss[t]);",
           "vec4 xa = xin(t, 2 * q + 1, ss[t]), xc = xin(t, 2 * q, ss[t]);",
           (KERNELS, "-k", "test_matvec and IQ"),
           "the lattice one-token product pairs a group's halves with the other half of x"),
    # -- GLSL: RoPE, attention, norms, exchange ------------------------------------------------------
    Mutant("rope-frequency-index", "shaders/rope_common.glsl",
           "exp2(p.log2_theta_scale * float(i))", "exp2(p.log2_theta_scale * float(i + 1))",
           (OPS, "-k", "rope"), "RoPE frequencies shifted by one pair"),
    Mutant("rope-neox-pairs-inverted", "shaders/rope_common.glsl",
           "return p.neox != 0 ?", "return p.neox == 0 ?",
           (OPS, "-k", "rope"), "normal and NEOX pairings swapped"),
    Mutant("attention-split-merge-unscaled", "shaders/attention_split.glsl",
           "den = den * a + mls.y * b;", "den = den * a + mls.y;",
           (OPS, "-k", "attention"), "merging KV splits: a split's softmax sum not rescaled to the common max"),
    Mutant("rms-norm-mean-over-n-minus-1", "shaders/rms_norm.comp",
           "inversesqrt(total / float(p.n_cols) + p.eps)", "inversesqrt(total / float(p.n_cols - 1) + p.eps)",
           (OPS, "-k", "rms_norm"), "RMS norm divides the sum of squares by n - 1"),
    Mutant("matvec-fused-norm-over-rows", "shaders/matvec.comp",
           "inversesqrt(ss[t] / float(p.cols) + p.eps)", "inversesqrt(ss[t] / float(p.n_rows) + p.eps)",
           (ENGINE, "-k", "greedy_decode"), "the decode products' folded RMS norm averages over the rows"),
    Mutant("exchange-waits-one-too-far", "shaders/exchange_sync.comp",
           "arrived = flags[line(peer, k)] >= value;", "arrived = flags[line(peer, k)] > value;",
           ("tests/test_vk_multidevice.py",), "an exchange point waits for the next step's counter"),
    Mutant("reduce-drops-the-residual", "shaders/reduce_sum.comp",
           "float acc = p.has_base != 0u ? base[t * p.base_stride + p.base_c0 + c] : 0.0;", "float acc = 0.0;",
           ("tests/test_split.py", "-k", "matches_none and llama and tensor"),
           "the all-reduce leaves out the residual it adds to"),
    Mutant("swiglu-sign", "shaders/elementwise.comp",
           "c[i] = g / (1.0 + exp(min(-g, 80.0))) * b[i];", "c[i] = g / (1.0 + exp(min(g, 80.0))) * b[i];",
           (OPS, "-k", "swiglu"), "silu(g) with e^g instead of e^-g"),
]


def copy_tree(dest: Path) -> None:
    """The working tree as it is (tracked and untracked files git does not ignore), without .git."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, check=True,
                           capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def rebuild_shaders(tree: Path, shader: str) -> tuple[int, int]:
    """Rebuild every kernel whose sources include `shader`: (kernels rebuilt, SPIR-V files changed)."""
    sys.path.insert(0, str(tree / "shaders"))
    try:
        import build
        names = [n for n, (src, _) in build.VARIANTS.items()
                 if (tree / shader).resolve() in [p.resolve() for p in build.includes(build.HERE / src)]]
    finally:
        sys.path.pop(0)
        sys.modules.pop("build", None)
    before = {n: (tree / "llamavk/spv" / f"{n}.spv").read_bytes() for n in names}
    subprocess.run([sys.executable, "shaders/build.py", *names], cwd=tree, check=True, capture_output=True)
    changed = sum((tree / "llamavk/spv" / f"{n}.spv").read_bytes() != before[n] for n in names)
    return len(names), changed


def run_tests(tree: Path, args: tuple[str, ...], timeout: float) -> tuple[int | None, str]:
    """pytest's exit status (None: timed out) and its output."""
    env = dict(os.environ, PYTHONPATH=str(tree), PYTHONDONTWRITEBYTECODE="1")
    shared = ROOT.parent / "shared" / "ref-llamacpp"      # the copy lives elsewhere: where the oracle is
    if shared.is_dir():
        env.setdefault("LLAMAVK_REF_LLAMACPP", str(shared))
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *args]
    try:
        r = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    return r.returncode, (r.stdout + r.stderr).strip()


def summary(output: str) -> str:
    """The first failing test and pytest's last line."""
    lines = output.splitlines() or [""]
    failed = next((l.split(" - ")[0] for l in lines if l.startswith(("FAILED ", "ERROR "))), "")
    return f"{lines[-1]}  {failed}".strip()


def check(m: Mutant, timeout: float, keep: bool) -> tuple[str, str]:
    tmp = Path(tempfile.mkdtemp(prefix=f"mutant-{m.name}-"))
    try:
        copy_tree(tmp)
        target = tmp / m.path
        text = target.read_text()
        if text.count(m.old) != 1:
            return "STALE", f"the text to mutate occurs {text.count(m.old)} times in {m.path}"
        target.write_text(text.replace(m.old, m.new))
        if m.path.startswith("shaders/"):
            if shutil.which("glslc") is None:
                return "SKIPPED", "glslc not found"
            n, changed = rebuild_shaders(tmp, m.path)
            if not changed:
                return "EQUIVALENT", f"none of the {n} kernels' SPIR-V changed"
        rc, out = run_tests(tmp, m.tests, timeout)
        if rc is None:
            return "killed", "timed out"
        if rc in (1, 2):                # tests failed, or collection/import errors
            return "killed", summary(out)
        if rc == 0:
            return "SURVIVED", summary(out)
        return "ERROR", f"pytest exit {rc}: {summary(out)}"
    finally:
        if keep:
            print(f"    kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-k", dest="pattern", help="only mutants whose name contains this")
    ap.add_argument("--list", action="store_true", help="list the mutants and exit")
    ap.add_argument("--no-baseline", action="store_true", help="skip the unmutated run of the chosen tests")
    ap.add_argument("--keep", action="store_true", help="keep each mutated copy (paths printed)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per mutant's tests")
    a = ap.parse_args()
    chosen = [m for m in MUTANTS if not a.pattern or a.pattern in m.name]
    if a.list:
        for m in chosen:
            print(f"{m.name:36} {m.path:30} {m.why}")
        return 0
    if not a.no_baseline:
        tmp = Path(tempfile.mkdtemp(prefix="mutant-baseline-"))
        try:
            copy_tree(tmp)
            for args in dict.fromkeys(m.tests for m in chosen):
                rc, out = run_tests(tmp, args, a.timeout)
                if rc != 0:
                    print(f"baseline fails: pytest {' '.join(args)}:\n" + "\n".join(out.splitlines()[-40:]))
                    return 2
            print(f"baseline: the chosen tests of {len(chosen)} mutants pass unmutated")
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    results = []
    for m in chosen:
        t0 = time.perf_counter()
        status, detail = check(m, a.timeout, a.keep)
        results.append(status)
        print(f"{status:10} {m.name:36} {time.perf_counter() - t0:6.1f}s  {detail}", flush=True)
    killed = results.count("killed")
    counted = sum(s in ("killed", "SURVIVED") for s in results)
    print(f"\nkilled {killed} of {counted} mutants ({100 * killed / max(1, counted):.0f}%)"
          + "".join(f", {results.count(s)} {s.lower()}" for s in ("STALE", "EQUIVALENT", "SKIPPED", "ERROR")
                    if s in results))
    return 0 if killed == counted == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
