#!/usr/bin/env python3
"""How fast a decode step's chain of Q4_0 products could run with their arithmetic, on the first
device: layers of dependent matrix-vector products (shaders/bench_persistent.comp: x quantized to
int8 per 32 values in every workgroup, integer dot products) recorded

    mode 0  one dispatch per product, a barrier between them (how the engine records a step)
    mode 1  one persistent dispatch: resident workgroups pass from product to product at a grid
            barrier (a counter), the next product's first weight loads issued before it

Both on the same fixed grid (--grids: modes 1's must be resident at once, or its waits give up),
each workgroup looping over chunks of rows (a row group of 32 or 64 lanes per row). --pipe 1 keeps
two chunks' weights per lane (~120 registers on an H100 against 72: 2 workgroups an SM, so there
mode 1 needs a grid of at most 264; a larger one is not resident: its waits give up, counted, and the
run takes ~90 ms a layer). --maxb 4: at most 4 blocks a lane, fewer registers (rows up to 8192 weights).
Prints microseconds per layer and the weights' GB/s.

    python3 benchmarks/bench_persistent.py [--layer 6144x4096,16x4096,4096x4096,28672x4096,4096x14336]
                                           [--layers 32] [--grids 132,264,396] [--modes 0,1] [--pipe 0,1]
                                           [--maxb 7|4] [--flags device|host]
    python3 benchmarks/bench_persistent.py --check [--maxb 7|4]    # one small layer in mode 0 against numpy

The default layer is a 7.2B Q4_0 one: Q/K/V, a 16-row product where attention goes, O, gate and up
as one 28672-row product, down. Host wall time over whole replays.
"""

import argparse
import math
import time

import numpy as np

from llamavk.devices import open_devices, select
from llamavk.vk import Buffer, CommandSequence, get_instance
from llamavk.vk.kernel import Kernel

LAYER = "6144x4096,16x4096,4096x4096,28672x4096,4096x14336"
ACT_MAX = 32768


def parse_layer(text: str, maxb: int) -> list:
    shapes = [tuple(int(v) for v in part.split("x")) for part in text.split(",")]
    for rows, cols in shapes:
        lanes = 32 if cols <= 1024 * maxb else 64   # the kernel's lanes per row
        if rows % 8 or cols % (32 * lanes) or cols > 2048 * maxb or rows > ACT_MAX or len(shapes) > 6:
            raise SystemExit(f"{text}: rows a multiple of 8 up to {ACT_MAX}; columns a multiple of 1024 up to "
                             f"{1024 * maxb}, or of 2048 up to {2048 * maxb}; at most 6 products a layer")
    return shapes


