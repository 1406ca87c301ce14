"""The split timeline (llamavk/split/clock.py): device-clock stamps inside the exchange point and the
products after it. The CLOCK kernels compute what the plain ones do; their stamps follow the order
the kernels impose (a chained product's wait is released only after the exchange point counted
itself done, which is after its end stamp); the clock counts nanoseconds; a profiled split decode
gives the unprofiled logits.

On llvmpipe a split synchronises through the host (relay: it cannot spin, docs/TESTING.md), so the
model-level test sees barriers around every exchange point in both tensor and graph mode; the
chained path is tested at the kernel level (the peer's counter published before the dispatch, as
in tests/test_vk_multidevice.py) and, in a spin-synchronised split, recorded only.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

import llamavk
from llamavk.errors import LlamavkError
from llamavk.kernels import KernelCache, View, collective, upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.kernels.chain import ChainCounters
from llamavk.kernels.matmul import MatvecConfig, matmul
from llamavk.split import clock
from llamavk.vk import Buffer, CommandSequence, SharedHostMemory

from .test_kernels_matmul import make_weight

DP = MatvecConfig(64, 2, 1, 1, "stream_dp")


def f32(dev, a):
    buf = Buffer(dev, max(4, a.nbytes), host_visible=True)
    buf.array(np.float32, a.size)[:] = a.reshape(-1)
    return buf


@pytest.fixture
def clock_dev(dev):
    if not dev.info.shader_clock or not dev.info.external_memory_host or not dev.features.get("int_dot"):
        pytest.skip("needs VK_KHR_shader_clock, host memory import and integer dot products")
    return dev


class Exchange:
    """One device's exchange point and sum (exchange_reduce.comp) with its peer played by the host
    (its counter published before the dispatch), and a stream product reading the sum."""

    def __init__(self, dev, cols=256, rows=96, qtype=T.Q4_0):
        rng = np.random.default_rng(3)
        self.dev, self.kc = dev, KernelCache(dev)
        self.n_dev, self.exchange, self.cols, self.rows = 2, 1, cols, rows
        self.flags_mem = SharedHostMemory(collective.flag_bytes(4, self.n_dev), [dev])
        self.parts_mem = SharedHostMemory(4 * self.n_dev * cols, [dev])
        self.parts = rng.standard_normal((self.n_dev, cols), dtype=np.float32)
        self.parts_mem.array(np.float32)[:self.parts.size] = self.parts.reshape(-1)
        self.base = f32(dev, rng.standard_normal(cols, dtype=np.float32))
        self.out = Buffer(dev, 4 * cols, host_visible=True)
        self.status = Buffer(dev, 16, host_visible=True)
        self.step = Buffer(dev, 256, host_visible=True)
        self.step.array(np.uint32)[:] = 0
        self.nw = f32(dev, rng.uniform(0.5, 1.5, cols).astype(np.float32))
        raw, _ = make_weight(qtype, rows, cols, seed=5)
        self.w = upload_qweight(dev, raw, qtype, rows, cols)
        self.y = Buffer(dev, 4 * rows, host_visible=True)

    def record(self, stamps=None, chained=True):
        """exchange_reduce, then the normed product of its sum: chained without a barrier (as -sm
        graph records it) or behind one (-sm tensor). stamps: a clock.ClockStamps (CLOCK kernels)."""
        words = collective.FLAG_LINE_BYTES // 4
        flags = self.flags_mem.array(np.uint32)
        flags[:] = 0
        first = (self.exchange * self.n_dev + 1) * collective.FLAG_LINES   # the peer (device 1): published
        flags[first * words:(first + collective.FLAG_LINES) * words:words] = self.exchange + 1
        self.status.array(np.uint32)[:] = 0
        self.out.array(np.float32)[:] = np.nan
        self.y.array(np.float32)[:] = np.nan
        st = stamps.stamp(self.exchange, 0) if stamps is not None else None
        chain = ChainCounters(self.kc, 2) if chained else None
        seq = CommandSequence(self.dev).begin()
        if chain is not None:
            chain.begin(seq)
        signal = chain.signal() if chain is not None else None
        n = collective.exchange_reduce(seq, self.kc, View.whole(self.flags_mem.buffer(self.dev)), View.whole(self.status),
                                       View.whole(self.step), 0, self.exchange, True, 0b10, self.n_dev, 3,
                                       View.whole(self.parts_mem.buffer(self.dev)), 0b11, self.cols, View.whole(self.out),
                                       1, self.cols, base=View.whole(self.base), chain=signal, clock=st)
        if not chained:
            seq.barrier()
        matmul(seq, self.kc, self.w, View.whole(self.out), View.whole(self.y), 1, norm=View.whole(self.nw), eps=1e-5,
               wait=ChainCounters.wait(signal, n) if chained else None, clock=st)
        return seq.end()

    def run(self, stamps=None, chained=True):
        if stamps is not None:
            stamps.reset()
        self.record(stamps, chained).run()
        assert int(self.status.array(np.uint32)[0]) == 0
        return self.out.array(np.float32).copy(), self.y.array(np.float32).copy()


@pytest.mark.parametrize("qtype,cols,kernel", [(T.Q4_0, 256, "stream_dp"), (T.Q8_0, 256, "stream_dp"),
                                               (T.Q4_K, 512, "stream_dp"), (T.Q6_K, 512, "stream_dp"),
                                               (T.Q2_K, 512, "stream_dp_half"), (T.Q3_K, 512, "stream_dp_half")])
def test_clock_kernels_compute_what_the_plain_ones_do(clock_dev, monkeypatch, qtype, cols, kernel):
    """The CLOCK variants of the exchange point and of the stream _dp product (every type with one)
    write the same sum and the same rows as the plain ones, bit for bit, chained and not; and the
    stamps are ordered: entry <= arrived <= end, the products' entries, releases and ends in order,
    and a chained product's wait is released only after the exchange point's end (it waits for its
    count, made after the end stamp)."""
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": replace(DP, kernel=kernel)})
    ex = Exchange(clock_dev, cols=cols, qtype=qtype)
    stamps = clock.ClockStamps(clock_dev, 4)
    want_sum = ex.base.array(np.float32) + ex.parts.sum(0)
    for chained in (True, False):
        plain = ex.run(chained=chained)
        np.testing.assert_allclose(plain[0], want_sum, rtol=1e-6, atol=1e-6)
        assert np.isfinite(plain[1]).all()
        ex.run(stamps, chained=chained)     # llvmpipe compiles a pipeline at its first dispatch
        for _ in range(3):   # a run whose stamps straddle the 32-bit clock's wrap (every 4.3 s) has no timeline
            clocked = ex.run(stamps, chained=chained)
            assert np.array_equal(plain[0], clocked[0]) and np.array_equal(plain[1], clocked[1]), chained
            timeline = clock.Timeline.of(stamps.read(), stamps.layers)
            if timeline is not None:
                break
        (p,) = timeline
        assert 0 <= p.entry <= p.arrived <= p.end
        assert p.first_entry <= p.last_entry and p.first_release <= p.last_release <= p.product_end
        assert p.first_entry <= p.first_release and p.last_entry <= p.last_release
        assert p.first_release >= p.end, "a product read the sum before the exchange point ended"
        if not chained:   # behind a barrier: the product starts after the exchange point's end
            assert p.first_entry >= p.end
    assert f"{mm.MATVEC_KERNELS[kernel][0]}_clock_{mm.type_suffix(qtype)}" in {name for name, _ in ex.kc._kernels}
    stamps.close()


def test_device_clock_counts_nanoseconds(clock_dev):
    """Two runs of the exchange point 0.2 s apart on the host: the device clock's entries are as far
    apart in nanoseconds as the host's bounds allow (between the end of the first run and the
    start of the second, and the start of the first and the end of the second)."""
    ex = Exchange(clock_dev)
    stamps = clock.ClockStamps(clock_dev, 4)
    seq = ex.record(stamps, chained=False)
    seq.run()                           # llvmpipe compiles a pipeline at its first dispatch
    t = []
    entries = []
    for _ in range(2):
        stamps.reset()
        t0 = time.perf_counter_ns()
        seq.run()
        t.append((t0, time.perf_counter_ns()))
        entries.append(int(stamps.read()[ex.exchange][clock.EX_ENTRY]))
        time.sleep(0.2)
    delta = (entries[1] - entries[0]) % (1 << 32)
    assert t[1][0] - t[0][1] <= delta <= t[1][1] - t[0][0], (delta, t)
    stamps.close()


def test_timeline_discards_a_step_across_a_clock_wrap():
    """32-bit stamps wrap every 4.3 s: a step whose stamps straddle a wrap gives no timeline; one
    that does not is read relative to its earliest stamp."""
    words = np.zeros((2, clock.STAMP_WORDS), np.uint32)
    words[:, [clock.PR_FIRST, clock.REL_FIRST]] = 0xFFFFFFFF
    words[0, :3] = [100, 150, 400]
    words[0, 3:] = [300, 350, 450, 460, 900]
    assert [(p.wait, p.sum, p.lead, p.release, p.finish) for p in clock.Timeline.of(words, {0: 5, 1: 6})] \
        == [(50, 250, 100, 50, 500)]                            # slot 1 was never stamped: left out
    words[1, :3] = [0xFFFFFF00, 0xFFFFFF80, 0xFFFFFFF0]         # just before the wrap; slot 0 after it
    assert clock.Timeline.of(words, {0: 5, 1: 6}) is None
    assert clock.Timeline.of(words, {}) == []                  # nothing recorded (no all-reduce)


def quiet(path, **kw):
    return llamavk.load(path, warn=lambda m: None, **kw)


def one_token_logits(rt, tokens):
    rows, timelines = [], []
    for i, t in enumerate(tokens):
        rt.run_batch("last", [t], i)
        rows.append(rt.logits(1)[0].copy())
        if any(r.clock is not None for r in rt.runtimes):
            timelines.append(rt.clock_timelines())
    return np.array(rows), timelines


@pytest.mark.parametrize("mode", ["tensor", "graph"])
def test_profiled_split_decode(synthetic_model, monkeypatch, clock_dev, mode):
    """A split decode with LLAMAVK_CLOCK_PROFILE=1 (2 virtual devices, host relay on llvmpipe) gives
    the unprofiled logits bit for bit, and per device a stamped timeline of every exchange point
    and the product after it, in order; the products start after their exchange point's end
    (barriers here, as -sm tensor always has)."""
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": DP})
    path = synthetic_model("llama", "q4_0")
    tokens = [3, 17, 42, 9]
    with quiet(path, n_ctx=32, devices="Vulkan0,Vulkan0", split_mode=mode) as m:
        want, _ = one_token_logits(m.runtime, tokens)
        with pytest.raises(LlamavkError, match=clock.ENV):
            m.runtime.clock_timelines()
    monkeypatch.setenv(clock.ENV, "1")
    with quiet(path, n_ctx=32, devices="Vulkan0,Vulkan0", split_mode=mode) as m:
        got, timelines = one_token_logits(m.runtime, tokens)
        n_layer = m.config.n_layer
    assert np.array_equal(got, want)
    for per_device in timelines[1:]:    # the first step: llvmpipe compiling pipelines (seconds)
        for points in per_device:
            assert points is not None
            assert sorted(p.layer for p in points) == sorted(list(range(n_layer)) * 2)   # attention, FFN
            for p in points:
                assert 0 <= p.entry <= p.arrived <= p.end
            stamped = [p for p in points if p.first_entry is not None]
            assert len(stamped) >= 2 * n_layer - 1      # the last one's reader: the output product
            for p in stamped:
                assert p.end <= p.first_entry <= p.last_entry
                assert p.first_release <= p.last_release <= p.product_end
            s = clock.summary(points)
            assert s["overlapped"] == 0 and s["lead_us"] < 0 and s["sum_us"] > 0


@pytest.mark.parametrize("mode", ["tensor", "graph"])
def test_spin_split_records_clock_kernels(synthetic_model, monkeypatch, clock_dev, mode):
    """Spin-synchronised splits (forced, recorded only: llvmpipe cannot spin): profiled, every
    exchange point and every stream product reading its sum take the CLOCK kernels (graph mode's
    chained after it); unprofiled, none does."""
    monkeypatch.setenv("LLAMAVK_SPLIT_SYNC", "spin")
    monkeypatch.setenv("LLAMAVK_CHAIN", "1")
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": DP})
    path = synthetic_model("llama", "q4_0")
    for profiled in (False, True):
        monkeypatch.setenv(clock.ENV, "1" if profiled else "0")
        with quiet(path, n_ctx=32, devices="Vulkan0,Vulkan0", split_mode=mode, profile=True) as m:
            n_layer = m.config.n_layer
            for sub in m.runtime.runtimes:
                (seq,) = sub.sequence("last", 1, 0)
                kernels = [name.split()[0] for name in seq.profiler.names]
                clocked = [k for k in kernels if "clock" in k]
                if not profiled:
                    assert clocked == [] and sub.clock is None
                    continue
                assert kernels.count("exchange_reduce_clock") == 2 * n_layer and "exchange_reduce" not in kernels
                # after each exchange but the last: the products reading its sum (gate+up as one
                # pair; Q, K, V), all stream _dp CLOCK kernels
                assert sum(k.startswith("mul_mv_stream_dp_clock") for k in clocked) >= 2 * n_layer - 1
                chained = [op for op, _ in sub.chains[("last", 1, 0, False)] if op.kind == "sync_reduce"]
                assert len(chained) == (2 * n_layer - 1 if mode == "graph" else 0)


def test_every_stream_type_has_a_clock_variant():
    """A profiled split asks for the CLOCK variant of whatever stream _dp product follows an
    all-reduce (matmul.CLOCK_KERNELS): every type with a stream form has one built."""
    from pathlib import Path
    spv = Path(llamavk.__file__).parent / "spv"
    kernel = mm.MATVEC_KERNELS[next(iter(mm.CLOCK_KERNELS))][0]
    missing = [t for t in mm.MATVEC_STREAM_NQ if not (spv / f"{kernel}_clock_{t}.spv").exists()]
    assert not missing, missing


def test_profile_switch_errors(monkeypatch):
    """LLAMAVK_CLOCK_PROFILE takes 0 or 1; a device without the shader clock is a one-line error
    naming it, before anything is allocated."""
    from types import SimpleNamespace

    monkeypatch.setenv(clock.ENV, "yes")
    with pytest.raises(LlamavkError, match="0 or 1"):
        clock.enabled()
    monkeypatch.setenv(clock.ENV, "1")
    assert clock.enabled()
    gpu = SimpleNamespace(name="Vulkan1", info=SimpleNamespace(shader_clock=False, name="Some GPU"))
    with pytest.raises(LlamavkError, match="Vulkan1 .Some GPU. has no device clock"):
        clock.check_devices([gpu])
