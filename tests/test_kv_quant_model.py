"""Models with a quantized KV cache (-ctk/-ctv q8_0, q4_0, q4_1, q5_0, q5_1): logits and greedy tokens against the
numpy reference fed the same quantized cache (reference.kv_round_trip), every split mode against -sm
none, SmolLM2's perplexity on botchan against f16 (issue 25: within 0.5%), and the flags.

Synthetic models here take head_dim 32 (the tiny llama's 16 cannot hold a 32-value block per head).
Tolerance against the reference: test_engine's 0.003 max|logit|. The engine and numpy quantize
K rows they computed in different float orders, so a value lying on a rounding boundary may take
the neighbouring level on one side: one step of one value of a block, which this bound covers (a
wrong block layout or scale moves logits by O(1)).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import llamavk
from llamavk.errors import LlamavkError, UsageError
from llamavk.models import load_model_file
from llamavk.reference import ReferenceModel

from .test_split import rel_tol

ARCHS = [("llama", "q8_0"), ("qwen3", "q4_0"), ("gemma3", "q8_0"), ("qwen35", "q8_0"), ("qwen3moe", "q4_0")]


def quiet(path, **kw):
    return llamavk.load(path, warn=lambda m: None, **kw)


def model32(synthetic_model, arch, qtype):
    return synthetic_model(arch, qtype, head_dim=32)


def reference_spread(path, types, tokens, ref, monkeypatch, rel: float = 1e-5, seeds: int = 3) -> float:
    """How far the reference's own logits move when its K and V rows carry relative noise `rel`
    before they are quantized into the cache (largest over `seeds` draws): the scale at which a
    device's other summation order and rounding moves them. Why: a value on a rounding boundary of a
    4-bit block flips a whole step, and one such flip moves these models' logits about twice
    0.003 max|logit| (q8_0 caches: about half of it)."""
    import llamavk.reference as reference

    exact = reference.kv_round_trip
    spread = 0.0
    for seed in range(seeds):
        rng = np.random.default_rng(seed)
        monkeypatch.setattr(reference, "kv_round_trip", lambda x, t: exact(
            (x * (1 + rel * rng.standard_normal(x.shape))).astype(x.dtype), t))
        spread = max(spread, float(np.abs(ReferenceModel(load_model_file(path), *types).logits(tokens) - ref).max()))
    monkeypatch.setattr(reference, "kv_round_trip", exact)
    return spread


@pytest.mark.parametrize("arch,qtype,types", [(a, q, t) for a, q in ARCHS for t in (("q8_0", "q8_0"), ("q4_0", "q8_0"))]
                         + [("llama", "q8_0", ("q5_1", "q4_1")), ("qwen3", "q4_0", ("q4_1", "q5_0"))])
def test_logits_match_reference_with_quantized_cache(synthetic_model, monkeypatch, arch, qtype, types):
    """All-token logits of a 40-token prompt in micro-batches of 16 (the cache read back across
    batches) and 6 greedy tokens (the decode kernel) equal the reference's with the same cache types:
    the logits within 0.003 max|logit|, or within 1.5x the reference's own spread under noise at f32
    rounding's scale (reference_spread: a 4-bit K block's value on a rounding boundary flips on one
    device and not the other; a GPU's q4_0 K cache read 1.12x the fixed bound), the greedy tokens the
    same up to a near tie of the reference's two best logits (within that bound: the flip's scale)."""
    path = model32(synthetic_model, arch, qtype)
    tokens = [int(t) for t in np.random.default_rng(11).integers(0, 500, 40)]
    ref_model = ReferenceModel(load_model_file(path), type_k=types[0], type_v=types[1])
    ref = ref_model.logits(tokens)
    want_tokens = list(ReferenceModel(load_model_file(path), *types).generate_greedy(tokens[:12], 6))
    with quiet(path, n_ctx=128, n_ubatch=16, type_k=types[0], type_v=types[1]) as m:
        got = m.logits(tokens, all=True)
        greedy = list(m.generate(tokens[:12], n=6, temp=0))
        assert m.runtime.kv_types.k == types[0]
    tol = max(0.003 * np.abs(ref).max(), 1.5 * reference_spread(path, types, tokens, ref, monkeypatch))
    assert np.abs(got - ref).max() <= tol
    same = next((i for i, (a, b) in enumerate(zip(greedy, want_tokens)) if a != b), len(want_tokens))
    if same < len(want_tokens):    # the reference's logits where they part: a near tie, or a fault
        at = ReferenceModel(load_model_file(path), *types).logits(tokens[:12] + want_tokens[:same])[-1]
        assert at[want_tokens[same]] - at[greedy[same]] <= tol, (greedy, want_tokens)


def test_prompt_attention_over_f16_copies(synthetic_model, monkeypatch):
    """Where the device has cooperative matrices, a prompt over a q8_0 cache runs that kernel over
    f16 copies of the rows (attention.coop_over_f16_copies, kv_dequant.comp): all-token logits of a
    100-token prompt and 4 greedy tokens as the reference's with the same cache types (the bound above),
    and within that of the flash kernel's (LLAMAVK_ATTN_KVQ_COPY=0). Devices without skip (llvmpipe)."""
    from llamavk.kernels.selection import has_coopmat

    path = synthetic_model("llama", "q8_0", n_embd=256, n_head=4, n_head_kv=2)   # head_dim 64
    tokens = [int(t) for t in np.random.default_rng(8).integers(0, 500, 100)]
    types = dict(type_k="q8_0", type_v="q8_0")
    ref = ReferenceModel(load_model_file(path), "q8_0", "q8_0").logits(tokens)
    want = list(ReferenceModel(load_model_file(path), "q8_0", "q8_0").generate_greedy(tokens[:80], 4))
    got = {}
    monkeypatch.setenv("LLAMAVK_ATTN_SPLITS", "1")   # prompts of 100 tokens fill no GPU: one split, as long ones
    for copy in ("1", "0"):
        monkeypatch.setenv("LLAMAVK_ATTN_KVQ_COPY", copy)
        with quiet(path, n_ctx=256, n_ubatch=128, **types) as m:
            if not has_coopmat(m.runtime.kc):
                pytest.skip(f"{m.runtime.device.info.name} has no cooperative matrices")
            got[copy] = m.logits(tokens, all=True)
            assert list(m.generate(tokens[:80], n=4, temp=0)) == want
            assert ("kv_dequant_f16" in {name for name, _ in m.runtime.kc._kernels}) == (copy == "1")
    tol = 0.003 * np.abs(ref).max()
    assert np.abs(got["1"] - ref).max() <= tol
    assert np.abs(got["1"] - got["0"]).max() <= tol


