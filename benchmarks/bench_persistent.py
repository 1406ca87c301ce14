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
run takes ~90 ms a layer; with LLAMAVK_PIPELINE_STATS=1 such grids are skipped). --maxb 4: at most 4
blocks a lane, fewer registers (rows up to 8192 weights).
What x costs: --xmode 1 reads one fixed int8 x from memory inside the dot (no staging: what the products
take when x arrives quantized), 2 copies that x into shared memory, 3 keeps a lane's blocks of it in
registers; --form 1 is the engine's stream-kernel shape (a lane per 32-weight block of a row, --rj rows a
lane, x in registers; --xmode 4 with it: x quantized per 8 values, as 8-row chunks of a producer could write
it). --pref N touches the next N chunks before a grid barrier's wait (pulls them into L2).
Prints microseconds per layer and the weights' GB/s.

    python3 benchmarks/bench_persistent.py [--layer 6144x4096,16x4096,4096x4096,28672x4096,4096x14336]
                                           [--layers 32] [--grids 132,264,396] [--modes 0,1] [--pipe 0,1]
                                           [--maxb 7|4] [--xmode 0,1,2,3] [--form 0,1 --rj 1,2,4,8]
                                           [--pref 0,1,2] [--flags device|host]
    python3 benchmarks/bench_persistent.py --check [--maxb 7|4] [...]   # one small layer in mode 0 against numpy

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


