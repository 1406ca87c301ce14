"""llama.cpp as the oracle (issue 29): synthetic models of every architecture (llama, mistral3, qwen2,
qwen2moe, qwen3, qwen3moe, qwen35, qwen35moe, qwen3next, gemma3) and several weight types, and the quantized KV
cache types, scored by llama-perplexity's CPU build (../shared/ref-llamacpp, `-ngl 0`) and by llamavk.

llama.cpp shares no code with llamavk, its numpy reference or its ModelConfig, so a wrong RoPE
layout, a missing bias, a misplaced norm, a weight decoded wrongly or a perplexity window cut
differently shows up here even where llamavk and reference.py agree.

Why the models are peaked and the text is sampled from them: random tiny weights give near-uniform
attention and near-uniform token distributions, so a bug only reshuffles which tokens are unlikely
and moves the perplexity by as much as rounding does. Here (synthetic `qk_gain`, `output_gain`)
attention scores are 9x and logits 2x larger, and the text is drawn from the model itself (the numpy
reference, chunk by chunk from BOS, among the ~90 words that are one token each), so the correct
model finds it likely and any bug makes it systematically less likely.

Tolerances, on |ln(PPL_llamavk / PPL_llama.cpp)| (the difference of the mean NLLs) and on the mean
KL divergence of llamavk's token distributions from llama.cpp's (read from the base file the same
llama-perplexity run writes), by how llama.cpp rounds: it keeps the KV cache in f16 (as llamavk does)
and rounds the activations of a product to 8 bits (Q8_0 / Q8_K blocks) for a quantized weight, to f16
for an f16 weight, not at all for f32; llamavk keeps them in f32. Measured with
`python -m tests.test_llamacpp_oracle 1 2 ... 12` (every case with the models of seeds 1-12 and
their texts, 8 chunks of 64 tokens), maxima over the seeds:

    weights          |d ln PPL|    running values   rel. uncertainty   mean KLD    tolerance (PPL, KLD)
    f32              2.6e-5        6.7e-5           1.7e-5             2.0e-6      1e-4, 1e-5
    f16              1.2e-3        2.7e-3           5.9e-4             5.2e-5      3e-3, 1.5e-4
    quantized        0.064 (Q6_K)  0.19 (Q3_K)      0.030              0.028       0.15, 0.06
    f16, MoE         0.011         0.024            3.5e-3             5.5e-3      3e-2, 1.5e-2
    quantized, MoE   0.076         0.17             0.036              0.093       0.15, 0.2

(running values, the first of which covers one chunk's 31 tokens: 3x the PPL tolerance; the
uncertainty, relative to itself: the PPL tolerance).

A bug shows up far above these. Planted in the engine (scripts/mutation_check.py), with the ln PPL
ratio and the mean KLD each case then measured (f16 / Q8_0 or Q6_K / Q4_K):
- qwen2 with llama's RoPE pairs instead of NEOX: ln ratio -4.7 / -4.6 / -5.2, KLD 5.7 / 6.2 / 6.4
  (reference.py reads the same flag, so test_engine.py passes);
- qwen2 without its Q bias: +0.62 / +0.39 / +0.30, KLD 0.68 / 0.50 / 0.27;
- qwen3's QK norm after RoPE instead of before: +0.25 / +0.85 / +0.23, KLD 0.31 / 0.88 / 0.25
  (qwen3moe f16 / Q4_0: +0.37 / +0.34, KLD 0.39 / 0.48);
- qwen3moe's chosen experts' weights not renormalised to sum 1 (prompt routing): f16 +0.14, KLD
  0.15; Q4_0 +0.004 (within its PPL tolerance), KLD 0.27.
"""

from __future__ import annotations

import math
import re
import sys

import numpy as np
import pytest

import llamavk
from llamavk.kld import KLDBase
from llamavk.kld_stats import KLDStats
from llamavk.models import load_model_file
from llamavk.reference import ReferenceModel, softmax
from llamavk.synthetic import MOE_ARCHS

from .llamacpp_ref import llamacpp_perplexity_run, llamacpp_tool

