"""The numpy reference forward pass: SmolLM2 against llama.cpp, tiny models for self-consistency."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from llamavk.models import load_model_file
from llamavk.models.base import RopeScaling
from llamavk.reference import ReferenceModel, apply_rope, rope_cos_sin
from llamavk.synthetic import write_synthetic_model

TOKENS = [1, 17, 300, 42, 42, 7, 499, 260, 100, 5, 3]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ref")


@pytest.mark.parametrize("arch,qtype", [("llama", "q4_0"), ("llama", "q6_k"), ("qwen2", "q8_0"),
                                        ("qwen2", "q4_k"), ("qwen3", "f16"), ("qwen3", "q4_0")])
def test_tiny_logits_finite_deterministic_and_incremental(tiny_dir, arch, qtype):
    path = write_synthetic_model(tiny_dir / f"{arch}-{qtype}.gguf", "tiny", qtype, arch, seed=7)
    ref = ReferenceModel(load_model_file(path))
    full = ref.logits(TOKENS)
    assert full.shape == (len(TOKENS), 500) and full.dtype == np.float32
    assert np.isfinite(full).all() and 0.3 < full.std() < 20

    again = ReferenceModel(load_model_file(path)).logits(TOKENS)
    np.testing.assert_array_equal(full, again)

    # incremental evaluation with the KV cache: prompt chunk, then single tokens, then a chunk
    ref.reset()
    parts = [ref.forward(TOKENS[:4], 0)]
    parts += [ref.forward([t]) for t in TOKENS[4:7]]
    parts.append(ref.forward(TOKENS[7:]))
    np.testing.assert_allclose(np.concatenate(parts), full, atol=2e-4, rtol=1e-4)

    # rewinding the cache and re-evaluating gives the same rows
    np.testing.assert_allclose(ref.forward(TOKENS[5:], 5), full[5:], atol=2e-4, rtol=1e-4)

    # causal: a row does not depend on later tokens
    prefix = ref.logits(TOKENS[:6])
    np.testing.assert_allclose(prefix, full[:6], atol=2e-4, rtol=1e-4)


def test_seed_changes_weights(tiny_dir):
    a = write_synthetic_model(tiny_dir / "a.gguf", seed=1).read_bytes()
    b = write_synthetic_model(tiny_dir / "b.gguf", seed=1).read_bytes()
    c = write_synthetic_model(tiny_dir / "c.gguf", seed=2).read_bytes()
    assert a == b and a != c


def _cfg(tiny_dir, arch="llama"):
    return load_model_file(write_synthetic_model(tiny_dir / f"cfg-{arch}.gguf", arch=arch)).config


@pytest.mark.parametrize("neox", [False, True])
def test_rope_is_a_relative_rotation(tiny_dir, neox):
    cfg = dataclasses.replace(_cfg(tiny_dir), rope_neox=neox, rope_base=10000.0)
    rng = np.random.default_rng(0)
    q = rng.standard_normal((1, 1, cfg.head_dim)).astype(np.float32)
    k = rng.standard_normal((1, 1, cfg.head_dim)).astype(np.float32)

    def rot(x, pos):
        cos, sin = rope_cos_sin(cfg, np.array([pos]))
        return apply_rope(x, cos, sin, neox)

    np.testing.assert_allclose(rot(q, 0), q)                                   # position 0: identity
    np.testing.assert_allclose(np.linalg.norm(rot(q, 9)), np.linalg.norm(q), rtol=1e-5)
    d1 = float(np.sum(rot(q, 10) * rot(k, 7)))
    d2 = float(np.sum(rot(q, 103) * rot(k, 100)))
    np.testing.assert_allclose(d1, d2, rtol=1e-4)                              # depends on 10-7 only
    # pair layout: llama rotates (0, 1) together, neox (0, d/2)
    e0 = np.zeros((1, 1, cfg.head_dim), np.float32)
    e0[..., 0] = 1
    moved = np.nonzero(np.abs(rot(e0, 1)[0, 0]) > 1e-6)[0].tolist()
    assert moved == ([0, cfg.head_dim // 2] if neox else [0, 1])


def test_rope_linear_scaling_and_yarn(tiny_dir):
    base = _cfg(tiny_dir)
    lin = dataclasses.replace(base, rope_scaling=RopeScaling("linear", 4.0, 512, ext_factor=0.0))
    c1, s1 = rope_cos_sin(lin, np.array([40]))
    c0, s0 = rope_cos_sin(base, np.array([10]))
    np.testing.assert_allclose(c1, c0, atol=1e-6)
    np.testing.assert_allclose(s1, s0, atol=1e-6)
    yarn = dataclasses.replace(base, rope_scaling=RopeScaling("yarn", 4.0, 512))
    cy, sy = rope_cos_sin(yarn, np.arange(64))
    mscale = 1 + 0.1 * np.log(4.0)
    np.testing.assert_allclose(cy ** 2 + sy ** 2, mscale ** 2, rtol=1e-5)
    # high-frequency dims extrapolate (unscaled), the lowest frequency is interpolated
    np.testing.assert_allclose(cy[:, 0] / mscale, rope_cos_sin(base, np.arange(64))[0][:, 0], atol=1e-5)


# -- SmolLM2-135M-Instruct Q4_1 against llama.cpp (SPEC §7) ------------------------------------

PROMPT = [504, 3575, 282, 4649, 314]            # "The capital of France is"
LLAMA_CPP_TOP5 = {7042: 17.5692, 260: 15.0329, 4528: 13.4639, 2250: 13.1317, 1315: 13.1229}


@pytest.fixture(scope="module")
def smollm2_ref(smollm2_path):
    return ReferenceModel(load_model_file(smollm2_path))


def test_smollm2_next_token_logits(smollm2_ref):
    last = smollm2_ref.logits(PROMPT)[-1]
    top5 = [int(t) for t in np.argsort(-last)[:5]]
    assert top5[:2] == [7042, 260]
    assert set(top5) == set(LLAMA_CPP_TOP5)
    for tok, expected in LLAMA_CPP_TOP5.items():
        assert abs(last[tok] - expected) < 0.5, (tok, last[tok], expected)


def test_smollm2_greedy_continuation(smollm2_ref):
    assert smollm2_ref.generate_greedy(PROMPT, 5) == [7042, 30, 198, 198, 504]
