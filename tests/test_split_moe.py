"""-sm tensor / graph on mixtures of experts with LLAMAVK_MOE_MIRROR=1: the attention and DeltaNet blocks
mirrored on every device (split/tensor.py), the experts split, one all-reduce per layer; by default
(SPEC §5) the attention is split by heads instead (two per layer). Virtual devices on llvmpipe, as in tests/test_split.py.

Tolerances are the existing split tests' bounds (tests/test_split.py for qwen3moe, tests/test_qwen35.py
for qwen35moe, whose DeltaNet state carries a token's rounding on). Measured on llvmpipe (these files,
70-token prompt in micro-batches of 48 and 22, 2 and 3 devices): mirrored tensor at most 1.8e-5 of
max|logit|, graph (f16 partials above 32 tokens) 7.0e-4; one-token steps 1.3e-5.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

import llamavk
from llamavk.kernels.selection import has_coopmat
from llamavk.models import build_graph, load_model_file
from llamavk.split import mode_module
from llamavk.split.base import SplitOptions

# (arch, type, seed): seeds whose routers have no near-tie that f16 partials could flip (test_qwen35.py)
CASES = [("qwen3moe", "q8_0", 1), ("qwen3moe", "q4_k", 1), ("qwen35moe", "q4_0", 1), ("qwen35moe", "q4_k", 3),
         ("qwen2moe", "q8_0", 1)]
TOL = {"qwen3moe": {"tensor": 2e-4, "graph": 1.5e-3}, "qwen35moe": {"tensor": 1e-4, "graph": 4e-3},
       "qwen2moe": {"tensor": 2e-4, "graph": 1.5e-3}}
STEP_TOL = 1e-4            # one-token steps: f32 partials in every mode
COOP_TOL = 8e-3            # GPUs with cooperative matrices (tests/test_split.py's REL_TOL_COOP)
N_STEPS = 5


def quiet(path, **kw):
    return llamavk.load(path, warn=lambda m: None, **kw)


def answers(m, prompt):
    """All-token logits of the prompt, 6 greedy tokens after it, and the logits of N_STEPS one-token
    steps (the decode path: matrix-vector products, one exchange point per layer)."""
    logits = m.logits(prompt, all=True)
    tokens = list(m.generate(prompt, n=6, temp=0))
    rows = []
    for i, t in enumerate(prompt[:N_STEPS]):
        m.runtime.run_batch("last", [t], i)
        rows.append(m.runtime.logits(1)[0].copy())
    return logits, tokens, np.array(rows)


@pytest.fixture(scope="module")
def references(synthetic_model):
    out = {}
    prompt = [int(t) for t in np.random.default_rng(5).integers(3, 500, 70)]
    for arch, qtype, seed in CASES:
        path = synthetic_model(arch, qtype, seed=seed)
        with quiet(path, n_ctx=128, n_ubatch=48, split_mode="none") as m:
            out[(arch, qtype)] = (path, prompt, answers(m, prompt))
    return out


def check_against_none(references, arch, qtype, mode, layouts, mirrored: bool):
    path, prompt, (want, want_tokens, want_rows) = references[(arch, qtype)]
    for n_dev, ts in layouts:
        with quiet(path, n_ctx=128, n_ubatch=48, devices=",".join(["Vulkan0"] * n_dev), split_mode=mode,
                   tensor_split=ts) as m:
            lines = m.runtime.describe()
            got, tokens, rows = answers(m, prompt)
            coop = any(has_coopmat(rt.kc) for rt in m.runtime.runtimes)
        where = f"{arch} {qtype} {mode} on {n_dev} devices, -ts {ts}"
        assert all(("attention mirrored" in line) == mirrored for line in lines[:-1]), (where, lines)
        assert any("KV heads" in line for line in lines[:-1]) != mirrored, (where, lines)
        tol = max(TOL[arch][mode], COOP_TOL if coop else 0)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < tol, f"{where}: prompt max |dlogit| / max |logit| = {err:.2e}"
        err = np.abs(rows - want_rows).max() / np.abs(want_rows).max()
        assert err < max(STEP_TOL, COOP_TOL if coop else 0), f"{where}: one-token steps {err:.2e}"
        assert tokens == want_tokens, where


@pytest.mark.parametrize("arch,qtype", [c[:2] for c in CASES])
@pytest.mark.parametrize("mode", ["tensor", "graph"])
def test_mirrored_attention_matches_none(references, monkeypatch, arch, qtype, mode):
    monkeypatch.setenv("LLAMAVK_MOE_MIRROR", "1")
    check_against_none(references, arch, qtype, mode, [(2, None), (3, [2, 1, 1])], mirrored=True)


@pytest.mark.parametrize("arch,qtype", [("qwen3moe", "q8_0"), ("qwen35moe", "q4_0")])
@pytest.mark.parametrize("mode", ["tensor", "graph"])
def test_split_attention_default_matches_none(references, monkeypatch, arch, qtype, mode):
    """The default (SPEC §5): the attention split by KV heads and DeltaNet by key heads."""
    monkeypatch.delenv("LLAMAVK_MOE_MIRROR", raising=False)
    check_against_none(references, arch, qtype, mode, [(2, None), (3, None)], mirrored=False)


# -- the plans ------------------------------------------------------------------------------------

def plans(path, mode, n_dev):
    """Every plan a split of `mode` makes (graph mode: also the large-batch ring plans), by key."""
    cfg = load_model_file(path).config
    module, opts, shares = mode_module(mode), SplitOptions(mode=mode), [1 / n_dev] * n_dev
    out = {}
    for key in ("last", "all"):
        g = build_graph(cfg, all_logits=key == "all")
        out[key] = module.plan(g, shares, opts)
        if mode == "graph":
            out[key + "@large"] = module.plan(g, shares, opts, large=True)
    return cfg, out


def syncs_per_layer(dg) -> set[int]:
    """How many exchange points each device passes per layer (sync ops of each layer)."""
    counts = {}
    for d, g in enumerate(dg.graphs):
        for op in g.ops:
            if op.kind == "sync":
                counts[(d, op.layer)] = counts.get((d, op.layer), 0) + 1
    assert {layer for _, layer in counts} == set(range(dg.model.config.n_layer))
    return set(counts.values())


@pytest.mark.parametrize("arch,qtype,seed", [CASES[0], CASES[2]])
@pytest.mark.parametrize("mode", ["tensor", "graph"])
@pytest.mark.parametrize("n_dev", [2, 3])
def test_one_exchange_point_per_moe_layer(synthetic_model, monkeypatch, arch, qtype, seed, mode, n_dev):
    """Mirrored: one all-reduce per layer (a ring all-reduce of a large batch is two exchange points);
    the attention's products whole on every device. Split by heads: two all-reduces per layer."""
    path = synthetic_model(arch, qtype, seed=seed)
    monkeypatch.setenv("LLAMAVK_MOE_MIRROR", "1")
    cfg, mirrored = plans(path, mode, n_dev)
    for key, dg in mirrored.items():
        per_reduce = 2 if key.endswith("@large") else 1
        assert syncs_per_layer(dg) == {per_reduce}, key
        assert len(dg.exchanges) == per_reduce * cfg.n_layer, key
        for g in dg.graphs:
            products = [op for op in g.ops if op.kind == "matmul" and op.inputs[0].role in ("q", "o", "ssm_out")]
            assert products and all(op.inputs[0].part is None for op in products), key
            assert all(op.attrs.get("n_head_kv", cfg.n_head_kv) == cfg.n_head_kv
                       for op in g.ops if op.kind == "attention"), key
    monkeypatch.delenv("LLAMAVK_MOE_MIRROR")
    _, by_heads = plans(path, mode, n_dev)
    for key, dg in by_heads.items():
        assert syncs_per_layer(dg) == {2 * (2 if key.endswith("@large") else 1)}, key


