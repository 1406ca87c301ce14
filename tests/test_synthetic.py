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


def test_bad_requests():
    with pytest.raises(LlamavkError, match="preset"):
        synthetic_plan("13b")
    with pytest.raises(LlamavkError, match="q5_1"):
        synthetic_plan("tiny", "q5_1")
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
    """Decoded by gguf.quants (not by llamavk): the std asked for and a mean near 0 (Q4_0's levels
    -8..7 have mean -0.5: -0.11 std), for a tiny model's scales and a 70B's."""
    from gguf import quants

    wtype = T[qtype.upper()]
    for std in (1 / 16, 0.006):
        raw = random_blocks(np.random.default_rng(3), wtype, 4096, std)
        w = quants.dequantize(raw, wtype).ravel() if wtype not in (T.F32, T.F16) else \
            raw.view(np.float16 if wtype == T.F16 else np.float32).astype(np.float32)
        # MXFP4's scales are powers of two, the nearest to the wanted one: within a factor sqrt(2)
        ratio = (1 / 1.42, 1.42) if wtype == T.MXFP4 else (0.94, 1.06)
        assert ratio[0] < w.std() / std < ratio[1] and abs(w.mean()) < 0.12 * std, (std, w.std(), w.mean())


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
