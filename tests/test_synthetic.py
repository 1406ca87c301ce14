"""Synthetic models: exact preset shapes (SPEC §10), valid tokenizer, fast streaming writer."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from llamavk.errors import LlamavkError
from llamavk.gguf_file import GGUFFile
from llamavk.models import load_model_file
from llamavk.synthetic import (PRESETS, SYNTHETIC_TYPES, parse_synthetic_name, random_blocks, synthetic_model_path,
                               synthetic_plan, synthetic_vocab, write_synthetic_model)

REPO = Path(__file__).resolve().parents[1]

# SPEC §10: dim, layers, ffn, heads, kv heads, parameters (billions, rounded)
SPEC_SHAPES = {
    "1b": (2048, 16, 8192, 32, 8, 1.10),
    "8b": (4096, 32, 14336, 32, 8, 7.24),
    "32b": (5120, 64, 27648, 40, 8, 31.53),
    "70b": (8192, 80, 28672, 64, 8, 68.98),
}


@pytest.mark.parametrize("preset", list(SPEC_SHAPES))
@pytest.mark.parametrize("qtype", ["q4_0", "q4_k", "f16"])
def test_big_preset_plans_match_spec(preset, qtype):
    plan = synthetic_plan(preset, qtype)
    c = plan.config
    dim, layers, ffn, heads, kv, params = SPEC_SHAPES[preset]
    assert (c.n_embd, c.n_layer, c.n_ff, c.n_head, c.n_head_kv) == (dim, layers, ffn, heads, kv)
    assert (c.n_vocab, c.rope_base, c.head_dim, c.tied_output) == (32000, 500000.0, 128 if dim > 2048 else 64, False)
    assert round(plan.n_params / 1e9, 2) == params
    wtype = T[qtype.upper()]
    names = {t.spec.name for t in plan.tensors}
    assert {"token_embd.weight", "output.weight", "output_norm.weight"} <= names
    assert len(plan.tensors) == 3 + 9 * layers
    for t in plan.tensors:
        assert t.qtype == (wtype if len(t.spec.shape) == 2 else T.F32)
    if qtype == "q4_0":   # Q4_0: 18 bytes per 32 weights; norms f32
        n_norm = dim * (2 * layers + 1)
        assert plan.total_bytes == (plan.n_params - n_norm) // 32 * 18 + 4 * n_norm


def test_tiny_preset_dims_fit_every_type():
    assert (PRESETS["tiny"].n_embd, PRESETS["tiny"].n_ff) == (64, 160)
    for qtype in SYNTHETIC_TYPES:
        for arch in ("llama", "qwen2", "qwen3", "gemma3"):
            synthetic_plan("tiny", qtype, arch)


def test_mxfp4_moe_mix_is_the_released_gpt_oss_layout():
    """MXFP4 experts, Q8_0 every other matrix (attention, embeddings, output), the router and biases
    f32; file type 38 (MOSTLY_MXFP4_MOE); by name too."""
    plan = synthetic_plan("gpt-oss-20b", "mxfp4_moe", n_layer=1)
    types = {t.spec.name: t.qtype for t in plan.tensors}
    assert types["blk.0.ffn_gate_exps.weight"] == types["blk.0.ffn_down_exps.weight"] == T.MXFP4
    assert types["blk.0.attn_q.weight"] == types["token_embd.weight"] == types["output.weight"] == T.Q8_0
    assert types["blk.0.ffn_gate_inp.weight"] == types["blk.0.ffn_gate_exps.bias"] == T.F32
    assert plan.metadata["general.file_type"] == 38
    assert parse_synthetic_name("synthetic:gpt-oss-20b-mxfp4_moe") == ("gpt-oss-20b", "mxfp4_moe", "gpt-oss")


def test_k_quant_m_mixes_widen_v_down_and_output_on_the_layers_that_get_more_bits():
    """q4_k_m / q5_k_m: the base K-quant, Q6_K for output.weight and, on layers 0-1, 14-15 and every
    third from 4 of 16 (the first and last eighth, every third between), attn_v and the experts' down
    matrices; file types 15 / 17 (MOSTLY_Q4_K_M / Q5_K_M); by name too."""
    wide = {0, 1, 4, 7, 10, 13, 14, 15}
    for name, base, ftype in (("q4_k_m", T.Q4_K, 15), ("q5_k_m", T.Q5_K, 17)):
        plan = synthetic_plan("30b-a3b", name, n_layer=16)
        types = {t.spec.name: t.qtype for t in plan.tensors}
        assert types["output.weight"] == T.Q6_K and types["token_embd.weight"] == base
        for i in range(16):
            for matrix in ("attn_v", "ffn_down_exps"):
                assert types[f"blk.{i}.{matrix}.weight"] == (T.Q6_K if i in wide else base), (name, i, matrix)
            for matrix in ("attn_q", "attn_k", "attn_output", "ffn_gate_exps", "ffn_up_exps"):
                assert types[f"blk.{i}.{matrix}.weight"] == base
            assert types[f"blk.{i}.ffn_gate_inp.weight"] == T.F32
        assert plan.metadata["general.file_type"] == ftype
        assert parse_synthetic_name(f"synthetic:30b-a3b-{name}") == ("30b-a3b", name, "qwen3moe")
    dense = {t.spec.name: t.qtype for t in synthetic_plan("8b", "q4_k_m", n_layer=8).tensors}
    assert [dense[f"blk.{i}.ffn_down.weight"] for i in range(8)] == [T.Q6_K, T.Q4_K, T.Q4_K, T.Q6_K,
                                                                     T.Q4_K, T.Q4_K, T.Q6_K, T.Q6_K]


def test_bad_requests():
    with pytest.raises(LlamavkError, match="preset"):
        synthetic_plan("13b")
    with pytest.raises(LlamavkError, match="nvfp4"):
        synthetic_plan("tiny", "nvfp4")
    with pytest.raises(LlamavkError, match="supported"):
        synthetic_plan("tiny", "q4_0", "gpt2")
    with pytest.raises(LlamavkError, match="block size 256"):
        synthetic_plan("tiny", "q4_k", n_embd=64)
    with pytest.raises(LlamavkError, match="n_lyaer"):
        synthetic_plan("tiny", n_lyaer=3)


def test_overrides(tmp_path):
    p = write_synthetic_model(tmp_path / "o.gguf", "tiny", "q8_0", "qwen2", n_layer=3, n_embd=96,
                              n_head=3, n_head_kv=1, n_ff=224, n_vocab=300)
    c = load_model_file(p).config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_ff, c.n_vocab) == \
        (3, 96, 3, 1, 32, 224, 300)


def test_file_layout_and_arch_tensors(tmp_path):
    p = write_synthetic_model(tmp_path / "q2.gguf", "tiny", "q4_0", "qwen2")
    g = GGUFFile(p)
    assert g.metadata["general.architecture"] == "qwen2"
    assert g.tensor_type("blk.0.attn_q.bias") == T.F32
    assert g.tensor_shape("blk.0.attn_k.bias") == (32,)
    m3 = load_model_file(write_synthetic_model(tmp_path / "q3.gguf", "tiny", "q4_0", "qwen3"))
    assert m3.weights["blk.1.attn_k_norm.weight"].shape == (32,)
    norm = m3.dequantize("blk.0.attn_norm.weight")
    assert abs(norm.mean() - 1.0) < 0.1 and norm.std() < 0.3


def test_vocab():
    tokens, scores, types = synthetic_vocab(32000)
    assert len(tokens) == len(set(tokens)) == len(scores) == len(types) == 32000
    assert tokens[:3] == ["<unk>", "<s>", "</s>"] and types[:3] == [2, 3, 3]
    assert tokens[3] == "<0x00>" and tokens[258] == "<0xFF>" and set(types[3:259]) == {6}
    assert tokens[259] == "\u2581" and set(types[259:]) == {1}
    assert all(a > b for a, b in zip(scores[260:], scores[261:]))


def test_tokenizer_on_synthetic_vocab(tmp_path):
    """Words that are pieces ("▁" + letters) are one token each, with the id of their piece; a
    character outside the vocabulary falls back to its UTF-8 bytes (<0xXX> = 3 + byte)."""
    from llamavk.tokenizer import Tokenizer

    m = load_model_file(write_synthetic_model(tmp_path / "t.gguf"))
    tok = Tokenizer.from_metadata(m.metadata)
    tokens = m.metadata["tokenizer.ggml.tokens"]
    words = ["a", "ab", "z", "bc", "q"]
    assert tok.encode(" ".join(words)) == [1] + [tokens.index("\u2581" + w) for w in words]
    assert tok.encode("é") == [1, tokens.index("\u2581"), 3 + 0xC3, 3 + 0xA9]
    assert tok.decode(tok.encode("ab ca é")[1:]) == "ab ca é"


@pytest.mark.parametrize("qtype", SYNTHETIC_TYPES)
def test_random_blocks_have_the_requested_std(qtype):
    """Decoded by gguf.quants (not by llamavk): the std asked for, all finite, and a mean near 0, for a
    token embedding's std (1), a tiny model's (1/16, 0.05) and a 70B's (0.006, 0.005). Within 0.02
    std (measured: at most 0.011, Q3_K's d (s - 32) q with E[s - 32] E[q] = 1/4); levels that are not
    symmetric about 0 shift it further: Q4_0's -8..7 by -0.11 std, IQ4_NL's table by -0.09, Q5_0's
    -16..15 by -0.05 (0.12 allowed). The mins of Q4_1, Q5_1 and the K-quants cancel the mean of
    their levels: a min off by one level's step moves it by 0.06 std or more."""
    from gguf import quants

    wtype = T[qtype.upper()]
    for std in (1.0, 1 / 16, 0.05, 0.006, 0.005):
        raw = random_blocks(np.random.default_rng(3), wtype, 4096, std)
        w = quants.dequantize(raw, wtype).ravel() if wtype not in (T.F32, T.F16) else \
            raw.view(np.float16 if wtype == T.F16 else np.float32).astype(np.float32)
        assert np.isfinite(w).all()
        # MXFP4's scales are powers of two, the nearest to the wanted one: within a factor sqrt(2)
        ratio = (1 / 1.42, 1.42) if wtype == T.MXFP4 else (0.94, 1.06)
        mean_tol = 0.12 if wtype in (T.Q4_0, T.Q5_0, T.IQ4_NL) else 0.02
        assert ratio[0] < w.std() / std < ratio[1] and abs(w.mean()) < mean_tol * std, (std, w.std(), w.mean())


# byte offsets of the f16 super-block scales (d, and dmin or the block minimum where the type has one)
F16_SCALES = {T.Q4_1: (0, 2), T.Q5_0: (0,), T.Q5_1: (0, 2), T.Q2_K: (80, 82), T.Q3_K: (108,), T.Q5_K: (0, 2)}


@pytest.mark.parametrize("wtype", list(F16_SCALES), ids=lambda t: t.name)
def test_f16_scales_stay_normal_numbers(wtype):
    """For every std a preset asks for (down to a 70B's 1/sqrt(28672) = 0.0059) and a little below,
    the f16 scales are normal numbers (not subnormal: they would lose precision), none NaN or inf."""
    for std in (1.0, 1 / 16, 0.0059, 0.005):
        raw = random_blocks(np.random.default_rng(5), wtype, 2048, std).reshape(2048, -1)
        for col in F16_SCALES[wtype]:
            v = np.abs(raw[:, col:col + 2].copy().view(np.float16).astype(np.float32))
            assert np.isfinite(v).all() and (v >= 2.0 ** -14).all(), (std, col, v.min())


def test_q5_k_and_q3_k_scales_pack_as_gguf_reads_them():
    """The packed 6-bit sub-block scales (and Q5_K's mins) decode, by gguf.quants, to the values drawn,
    and a tiny model's stds use their top bits (stored apart from the low ones), as Q4_K's do."""
    from gguf import quants

    from llamavk.synthetic import _pack_k_scales, _pack_q3_k_scales

    rng = np.random.default_rng(6)
    sc, m = rng.integers(0, 64, (2, 512, 8))
    got_sc, got_m = quants.Q4_K.get_scale_min(_pack_k_scales(sc, m))
    assert (got_sc == sc).all() and (got_m == m).all()
    # Q3_K: every quant 1 (low bits 01, hmask bit set), d = 1: each 16-value sub-block decodes to s - 32
    s = rng.integers(0, 64, (512, 16))
    blocks = np.zeros((512, 110), np.uint8)
    blocks[:, 0:32], blocks[:, 32:96] = 0xFF, 0x55
    blocks[:, 96:108] = _pack_q3_k_scales(s)
    blocks[:, 108:110] = np.full((512, 1), 1.0, np.float16).view(np.uint8)
    w = quants.dequantize(blocks.reshape(-1), T.Q3_K).reshape(512, 16, 16)
    assert (w == (s - 32)[:, :, None]).all()

    q5k = random_blocks(rng, T.Q5_K, 2048, 1.0).reshape(-1, 176)        # a token embedding: 6 bits
    sc, m = quants.Q4_K.get_scale_min(q5k[:, 4:16])
    assert sc.max() == m.max() == 63 and (sc >= 32).mean() > 0.4 and (m >= 32).mean() > 0.4
    q5k = random_blocks(rng, T.Q5_K, 2048, 1 / 16).reshape(-1, 176)     # a tiny model's matrix: 5 bits
    sc, m = quants.Q4_K.get_scale_min(q5k[:, 4:16])
    assert sc.max() == m.max() == 31 and (sc >= 16).mean() > 0.4
    q3k = random_blocks(rng, T.Q3_K, 2048, 1 / 16).reshape(-1, 110)     # all 6 bits of the scales
    top = np.unpackbits(q3k[:, 104:108], axis=1).reshape(-1, 16, 2)
    assert (top == [0, 0]).all(axis=2).mean() > 0.2 and (top == [1, 1]).all(axis=2).mean() > 0.2
    q3k = random_blocks(rng, T.Q3_K, 2048, 0.005).reshape(-1, 110)      # a 70B's: top bits 01 or 10
    top = np.unpackbits(q3k[:, 104:108], axis=1).reshape(-1, 16, 2)
    assert (top[:, :, 0] != top[:, :, 1]).all()


def test_new_types_are_llamacpp_file_types():
    """general.file_type of a file whose every matrix is of the type: the name llama-bench (0c1e570)
    printed for these synthetic files."""
    from llamavk.bench import ftype_name

    want = {"q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1", "q2_k": "Q2_K - Medium",
            "q3_k": "Q3_K - Medium", "q5_k": "Q5_K - Medium"}
    for qtype, name in want.items():
        plan = synthetic_plan("tiny", qtype)
        assert ftype_name(plan.metadata, []) == name
        assert {t.qtype for t in plan.tensors if len(t.spec.shape) == 2} == {T[qtype.upper()]}


def test_q4_k_blocks_use_every_bit_of_the_6_bit_scales():
    """Q4_K packs 8 six-bit scales and mins in 12 bytes: the low 6 bits of sub-blocks 0-3 in bytes
    0-7, sub-blocks 4-7 as a nibble in bytes 8-11 plus the top 2 bits of bytes 0-7. Tiny models'
    blocks (and every block whose f16 super-block scale stays normal) set those top bits, so a wrong
    decoding of them changes every model-level result. Where that would make the f16 scale d
    subnormal (an 8B's stds), scales stay in 0..15 and d normal."""
    raw = random_blocks(np.random.default_rng(4), T.Q4_K, 2048, 1 / 16).reshape(-1, 144)
    top = raw[:, 4:12] >> 6
    assert (top == 3).mean() > 0.2 and (top == 0).mean() > 0.2
    small = random_blocks(np.random.default_rng(4), T.Q4_K, 2048, 1 / 64).reshape(-1, 144)
    assert not (small[:, 4:12] >> 6).any()
    d = small[:, 0:2].copy().view(np.float16).astype(np.float32)
    assert (d >= 2.0 ** -14).all()                     # normal f16 numbers


def test_1b_preset_is_written_fast(tmp_path):
    t0 = time.perf_counter()
    p = write_synthetic_model(tmp_path / "1b.gguf", "1b", "q4_0")
    elapsed = time.perf_counter() - t0
    assert elapsed < 30
    plan = synthetic_plan("1b", "q4_0")
    assert plan.total_bytes <= p.stat().st_size < plan.total_bytes + (8 << 20)
    m = load_model_file(p)
    w = m.dequantize("blk.15.ffn_down.weight")
    assert np.isfinite(w).all() and 0.5 / np.sqrt(8192) < w.std() < 2 / np.sqrt(8192)
    del m, w
    p.unlink()


def test_example_script(tmp_path):
    script = REPO / "examples" / "make_synthetic_model.py"
    out = tmp_path / "ex.gguf"
    r = subprocess.run([sys.executable, str(script), "--preset", "tiny", "--type", "q6_k", "--arch",
                        "qwen3", "-o", str(out), "--seed", "5"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert load_model_file(out).config.arch == "qwen3"
    r = subprocess.run([sys.executable, str(script), "--preset", "70b", "--dry-run"],
                       capture_output=True, text=True)
    assert r.returncode == 0 and "68.98B" in r.stderr


def test_synthetic_names(tmp_path):
    assert parse_synthetic_name("synthetic:8b-q4_0") == ("8b", "q4_0", "llama")
    assert parse_synthetic_name("synthetic:tiny-q4_k-qwen3") == ("tiny", "q4_k", "qwen3")
    with pytest.raises(LlamavkError, match="PRESET-TYPE"):
        parse_synthetic_name("synthetic:9b-q4_0")
    p = synthetic_model_path("synthetic:tiny-q8_0-qwen2", cache_dir=tmp_path)
    assert p.parent == tmp_path and load_model_file(p).config.arch == "qwen2"
    mtime = p.stat().st_mtime_ns
    assert synthetic_model_path("synthetic:tiny-q8_0-qwen2", cache_dir=tmp_path) == p
    assert p.stat().st_mtime_ns == mtime   # reused, not rewritten
