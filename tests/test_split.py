"""Split modes on virtual devices (several logical devices on llvmpipe): every mode must give what
-sm none gives, on 2, 3 and 4 devices, even and uneven -ts, for every architecture.

Tolerance: a split changes only the order of float32 additions (a product's partial sums meet in a
different order; an all-reduce adds the devices' partials), plus, in graph mode for batches above
32 tokens, partial sums rounded to f16 (relative error 2^-11 on each partial, before the residual
add). Measured on llvmpipe (the cases below, models of seeds 1-3): layer and row modes bit for bit,
tensor at most 7.1e-5 of max|logit|, graph (f16 partials) at most 5.5e-4. Bounds, ~3x those:
REL_TOL 2e-4, REL_TOL_F16 1.5e-3; on devices with cooperative matrices (prompt products round their
inputs to f16, and a split changes which products take the f16 tiles) REL_TOL_COOP, from an H100. For scale: a 1% error in half of one weight matrix moves these models' logits by
1.8e-3 to 1.3e-2 of max|logit| (numpy, every role of layers 0 and 3). Greedy tokens must be identical.
"""

from __future__ import annotations

import numpy as np
import pytest

import llamavk
from llamavk.errors import LlamavkError, UsageError
from llamavk.kernels.selection import has_coopmat
from llamavk.split.base import SplitOptions, partition, proportions

MODES = ["layer", "row", "tensor", "graph"]
LAYOUTS = [(2, None), (2, [2, 1]), (3, None), (4, [1, 2, 1, 1])]
ARCH_TYPES = [("llama", "q4_0"), ("qwen2", "q8_0"), ("qwen3", "q4_k"), ("qwen3moe", "q4_0"), ("gemma3", "q8_0")]
REL_TOL = 2e-4
REL_TOL_F16 = 1.5e-3
# gemma3 renormalizes each block's output before the residual add (its post-norms) and scales the
# embedding, which carries the order differences further: measured on llvmpipe (seeds 1-3) tensor
# 2.1e-4, graph (f16 partials) 2.7e-3; bounds ~3x those.
ARCH_TOL = {"gemma3": (6e-4, 8e-3)}


def quiet(path, **kw):
    return llamavk.load(path, warn=lambda m: None, **kw)


# Devices with cooperative matrices: a split changes the products' shapes and with them which kernel
# runs (f16 tiles, or f32 matrix-vector products for small parts). Measured on an H100: row mode on
# qwen2 2.0e-3 (qwen35's row mode 3.5e-3, tests/test_qwen35.py).
REL_TOL_COOP = 8e-3


def rel_tol(m) -> float:
    """The bound on max|Δlogit| / max|logit| for this loaded model (see the module's docstring)."""
    coop = any(has_coopmat(rt.kc) for rt in getattr(m.runtime, "runtimes", [m.runtime]))
    f32, f16 = ARCH_TOL.get(m.config.arch, (REL_TOL, REL_TOL_F16))
    return max(f16, REL_TOL_COOP) if coop else f16 if m.split_mode == "graph" else f32


@pytest.fixture(scope="module")
def references(synthetic_model):
    """-sm none: all-token logits of a 70-token prompt and 6 greedy tokens, per (arch, type).
    4 layers (tiny has 2), so that layer mode puts layers on up to 4 devices."""
    out = {}
    rng = np.random.default_rng(5)
    for arch, qtype in ARCH_TYPES:
        path = synthetic_model(arch, qtype, n_layer=4)
        prompt = [int(t) for t in rng.integers(0, 500, 70)]
        with quiet(path, n_ctx=128, split_mode="none") as m:
            out[(arch, qtype)] = (path, prompt, m.logits(prompt, all=True), list(m.generate(prompt, n=6, temp=0)))
    return out