def test_quantized_cache_is_not_the_f16_cache(synthetic_model):
    """The types reach the kernels: q4_0 logits differ from f16's by more than rounding (and lie
    closer to the q4_0 reference than to the f32 one)."""
    path = model32(synthetic_model, "llama", "q8_0")
    tokens = [int(t) for t in np.random.default_rng(3).integers(0, 500, 24)]
    with quiet(path, n_ctx=64) as m:
        f16 = m.logits(tokens, all=True)
    with quiet(path, n_ctx=64, type_k="q4_0", type_v="q4_0") as m:
        q4 = m.logits(tokens, all=True)
        assert m.runtime.kv_bytes() == 2 * 2 * (64 * 64 // 32 * 18)   # 2 layers, K and V, 64 rows of 2 blocks
    ref_q4 = ReferenceModel(load_model_file(path), "q4_0", "q4_0").logits(tokens)
    ref_f32 = ReferenceModel(load_model_file(path)).logits(tokens)
    assert np.abs(q4 - f16).max() > 0.01 * np.abs(f16).max()
    assert np.abs(q4 - ref_q4).max() < 0.5 * np.abs(q4 - ref_f32).max()


@pytest.mark.parametrize("mode,n_dev,ts", [("layer", 2, [2, 1]), ("row", 2, None), ("tensor", 2, None),
                                           ("tensor", 3, [1, 2, 1]), ("graph", 2, [2, 1])])
def test_split_modes_match_none_with_q8_0(synthetic_model, mode, n_dev, ts):
    """Every split mode with -ctk q8_0 -ctv q8_0 gives -sm none's logits (test_split's bounds) and
    greedy tokens; tensor/graph split the quantized cache by KV heads."""
    path = model32(synthetic_model, "llama", "q8_0")
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 500, 70)]
    kv = dict(type_k="q8_0", type_v="q8_0")
    with quiet(path, n_ctx=128, split_mode="none", **kv) as m:
        want, want_tokens = m.logits(prompt, all=True), list(m.generate(prompt, n=6, temp=0))
    with quiet(path, n_ctx=128, devices=",".join(["Vulkan0"] * n_dev), split_mode=mode, tensor_split=ts,
               n_ubatch=48, **kv) as m:
        assert m.split_mode == mode
        got, tokens, tol = m.logits(prompt, all=True), list(m.generate(prompt, n=6, temp=0)), rel_tol(m)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < tol, f"{mode}: {err:.2e}"
    assert tokens == want_tokens