# One entry per (architecture, weight type): a new architecture is one more line (its synthetic
# overrides, if any, in the dict; MoE and hybrid architectures take their tiny presets). Types:
# f32 and f16 (no 8-bit activations in llama.cpp: tight), and quantized types whose decoding differs
# (Q4_K's 6-bit packed scales, Q6_K's split bits), and Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q5_K once each.
MISTRAL3 = dict(rope_scaling="yarn", rope_factor=4.0, rope_orig_ctx=512, yarn_log_mul=1.0, attn_temp_scale=0.1)
GPT_OSS = dict(rope_scaling="yarn", rope_factor=4.0, rope_orig_ctx=128)
ORACLE_CASES = [
    ("llama", "f32", {}),
    ("llama", "q4_0", {}),
    ("qwen2", "f16", {}),
    ("qwen2", "q8_0", {}),
    ("qwen2", "q4_k", {}),
    ("qwen3", "f16", {}),
    ("qwen3", "q6_k", {}),
    ("qwen3", "q4_k", {}),
    ("qwen3moe", "f16", {}),
    ("qwen3moe", "q4_0", {}),
    ("qwen3moe", "q4_k_m", {}),      # Q4_K_M's mix: Q6_K attn_v / ffn_down_exps in its last layer, output
    ("qwen35", "f16", {}),
    ("qwen35", "q4_k", {}),
    ("qwen35moe", "f16", {}),
    ("qwen35moe", "q4_0", {}),
    # gemma3's synthetic Q/K norms are ~2 already (peaked attention): no further gain
    ("gemma3", "f16", {"qk_gain": 1.0}),
    ("gemma3", "q8_0", {"qk_gain": 1.0}),
    ("llama", "q4_1", {}),
    ("qwen2", "q5_0", {}),
    ("qwen3", "q5_1", {}),
    ("llama", "q2_k", {}),
    ("qwen2", "q3_k", {}),
    ("qwen3", "q5_k", {}),
    # Mistral Nemo's shape: heads wider than n_embd / n_head (llama.attention.key_length)
    ("llama", "f16", {"head_dim": 32}),
    # Ministral 3: YaRN with its log multiplier (cos / sin left at magnitude 1) and an attention
    # temperature that is 1 inside the original context (the only contexts llamavk runs it with)
    ("mistral3", "f16", MISTRAL3),
    ("mistral3", "q4_k", MISTRAL3),
    # qwen2's attention, experts without renormalized weights, a sigmoid-gated shared expert
    ("qwen2moe", "f16", {}),
    ("qwen2moe", "q4_0", {}),
    # qwen3next: value heads grouped per key head, q|k|v|z and beta|alpha fused (or q|k|v and z apart)
    ("qwen3next", "f16", {}),
    ("qwen3next", "q4_k", {}),
    ("qwen3next", "f16", {"ssm_fused_in": False}),
    # the table types: IQ4_NL's levels, IQ4_XS's 6-bit sub-block scales, MXFP4's E8M0 exponents
    ("llama", "iq4_nl", {}),
    ("qwen2", "iq4_xs", {}),
    ("qwen3", "mxfp4", {}),
    # the lattice types: grids, sign tables, IQ1's shifts and IQ1_M's scattered f16 scale
    ("llama", "iq2_xxs", {}),
    ("qwen2", "iq2_xs", {}),
    ("qwen3", "iq2_s", {}),
    ("llama", "iq3_xxs", {}),
    ("qwen2", "iq3_s", {}),
    ("qwen3", "iq1_s", {}),
    ("llama", "iq1_m", {}),
    # the ternary types: TQ1_0's base-3 digits, TQ2_0's 2-bit fields
    ("qwen2", "tq1_0", {}),
    ("qwen3", "tq2_0", {}),
    # gpt-oss: attention sinks, biases everywhere (per expert too), swiglu_oai's limit, windows on the
    # even layers with the model's RoPE (YaRN, as the released files); f32 (llama.cpp rounds nothing:
    # the same PPL to 5 digits, KLD ~1e-6) rather than f16, whose activations llama.cpp rounds to f16
    # before products that the std-4 expert biases and swiglu_oai's (u + 1) amplify (its first chunk
    # 14% away, KLD 3e-3), MXFP4 everywhere, and as released (mxfp4_moe: Q8_0 outside the experts)
    ("gpt-oss", "f32", GPT_OSS),
    ("gpt-oss", "mxfp4", GPT_OSS),
    ("gpt-oss", "mxfp4_moe", GPT_OSS),
    # glm4moe: Q/K/V biases, RoPE on half of each head, a dense first layer, a sigmoid router whose
    # choice reads a bias per expert (not its weights), renormalized, an ungated shared expert, a NextN
    # block in the file that neither engine runs (synthetic.TINY_GLM4MOE: why its router is unscaled)
    ("glm4moe", "f32", {}),
    ("glm4moe", "f16", {}),
    ("glm4moe", "q4_0", {}),
    ("glm4moe", "f16", {"qk_norm": True}),        # GLM-4.5's 355B: per-head Q/K norms
]
PEAKED = dict(qk_gain=3.0, output_gain=2.0)
N_CTX, N_CHUNKS = 64, 8