@pytest.mark.parametrize("arch,qtype", ARCH_TYPES)
@pytest.mark.parametrize("mode", MODES)
def test_split_matches_none(references, arch, qtype, mode):
    path, prompt, want, want_tokens = references[(arch, qtype)]
    scale = np.abs(want).max()
    for n_dev, ts in LAYOUTS:
        # micro-batches of 48: several per prompt (layer pipelining), above graph mode's 32-token
        # threshold (ring reduce with f16 partials); decode takes the one-token path
        with quiet(path, n_ctx=128, devices=",".join(["Vulkan0"] * n_dev), split_mode=mode, tensor_split=ts,
                   n_ubatch=48) as m:
            assert m.split_mode == mode and len(m.devices) == n_dev
            got = m.logits(prompt, all=True)
            tokens = list(m.generate(prompt, n=6, temp=0))
            tol = rel_tol(m)
        err = np.abs(got - want).max() / scale
        assert err < tol, f"{mode} on {n_dev} devices, -ts {ts}: max |dlogit| / max |logit| = {err:.2e}"
        assert tokens == want_tokens, f"{mode} on {n_dev} devices, -ts {ts}"


@pytest.mark.parametrize("mode,ts", [("layer", None), ("row", None), ("tensor", [1, 1]), ("tensor", [2, 1]),
                                     ("graph", [2, 1])])
def test_smollm2_paris_in_every_mode(smollm2_path, mode, ts):
    """SmolLM2 has 3 KV heads: tensor parallelism over 2 devices splits them 2 + 1 either way."""
    with quiet(smollm2_path, n_ctx=64, devices="Vulkan0,Vulkan0", split_mode=mode, tensor_split=ts) as m:
        tokens = list(m.generate("The capital of France is", n=1, temp=0))
    assert tokens == [7042]   # " Paris"


def test_graph_mode_can_leave_devices_out(references):
    path, prompt, want, _ = references[("llama", "q4_0")]
    with quiet(path, n_ctx=128, devices="Vulkan0,Vulkan0,Vulkan0", split_mode="graph", tensor_split=[1, 0, 1]) as m:
        assert len(m.devices) == 2
        got = m.logits(prompt, all=True)
        tol = rel_tol(m)
    assert np.abs(got - want).max() < tol * np.abs(want).max()
    with quiet(path, n_ctx=128, devices="Vulkan0,Vulkan0,Vulkan0", split_mode="graph", max_gpu=1) as m:
        assert len(m.devices) == 1 and m.split_mode == "none"


def test_verbose_description_names_devices_and_traffic(references):
    path = references[("llama", "q4_0")][0]
    with quiet(path, n_ctx=64, devices="Vulkan0,Vulkan0", split_mode="tensor") as m:
        lines = m.runtime.describe()
    assert "KV heads 0-0" in lines[0] and "KV heads 1-1" in lines[1]
    assert "MiB" in lines[0] and "exchange points" in lines[-1]
    # 4 layers x 2 all-reduces; each of 2 devices writes its 64-float partial per reduce (8 x 2 x 256 B)
    # and reads both partials (8 x 2 x 2 x 256 B)
    assert "8 exchange points, 4.0 KiB written to and 8.0 KiB read" in lines[-1]


@pytest.mark.parametrize("kwargs,message", [
    (dict(split_mode="diagonal"), "unknown split mode"),
    (dict(split_mode="layer", tensor_split=[1, 1, 1]), "-ts has 3 values"),
    (dict(split_mode="layer", tensor_split=[0, 0]), "not all zero"),
    (dict(split_mode="row", main_gpu=2), "-mg 2 is out of range"),
    (dict(split_mode="graph", reduce_type="f8"), "unknown reduce type"),
    (dict(split_mode="graph", max_gpu=0), "--max-gpu"),
])
def test_bad_split_options_are_usage_errors(references, kwargs, message):
    path = references[("llama", "q4_0")][0]
    with pytest.raises(UsageError, match=message):
        quiet(path, n_ctx=64, devices="Vulkan0,Vulkan0", **kwargs)