def parse_layer(text: str, maxb: int, forms=(0,), rj: int = 4) -> list:
    shapes = [tuple(int(v) for v in part.split("x")) for part in text.split(",")]
    for rows, cols in shapes:
        if 1 in forms and (cols not in (2048, 4096, 8192) or rows % (8192 // cols * rj)):
            raise SystemExit(f"{text}: form 1 takes rows 2048, 4096 or 8192 wide, a multiple of {rj} row groups "
                             "(a row group: 256 lanes / 32-weight blocks per row)")
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


def reference(quants, scales, shapes: list, act: np.ndarray, n: int, fixed_x=None) -> np.ndarray:
    """act after n products in float64: what the kernel computes but for x's int8 rounding (fixed_x: every
    product's input, as XMODE 1 reads it)."""
    act = act.astype(np.float64).reshape(2, ACT_MAX).copy()
    q = np.concatenate([quants & 15, quants >> 4], axis=1).astype(np.float64) - 8
    w_all = q * scales.astype(np.float64)[:, None]
    base = 0
    for s in range(n):
        rows, cols = shapes[s % len(shapes)]
        w = w_all[base:base + rows * cols // 32].reshape(rows, cols)
        base += rows * cols // 32
        x = act[s % 2, :cols] if fixed_x is None else fixed_x[:cols]
        act[(s + 1) % 2, :rows] = w @ x
    return act.reshape(-1)


def quantize_blocks(x: np.ndarray, size: int):
    """int8 per `size` values (s = max|x| / 127): the values, and (s, s * sum) per block as float32 pairs."""
    blocks = x.reshape(-1, size).astype(np.float32)
    amax = np.abs(blocks).max(axis=1)
    s = (amax / 127).astype(np.float32)
    q = np.round(blocks * np.where(amax > 0, 127 / np.maximum(amax, 1e-30), 0)[:, None]).astype(np.int8)
    return q, np.stack([s, s * q.sum(axis=1).astype(np.float32)], axis=1).astype(np.float32)


def quantize_x(x: np.ndarray):
    """The fixed x of XMODE 1-3 as the kernel's staging would make it (int8 per 32 values), and of XMODE 4 (per 8):
    binding 4's bytes, [the int8 values, ACT_MAX of them, (s, s * sum) per 32] then the same per 8; and each
    form's values as float64."""
    q32, s32 = quantize_blocks(x, 32)
    q8, s8 = quantize_blocks(x, 8)
    values = {size: (q.astype(np.float64) * sc[:, :1]).reshape(-1) for size, q, sc in ((32, q32, s32), (8, q8, s8))}
    return q32.tobytes() + s32.tobytes() + q8.tobytes() + s8.tobytes(), values


def chain_arguments(layer: str, grids: str) -> argparse.ArgumentParser:
    """The options this tool and bench_dataflow.py share."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", default=layer)
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--grids", default=grids)
    ap.add_argument("--modes", default="0,1")
    ap.add_argument("--sms", type=int, default=132, help="the device's SMs (H100: 132): mode 1 skips grids larger "
                    "than the workgroups its register count lets them hold at once (with LLAMAVK_PIPELINE_STATS=1)")
    return ap


def replay_seconds(seq, runs: int = 10) -> float:
    """Median host wall time of whole replays of a recorded sequence, after 0.3 s of them (clocks up)."""
    t0 = time.time()
    while time.time() - t0 < 0.3:
        seq.run()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        seq.run()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


def shape_words(shapes: list) -> list:
    """The push constants' rows[6] and cols[6]."""
    pad = [0] * (6 - len(shapes))
    return [r for r, _ in shapes] + pad + [c for _, c in shapes] + pad


def resident_grid(stats: dict, sms: int):
    """(registers, workgroups of 256 threads resident at once) from the driver's pipeline statistics
    (LLAMAVK_PIPELINE_STATS=1), or (None, None) without them. NVIDIA: 64K registers an SM, allocated per
    thread in steps of 8, at most 2048 threads."""
    regs = stats.get("Register Count") if stats else None
    return (regs, sms * min(65536 // (256 * -(-int(regs) // 8) * 8), 8)) if regs else (None, None)


def record(dev, k, bufs, mode: int, n: int, grid: int, shapes: list, copies: int):
    seq = CommandSequence(dev).begin()
    seq.fill(bufs[3], 0)
    seq.barrier()
    for s in range(n if mode == 0 else 1):
        push = np.array([s, n, copies, len(shapes)] + shape_words(shapes), np.uint32).tobytes()
        seq.dispatch(k, bufs, (grid, 1, 1), push)
    seq.end()
    return seq


def main():
    ap = chain_arguments(LAYER, "132,264,396")
    ap.add_argument("--pipe", default="0", help="0: one chunk of weights in flight per workgroup; "
                    "1: the next chunk's loads issued before this one's arithmetic (two register sets)")
    ap.add_argument("--maxb", type=int, choices=(7, 4), default=7,
                    help="blocks per lane of a row at most (4: fewer registers, rows up to 8192 weights)")
    ap.add_argument("--xmode", default="0", help="0: every workgroup stages x (reads, quantizes, shared memory); "
                    "1: every product reads one fixed int8 x from memory inside its dot (no staging; timing "
                    "only, the chain's values are not passed on); 2: that fixed x copied into shared memory; "
                    "3: a lane keeps its blocks' x in "
                    "registers for the whole product; 4 (--form 1): x quantized per 8 values, as a producer's "
                    "8-row chunks could write it")
    ap.add_argument("--form", default="0", help="0: a row group of 32 or 64 lanes per row, each on up to "
                    "maxb blocks; 1: the engine's stream-kernel shape, a lane per block of the row and 4 rows per "
                    "lane, x in registers (the fixed int8 x, as --xmode 1)")
    ap.add_argument("--rj", default="4", help="form 1: rows per lane")
    ap.add_argument("--pref", default="0", help="chunks a lane touches ahead (pulls into L2) before waiting at a "
                    "grid barrier, besides the one it loads")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--flags", choices=("device", "host"), default="device",
                    help="where the stage counters live (host: system memory, over PCIe)")
    a = ap.parse_args()
    # the middle product takes 64 lanes a row (more than 32 x maxb blocks)
    forms = tuple(map(int, a.form.split(",")))
    check_layer = "64x1024,16x10240,32x1024" if a.maxb == 7 else "64x1024,16x6144,32x1024"
    if 1 in forms:
        check_layer = "64x4096,32x2048,32x8192"
    rjs = tuple(map(int, a.rj.split(",")))
    if any(r not in (1, 2, 4, 8) for r in rjs):
        raise SystemExit("--rj: 1, 2, 4 or 8 rows per lane")
    shapes = parse_layer(check_layer if a.check else a.layer, a.maxb, forms, max(rjs) if 1 in forms else 1)
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
    xg_bytes, fixed = quantize_x(act0[:ACT_MAX])
    xg = Buffer(dev, len(xg_bytes))
    xg.write(xg_bytes)
    bufs = [wq, wd, act, flags, xg]
    print(f"{dev.info.name}; {len(shapes)} products a layer, {layer_bytes / 1e6:.1f} MB, {copies} weight copies")
    prefs = tuple(map(int, a.pref.split(",")))
    if any(not 0 <= v <= 8 for v in prefs):
        raise SystemExit("--pref: 0 to 8 chunks")
    if 4 in map(int, a.xmode.split(",")) and forms != (1,):
        raise SystemExit("--xmode 4 is --form 1's")
    variants = [(m, q, x if f == 0 or x == 4 else 1, f, r if f == 1 else 4, pf) for m in map(int, a.modes.split(","))
                for q in map(int, a.pipe.split(",")) for x in map(int, a.xmode.split(",")) for f in forms
                for r in rjs for pf in prefs]
    variants = list(dict.fromkeys(variants))
    if a.check:
        n = len(shapes)
        rows = shapes[-1][0]
        half = (n % 2) * ACT_MAX
        worst = 0.0
        for pipe, xmode, form, rj, pref in [v[1:] for v in variants if v[0] == 0]:
            want = reference(quants, scales, shapes, act0, n, fixed[8 if xmode == 4 else 32] if xmode else None)
            k = Kernel(dev, kernel, "rrwwr", push_size=64, spec=(0, pipe, xmode, form, rj, pref))
            act.write(act0.tobytes())
            seq = record(dev, k, bufs, 0, n, 4, shapes, copies)
            seq.run()
            got = np.frombuffer(act.read(), np.float32)
            err = np.abs(got[half:half + rows] - want[half:half + rows]).max() / np.abs(want[half:half + rows]).max()
            shape = f", rj {rj}" if form == 1 else ""
            print(f"mode 0, pipe {pipe}, xmode {xmode}, form {form}{shape}, pref {pref}, {n} products: "
                  f"largest error {err:.2e} of the largest value")
            worst = max(worst, err)
            seq.close()
            k.close()
        raise SystemExit(0 if worst < 5e-2 else 1)
    n = a.layers * len(shapes)
    for mode, pipe, xmode, form, rj, pref in variants:
        k = Kernel(dev, kernel, "rrwwr", push_size=64, spec=(mode, pipe, xmode, form, rj, pref))
        stats = k.statistics()   # with LLAMAVK_PIPELINE_STATS=1 (NVIDIA: registers per thread)
        tag = (f"mode {mode}  pipe {pipe}  x {xmode}  form {form}" + (f"  rj {rj}" if form == 1 else "")
               + (f"  pref {pref}" if pref else ""))
        if stats:
            print(f"{tag}: " + ", ".join(f"{key} {v}" for key, v in stats.items()))
        regs, resident = resident_grid(stats, a.sms)
        for grid in map(int, a.grids.split(",")):
            if mode == 1 and resident and grid > resident:
                print(f"{tag}  grid {grid:4d}: skipped, at most {resident} resident ({regs} registers)")
                continue
            act.write(act0.tobytes())
            seq = record(dev, k, bufs, mode, n, grid, shapes, copies)
            us = replay_seconds(seq) / a.layers * 1e6
            fl = np.frombuffer(flags.read(), np.uint32)
            note = f"  (waits given up: {int(fl[1023])}, count {int(fl[0])} of {n * grid})" if mode == 1 else ""
            print(f"{tag}  grid {grid:4d}: {us:7.2f} us per layer  "
                  f"{layer_bytes / us / 1e3:6.0f} GB/s{note}", flush=True)
            seq.close()
        k.close()


if __name__ == "__main__":
    main()
