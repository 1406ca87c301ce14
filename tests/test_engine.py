"""The Vulkan engine against the numpy reference forward pass, and SmolLM2 against llama.cpp (SPEC §7).

Tolerance for tiny synthetic models: |Δlogit| <= 0.003 · max|logit|. The engine keeps the KV cache
in f16 (relative rounding 2^-11) and may round activations to f16 inside the prompt matmul tiles; over
two layers that moves logits by ~1e-3 of their range (measured: at most 0.017 on logits up to 15). A
wrong kernel moves them by O(1).
"""

import numpy as np
import pytest

import llamavk
from llamavk.models import load_model_file
from llamavk.reference import ReferenceModel

from .vk_fixtures import chainable_stream_kernel

# the other synthetic weight types, one architecture each
MORE_TYPES = [("llama", "q4_1"), ("qwen2", "q5_0"), ("qwen3", "q5_1"), ("llama", "q2_k"), ("qwen2", "q3_k"),
              ("qwen3", "q5_k"), ("llama", "iq2_xxs"), ("qwen2", "iq2_xs"), ("qwen3", "iq2_s"), ("llama", "iq3_xxs"),
              ("qwen2", "iq3_s"), ("qwen3", "iq1_s"), ("llama", "iq1_m"), ("qwen2", "tq1_0"), ("qwen3", "tq2_0")]
ARCH_TYPES = [(a, q) for a in ("llama", "qwen2", "qwen3") for q in ("f16", "q8_0", "q4_0", "q4_k", "q6_k")] + \
    [("llama", "iq4_nl"), ("qwen2", "iq4_xs"), ("qwen3", "mxfp4")] + MORE_TYPES   # every 2-D weight of these types


def quiet_load(path, **kw):
    return llamavk.load(path, warn=lambda msg: None, **kw)


def assert_greedy_matches_reference(path, n: int, seed: int = 3) -> None:
    """12 random prompt tokens, then n greedy one-token steps: the numpy reference's tokens."""
    prompt = [int(t) for t in np.random.default_rng(seed).integers(0, 500, 12)]
    want = ReferenceModel(load_model_file(path)).generate_greedy(prompt, n)
    with quiet_load(path, n_ctx=64) as m:
        assert list(m.generate(prompt, n=n, temp=0)) == list(want)


def assert_split_mode_matches_none(path, mode: str) -> None:
    """Split mode `mode` over two virtual devices of Vulkan0 against -sm none: a 30-token prompt's
    logits within 5e-3 max|logit| and 10 greedy tokens equal."""
    tokens = [int(t) for t in np.random.default_rng(9).integers(0, 500, 30)]
    with quiet_load(path, n_ctx=64, split_mode="none") as m:
        want = m.logits(tokens, all=True)
        want_tokens = list(m.generate(tokens[:8], n=10, temp=0))
    with quiet_load(path, n_ctx=64, devices="Vulkan0,Vulkan0", split_mode=mode) as m:
        got = m.logits(tokens, all=True)
        got_tokens = list(m.generate(tokens[:8], n=10, temp=0))
    assert np.abs(got - want).max() < 5e-3 * np.abs(want).max()
    assert got_tokens == want_tokens


def one_token_logits(rt, tokens) -> np.ndarray:
    """The logits of each token decoded as a one-token step after the ones before it."""
    rows = []
    for i, t in enumerate(tokens):
        rt.run_batch("last", [t], i)
        rows.append(rt.logits(1)[0].copy())
    return np.array(rows)