def test_partition_and_proportions():
    assert partition(10, [0.5, 0.5]) == [(0, 5), (5, 10)]
    assert partition(3, [2 / 3, 1 / 3]) == [(0, 2), (2, 3)]
    assert partition(160, [1 / 3] * 3, 32) == [(0, 64), (64, 96), (96, 160)]
    assert partition(4, [0.5, 0.0, 0.5]) == [(0, 2), (2, 2), (2, 4)]
    assert proportions(SplitOptions(tensor_split=[3, 1]), [None, None]) == [0.75, 0.25]
    assert proportions(SplitOptions(tensor_split=[1]), [None, None]) == [1.0, 0.0]
    assert proportions(SplitOptions(), [30, 10]) == [0.75, 0.25]        # free memory
    assert proportions(SplitOptions(), [None, 10]) == [0.5, 0.5]


@pytest.mark.parametrize("mode", ["layer", "tensor", "graph", "row"])
def test_staging_copies_where_devices_cannot_import_host_memory(references, monkeypatch, mode):
    """Devices without VK_EXT_external_memory_host: a host-visible buffer each, and the host copies
    every exchange's slots between them (forced here on devices that could import)."""
    monkeypatch.setenv("LLAMAVK_HOST_IMPORT", "0")
    path, prompt, want, want_tokens = references[("llama", "q4_0")]
    with quiet(path, n_ctx=128, devices="Vulkan0,Vulkan0,Vulkan0", split_mode=mode, tensor_split=[1, 1, 1],
               n_ubatch=48) as m:
        assert m.runtime.shared.staged and m.runtime.sync == "relay"
        got = m.logits(prompt, all=True)
        tokens = list(m.generate(prompt, n=6, temp=0))
        tol = rel_tol(m)
    assert np.abs(got - want).max() < tol * np.abs(want).max()
    assert tokens == want_tokens


@pytest.mark.parametrize("qtype", ["iq4_nl", "iq4_xs", "mxfp4", "iq2_xs", "iq1_m"])
def test_split_new_weight_types(synthetic_model, qtype):
    """IQ4_NL / IQ4_XS / MXFP4 / IQ2_XS / IQ1_M weights cut by rows (row mode) and by columns (tensor mode
    on 3 devices: the 256-wide blocks are cut off their edges, so those parts run as f32; a lattice
    type's row parts carry its grid) give -sm none's answer."""
    path = synthetic_model("llama", qtype)
    prompt = [int(t) for t in np.random.default_rng(6).integers(0, 500, 40)]
    with quiet(path, n_ctx=64, split_mode="none") as m:
        want, want_tokens = m.logits(prompt, all=True), list(m.generate(prompt, n=4, temp=0))
    for mode, n_dev, ts in (("row", 2, [2, 1]), ("tensor", 3, [2, 1, 1])):
        with quiet(path, n_ctx=64, devices=",".join(["Vulkan0"] * n_dev), split_mode=mode, tensor_split=ts) as m:
            got, tokens = m.logits(prompt, all=True), list(m.generate(prompt, n=4, temp=0))
            tol = rel_tol(m)
        err = np.abs(got - want).max() / np.abs(want).max()
        assert err < tol, f"{qtype} {mode} on {n_dev} devices: max |dlogit| / max |logit| = {err:.2e}"
        assert tokens == want_tokens, f"{qtype} {mode} on {n_dev} devices"


