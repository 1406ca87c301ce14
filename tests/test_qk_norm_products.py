"""qwen3 / qwen3moe one-token steps with the per-head Q/K RMS norms, RoPE and the K/V store in the
Q/K/V products (fusion.fuse_rope_into_products, matvec_stream.comp HEADS): the logits equal the
numpy reference forward pass and the unfused path (LLAMAVK_QKNORM_FUSE=0: norms and RoPE in the
rope_kv dispatch), with one dispatch per layer fewer.

The products run on the stream kernel as on GPUs (forced here: software devices take the base
kernel). Row blocks: wg / lanes per row * rows per lane; tiny qwen3's head_dim is 32 (q4_0, q8_0) or
128 (q4_k: dim 256), so both forms of the epilogue run: a row block of whole heads, and heads that
span several row blocks (finished by the block that counts last).
"""

import numpy as np
import pytest

import llamavk
from llamavk.kernels import matmul as mm
from llamavk.models import load_model_file
from llamavk.reference import ReferenceModel

# (arch, type, rows per lane): 64-thread workgroups, 8 lanes per row: row blocks of 8 * nr rows
CASES = [
    ("qwen3", "q4_0", 4),      # head_dim 32, row blocks of 32: one head each
    ("qwen3", "q8_0", 2),      # head_dim 32, row blocks of 16: 2 per head
    ("qwen3", "q4_k", 2),      # head_dim 128 (4 lanes per 256-wide row: blocks of 32): 4 per head
    ("qwen3moe", "q4_0", 2),
    ("qwen3moe", "q4_k", 4),   # head_dim 128, blocks of 64
]


def decode_logits(path, tokens):
    """Every token through the one-token step; (logits per token, the step's dispatches, its graph)."""
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        rt = m.runtime
        rows = []
        for i, t in enumerate(tokens):
            rt.run_batch("last", [t], i)
            rows.append(rt.logits(1)[0].copy())
        dispatches = sum(seq.n_dispatches for seq in rt.recordings[("last", 1, 0)])
        return np.array(rows), dispatches, rt.fused_one["last"]


@pytest.mark.parametrize("arch,qtype,nr", CASES)
def test_qk_norms_in_products_match_reference_and_unfused(synthetic_model, monkeypatch, arch, qtype, nr):
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": mm.MatvecConfig(64, nr, 1, 1, "stream", steps=2)})
    path = synthetic_model(arch, qtype, seed=5)
    cfg = load_model_file(path).config
    assert cfg.qk_norm and cfg.rope_neox
    tokens = [int(t) for t in np.random.default_rng(11).integers(3, cfg.n_vocab, 8)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    runs = {}
    for knob in ("1", "0"):
        monkeypatch.setenv("LLAMAVK_QKNORM_FUSE", knob)
        runs[knob] = decode_logits(path, tokens)
    (fused, n_fused, one), (plain, n_plain, one_plain) = runs["1"], runs["0"]
    qk = [op for op in one.ops if op.attrs.get("rope") in ("q", "k")]
    assert len(qk) == 2 * cfg.n_layer and all(op.attrs["head_norm"].role == op.attrs["rope"] + "_norm" for op in qk)
    assert sum(op.attrs.get("kv_stored", False) for op in one.ops) == cfg.n_layer
    assert not any(op.attrs.get("kv_stored") for op in one_plain.ops)
    assert n_plain - n_fused == cfg.n_layer             # each layer's rope_kv dispatch
    scale = np.abs(ref).max()
    assert np.abs(fused - ref).max() <= 0.003 * scale
    assert np.abs(fused - plain).max() <= 0.001 * scale


def test_chained_products_with_qk_norms_match_reference(synthetic_model, monkeypatch):
    """Every chain edge on (the down product -> next layer's Q/K/V included: the Q/K products wait in
    their shader, x loaded first, then finish their heads): logits as the reference."""
    from .vk_fixtures import chainable_stream_kernel

    chainable_stream_kernel(monkeypatch)
    monkeypatch.setenv("LLAMAVK_CHAIN", "1")
    path = synthetic_model("qwen3", "q4_k", seed=5)
    tokens = [int(t) for t in np.random.default_rng(12).integers(3, 500, 6)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    got, _, one = decode_logits(path, tokens)
    assert sum(op.attrs.get("kv_stored", False) for op in one.ops) == 2
    assert np.abs(got - ref).max() <= 0.003 * np.abs(ref).max()


def test_quantized_kv_cache_keeps_rope_kv(synthetic_model, monkeypatch):
    """The products write f16 caches only: with -ctk q8_0 the norms and RoPE stay in rope_kv."""
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": mm.MatvecConfig(64, 4, 1, 1, "stream", steps=2)})
    with llamavk.load(synthetic_model("qwen3", "q4_0", seed=5), n_ctx=64, type_k="q8_0", type_v="q8_0",
                      warn=lambda m: None) as m:
        one = m.runtime.fused_one["last"]
    attn = [op for op in one.ops if op.kind == "attention"]
    assert attn and all(op.attrs["rope"] and "q_norm" in op.attrs for op in attn)
    assert not any(op.attrs.get("rope") for op in one.ops if op.kind == "matmul")


@pytest.mark.parametrize("arch", ["qwen2", "gemma3"])
def test_other_neox_models_on_the_whole_heads_epilogue(synthetic_model, monkeypatch, arch):
    """Neox RoPE without head norms (qwen2: its Q/K biases before the rotation) and gemma3 (head norms,
    sliding-window layers with their own RoPE base) take the same epilogue: logits as the reference."""
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": mm.MatvecConfig(64, 2, 1, 1, "stream", steps=2)})
    path = synthetic_model(arch, "q8_0", seed=5)
    cfg = load_model_file(path).config
    tokens = [int(t) for t in np.random.default_rng(13).integers(3, cfg.n_vocab, 8)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    got, _, one = decode_logits(path, tokens)
    assert sum(op.attrs.get("kv_stored", False) for op in one.ops) == cfg.n_layer
    assert any("head_norm" in op.attrs for op in one.ops) == cfg.qk_norm
    assert np.abs(got - ref).max() <= 0.003 * np.abs(ref).max()


@pytest.mark.parametrize("sm", ["tensor", "graph"])
def test_head_split_modes_norm_heads_in_each_devices_products(synthetic_model, monkeypatch, sm):
    """-sm tensor / graph on 2 virtual devices: each device's Q/K products hold whole heads (its KV
    head group) and finish them; one-token logits as the reference."""
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": mm.MatvecConfig(64, 2, 1, 1, "stream", steps=2)})
    path = synthetic_model("qwen3", "q4_k", seed=5)
    tokens = [int(t) for t in np.random.default_rng(14).integers(3, 500, 5)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    with llamavk.load(path, n_ctx=64, split_mode=sm, devices=["Vulkan0", "Vulkan0"], warn=lambda m: None) as m:
        rts = m.runtime.runtimes
        assert [sum(op.attrs.get("kv_stored", False) for op in rt.fused_one["last"].ops) for rt in rts] == [2, 2]
        rows = []
        for i, t in enumerate(tokens):
            m.runtime.run_batch("last", [t], i)
            rows.append(m.runtime.logits(1)[0].copy())
    assert np.abs(np.array(rows) - ref).max() <= 0.003 * np.abs(ref).max()