# (|ln(PPL_llamavk / PPL_llama.cpp)|, mean KL divergence of llamavk's distributions from llama.cpp's)
# allowed, by how llama.cpp rounds the activations of the products (measured: the module docstring)
TOLERANCE = {"f32": (1e-4, 1e-5), "f16": (3e-3, 1.5e-4), "quantized": (0.15, 0.06)}
# Mixture of experts: where two router logits nearly tie, rounding can send a token through other
# experts, which moves its NLL by far more than rounding moves a dense model's.
# f32: llama.cpp still rounds q to f16 for its dot with the f16 K cache, enough to flip a pick whose
# keys are 1e-4 apart (glm4moe's tiny files: running PPLs up to 4.7e-4 away, the mean KLD 2e-6 all the same)
MOE_TOLERANCE = {"f32": (1e-3, 1e-5), "f16": (3e-2, 1.5e-2), "quantized": (0.15, 0.2)}


def tolerance(arch: str, qtype: str) -> tuple[float, float]:
    kind = qtype if qtype in TOLERANCE else "quantized"
    return MOE_TOLERANCE.get(kind, TOLERANCE[kind]) if arch in MOE_ARCHS else TOLERANCE[kind]


def word_tokens(model_file) -> dict[int, str]:
    """Token id -> word, for the vocabulary's pieces that are "▁" and lowercase letters: each such
    word, space-separated, is one token, so a text of them tokenizes to a known sequence."""
    tokens = model_file.metadata["tokenizer.ggml.tokens"]
    return {i: t[1:] for i, t in enumerate(tokens) if re.fullmatch("\u2581[a-z]+", t)}


def sampled_text(model_file, n_ctx: int, n_chunks: int, seed: int) -> str:
    """Words drawn from the model (numpy reference, temperature 1, among the one-token words), each
    chunk from a fresh context: BOS, then n_ctx - 1 words. In the text, each chunk's first slot holds
    a filler word that perplexity replaces by BOS, so both engines score exactly what was sampled."""
    words = word_tokens(model_file)
    ids = np.array(sorted(words))
    ref = ReferenceModel(model_file)
    bos = int(model_file.metadata["tokenizer.ggml.bos_token_id"])
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_chunks):
        out.append(words[int(ids[0])])          # replaced by BOS
        logits = ref.logits([bos])[-1]
        for j in range(n_ctx - 1):
            t = int(ids[rng.choice(len(ids), p=softmax(logits[ids].astype(np.float64)))])
            out.append(words[t])
            if j < n_ctx - 2:
                logits = ref.forward([t])[-1]
    return " ".join(out[1:])    # the text's first slot is the tokenizer's BOS