def assert_prompt_logits_match_reference(path) -> None:
    """A 40-token prompt's logits (all rows, and the last alone) against the numpy reference, within
    0.003 max|logit|. n_ubatch 16: the prompt runs as three micro-batches (16, 16, 8) through the KV
    cache."""
    tokens = [int(t) for t in np.random.default_rng(7).integers(0, 500, 40)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    with quiet_load(path, n_ctx=128, n_ubatch=16) as m:
        got = m.logits(tokens, all=True)
        last = m.logits(tokens)
    assert got.shape == ref.shape
    tol = 0.003 * np.abs(ref).max()
    assert np.abs(got - ref).max() <= tol
    assert np.abs(last - ref[-1]).max() <= tol


@pytest.mark.parametrize("arch,qtype", ARCH_TYPES)
def test_logits_match_reference(synthetic_model, arch, qtype):
    assert_prompt_logits_match_reference(synthetic_model(arch, qtype))


@pytest.mark.parametrize("arch,qtype", MORE_TYPES)
def test_one_token_steps_of_more_weight_types(synthetic_model, arch, qtype):
    """Each one-token step (the matrix-vector kernels this device gets) of a model of these types
    gives the reference's logits; test_logits_match_reference takes them through prompts."""
    path = synthetic_model(arch, qtype)
    tokens = [int(t) for t in np.random.default_rng(11).integers(0, 500, 6)]
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    with quiet_load(path, n_ctx=64) as m:
        got = one_token_logits(m.runtime, tokens)
    assert np.abs(got - ref).max() <= 0.003 * np.abs(ref).max()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_greedy_decode_matches_reference_and_replays(synthetic_model, arch):
    path = synthetic_model(arch, "q8_0")
    prompt = [int(t) for t in np.random.default_rng(3).integers(0, 500, 12)]
    want = ReferenceModel(load_model_file(path)).generate_greedy(prompt, 16)
    with quiet_load(path, n_ctx=64) as m:
        got = list(m.generate(prompt, n=16, temp=0))
        recordings = dict(m.runtime.recordings)
        again = list(m.generate(prompt, n=16, temp=0))
        # decode replays one recording ("last", 1 token) instead of recording per token
        assert set(m.runtime.recordings) == set(recordings)
        assert m.runtime.recordings[("last", 1, 0, False)] is recordings[("last", 1, 0, False)]
    assert got == list(want)
    assert again == got


# every type with a stream form (the newly streamed ones: tests/test_kernels_matvec_stream_types.py)
@pytest.mark.parametrize("qtype", ["q4_0", "q8_0", "q4_k", "q6_k", "q5_k", "q3_k", "q2_k", "iq4_nl", "mxfp4",
                                   "iq4_xs", "q4_1", "q5_0", "q5_1", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs",
                                   "iq3_s", "iq1_s", "iq1_m", "tq2_0", "tq1_0"])
def test_one_token_steps_on_the_stream_kernel_with_gate_up_pairs(synthetic_model, monkeypatch, qtype):
    """The GPUs' decode path (stream kernel, gate and up as one product, RoPE and the KV store in the
    Q/K/V products, 2 row blocks per workgroup), forced on this device with its f32 form: greedy
    decoding matches the reference."""
    from llamavk.kernels import matmul as mm

    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": mm.MatvecConfig(64, 2, 1, 1, "stream", steps=2)})
    path = synthetic_model("llama", qtype)
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 500, 6)]
    want = ReferenceModel(load_model_file(path)).generate_greedy(prompt, 8)
    with quiet_load(path, n_ctx=64) as m:
        got = list(m.generate(prompt, n=8, temp=0))
        one = m.runtime.fused_one["last"]
        assert sum("pair" in op.attrs for op in one.ops) == m.runtime.cfg.n_layer
        assert sum(op.attrs.get("kv_stored", False) for op in one.ops) == m.runtime.cfg.n_layer
        assert [op.attrs["rope"] for op in one.ops if op.attrs.get("rope")][:3] == ["q", "k", "v"]
    assert got == list(want)


@pytest.mark.parametrize("qtype,splits,rows", [("q4_0", 0, "4"), ("q4_k", 0, "4"), ("q4_k", 4, "4"), ("q6_k", 0, "4"),
                                               ("q4_0", 0, "1:8"), ("q4_k", 4, "1:20")])
