"""Configs and weight specs of every architecture, read from synthetic and real GGUFs."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from llamavk.errors import LlamavkError
from llamavk.models import ARCHITECTURES, config_from_metadata, load_model_file
from llamavk.models.base import ROLES, RopeScaling
from llamavk.quant import QUANT_INFO, SUPPORTED_TYPES, qtype_from_name, quant_info
from llamavk.synthetic import write_synthetic_model

ARCHS = ["llama", "qwen2", "qwen3"]
TYPES = ["f16", "q8_0", "q4_0", "q4_k", "q6_k"]


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny")
    return {(a, t): write_synthetic_model(d / f"{a}-{t}.gguf", "tiny", t, a, seed=3)
            for a in ARCHS for t in TYPES}


def assert_metadata_error(meta: dict, key: str, value, message: str) -> None:
    """config_from_metadata of meta with key set to value (None: deleted) is a one-line LlamavkError
    matching message."""
    meta = dict(meta)
    if value is None:
        del meta[key]
    else:
        meta[key] = value
    with pytest.raises(LlamavkError, match=message):
        config_from_metadata(meta, ["output.weight"])


def test_registry():
    assert sorted(ARCHITECTURES) == sorted(ARCHS + ["qwen3moe", "qwen35", "qwen35moe", "gemma3", "mistral3", "qwen2moe",
                                                  "qwen3next", "gpt-oss", "glm4moe"])
    for module in ARCHITECTURES.values():
        assert callable(module.config) and callable(module.weight_specs)


def test_quant_table():
    assert len(SUPPORTED_TYPES) == 25
    # ggml-common.h: block_iq4_nl {d, qs[16]}, block_iq4_xs {d, scales_h, scales_l[4], qs[128]},
    # block_mxfp4 {e, qs[16]}
    assert [(QUANT_INFO[t].block_size, QUANT_INFO[t].type_size) for t in (T.IQ4_NL, T.IQ4_XS, T.MXFP4)] == \
        [(32, 18), (256, 136), (32, 17)]
    # block_iq2_xxs {d, qs[32] u16}, block_iq2_xs {+ scales[8]}, block_iq2_s {d, qs[64], qh[8], scales[8]},
    # block_iq3_xxs {d, qs[96]}, block_iq3_s {d, qs[64], qh[8], signs[32], scales[4]},
    # block_iq1_s {d, qs[32], qh[8] u16}, block_iq1_m {qs[32], qh[16], scales[8]}
    assert [QUANT_INFO[t].type_size for t in (T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S, T.IQ1_M)] == \
        [66, 74, 82, 98, 110, 50, 56]
    assert (QUANT_INFO[T.Q4_0].block_size, QUANT_INFO[T.Q4_0].type_size) == (32, 18)
    assert (QUANT_INFO[T.Q6_K].block_size, QUANT_INFO[T.Q6_K].type_size) == (256, 210)
    assert (QUANT_INFO[T.F16].block_size, QUANT_INFO[T.F16].type_size) == (1, 2)
    assert QUANT_INFO[T.Q4_K].row_bytes(4096) == 16 * 144
    assert qtype_from_name("q4_k") == T.Q4_K
    with pytest.raises(LlamavkError, match="NVFP4"):
        quant_info(T.NVFP4, "blk.0.attn_q.weight")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", TYPES)
def test_tiny_model_loads(tiny_models, arch, qtype):
    m = load_model_file(tiny_models[(arch, qtype)])
    c = m.config
    kquant = qtype in ("q4_k", "q6_k")
    assert c.arch == arch
    assert (c.n_embd, c.n_ff) == ((256, 512) if kquant else (64, 160))
    assert (c.n_layer, c.n_head, c.n_head_kv, c.n_vocab) == (2, 4, 2, 500)
    assert c.head_dim == c.n_embd // c.n_head * (2 if arch == "qwen3" else 1)
    assert c.rope_dim == c.head_dim and c.rope_base == 500000.0 and c.rope_scaling is None
    assert c.rope_neox == (arch != "llama")
    assert c.qkv_bias == (arch == "qwen2") and c.qk_norm == (arch == "qwen3")
    assert not c.tied_output
    wtype = qtype_from_name(qtype)
    roles = {s.role for s in m.weights.values()}
    assert roles <= set(ROLES)
    assert ("q_bias" in roles) == c.qkv_bias and ("q_norm" in roles) == c.qk_norm
    for name, spec in m.weights.items():
        assert m.tensor_type(name) == (wtype if len(spec.shape) == 2 else T.F32)
    q = m.weights["blk.1.attn_q.weight"]
    assert (q.role, q.layer, q.shape) == ("q", 1, (c.n_head * c.head_dim, c.n_embd))
    assert m.weights["blk.0.ffn_down.weight"].shape == (c.n_embd, c.n_ff)
    assert m.weights["blk.0.attn_output.weight"].shape == (c.n_embd, c.n_head * c.head_dim)
    raw = m.raw("blk.0.ffn_gate.weight")
    assert not raw.flags.owndata  # a view into the memory map
    w = m.dequantize("blk.0.ffn_gate.weight")
    assert w.dtype == np.float32 and w.shape == (c.n_ff, c.n_embd) and np.isfinite(w).all()
    assert 0.5 / np.sqrt(c.n_embd) < w.std() < 2 / np.sqrt(c.n_embd)


def test_tied_output(tmp_path):
    m = load_model_file(write_synthetic_model(tmp_path / "t.gguf", tied_output=True))
    assert m.config.tied_output and "output.weight" not in m.weights


def test_rope_scaling_from_metadata():
    meta = {"general.architecture": "qwen2", "qwen2.embedding_length": 64, "qwen2.block_count": 1,
            "qwen2.feed_forward_length": 128, "qwen2.attention.head_count": 4,
            "qwen2.vocab_size": 100, "qwen2.context_length": 131072,
            "qwen2.rope.scaling.type": "yarn", "qwen2.rope.scaling.factor": 4.0,
            "qwen2.rope.scaling.original_context_length": 32768}
    c = config_from_metadata(meta)
    assert c.n_head_kv == 4 and c.head_dim == 16 and c.tied_output
    assert c.rope_scaling == RopeScaling("yarn", 4.0, 32768, ext_factor=1.0)
    meta["qwen2.rope.scaling.type"] = "linear"
    assert config_from_metadata(meta).rope_scaling.type == "linear"
    meta["qwen2.rope.scaling.type"] = "none"
    assert config_from_metadata(meta).rope_scaling is None
    meta["qwen2.rope.scaling.type"] = "longrope"
    with pytest.raises(LlamavkError, match="longrope"):
        config_from_metadata(meta)


def test_smollm2_config(smollm2_path):
    m = load_model_file(smollm2_path)
    c = m.config
    assert (c.arch, c.n_vocab, c.n_embd, c.n_layer, c.n_head, c.n_head_kv, c.head_dim, c.n_ff) == \
        ("llama", 49152, 576, 30, 9, 3, 64, 1536)
    assert c.tied_output and not c.rope_neox and c.rope_base == 100000.0 and c.n_ctx_train == 8192
    assert m.tensor_type("token_embd.weight") == T.Q8_0
    assert m.tensor_type("blk.0.attn_q.weight") == T.Q4_1
    assert len(m.weights) == 2 + 30 * 9


@pytest.mark.parametrize("qtype", SUPPORTED_TYPES, ids=lambda t: t.name)
def test_every_supported_type_loads_and_dequantizes(tmp_path, qtype):
    """Random bytes of `qtype` in an otherwise f32 model (256-wide rows, between two other tensors):
    the loader hands gguf.quants exactly those bytes, shaped as the tensor (NaN where random scale
    bits spell one, on both sides)."""
    from tests.test_gguf_errors import write_gguf
    name = "blk.0.ffn_up.weight"
    raw = np.random.default_rng(int(qtype)).integers(0, 256, (256, quant_info(qtype).row_bytes(256)), dtype=np.uint8)
    m = load_model_file(write_gguf(tmp_path / "t.gguf", retype={name: qtype}, data={name: raw}, n_embd=256,
                                   n_ff=256))
    assert m.tensor_type(name) == qtype
    with np.errstate(all="ignore"):
        w = m.dequantize(name)
        want = np.asarray(quants.dequantize(raw, qtype), dtype=np.float32).reshape(256, 256)
    assert w.shape == (256, 256) and w.dtype == np.float32 and np.isfinite(want).mean() > 0.5
    np.testing.assert_array_equal(w, want)