def score_both(path, text_file, n_ctx: int = N_CTX, n_chunks: int = N_CHUNKS, cache: tuple[str, str] = ("f16", "f16")):
    """On one text file: llamavk's PerplexityResult, llama.cpp's (PPL, uncertainty, running PPLs),
    and the KL divergence of llamavk's token distributions from llama.cpp's (its base file, written
    by the same llama-perplexity run, read as llamavk --kl-divergence reads it). cache: the K and V
    cache types of both."""
    text = text_file.read_text()
    base = text_file.with_suffix(".llamacpp.kld")
    theirs = llamacpp_perplexity_run(path, text_file, n_ctx, n_chunks, "--kl-divergence-base", base,
                                     "-ctk", cache[0], "-ctv", cache[1], "-fa", "on")
    stats = KLDStats()
    with KLDBase(base) as b, llamavk.load(path, n_ctx=n_ctx, warn=lambda m: None, type_k=cache[0],
                                          type_v=cache[1]) as m:
        assert len(m.tokenize(text)) == n_ctx * n_chunks, "the text must be one token per word"
        ours = m.perplexity(text, n_ctx=n_ctx, chunks=n_chunks,
                            on_scored=lambda logits, targets: stats.add(logits, targets, b.read_rows(len(logits))))
    return ours, theirs, stats.result()


@pytest.mark.parametrize("arch,qtype,overrides", ORACLE_CASES,
                         ids=[f"{a}-{q}" + "".join(f"-{k}{v}" for k, v in o.items()
                                                  if k in ("head_dim", "ssm_fused_in", "qk_norm"))
                              for a, q, o in ORACLE_CASES])
