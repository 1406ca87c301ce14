#!/usr/bin/env python3
"""A decode step's chain of Q4_0 products with no grid barrier, on the first device
(shaders/bench_dataflow.comp): tasks of 32 rows by 1024 columns, each waiting only for the 32 blocks of x
its part reads, the last part of a row chunk adding the others' partial sums and publishing the chunk
as one int8 block of the next product's x. Against bench_persistent.py's grid barriers.

    mode 0  one dispatch per product, a barrier between them (the same tasks; only a chunk's merge waits,
            for the chunk's other parts)
    mode 1  one persistent dispatch of every product

Both need their grid resident at once (a merge may wait for a workgroup of higher index): with
LLAMAVK_PIPELINE_STATS=1 larger grids are skipped; otherwise their waits give up, counted.

    python3 benchmarks/bench_dataflow.py [--layer 6144x4096,4096x4096,28672x4096,4096x14336] [--layers 32]
                                         [--grids 264,396,528] [--modes 0,1]
    python3 benchmarks/bench_dataflow.py --check [--check-grids 1,132]   # small layers, modes 0 and 1, against numpy

A product's x is the first `cols` sums of the product before (O reads Q/K/V's first 4096 rows where
attention would be, down the gate/up product's first 14336 where SwiGLU would be), so a product's columns
are at most the rows of the one before (and the first product's at most the last's). Prints microseconds
per layer and the weights' GB/s (host wall time over whole replays, the buffers' resets included).
"""

import math

import numpy as np

from bench_persistent import (chain_arguments, quantize_blocks, random_weights, replay_seconds, resident_grid,
                              shape_words)
from llamavk.devices import open_devices, select
from llamavk.vk import Buffer, CommandSequence, get_instance
from llamavk.vk.kernel import Kernel

LAYER = "6144x4096,4096x4096,28672x4096,4096x14336"
ACT_MAX = 32768
SLOT_BYTES = ACT_MAX + ACT_MAX // 4   # an x slot: int8 values, then a (s, s * sum) float pair per 32
NOBODY = 0xFFFFFFFF                   # a partial sum's product index before it is written
NOT_READY = 0xBF800000                # -1.0: a block's scale before it is published


def parse_layer(text: str) -> list:
    shapes = [tuple(int(v) for v in part.split("x")) for part in text.split(",")]
    if len(shapes) > 6:
        raise SystemExit(f"{text}: at most 6 products a layer")
    for i, (rows, cols) in enumerate(shapes):
        if rows % 1024 or cols % 1024 or rows > ACT_MAX or cols > min(16384, shapes[i - 1][0]):
            raise SystemExit(f"{text}: rows a multiple of 1024 up to {ACT_MAX}, columns a multiple of 1024 up to "
                             "16384 and at most the rows of the product before (the first's: the last's)")
    return shapes


def quantized(values: np.ndarray) -> np.ndarray:
    """values after int8 quantization per 32, as the merging task publishes them."""
    q, sc = quantize_blocks(values.astype(np.float32), 32)
    return (q.astype(np.float64) * sc[:, :1].astype(np.float64)).reshape(-1)