def test_exchange_point_waits_for_its_product_up_to_a_width(references, monkeypatch):
    """-sm graph chains an exchange point to the product writing its partial (edge x) only for
    all-reduces of at most LLAMAVK_CHAIN_X_COLS values (selection.CHAIN_X_MAX_COLS); a bad value is a
    one-line error."""
    monkeypatch.setenv("LLAMAVK_SPLIT_SYNC", "spin")
    monkeypatch.setenv("LLAMAVK_CHAIN", "1")
    from llamavk.kernels import matmul
    from llamavk.kernels.selection import chain_x_ok
    monkeypatch.setattr(matmul, "_MATVEC_ENV", matmul.parse_matvec_env("stream:64,2,1,1"))
    path = references[("llama", "q4_0")][0]
    monkeypatch.setenv("LLAMAVK_CHAIN_X_COLS", "1")
    with quiet(path, n_ctx=64, devices="Vulkan0,Vulkan0", split_mode="graph") as m:
        for sub in m.runtime.runtimes:
            sub.sequence("last", 1, 0)
            partials = {op.inputs[0] for op in sub.fused_one["last"].ops if op.kind == "put"}
            assert not [op for op, _ in sub.chains[("last", 1, 0, False)] if op.out in partials]
            assert any(op.kind == "sync_reduce" for op, _ in sub.chains[("last", 1, 0, False)])   # the next product's
    monkeypatch.setenv("LLAMAVK_CHAIN_X_COLS", "wide")
    with pytest.raises(LlamavkError, match="LLAMAVK_CHAIN_X_COLS"):
        chain_x_ok(64)


@pytest.mark.parametrize("mode", ["tensor", "graph"])
def test_one_token_exchange_point_is_one_dispatch(references, monkeypatch, mode):
    """Spin-synchronised splits (separate GPUs; forced here, and only recorded: llvmpipe cannot spin):
    each all-reduce of a decode step is one dispatch after the product that wrote its partial straight
    into shared host memory (split/matvec_steps.py) -- no copy, exchange_sync or reduce_sum dispatch.
    -sm graph chains the next products to it (their weight loads overlap the exchange); tensor does not."""
    monkeypatch.setenv("LLAMAVK_SPLIT_SYNC", "spin")
    monkeypatch.setenv("LLAMAVK_CHAIN", "1")         # chain products as on an NVIDIA GPU,
    from llamavk.kernels import matmul                # whose one-token products take the stream kernel
    monkeypatch.setattr(matmul, "_MATVEC_ENV", matmul.parse_matvec_env("stream:64,2,1,1"))
    path = references[("llama", "q4_0")][0]
    with quiet(path, n_ctx=64, devices="Vulkan0,Vulkan0", split_mode=mode, profile=True) as m:
        rt = m.runtime
        assert rt.sync == "spin"
        for sub in rt.runtimes:
            graph = sub.fused_one["last"]
            kinds = [op.kind for op in graph.ops]
            assert kinds.count("sync_reduce") == 8 and "sync" not in kinds and "reduce" not in kinds  # 4 layers x 2
            assert all(op.attrs["direct"] for op in graph.ops if op.kind == "put")
            (seq,) = sub.sequence("last", 1, 0)
            kernels = [name.split()[0] for name in seq.profiler.names]
            assert kernels.count("exchange_reduce") == 8
            assert not {"exchange_sync", "reduce_sum_f32"} & set(kernels)
            # no partial is copied: the copies are the last row's and the fill zeroing the chain counters
            assert seq.n_copies == kinds.count("last_row") + 1
            # every all-reduce but the last (the output product after it is not chained) is chained
            chained_after = [op for op, _ in sub.chains[("last", 1, 0, False)] if op.kind == "sync_reduce"]
            assert len(chained_after) == (7 if mode == "graph" else 0)
            # -sm graph: every exchange point also waits in its shader for the product whose partial
            # it publishes (no barrier between them)
            partials = {op.inputs[0] for op in graph.ops if op.kind == "put"}
            chained_before = [op for op, _ in sub.chains[("last", 1, 0, False)] if op.out in partials]
            assert len(chained_before) == (8 if mode == "graph" else 0)