def test_perplexity_matches_llamacpp(synthetic_model, tmp_path, arch, qtype, overrides):
    llamacpp_tool("llama-perplexity")      # skips, with the reason, where the build is not at hand
    path = synthetic_model(arch, qtype, **{**PEAKED, **overrides})
    text_file = tmp_path / "sampled.txt"
    text_file.write_text(sampled_text(load_model_file(path), N_CTX, N_CHUNKS, seed=5))
    ours, (ppl, unc, running), kld = score_both(path, text_file)
    tol, kld_tol = tolerance(arch, qtype)
    d = math.log(ours.ppl / ppl)
    print(f"{arch} {qtype}: llamavk {ours.ppl:.4f} +/- {ours.uncertainty:.4f}, llama.cpp {ppl:.4f} +/- {unc:.4f}, "
          f"ln ratio {d:+.5f} (tolerance {tol}); KLD mean {kld.kld_mean:.2e} (tolerance {kld_tol}) max "
          f"{kld.kld_max:.2e}, same top {100 * kld.same_top:.1f}%")
    assert len(running) == len(ours.running) == N_CHUNKS
    assert abs(d) <= tol, f"ln(PPL_llamavk / PPL_llama.cpp) = {d:+.5f}, tolerance {tol}"
    # the uncertainty, PPL sqrt(var(NLL) / (count - 1)) on both sides: rounding moves it by a
    # smaller fraction of itself than the tolerance (measured: at most 0.2 of it; the
    # f32 case's tolerance is 1/20 of what count instead of count - 1 would change)
    assert abs(ours.uncertainty / ours.ppl - unc / ppl) <= tol * unc / ppl
    # the running value after each chunk: the first chunks hold few tokens (31 for the first), where
    # the measured differences reach 2.8x those of the final value: 3x the tolerance
    for i, (a, b) in enumerate(zip(ours.running, running)):
        assert abs(math.log(a / b)) <= 3 * tol, f"running PPL after chunk {i + 1}: {a} vs llama.cpp's {b}"
    # token by token: the mean KL divergence from llama.cpp's distributions (its base file stores
    # log-probabilities to 16 bits: ~1e-6 even between identical distributions)
    assert kld.count == N_CHUNKS * (N_CTX - 1 - N_CTX // 2)
    assert kld.kld_mean <= kld_tol, f"mean KLD from llama.cpp {kld.kld_mean:.2e}, tolerance {kld_tol}"


@pytest.mark.parametrize("cache", [("f16", "q4_1"), ("f16", "q5_0"), ("f16", "q5_1"),
                                   ("q4_1", "f16"), ("q5_0", "f16"), ("q5_1", "f16")])
def test_quantized_cache_matches_llamacpp(synthetic_model, tmp_path, cache):
    """The KV cache in ggml's q4_1 / q5_0 / q5_1 blocks against llama-perplexity's CPU build with the
    same -ctk / -ctv, on f32 weights (no 8-bit activations on its side). A quantized V: the same
    distributions to rounding (f16 cache: KLD 9e-7; these 6e-5 to 8e-5). A quantized K: llama.cpp's
    CPU flash attention rounds q to 8 bits for its dot with K's blocks, llamavk keeps q in f32, so
    the bound is what llamavk's own q8_0 / q4_0 caches reach beside it (KLD 3.5e-3 / 2.5e-2 on this
    model); a misread block layout gives garbage attention, far beyond it."""
    llamacpp_tool("llama-perplexity")
    path = synthetic_model("llama", "f32", head_dim=32, **PEAKED)
    text_file = tmp_path / "sampled.txt"
    text_file.write_text(sampled_text(load_model_file(path), N_CTX, N_CHUNKS, seed=6))
    ours, (ppl, unc, running), kld = score_both(path, text_file, cache=cache)
    d = math.log(ours.ppl / ppl)
    print(f"cache {cache}: llamavk {ours.ppl:.4f}, llama.cpp {ppl:.4f}, ln ratio {d:+.5f}; KLD mean {kld.kld_mean:.2e} "
          f"max {kld.kld_max:.2e}, same top {100 * kld.same_top:.1f}%")
    tol, kld_tol = (5e-3, 2e-4) if cache[0] == "f16" else (0.05, 0.04)
    assert abs(d) <= tol and kld.kld_mean <= kld_tol


def measure(seeds: list[int]) -> None:
    """Print ln(PPL_llamavk / PPL_llama.cpp) per case and seed: the figures behind TOLERANCE."""
    import tempfile
    from pathlib import Path

    from llamavk.synthetic import tiny_preset, write_synthetic_model

    worst: dict[str, list[float]] = {}        # class -> max |d ln PPL|, over running values, unc
    with tempfile.TemporaryDirectory() as tmp:
        for arch, qtype, overrides in ORACLE_CASES:
            for seed in seeds:
                path = write_synthetic_model(Path(tmp) / "m.gguf", tiny_preset(arch), qtype, arch, seed=seed,
                                             **{**PEAKED, **overrides})
                text_file = Path(tmp) / "t.txt"
                text_file.write_text(sampled_text(load_model_file(path), N_CTX, N_CHUNKS, seed=seed + 4))
                ours, (ppl, unc, running), kld = score_both(path, text_file)
                d = math.log(ours.ppl / ppl)
                d_run = max(abs(math.log(a / b)) for a, b in zip(ours.running, running))
                d_unc = abs(ours.uncertainty / ours.ppl - unc / ppl) / (unc / ppl)
                kind = qtype if qtype in TOLERANCE else "quantized"
                w = worst.setdefault(kind + (" MoE" if arch in MOE_ARCHS else ""), [0.0] * 6)
                w[:] = (max(w[0], abs(d)), max(w[1], d_run), max(w[2], d_unc), max(w[3], kld.kld_mean),
                        max(w[4], kld.kld_max), max(w[5], 1 - kld.same_top))
                print(f"{arch:6} {qtype:5} seed {seed:2}: ln PPL {math.log(ppl):7.4f}  d ln PPL {d:+.6f}  "
                      f"running {d_run:.6f}  uncertainty {d_unc:.6f}  KLD mean {kld.kld_mean:.2e} "
                      f"max {kld.kld_max:.2e}  same top {100 * kld.same_top:.1f}%", flush=True)
    for k, (a, b, c, *_) in worst.items():
        kind, moe = k.split()[0], k.endswith("MoE")
        tol = MOE_TOLERANCE.get(kind, TOLERANCE[kind]) if moe else TOLERANCE[kind]   # (PPL, KLD)
        print(f"{k:14} max |d ln PPL| {a:.2e}, over running values {b:.2e}, relative uncertainty {c:.2e}; "
              f"tolerance {tol}; KLD mean {worst[k][3]:.2e}, max {worst[k][4]:.2e}, "
              f"top token differs {100 * worst[k][5]:.1f}%")


if __name__ == "__main__":
    measure([int(s) for s in sys.argv[1:]] or [1, 2, 3, 4])