def test_head_dim_not_a_multiple_of_32_is_one_line(synthetic_model):
    path = synthetic_model("llama", "q8_0")     # head_dim 16
    with pytest.raises(LlamavkError, match="head_dim 16 is not a multiple of 32"):
        quiet(path, n_ctx=64, type_k="q8_0")


def test_api_rejects_unknown_cache_types(synthetic_model):
    path = model32(synthetic_model, "llama", "q8_0")
    with pytest.raises(UsageError, match="llamavk's KV cache types are f16, q8_0, q4_0, q4_1, q5_0, q5_1"):
        quiet(path, n_ctx=64, type_v="iq4_nl")
    with pytest.raises(UsageError, match="unknown KV cache type"):
        quiet(path, n_ctx=64, type_k="q9")


def cli(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "llamavk", *args], capture_output=True, text=True, errors="replace",
                          timeout=timeout)


def test_run_verbose_reports_the_smaller_cache(synthetic_model):
    """-v names the types and the cache's size: q8_0 is 34/64 of f16's."""
    path = model32(synthetic_model, "llama", "q8_0")
    sizes = {}
    for t in ("f16", "q8_0"):
        r = cli("run", "-m", str(path), "-p", "hi", "-n", "2", "-c", "256", "--temp", "0", "-v", "-ctk", t, "-ctv", t)
        assert r.returncode == 0, r.stderr
        line = next(l for l in r.stderr.splitlines() if "KV cache" in l)
        assert f"(K {t}, V {t})" in line
        sizes[t] = float(line.split("KV cache ")[1].split(" MiB")[0])
    assert sizes["q8_0"] == pytest.approx(sizes["f16"] * 34 / 64, abs=0.06)


def test_smollm2_botchan_q8_0_against_f16_as_llamacpps(smollm2_path, botchan_text, tmp_path):
    """The issue's check: -c 128, 3 chunks of botchan (as parallel sequences), -ctk q8_0 -ctv q8_0
    against f16. On 3 chunks (192 scored tokens) the ratio is mostly which q8_0 roundings those tokens
    meet, not what the cache type costs: llama.cpp's CPU build reads +0.86% there and +0.34% over 16
    chunks, llamavk +0.64% and +0.24% (a norm's summation order, rms_norm.comp VEC4, moved its 3-chunk
    figure from +0.13%, its 16-chunk one from +0.15%). So llamavk's ratio is held to llama.cpp's on the
    same text and settings (within 0.5%), and the q8_0 cache to within 1% of f16."""
    from .llamacpp_ref import llamacpp_perplexity

    text = botchan_text[:6000]
    text_file = tmp_path / "botchan.txt"
    text_file.write_text(text)
    ours, theirs = {}, {}
    for t in ("f16", "q8_0"):
        with quiet(smollm2_path, n_ctx=384, type_k=t, type_v=t) as m:
            ours[t] = m.perplexity(text, n_ctx=128, chunks=3).ppl
        theirs[t] = llamacpp_perplexity(smollm2_path, text_file, 128, 3, "-fa", "on", "-ctk", t, "-ctv", t)[0]
    r_ours, r_theirs = ours["q8_0"] / ours["f16"] - 1, theirs["q8_0"] / theirs["f16"] - 1
    print(f"SmolLM2 botchan -c 128 --chunks 3, q8_0 against f16: llamavk {ours} {100 * r_ours:+.2f}%, "
          f"llama.cpp {theirs} {100 * r_theirs:+.2f}%")
    assert abs(r_ours - r_theirs) < 0.005 and abs(r_ours) < 0.01


def test_bench_type_k_type_v_columns(synthetic_model):
    """llama-bench's -ctk/-ctv lists: every combination runs; the markdown table shows type_k and
    type_v (not the defaults), json rows carry them."""
    import json

    path = str(model32(synthetic_model, "llama", "q8_0"))
    r = cli("bench", "-m", path, "-p", "8", "-n", "2", "-r", "1", "-ctk", "f16,q8_0", "-ctv", "q4_0")
    assert r.returncode == 0, r.stderr
    lines = [l for l in r.stdout.splitlines() if l.startswith("|")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[head.index("type_k") + 1] == "type_v" and head.index("type_k") < head.index("sm")
    rows = [[c.strip() for c in l.strip("|").split("|")] for l in lines[2:]]
    assert [(row[head.index("type_k")], row[head.index("type_v")]) for row in rows] == \
        [("f16", "q4_0")] * 2 + [("q8_0", "q4_0")] * 2
    r = cli("bench", "-m", path, "-p", "8", "-n", "0", "-r", "1", "-ctk", "q8_0", "-o", "json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)
    assert (row["type_k"], row["type_v"]) == ("q8_0", "f16")