def test_chained_one_token_steps_match_unchained(synthetic_model, monkeypatch, portable_attention, qtype, splits,
                                                 rows):
    """Stages chained without barriers (kernels/chain.py, every kind of edge: Q/K/V (with RoPE and the
    KV store) -> attention -> output projection -> gate/up -> down -> next Q/K/V) on the stream kernel, x loaded before the weights,
    one row block per workgroup when chained: bit for bit the unchained logits (within the reference's
    tolerance), every producer's counter at its workgroup count after a step (each workgroup counted
    once, the counters zeroed per step), fewer barriers. splits: KV splits (the split kernel's chain).
    rows: the decode attention's rows per workgroup (LLAMAVK_ATTN_ROWS; 1:N, the 1-row form up to n_kv N
    and the 4-row form beyond it, a recording each, both waiting and counting; the counters checked are
    the last step's, past N)."""
    chainable_stream_kernel(monkeypatch)
    monkeypatch.setenv("LLAMAVK_ATTN_ROWS", rows)
    if splits:
        monkeypatch.setenv("LLAMAVK_ATTN_SPLITS", str(splits))
        monkeypatch.setenv("LLAMAVK_ATTN_MIN_CHUNK", "32")
    # head_dim 32 and up: attention runs the decode kernel, which can be chained
    path = synthetic_model("llama", qtype, n_embd=128, n_head=4, n_head_kv=2) if qtype == "q4_0" else \
        synthetic_model("llama", qtype)
    tokens = [int(t) for t in np.random.default_rng(9).integers(0, 500, 40 if splits else 12)]   # 2 active splits
    ref = ReferenceModel(load_model_file(path)).logits(tokens)
    got = {}
    for chain in ("0", "1"):
        monkeypatch.setenv("LLAMAVK_CHAIN", chain)
        with quiet_load(path, n_ctx=128) as m:
            rt = m.runtime
            got[chain] = one_token_logits(rt, tokens)
            key = ("last", 1, 0, rows != "4")    # the last step's recording
            assert set(rt.recordings) == {("last", 1, 0, False), key}
            barriers = sum(seq.n_barriers for seq in rt.recordings[key])
            chains = rt.chains[key]
            if chain == "0":
                assert chains == [] and barriers > 0
                unchained_barriers = barriers
            else:
                kinds = [op.kind if op.kind == "attention" else op.inputs[0].role for op, _ in chains]
                n_layer = rt.cfg.n_layer
                assert kinds.count("attention") == kinds.count("o") == kinds.count("gate") == n_layer
                assert kinds.count("down") >= n_layer - 1 and len(kinds) <= 4 * n_layer   # the last: output norm
                # 5 per layer (with edge q, the Q/K/V products -> attention), less the last down, plus the zeroing
                assert barriers <= unchained_barriers - 4 * n_layer
                names = {name for name, _ in rt.kc._kernels}
                assert ("attention_dec_split_chain_wait_f16" if splits else "attention_dec_chain_wait_f16") in names
                words = np.frombuffer(chains[0][1].counters[0].read(), dtype=np.uint32)
                assert all(words[w.slot] == w.n > 0 for _, w in chains)
    assert np.array_equal(got["0"], got["1"])
    assert np.abs(got["1"] - ref).max() <= 0.003 * np.abs(ref).max()


@pytest.mark.parametrize("norm,rows", [(False, "4"), (True, "4"), (False, "1:8")])
def test_chained_one_token_steps_with_a_quantized_cache_match_unchained(synthetic_model, monkeypatch,
                                                                        portable_attention, norm, rows):
    """A q8_0 K / q4_0 V cache keeps the rope_kv dispatch (the products store f16 only); chained, it waits
    in its shader for the Q/K/V products and the decode attention for it (edges q and k), as with f16
    caches: the unchained logits bit for bit, fewer barriers, every producer's counter at its workgroup
    count. norm: qwen3's per-head norms (rope_kv_norm). rows "1:8": the 1-row form up to n_kv 8 and the
    4-row form beyond it, a recording each (the counters checked are the last step's, past 8)."""
    chainable_stream_kernel(monkeypatch)
    monkeypatch.setenv("LLAMAVK_ATTN_ROWS", rows)
    path = synthetic_model("qwen3" if norm else "llama", "q4_0", n_embd=128, n_head=4, n_head_kv=2)
    tokens = [int(t) for t in np.random.default_rng(4).integers(0, 500, 10)]
    got, barriers = {}, {}
    for chain in ("0", "1"):
        monkeypatch.setenv("LLAMAVK_CHAIN", chain)
        with quiet_load(path, n_ctx=64, type_k="q8_0", type_v="q4_0") as m:
            rt = m.runtime
            got[chain] = one_token_logits(rt, tokens)
            key = ("last", 1, 0, rows != "4")    # the last step's recording
            assert set(rt.recordings) == {("last", 1, 0, False), key}
            barriers[chain] = sum(seq.n_barriers for seq in rt.recordings[key])
            if chain == "1":
                names = {name for name, _ in rt.kc._kernels}
                rope = "rope_kv_norm_wait_chain_kvq" if norm else "rope_kv_wait_chain_kvq"
                assert {rope, "attention_dec_chain_wait_kvq"} <= names
                assert sum(op.kind == "attention" for op, _ in rt.chains[key]) == rt.cfg.n_layer
                words = np.frombuffer(rt.chains[key][0][1].counters[0].read(), dtype=np.uint32)
                assert all(words[w.slot] == w.n > 0 for _, w in rt.chains[key])
    assert np.array_equal(got["0"], got["1"])
    assert barriers["1"] <= barriers["0"] - 4 * 2