def random_weights(rng, shapes: list, copies: int):
    """Quant bytes and f16 scales of `copies` layers; scales keep a product's output near its input's size."""
    blocks = sum(r * c // 32 for r, c in shapes)
    quants = rng.integers(0, 256, (copies * blocks, 16), dtype=np.uint8)
    scales = np.concatenate([np.full(r * c // 32, 1 / math.sqrt(21 * c), np.float16) for r, c in shapes] * copies)
    return quants, scales


def reference(quants, scales, shapes: list, act: np.ndarray, n: int) -> np.ndarray:
    """act after n products in float64: what the kernel computes but for x's int8 rounding."""
    act = act.astype(np.float64).reshape(2, ACT_MAX).copy()
    q = np.concatenate([quants & 15, quants >> 4], axis=1).astype(np.float64) - 8
    w_all = q * scales.astype(np.float64)[:, None]
    base = 0
    for s in range(n):
        rows, cols = shapes[s % len(shapes)]
        w = w_all[base:base + rows * cols // 32].reshape(rows, cols)
        base += rows * cols // 32
        act[(s + 1) % 2, :rows] = w @ act[s % 2, :cols]
    return act.reshape(-1)


def record(dev, k, bufs, mode: int, n: int, grid: int, shapes: list, copies: int):
    seq = CommandSequence(dev).begin()
    seq.fill(bufs[3], 0)
    seq.barrier()
    rows = [r for r, _ in shapes] + [0] * (6 - len(shapes))
    cols = [c for _, c in shapes] + [0] * (6 - len(shapes))
    for s in range(n if mode == 0 else 1):
        push = np.array([s, n, copies, len(shapes)] + rows + cols, np.uint32).tobytes()
        seq.dispatch(k, bufs, (grid, 1, 1), push)
    seq.end()
    return seq


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", default=LAYER)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--grids", default="132,264,396")
    ap.add_argument("--modes", default="0,1")
    ap.add_argument("--pipe", default="0", help="0: one chunk of weights in flight per workgroup; "
                    "1: the next chunk's loads issued before this one's arithmetic (two register sets)")
    ap.add_argument("--maxb", type=int, choices=(7, 4), default=7,
                    help="blocks per lane of a row at most (4: fewer registers, rows up to 8192 weights)")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--flags", choices=("device", "host"), default="device",
                    help="where the stage counters live (host: system memory, over PCIe)")
    a = ap.parse_args()
    # the middle product takes 64 lanes a row (more than 32 x maxb blocks)
    check_layer = "64x1024,16x10240,32x1024" if a.maxb == 7 else "64x1024,16x6144,32x1024"
    shapes = parse_layer(check_layer if a.check else a.layer, a.maxb)
    kernel = "bench_persistent" if a.maxb == 7 else "bench_persistent_b4"
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    layer_bytes = sum(r * c // 32 * 18 for r, c in shapes)
    copies = 1 if a.check else max(2, math.ceil(160e6 / layer_bytes))
    rng = np.random.default_rng(0)
    quants, scales = random_weights(rng, shapes, copies)
    act0 = rng.standard_normal(2 * ACT_MAX).astype(np.float32)
    wq, wd, act = Buffer(dev, quants.nbytes), Buffer(dev, scales.nbytes + 4), Buffer(dev, act0.nbytes)
    # the counters in device memory, as the engine's (kernels/chain.py); --flags host puts them in
    # system memory, where every atomic and poll crosses PCIe (how this measured before 2026-11-27)
    flags = Buffer(dev, 4 * 1024, host_visible=a.flags == "host")
    wq.write(quants.tobytes())
    wd.write(scales.tobytes())
    bufs = [wq, wd, act, flags]
    print(f"{dev.info.name}; {len(shapes)} products a layer, {layer_bytes / 1e6:.1f} MB, {copies} weight copies")
    if a.check:
        n = len(shapes)
        want = reference(quants, scales, shapes, act0, n)
        rows = shapes[-1][0]
        half = (n % 2) * ACT_MAX
        worst = 0.0
        for pipe in map(int, a.pipe.split(",")):
            k = Kernel(dev, kernel, "rrww", push_size=64, spec=(0, pipe))
            act.write(act0.tobytes())
            seq = record(dev, k, bufs, 0, n, 4, shapes, copies)
            seq.run()
            got = np.frombuffer(act.read(), np.float32)
            err = np.abs(got[half:half + rows] - want[half:half + rows]).max() / np.abs(want[half:half + rows]).max()
            print(f"mode 0, pipe {pipe}, {n} products: largest error {err:.2e} of the largest value")
            worst = max(worst, err)
            seq.close()
            k.close()
        raise SystemExit(0 if worst < 5e-2 else 1)
    n = a.layers * len(shapes)
    for mode, pipe in [(m, q) for m in map(int, a.modes.split(",")) for q in map(int, a.pipe.split(","))]:
        k = Kernel(dev, kernel, "rrww", push_size=64, spec=(mode, pipe))
        stats = k.statistics()   # with LLAMAVK_PIPELINE_STATS=1 (NVIDIA: registers per thread)
        if stats:
            print(f"mode {mode}  pipe {pipe}: " + ", ".join(f"{key} {v}" for key, v in stats.items()))
        for grid in map(int, a.grids.split(",")):
            act.write(act0.tobytes())
            seq = record(dev, k, bufs, mode, n, grid, shapes, copies)
            t0 = time.time()
            while time.time() - t0 < 0.3:   # clocks up
                seq.run()
            times = []
            for _ in range(10):
                t = time.perf_counter()
                seq.run()
                times.append(time.perf_counter() - t)
            us = float(np.median(times)) / a.layers * 1e6
            fl = np.frombuffer(flags.read(), np.uint32)
            note = f"  (waits given up: {int(fl[1023])}, count {int(fl[0])} of {n * grid})" if mode == 1 else ""
            print(f"mode {mode}  pipe {pipe}  grid {grid:4d}: {us:7.2f} us per layer  "
                  f"{layer_bytes / us / 1e3:6.0f} GB/s{note}", flush=True)
            seq.close()
        k.close()


if __name__ == "__main__":
    main()
