#!/usr/bin/env python3
"""GPU time of the chunked gated delta rule's two kernels (gdn_chunk_prep, gdn_chunk_scan) on one
DeltaNet layer of a prompt batch; default shape Qwen3.6-35B-A3B's (16 key / 32 value heads of 128),
512 tokens.

    python3 benchmarks/bench_gdn_chunk.py [--tokens 512] [--heads 16,32] [--dim 128] [--cols 16,8] [--old DIR]
--cols: also time the scan with these state columns per workgroup (llamavk/kernels/deltanet.py
scan_columns picks one).
--old DIR: also time SPIR-V files found in DIR (e.g. DIR/gdn_chunk_scan_f32.spv from an earlier
commit: `git show REV:llamavk/spv/gdn_chunk_scan_f32.spv > DIR/gdn_chunk_scan_f32.spv`) in place of
the shipped ones, and print both. The output is checked between the two (same inputs, max relative
difference), so a faster kernel that computes something else shows.

Each measurement records --reps layers back to back (barrier-separated), replays them for --warmup
seconds (clocks up), then 5 more times; prints the median microseconds per dispatch (timestamps).
"""

import argparse
import time
from pathlib import Path

import numpy as np

import llamavk.vk.kernel as vkkernel
from llamavk.devices import open_devices, select
from llamavk.kernels import STEP_WORDS, KernelCache, View
from llamavk.kernels import deltanet as dn
from llamavk.vk import Buffer, CommandSequence, get_instance


def upload(dev, arr) -> View:
    """Device-local (host-visible memory would put the kernels' reads and writes on the bus)."""
    arr = np.ascontiguousarray(arr)
    buf = Buffer(dev, arr.nbytes)
    buf.write(arr)
    return View(buf, 0, arr.nbytes)


def measure(dev, kc, views, n, hk, hv, d, reps, warmup):
    """{kernel name: median us per dispatch} and the first layer's output."""
    step, x, alpha, beta, dt, a, state, out = views
    seq = CommandSequence(dev, profile=True).begin()
    for _ in range(reps):
        dn.delta_net(seq, kc, x, alpha, beta, dt, a, state, out, step, n, hk, hv, d, 1e-6, chunked=True)
        seq.barrier()
    seq.end()
    t0 = time.time()
    seq.run()
    while time.time() - t0 < warmup:
        seq.run()
    times: dict[str, list[float]] = {}
    for _ in range(5):
        seq.run()
        for name, us in seq.profile_results():
            times.setdefault(name, []).append(us)
    seq.close()
    return {k: float(np.median(v)) for k, v in times.items()}, np.frombuffer(out.buffer.read(), np.float32).copy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--heads", default="16,32", help="key heads,value heads")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=float, default=0.3)
    ap.add_argument("--cols", default="", help="also time these scan widths (COLS), e.g. 16,8")
    ap.add_argument("--old", type=Path, help="a folder of SPIR-V to time in place of the shipped kernels")
    a = ap.parse_args()
    hk, hv = map(int, a.heads.split(","))
    n, d = a.tokens, a.dim
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    print(f"{dev.info.name}: {n} tokens, {hk}/{hv} heads of {d}, {a.reps} layers per replay")
    rng = np.random.default_rng(0)
    step = np.zeros(STEP_WORDS, np.uint32)
    step[:3] = [0, n, n]                 # n_past 0: the state starts at zero, every replay alike
    views = [upload(dev, step), upload(dev, rng.standard_normal((n, (2 * hk + hv) * d)).astype(np.float32)),
             upload(dev, rng.standard_normal((n, hv)).astype(np.float32)),
             upload(dev, rng.standard_normal((n, hv)).astype(np.float32)),
             upload(dev, (rng.standard_normal(hv) * 0.5).astype(np.float32)),
             upload(dev, -np.exp(rng.uniform(np.log(0.002), np.log(8.0), hv)).astype(np.float32)),
             upload(dev, np.zeros((hv, d, d), np.float32)), upload(dev, np.zeros((n, hv * d), np.float32))]
    runs = [("shipped", None, None)] + [(f"cols {c}", None, int(c)) for c in a.cols.split(",") if c]
    runs += [("old", a.old, None)] if a.old else []
    results = {}
    shipped_load, shipped_cols = vkkernel.load_spirv, dn.scan_columns
    for label, folder, cols in runs:
        if cols is not None:
            dn.scan_columns = lambda kc, head_dim, cols=cols: cols
        if folder is not None:
            def load(name, folder=folder):
                path = folder / f"{name}.spv"
                return path.read_bytes() if path.exists() else shipped_load(name)
            vkkernel.load_spirv = load
        results[label] = measure(dev, KernelCache(dev), views, n, hk, hv, d, a.reps, a.warmup)
        vkkernel.load_spirv, dn.scan_columns = shipped_load, shipped_cols
    names = sorted({k for t, _ in results.values() for k in t})
    print(f"{'kernel':24}" + "".join(f"{label + ' us':>14}" for label in results))
    for k in names:
        print(f"{k:24}" + "".join(f"{t.get(k, float('nan')):14.1f}" for t, _ in results.values()))
    if a.old:
        new, old = results["shipped"][1], results["old"][1]
        print(f"output: max |shipped - old| / max |old| = {np.abs(new - old).max() / np.abs(old).max():.2e}")


if __name__ == "__main__":
    main()