def test_chain_nowait_drops_only_the_named_edges(synthetic_model, monkeypatch, portable_attention):
    """LLAMAVK_CHAIN_NOWAIT (bench_decode_ab.py --no-wait, timing only): the consumers of the named
    producers (g: the gate/up pair) wait for 0 workgroups, every other chained consumer for its
    producer's count."""
    chainable_stream_kernel(monkeypatch)
    monkeypatch.setenv("LLAMAVK_CHAIN", "1")
    monkeypatch.setenv("LLAMAVK_CHAIN_NOWAIT", "g")
    path = synthetic_model("llama", "q4_0", n_embd=128, n_head=4, n_head_kv=2)
    with quiet_load(path, n_ctx=64) as m:
        m.runtime.run_batch("last", [3], 0)
        chains = m.runtime.chains[("last", 1, 0, False)]
        waits = [(op.kind if op.kind == "attention" else op.inputs[0].role, w.n) for op, w in chains]
    assert {n for role, n in waits if role == "gate"} == {0}
    assert all(n > 0 for role, n in waits if role != "gate") and any(role == "o" for role, _ in waits)


def test_generation_is_deterministic_for_a_seed(synthetic_model):
    path = synthetic_model("llama", "q4_0")
    with quiet_load(path, n_ctx=64) as m:
        a = list(m.generate([1, 5, 9], n=20, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42))
        b = list(m.generate([1, 5, 9], n=20, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42))
        c = list(m.generate([1, 5, 9], n=20, temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=43))
    assert a == b and a != c


def test_context_full_stops_generation(synthetic_model):
    with quiet_load(synthetic_model("llama", "q4_0"), n_ctx=16) as m:
        out = list(m.generate([1, 2, 3, 4], n=-1, temp=0))
        # 12 decodes fill the 16 slots; the 13th token comes from the last slot's logits.
        assert m.n_past == 16 and len(out) == 13


def test_all_rows_logits_buffer_only_when_all_rows_are_asked_for(synthetic_model):
    """A generation writes one row of logits per slot: the all-rows buffer (n_ubatch x vocab per
    slot, pinned host memory on GPUs) is made only by the first all-logits step; each way gives
    the reference's logits, in either order."""
    path = synthetic_model("llama", "q8_0")
    tokens = [1, 7, 42, 99, 3]
    want = ReferenceModel(load_model_file(path)).logits(tokens)
    with quiet_load(path, n_ctx=64) as m:
        rt = m.runtime
        last = m.logits(tokens)
        assert rt._logits_buf is None
        every = m.logits(tokens, all=True)
        assert rt._logits_buf is not None
        again = m.logits(tokens)
    tol = 0.003 * np.abs(want).max()
    assert np.abs(every - want).max() <= tol
    assert np.abs(last - want[-1]).max() <= tol and np.array_equal(last, again)


def test_bad_tokens_and_overlong_prompts_are_clear_errors(synthetic_model):
    with quiet_load(synthetic_model("llama", "q4_0"), n_ctx=16) as m:
        with pytest.raises(llamavk.UsageError, match="outside the vocabulary"):
            m.logits([1, 100000])
        with pytest.raises(llamavk.UsageError, match="do not fit the context"):
            m.logits(list(range(20)))


# -- SmolLM2 vs llama.cpp (SPEC §7) ---------------------------------------------------------------

LLAMA_CPP_TOP5 = [(7042, 17.5692), (260, 15.0329), (4528, 13.4639), (2250, 13.1317), (1315, 13.1229)]


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    with quiet_load(smollm2_path, n_ctx=256) as m:
        yield m