@pytest.mark.parametrize("arch,qtype", [("llama", "q4_0"), ("qwen35", "q4_0"), ("gemma3", "q8_0")])
def test_dense_plans_do_not_change(synthetic_model, monkeypatch, arch, qtype):
    """Dense models keep the split by heads, two all-reduces per layer, whatever the knob says."""
    path = synthetic_model(arch, qtype)

    def signature(dg):
        return [[(op.kind, op.layer, tuple((t.name, t.width, t.part) if t.kind == "weight" else t.width
                                           for t in op.inputs), sorted(map(repr, op.attrs.items())))
                 for op in g.ops] for g in dg.graphs], dg.holds

    for mode in ("tensor", "graph"):
        monkeypatch.delenv("LLAMAVK_MOE_MIRROR", raising=False)
        _, default = plans(path, mode, 3)
        monkeypatch.setenv("LLAMAVK_MOE_MIRROR", "1")
        _, knob = plans(path, mode, 3)
        for key, dg in default.items():
            assert signature(dg) == signature(knob[key]), (mode, key)
            assert syncs_per_layer(dg) == {2 * (2 if key.endswith("@large") else 1)}, (mode, key)
            assert not any("mirrored" in h for holds in dg.holds for h in holds)


def test_decode_step_has_one_exchange_dispatch_per_layer(synthetic_model, monkeypatch):
    """Spin-synchronised decode (forced and only recorded, as in tests/test_split.py): each layer's one
    exchange point is one sync_reduce dispatch, and the router is folded into the output projection on
    every device as on one (its input is no longer a sum of the devices' partials)."""
    monkeypatch.setenv("LLAMAVK_SPLIT_SYNC", "spin")
    monkeypatch.setenv("LLAMAVK_CHAIN", "1")
    monkeypatch.setenv("LLAMAVK_MOE_MIRROR", "1")
    from llamavk.kernels import matmul
    monkeypatch.setattr(matmul, "_MATVEC_ENV", matmul.parse_matvec_env("stream:64,2,1,1"))
    path = synthetic_model("qwen35moe", "q4_0", seed=1)
    with quiet(path, n_ctx=64) as m:
        folded = sum("router" in op.attrs for op in m.runtime.fused_one["last"].ops)
        n_layer = m.config.n_layer
    assert folded == n_layer
    with quiet(path, n_ctx=64, devices="Vulkan0,Vulkan0", split_mode="graph") as m:
        assert m.runtime.sync == "spin"
        for rt in m.runtime.runtimes:
            ops = rt.fused_one["last"].ops
            assert [op.layer for op in ops if op.kind == "sync_reduce"] == list(range(n_layer))
            assert not any(op.kind in ("sync", "reduce") for op in ops)
            assert sum("router" in op.attrs for op in ops) == folded
        assert f"{n_layer} exchange points" in m.runtime.describe()[-1]


