"""The fit check before a load allocates anything (llamavk/memory_fit.py), and the load progress bar."""

import io
import subprocess
import sys

import pytest

from llamavk.errors import LlamavkError, UsageError
from llamavk.memory_fit import GiB, DeviceNeed, FreeMemory, check_fit, estimate_device_need, weight_progress


def need(name="Vulkan0", physical=0, weights=10 * GiB, kv=2 * GiB, acts=GiB // 2):
    return DeviceNeed(name, physical, weights, kv, acts)


H100 = FreeMemory("NVIDIA H100 80GB HBM3", 79 * GiB, "free")


def test_fits():
    check_fit([need()], {0: H100})
    check_fit([need(weights=76 * GiB, kv=2 * GiB, acts=GiB)], {0: H100})      # exactly 79 GiB


def test_too_big_names_device_bytes_and_what_to_change():
    with pytest.raises(LlamavkError) as e:
        check_fit([need(weights=70 * GiB, kv=8 * GiB, acts=2 * GiB)], {0: H100}, n_available=2)
    msg = str(e.value)
    assert not isinstance(e.value, UsageError) and "\n" not in msg
    assert msg.startswith("Vulkan0 (NVIDIA H100 80GB HBM3) needs 80.00 GiB (weights 70.00 GiB, "
                          "KV cache 8.00 GiB, activations 2.00 GiB) but has 79.00 GiB free: ")
    assert "use a smaller context (-c)" in msg
    assert "a split over more devices (-dev, -sm layer)" in msg


def test_split_names_the_device_that_does_not_fit_and_suggests_shares():
    free = {0: H100, 1: FreeMemory("AMD Radeon RX 7900 XTX", 20 * GiB, "free")}
    needs = [need("Vulkan0", 0, 30 * GiB), need("Vulkan1", 1, 30 * GiB)]
    with pytest.raises(LlamavkError, match=r"^Vulkan1 \(AMD Radeon RX 7900 XTX\) needs 32.50 GiB .* "
                                           r"has 20.00 GiB free: .*other shares \(-ts\) or another split mode"):
        check_fit(needs, free)


def test_virtual_devices_share_their_physical_devices_memory():
    free = {0: FreeMemory("llvmpipe", 20 * GiB, "host memory")}
    check_fit([need("Vulkan0", 0, 8 * GiB, GiB, 0)], free)
    with pytest.raises(LlamavkError, match=r"^Vulkan0 and Vulkan0#1 \(llvmpipe\) need 22.00 GiB .* but share "
                                           r"20.00 GiB \(host memory\)"):
        check_fit([need("Vulkan0", 0, 10 * GiB, GiB, 0), need("Vulkan0#1", 0, 10 * GiB, GiB, 0)], free)


def test_heap_size_is_said_when_the_driver_reports_no_free_memory():
    with pytest.raises(LlamavkError, match=r"has 4.00 GiB \(heap size\)"):
        check_fit([need()], {0: FreeMemory("Some GPU", 4 * GiB, "heap size")})


def test_unknown_free_memory_is_not_checked():
    check_fit([need(weights=1000 * GiB)], {})


@pytest.mark.parametrize("arch,qtype", [("llama", "q4_k"), ("qwen3moe", "q4_0")])
def test_estimate_matches_what_the_runtime_allocates(synthetic_model, dev, arch, qtype):
    """The estimate for one device equals the runtime's weights (stacked experts included) and KV
    cache, and its activations are at least the runtime's arena (planned over the unfused graph,
    an upper bound for these architectures)."""
    from llamavk.models import build_graph, load_model_file
    from llamavk.runtime import DeviceRuntime

    f = load_model_file(synthetic_model(arch, qtype))
    graphs = {"last": build_graph(f.config), "all": build_graph(f.config, all_logits=True)}
    est = estimate_device_need(f, graphs, 96, 16, dev)
    rt = DeviceRuntime(f, dev, 96, 16, graphs)
    assert est.weights == rt.weight_bytes()
    assert est.kv == rt.kv_bytes() and rt.state_bytes() == 0
    assert rt.arena.size + rt.logits_buf.size <= est.activations < 2 * (rt.arena.size + rt.logits_buf.size)
    assert est.name == dev.name and est.physical == dev.info.index


def test_progress_counts_every_weight_once(synthetic_model):
    import llamavk

    calls = []
    with llamavk.load(synthetic_model("llama", "q4_0"), n_ctx=64, warn=lambda m: None,
                      progress=lambda done, total: calls.append((done, total))) as m:
        stored = m.runtime.weight_bytes()
    assert len(calls) > 3
    dones = [d for d, _ in calls]
    assert dones == sorted(dones) and len({t for _, t in calls}) == 1
    assert dones[-1] == stored and calls[0][1] >= stored


def test_weight_progress_without_a_callback():
    assert weight_progress(None, 10) is None
    seen = []
    advance = weight_progress(lambda d, t: seen.append((d, t)), 10)
    advance(4)
    advance(6)
    assert seen == [(4, 10), (10, 10)]


def test_a_context_larger_than_memory_is_a_one_line_error(synthetic_model):
    """-c 10^9 on the tiny model (2 layers, 2 KV heads of 16): K and V in f16 take 2 x 2 x 10^9 x 32 x 2
    bytes = 238.42 GiB, more than this machine (or any GPU) has."""
    r = subprocess.run([sys.executable, "-m", "llamavk", "run", "-m", str(synthetic_model("llama", "q4_0")),
                        "-p", "hi", "-n", "1", "-c", "1000000000"], capture_output=True, text=True, errors="replace",
                       timeout=300)
    assert r.returncode == 1, r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip() and not l.startswith("warning:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert lines[0].startswith("error: Vulkan0 (") and "KV cache 238.42 GiB" in lines[0] and "-c" in lines[0]


# -- the progress bar ----------------------------------------------------------------------------
class FakeTerminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_only_on_a_terminal_and_after_a_second(monkeypatch):
    import time

    from llamavk.cli import load_progress
    from llamavk.cli.load_progress import LoadProgress

    with LoadProgress(stream=io.StringIO()) as pipe:      # not a terminal: never shown
        pipe(1, 10)
    assert not pipe.enabled and pipe.bar is None and pipe._timer is None

    term = FakeTerminal()
    with LoadProgress(stream=term) as quick:                  # over within the first second
        quick(1, 10)
        assert quick.bar is None
    assert quick.bar is None and term.getvalue() == ""

    monkeypatch.setattr(load_progress, "SHOW_AFTER_SECONDS", 0.01)
    with LoadProgress("loading m.gguf", stream=term) as slow:
        deadline = time.monotonic() + 10
        while slow.bar is None and time.monotonic() < deadline:   # the timer thread starts it
            time.sleep(0.01)
        assert slow.bar is not None
        slow(4, 10)
        assert slow.bar.tasks[0].completed == 4 and slow.bar.tasks[0].total == 10
    assert slow.bar is None                                   # cleared when the load ends


def test_dequant_scratch_is_counted_on_coopmat2_devices(synthetic_model, dev, monkeypatch):
    """On a device with coopmat2, prompts of Q4_K products dequantize to f16 scratch buffers first
    (two per power-of-two size class, one with LLAMAVK_DEQUANT_AHEAD=0): the estimate counts them; on
    others, and below the tokens from which that path applies, it does not."""
    from llamavk.kernels import selection
    from llamavk.memory_fit import dequant_scratch_bytes
    from llamavk.models import build_graph, load_model_file

    f = load_model_file(synthetic_model("llama", "q4_k"))
    graphs = {"last": build_graph(f.config), "all": build_graph(f.config, all_logits=True)}
    cm2 = type("CM2Device", (), {"name": dev.name, "info": dev.info, "features": {"coopmat2": True}})()
    # the Q4_K weights that products read (the embedding table is read by get_rows only, unless tied)
    names = {op.inputs[0].name for g in graphs.values() for op in g.ops if op.kind == "matmul"}
    sizes = {2 * f.gguf.tensor_shape(n)[0] * f.gguf.tensor_shape(n)[1] for n in names if f.tensor_type(n).name == "Q4_K"}
    expected = sum({1 << max(12, (b - 1).bit_length()) for b in sizes})
    assert expected > 0
    n = selection.cm2_dequant_min()
    assert dequant_scratch_bytes(f, graphs, n, cm2) == 2 * expected
    monkeypatch.setenv("LLAMAVK_DEQUANT_AHEAD", "0")
    assert dequant_scratch_bytes(f, graphs, n, cm2) == expected
    assert dequant_scratch_bytes(f, graphs, n - 1, cm2) == 0
    assert dequant_scratch_bytes(f, graphs, n, dev) == 0 or dev.features.get("coopmat2")
    assert (estimate_device_need(f, graphs, 96, n, cm2).activations
            - estimate_device_need(f, graphs, 96, n, dev).activations) == expected


def test_estimate_counts_the_recurrent_state(synthetic_model, dev):
    """A hybrid's DeltaNet layers keep a recurrent and a convolution state per layer: the estimate's
    cache part is the KV cache of its attention layers plus that state, as the runtime allocates."""
    from llamavk.models import build_graph, load_model_file
    from llamavk.runtime import DeviceRuntime

    f = load_model_file(synthetic_model("qwen35", "q8_0"))
    graphs = {"last": build_graph(f.config), "all": build_graph(f.config, all_logits=True)}
    est = estimate_device_need(f, graphs, 96, 16, dev)
    rt = DeviceRuntime(f, dev, 96, 16, graphs)
    assert rt.state_bytes() > 0 and est.kv == rt.kv_bytes() + rt.state_bytes()


def test_estimate_counts_the_f16_copies_of_a_quantized_cache(synthetic_model, dev):
    """On a device with cooperative matrices, a quantized cache's prompt attention dequantizes one layer's
    K and V rows into f16 copies (attention.coop_over_f16_copies): the estimate counts them (n_ctx rows
    of the widest layer, K and V, 2 bytes a value); an f16 cache or a device without those matrices not."""
    from llamavk.kv_cache import KVTypes
    from llamavk.models import build_graph, load_model_file

    f = load_model_file(synthetic_model("llama", "q8_0", head_dim=32))
    graphs = {"last": build_graph(f.config)}
    coop = type("CoopDevice", (), {"name": dev.name, "info": dev.info, "features": {"coopmat": True}})()
    plain = type("PlainDevice", (), {"name": dev.name, "info": dev.info, "features": {}})()
    q8 = KVTypes("q8_0", "q8_0")
    width = f.config.n_head_kv * f.config.head_dim
    extra = estimate_device_need(f, graphs, 96, 16, coop, q8).kv - estimate_device_need(f, graphs, 96, 16, plain, q8).kv
    assert extra == 2 * 96 * width * 2
    assert estimate_device_need(f, graphs, 96, 16, coop).kv == estimate_device_need(f, graphs, 96, 16, plain).kv