def test_smollm2_next_token_logits(smollm2):
    ids = smollm2.tokenize("The capital of France is")
    assert ids == [504, 3575, 282, 4649, 314]
    logits = smollm2.logits(ids)
    top5 = [int(t) for t in np.argsort(-logits)[:5]]
    assert top5[:2] == [7042, 260]                      # top-1 and order of the top-2 must match
    assert sorted(top5) == sorted(t for t, _ in LLAMA_CPP_TOP5)
    for token, value in LLAMA_CPP_TOP5:
        assert abs(logits[token] - value) < 0.5


def test_smollm2_greedy_continuation(smollm2):
    out = list(smollm2.generate("The capital of France is", n=5, temp=0))
    assert out == [7042, 30, 198, 198, 504]
    assert smollm2.detokenize(out) == " Paris.\n\nThe"



def test_one_token_step_recorded_per_side_of_the_decode_form_limit(synthetic_model, monkeypatch):
    """Where the decode attention's form changes at an n_kv (LLAMAVK_ATTN_ROWS=1:8: 1 row per workgroup
    up to 8, 4 beyond), the one-token step is recorded once per side and each step replays the one for
    its n_kv: a load preparing a prompt past the limit records the long-context step only, generation
    back below it records the other, and the greedy tokens are the reference's on both sides. Batches
    (one form) and LLAMAVK_ATTN_ROWS=4 (one form) have no limit."""
    path = synthetic_model("llama", "q8_0", n_embd=128, n_head=4, n_head_kv=2)   # head_dim 32: the decode kernel
    prompt = [int(t) for t in np.random.default_rng(6).integers(0, 500, 20)]   # past short_prompt_max: its own step
    ref = ReferenceModel(load_model_file(path))
    monkeypatch.setenv("LLAMAVK_ATTN_ROWS", "1:8")
    # the load's prompt (`run`) is past the limit: its first token's step, for long contexts, only
    with quiet_load(path, n_ctx=64, prepare_prompt=lambda m: prompt) as m:
        rt = m.runtime
        assert rt.long_context_from("last", 1) == 8 and rt.long_context_from("last", 4) is None
        assert {k for k in rt.recordings if k[1] == 1} == {("last", 1, 0, True)}
        assert list(m.generate(prompt, n=4, temp=0)) == list(ref.generate_greedy(prompt, 4))
        assert ("last", 1, 0, False) not in rt.recordings
        assert list(m.generate(prompt[:3], n=8, temp=0)) == list(ref.generate_greedy(prompt[:3], 8))  # n_kv 4..11
        assert {("last", 1, 0, False), ("last", 1, 0, True)} <= set(rt.recordings)
    monkeypatch.setenv("LLAMAVK_ATTN_ROWS", "4")
    with quiet_load(path, n_ctx=64, prepare_prompt=lambda m: prompt) as m:
        assert m.runtime.long_context_from("last", 1) is None
        assert {k for k in m.runtime.recordings if k[1] == 1} == {("last", 1, 0, False)}


def test_short_prompt_runs_through_the_one_token_step(synthetic_model, monkeypatch):
    """A prompt of at most runtime.short_prompt_max() tokens whose own step was never recorded runs
    token by token through the one-token step: the same logits as its own step (numpy reference),
    and no recording of that step; LLAMAVK_SHORT_PROMPT=0 records it again."""
    path = synthetic_model("llama", "q8_0")
    prompt = [int(t) for t in np.random.default_rng(5).integers(0, 500, 9)]
    want = ReferenceModel(load_model_file(path)).logits(prompt)[-1]
    got = {}
    for limit in ("16", "0"):
        monkeypatch.setenv("LLAMAVK_SHORT_PROMPT", limit)
        with quiet_load(path, n_ctx=64) as m:
            m.runtime.prerecord(len(prompt))
            got[limit] = m.logits(prompt)
            assert (("last", 9, 0, False) in m.runtime.recordings) == (limit == "0")
            m.runtime.eval("last", prompt, 0)        # no short_ok (bench's prompts): its own step
            assert ("last", 9, 0, False) in m.runtime.recordings
            assert list(m.generate(prompt, n=4, temp=0)) == list(ReferenceModel(load_model_file(path))
                                                                 .generate_greedy(prompt, 4))
    for v in got.values():
        assert np.abs(v - want).max() < 2e-3 * np.abs(want).max()