# -- memory ---------------------------------------------------------------------------------------

def test_every_device_holds_the_whole_kv_cache_and_the_estimate_says_so(synthetic_model, monkeypatch):
    """The fit estimate per device (memory_fit.py, from the device's plans) equals what its runtime
    allocates: the whole KV cache, DeltaNet state and all attention weights on every device, a part
    of the experts."""
    from llamavk.memory_fit import estimate_device_need

    monkeypatch.setenv("LLAMAVK_MOE_MIRROR", "1")
    path = synthetic_model("qwen35moe", "q4_0", seed=1)
    mf = load_model_file(path)
    with quiet(path, n_ctx=96, n_ubatch=16) as m:
        whole_kv, whole_state = m.runtime.kv_bytes(), m.runtime.state_bytes()
        whole_experts = m.runtime.weight_bytes(experts_only=True)
    assert whole_kv > 0 and whole_state > 0
    with quiet(path, n_ctx=96, n_ubatch=16, devices="Vulkan0,Vulkan0", split_mode="tensor") as m:
        split = m.runtime
        for i, rt in enumerate(split.runtimes):
            need = estimate_device_need(mf, {k: dg.graphs[i] for k, dg in split.plans.items()}, 96, 16, rt.device)
            assert rt.kv_bytes() == whole_kv and rt.state_bytes() == whole_state
            assert need.kv == whole_kv + whole_state     # the estimate's cache part: KV and DeltaNet state
            assert need.weights == rt.weight_bytes()
        assert split.weight_bytes(experts_only=True) == whole_experts


def test_a_context_too_large_for_the_mirrored_cache_is_a_one_line_error(synthetic_model, monkeypatch):
    """-c 5 x 10^7 on tiny qwen3moe split over two virtual devices of one GPU: each holds the whole KV
    cache, 2 layers x K and V x 5 x 10^7 positions x 2 KV heads x 32 x 2 bytes (f16) = 23.84 GiB, 47.68 GiB
    for both (split by heads: half that), more than this machine (or any GPU) has."""
    monkeypatch.setenv("LLAMAVK_MOE_MIRROR", "1")     # the command's process inherits it
    path = synthetic_model("qwen3moe", "q8_0", seed=1)
    cfg = load_model_file(path).config
    assert (cfg.n_layer, cfg.n_head_kv, cfg.head_dim) == (2, 2, 32)
    r = subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", str(path), "-p", "hi", "-n", "1",
                        "-c", "50000000", "-sm", "tensor", "-dev", "Vulkan0,Vulkan0"],
                       capture_output=True, text=True, errors="replace", timeout=300)
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("error: Vulkan0 and Vulkan0#1 (") and "KV cache 47.68 GiB" in lines[0], lines[0]
