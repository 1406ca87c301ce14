#!/usr/bin/env python3
"""Sweep matrix-vector kernels and work splits (llamavk/kernels/matmul.py MATVEC_KERNELS) on the first
device; prints GB/s of weights per (type, shape) x variant.

    python3 benchmarks/bench_matvec.py [--types q4_0,q8_0,q4_k,q6_k] [--shapes "4096x4096 2048x2048"]
                                     [--variants "base:256,4,2,2 wide:256,4,1,2,1 ..."] [--fused]
A variant is spelled as in LLAMAVK_MATVEC: KERNEL:wg,nr,ks,u[,dq] (kernels: base, wide, and the
pure-read references read / wide_read, which load the same words as base / wide and do no arithmetic:
the ceiling of that access pattern). A variant without the type prints "-".

Each measurement records 40 dispatches (barrier-separated, rotating over enough weight copies that
the L2 cache never holds the matrix read next), replays them for --warmup seconds (clocks up), then 5
more times, and reports bytes of weights / median GPU time per dispatch (timestamps). --fused adds a second value per cell: the same product with
the RMS norm folded in (plain/fused).
"""

import argparse
import dataclasses
import math
import time

import numpy as np

from llamavk.devices import open_devices, select
from llamavk.kernels import KernelCache, View, upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.quant import qtype_from_name, quant_info
from llamavk.vk import Buffer, CommandSequence, get_instance

SHAPES = "4096x4096 14336x4096 4096x14336 32000x4096 2048x2048"
VARIANTS = ("base:256,4,2,2 read:256,4,2,2 wide_read:256,4,1,2 wide_read:256,2,1,4 "
            "wide:256,4,1,2,1,0 wide:256,4,1,2,1,1 wide:256,4,1,2,0,1 wide:256,4,1,2,2,1 wide:256,4,1,1,1,1 "
            "wide:256,8,1,1,1,1 wide:256,4,2,1,1,1 wide:256,2,1,1,1,1 wide:128,4,1,1,1,1")
L2_DEFEAT_BYTES = 160e6   # more than 3x an H100's / H200's 50 MB L2 between two reads of one copy


def random_raw(qtype, rows, cols, rng):
    info = quant_info(qtype)
    raw = rng.integers(0, 256, (rows, cols // info.block_size, info.type_size), dtype=np.uint8)
    # sane f16 scales: Q4_0/Q8_0/Q4_K have d (and Q4_K dmin) first, Q6_K d last
    scale = np.array([0.01], np.float16).view(np.uint8)
    if info.name == "Q6_K":
        raw[:, :, -2:] = scale
    else:
        raw[:, :, 0:2] = scale
        if info.name in ("Q4_K", "Q5_K", "Q2_K"):
            raw[:, :, 2:4] = scale
    return raw.reshape(rows, -1)


def gbs(nbytes, seconds):
    v = nbytes / seconds / 1e9
    return f"{v:.0f}" if v >= 10 else f"{v:.2f}"


def time_recorded(dev, record, reps=40, warmup=0.15, runs=5):
    """Median GPU time (s) of one dispatch, from timestamps: record(seq, i) records repetition i,
    barrier-separated; `runs` runs after `warmup` seconds of replays (the GPU's clocks drop while the
    host prepares the next matrix: without the warm-up the first variants of a row measured up to 5x
    slow on an H100)."""
    seq = CommandSequence(dev, profile=True).begin()
    for i in range(reps):
        record(seq, i)
        seq.barrier()
    seq.end()
    t0 = time.time()
    while time.time() - t0 < warmup:
        seq.run()
    times = []
    for _ in range(runs):
        seq.run()
        times += [us for _, us in seq.profile_results()]
    seq.close()
    return float(np.median(times)) * 1e-6


def time_config(dev, kc, weights, x, y, norm, cfg, reps=40, warmup=0.15, runs=5):
    """time_recorded of one product through `weights` (rotating over the copies) with config cfg."""
    mm.matvec_config = lambda *a, **k: cfg
    return time_recorded(dev, lambda seq, i: mm.matmul(seq, kc, weights[i % len(weights)], x, y, 1, norm=norm,
                                                       eps=1e-5), reps, warmup, runs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="q4_0,q8_0,q4_k,q6_k")
    ap.add_argument("--variants", default=VARIANTS, help="KERNEL:wg,nr,ks,u[,dq] separated by spaces")
    ap.add_argument("--configs", default=None, help="old spelling: wg,nr,ks,u of the base kernel")
    ap.add_argument("--shapes", default=SHAPES, help="ROWSxCOLS separated by spaces")
    ap.add_argument("--fused", action="store_true", help="also time the product with the RMS norm fused")
    ap.add_argument("--warmup", type=float, default=0.15, help="seconds of replays before each measurement")
    a = ap.parse_args()
    t_start = time.time()
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    kc = KernelCache(dev)
    rng = np.random.default_rng(0)
    spec = a.variants if a.configs is None else " ".join(f"base:{c}" for c in a.configs.split())
    variants = [mm.parse_matvec_env(v)["*"] for v in spec.split()]
    shapes = [tuple(map(int, s.split("x"))) for s in a.shapes.split()]
    sg = dev.info.subgroup_size or 32
    width = 13 if a.fused else 8
    print(f"{dev.info.name}; subgroup {sg}; GB/s of weights{' (plain/fused norm)' if a.fused else ''}; "
          f"columns: kernel:wg,nr,ks,u[,dq]")
    for i, v in enumerate(variants):
        print(f"  v{i} = {v.spec()}")
    print("type  shape       " + "".join(f"v{i}".rjust(width) for i in range(len(variants))))
    for tname in a.types.split(","):
        qtype = qtype_from_name(tname)
        for rows, cols in shapes:
            raw = random_raw(qtype, rows, cols, rng)
            nbytes = raw.nbytes
            n_copies = max(4, min(64, math.ceil(L2_DEFEAT_BYTES / nbytes)))
            weights = [upload_qweight(dev, raw, qtype, rows, cols) for _ in range(n_copies)]
            x = Buffer(dev, 4 * cols)
            x.write(rng.standard_normal(cols).astype(np.float32))
            nw = Buffer(dev, 4 * cols)
            nw.write(np.ones(cols, np.float32))
            y = Buffer(dev, 4 * rows)
            cells = []
            for cfg in variants:
                if not mm.matvec_kernel_supports(cfg.kernel, tname):
                    cells.append("-")
                    continue
                cfg = dataclasses.replace(cfg, wg=max(cfg.wg, sg))
                plain = time_config(dev, kc, weights, View.whole(x), View.whole(y), None, cfg,
                                    reps=max(40, n_copies), warmup=a.warmup)
                cell = gbs(nbytes, plain)
                if a.fused and "read" not in cfg.kernel:
                    fused = time_config(dev, kc, weights, View.whole(x), View.whole(y), View.whole(nw), cfg,
                                        reps=max(40, n_copies), warmup=a.warmup)
                    cell += "/" + gbs(nbytes, fused)
                cells.append(cell)
            print(f"{tname:5s} {f'{rows}x{cols}':11s} " + "".join(c.rjust(width) for c in cells), flush=True)
            for buf in (x, nw, y):
                buf.close()
            for w in weights:
                for ch in w.chunks:
                    ch.buffer.close()
    dev.close()
    print(f"({time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