def test_layer_mode_hops_and_finished_devices_waiting(references, monkeypatch):
    """-sm layer on 4 devices: a device whose block of layers is done waits, with the last device,
    for the hand-over into it (a GPU left idle for the rest of the step loses its clocks), and
    records that wait in its decode step (spin sync; forced here and only recorded: llvmpipe cannot
    spin). The devices' turns are unchanged: each waits for the one before it, in one dispatch that
    also copies the activation out of host memory (exchange_reduce: the "sum" of one device's slot),
    and the products after it are chained to it (their weight loads out while the device waits).
    The finished devices' waits keep their GPUs busy (exchange_sync's hold)."""
    monkeypatch.setenv("LLAMAVK_SPLIT_SYNC", "spin")
    monkeypatch.setenv("LLAMAVK_CHAIN", "1")         # chain products as on an NVIDIA GPU,
    from llamavk.kernels import matmul                # whose one-token products take the stream kernel
    monkeypatch.setattr(matmul, "_MATVEC_ENV", matmul.parse_matvec_env("stream:64,2,1,1"))
    path = references[("llama", "q4_0")][0]

    def waits_of(m):
        return [[(op.kind, op.attrs["wait_mask"]) for op in sub.fused_one["last"].ops
                 if op.kind in ("sync", "sync_reduce") and op.attrs["wait_mask"]] for sub in m.runtime.runtimes]

    with quiet(path, n_ctx=64, devices="Vulkan0,Vulkan0,Vulkan0,Vulkan0", split_mode="layer", profile=True) as m:
        rt = m.runtime
        assert rt.sync == "spin"
        for sub in rt.runtimes:
            ops = sub.fused_one["last"].ops
            assert "get" not in [op.kind for op in ops]
            (seq,) = sub.sequence("last", 1, 0)
            kernels = [name.split()[0] for name in seq.profiler.names]
            syncs = [op for op in ops if op.kind == "sync" and (op.attrs["signal"] or op.attrs["wait_mask"])]
            assert kernels.count("exchange_sync") == len(syncs)
            hops = [op for op in ops if op.kind == "sync_reduce"]
            assert kernels.count("exchange_reduce") == len(hops)
            chained = [op for op, _ in sub.chains[("last", 1, 0, False)]]
            assert all(op in chained for op in hops)
        hop = lambda d: ("sync_reduce", 1 << d)   # noqa: E731
        assert waits_of(m) == [[("sync", 1 << 2)], [hop(0), ("sync", 1 << 2)], [hop(1)], [hop(2)]], waits_of(m)
        # the finished devices hold their GPUs busy while they wait (exchange_sync hold): every other wait
        # is followed by work of the device's own
        holds = [[op.attrs.get("hold", False) for op in sub.fused_one["last"].ops if op.kind == "sync"
                  and op.attrs["wait_mask"]] for sub in rt.runtimes]
        assert holds == [[True], [True], [], []]
    monkeypatch.setenv("LLAMAVK_LAYER_IDLE_WAIT", "0")    # the A/B switch: only the turns
    with quiet(path, n_ctx=64, devices="Vulkan0,Vulkan0,Vulkan0,Vulkan0", split_mode="layer") as m:
        assert waits_of(m) == [[], [hop(0)], [hop(1)], [hop(2)]], waits_of(m)
    monkeypatch.setenv("LLAMAVK_HOP_FUSE", "0")           # the hops' A/B switch: a wait, then a copy
    with quiet(path, n_ctx=64, devices="Vulkan0,Vulkan0,Vulkan0,Vulkan0", split_mode="layer") as m:
        assert waits_of(m) == [[], [("sync", 1)], [("sync", 2)], [("sync", 4)]]
        assert all("get" in [op.kind for op in sub.fused_one["last"].ops] for sub in m.runtime.runtimes[1:])
    monkeypatch.delenv("LLAMAVK_HOP_FUSE")
    monkeypatch.delenv("LLAMAVK_LAYER_IDLE_WAIT")
    # the logits stay those of -sm none (relay sync on llvmpipe: the waits are the host's rounds)
    monkeypatch.delenv("LLAMAVK_SPLIT_SYNC")
    _, prompt, want, _ = references[("llama", "q4_0")]
    with quiet(path, n_ctx=128, devices="Vulkan0,Vulkan0,Vulkan0,Vulkan0", split_mode="layer") as m:
        got = m.logits(prompt, all=True)
    assert np.abs(got - want).max() <= REL_TOL * np.abs(want).max()