def reference(quants, scales, shapes: list, x0: np.ndarray, n: int, copies: int) -> np.ndarray:
    """The last product's sums in float64, each product's x the int8 quantization of the sums before."""
    q = np.concatenate([quants & 15, quants >> 4], axis=1).astype(np.float64) - 8
    w_all = q * scales.astype(np.float64)[:, None]
    starts = np.cumsum([0] + [r * c // 32 for r, c in shapes])
    x, y = quantized(x0), None
    for s in range(n):
        e = s % len(shapes)
        rows, cols = shapes[e]
        base = (s // len(shapes)) % copies * starts[-1] + starts[e]
        # task order: (part, row chunk, row, block) -> (row chunk, row, part, block)
        tiles = w_all[base:base + rows * cols // 32].reshape(cols // 1024, rows // 32, 32, 32, 32)
        y = tiles.transpose(1, 2, 0, 3, 4).reshape(rows, cols) @ x[:cols]
        x = quantized(y)
    return y


def record(dev, k, bufs, x0, mode: int, n: int, grid: int, shapes: list, copies: int, lag: int, gap: int = 0):
    wq, wd, xs, parts, y, flags = bufs
    seq = CommandSequence(dev).begin()
    seq.fill(xs, NOT_READY)
    seq.fill(parts, NOBODY)
    seq.fill(flags, 0)
    seq.copy(x0, xs, SLOT_BYTES)
    seq.barrier()
    spans = [(s, s + 1) for s in range(n)] if mode == 0 else [(0, n)]
    for s0, s1 in spans:
        push = np.array([s0, s1, copies, len(shapes)] + shape_words(shapes) + [lag, gap], np.uint32).tobytes()
        seq.dispatch(k, bufs, (grid, 1, 1), push)
    seq.end()
    return seq


def main():
    ap = chain_arguments(LAYER, "264,396,528")
    ap.add_argument("--bare", default="0", help="timing only (wrong sums): 1, no task checks its x or merges (the "
                    "tasks' loads, arithmetic and partial stores alone); 2, no task checks its x; 3, merges do not "
                    "read the other parts' sums")
    ap.add_argument("--lag", default="0", help="steps between a group of row chunks' parts and its merges "
                    "(shaders/bench_dataflow.comp task_at)")
    ap.add_argument("--xshare", default="1", help="1: a task's x loaded once per workgroup into shared memory; "
                    "0: by every lane through L1")
    ap.add_argument("--gap", default="0", help="iterations of arithmetic between two polls of a word not there yet")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--check-grids", default="1", help="--check: mode 1's grids (beyond 1 only where they are "
                    "resident at once: a GPU, not llvmpipe)")
    a = ap.parse_args()
    shapes = parse_layer("2048x1024,3072x2048,1024x3072,1024x1024" if a.check else a.layer)
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    layer_bytes = sum(r * c // 32 * 18 for r, c in shapes)
    copies = 1 if a.check else max(2, math.ceil(160e6 / layer_bytes))
    n = (3 if a.check else a.layers) * len(shapes)
    rng = np.random.default_rng(0)
    quants, scales = random_weights(rng, shapes, copies)
    quants |= 0x11   # odd nibbles, -7..7 after the offset 8: weights of mean 0, so that 128 products neither blow
                     # up nor vanish (a mean of -0.5 grows x's mean ~7x a product: inf within ~40 products)
    x_first = rng.standard_normal(ACT_MAX).astype(np.float32)
    q0, s0 = quantize_blocks(x_first, 32)
    wq, wd = Buffer(dev, quants.nbytes), Buffer(dev, scales.nbytes + 4)
    wq.write(quants.tobytes())
    wd.write(scales.tobytes())
    x0 = Buffer(dev, SLOT_BYTES)
    x0.write(q0.tobytes() + s0.tobytes())
    xs = Buffer(dev, (n + 1) * SLOT_BYTES)
    parts = Buffer(dev, 8 * sum(r * (c // 1024) for r, c in shapes))
    y = Buffer(dev, 2 * ACT_MAX * 4)
    flags = Buffer(dev, 4 * 1024)
    bufs = [wq, wd, xs, parts, y, flags]
    xshares = tuple(map(int, a.xshare.split(",")))
    kernels = {(b, x): Kernel(dev, "bench_dataflow", "rrwwww", push_size=72, spec=(b, x))
               for b in map(int, a.bare.split(",")) for x in xshares}
    if a.check:
        kernels.update({(0, x): Kernel(dev, "bench_dataflow", "rrwwww", push_size=72, spec=(0, x)) for x in xshares})
    print(f"{dev.info.name}; {len(shapes)} products a layer, {layer_bytes / 1e6:.1f} MB, {copies} weight copies")
    if a.check:
        want = reference(quants, scales, shapes, x_first, n, copies)
        rows = shapes[(n - 1) % len(shapes)][0]
        half = ((n - 1) % 2) * ACT_MAX
        worst = 0.0
        regs, resident = resident_grid(kernels[0, xshares[0]].statistics(), a.sms)
        for (mode, grid), lag, xsh in [(v, lag, x) for v in [(0, 4)] + [(1, int(g)) for g in a.check_grids.split(",")]
                                       for lag in map(int, a.lag.split(",")) for x in xshares]:
            if resident and grid > resident:
                print(f"mode {mode}, grid {grid}: skipped, at most {resident} resident ({regs} registers)")
                continue
            seq = record(dev, kernels[0, xsh], bufs, x0, mode, n, grid, shapes, copies, lag)
            seq.run()
            got = np.frombuffer(y.read(), np.float32)[half:half + rows]
            err = np.abs(got - want).max() / np.abs(want).max()
            given_up = int(np.frombuffer(flags.read(), np.uint32)[1023])
            print(f"mode {mode}, grid {grid}, lag {lag}, xshare {xsh}, {n} products: largest error {err:.2e} of "
                  "the largest value, "
                  f"waits given up {given_up}")
            worst = max(worst, err, 1.0 if given_up else 0.0)
            seq.close()
        raise SystemExit(0 if worst < 2e-2 else 1)
    runs = [(m, b, lag, x, gap) for m in map(int, a.modes.split(",")) for b in map(int, a.bare.split(","))
            for lag in map(int, a.lag.split(",")) for x in xshares for gap in map(int, a.gap.split(","))]
    for mode, b, lag, xsh, gap in runs:
        tag = f"mode {mode}  lag {lag}  xshare {xsh}" + (f"  gap {gap}" if gap else "") + (f"  bare {b}" if b else "")
        regs, resident = resident_grid(kernels[b, xsh].statistics(), a.sms)
        if regs:
            print(f"{tag}: {regs} registers, at most {resident} workgroups resident")
        for grid in map(int, a.grids.split(",")):
            if resident and grid > resident:
                print(f"{tag}  grid {grid:4d}: skipped, at most {resident} resident")
                continue
            seq = record(dev, kernels[b, xsh], bufs, x0, mode, n, grid, shapes, copies, lag, gap)
            us = replay_seconds(seq) / a.layers * 1e6
            given_up = int(np.frombuffer(flags.read(), np.uint32)[1023])
            print(f"{tag}  grid {grid:4d}: {us:7.2f} us per layer  {layer_bytes / us / 1e3:6.0f} GB/s"
                  + (f"  (waits given up: {given_up})" if mode == 1 else ""), flush=True)
            seq.close()
    for kernel in kernels.values():
        kernel.close()


if __name__ == "__main__":
    main()
