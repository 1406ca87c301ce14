"""Tiny models decoding on the stream kernel's forms of the types added after Q4_0 / Q8_0 / Q4_K /
Q6_K (K-quants: tests/test_kernels_matvec_kquants.py; IQ4_NL / MXFP4 / IQ4_XS:
tests/test_kernels_matvec_iqstream.py), against the numpy reference forward pass (llvmpipe: the
kernel forced through the override, as an A/B run forces it)."""

from __future__ import annotations

import numpy as np
import pytest

from llamavk.kernels import matmul as mm
from llamavk.kernels.matmul import MatvecConfig


MODEL_TYPES = ["q5_k", "q3_k", "q2_k", "iq4_nl", "mxfp4", "iq4_xs"]


@pytest.mark.parametrize("qtype", MODEL_TYPES)
def test_decode_on_the_stream_dp_kernel_through_the_override(synthetic_model, monkeypatch, qtype):
    """A tiny model's one-token steps with every product on the DOT8 stream form, chosen as an A/B run
    chooses it (LLAMAVK_MATVEC=TYPE=stream_dp:..., 2 row blocks per workgroup): each step's logits
    equal the numpy reference forward pass."""
    from llamavk.models import load_model_file
    from llamavk.reference import ReferenceModel

    from .test_engine import one_token_logits, quiet_load

    monkeypatch.setattr(mm, "_MATVEC_ENV", mm.parse_matvec_env(f"{qtype}=stream_dp:64,2,1,1,2"))
    path = synthetic_model("llama", qtype)
    tokens = [int(t) for t in np.random.default_rng(13).integers(0, 500, 8)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    with quiet_load(path, n_ctx=64) as m:
        rt = m.runtime
        if not rt.kc.device.features.get("int_dot"):
            pytest.skip("no integer dot products")
        got = one_token_logits(rt, tokens)
        assert f"mul_mv_stream_dp_{qtype}" in {name for name, _ in rt.kc._kernels}
    assert np.abs(got - ref).max() <= 0.003 * np.abs(ref).max()


@pytest.mark.parametrize("qtype", MODEL_TYPES)
def test_greedy_decode_on_the_stream_kernel_with_gate_up_pairs(synthetic_model, monkeypatch, qtype):
    """The GPUs' decode path (gate and up as one product, RoPE and the KV store in the Q/K/V
    products) on the f32 stream form: greedy decoding matches the reference."""
    from llamavk.models import load_model_file
    from llamavk.reference import ReferenceModel

    from .test_engine import quiet_load

    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": MatvecConfig(64, 2, 1, 1, "stream", steps=2)})
    path = synthetic_model("llama", qtype)
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 500, 6)]
    want = ReferenceModel(load_model_file(path)).generate_greedy(prompt, 8)
    with quiet_load(path, n_ctx=64) as m:
        got = list(m.generate(prompt, n=8, temp=0))
        one = m.runtime.fused_one["last"]
        assert sum("pair" in op.attrs for op in one.ops) == m.runtime.cfg.n_layer
        assert f"mul_mv_stream_{qtype}" in {name for name, _ in m.runtime.kc._kernels}
    assert got == list(want)


# WAIT / SIGNAL do not depend on the type; the table types write their table after the wait
@pytest.mark.parametrize("qtype", ["q5_k", "q3_k", "iq4_nl", "iq4_xs"])
def test_chained_steps_match_unchained(synthetic_model, monkeypatch, qtype):
    """Stages chained without barriers (WAIT / SIGNAL, x loaded first) on these types' stream
    products: the unchained logits bit for bit, and the reference's within its tolerance."""
    from llamavk.models import load_model_file
    from llamavk.reference import ReferenceModel

    from .test_engine import one_token_logits, quiet_load
    from .vk_fixtures import chainable_stream_kernel

    chainable_stream_kernel(monkeypatch)
    path = synthetic_model("llama", qtype)
    tokens = [int(t) for t in np.random.default_rng(9).integers(0, 500, 10)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    got = {}
    for chain in ("0", "1"):
        monkeypatch.setenv("LLAMAVK_CHAIN", chain)
        with quiet_load(path, n_ctx=64) as m:
            got[chain] = one_token_logits(m.runtime, tokens)
            assert bool(m.runtime.chains[("last", 1, 0)]) == (chain == "1")
    assert np.array_equal(got["0"], got["1"])
    assert np.abs(got["1"] - ref).max() <= 0.003 * np.abs(ref).max()
