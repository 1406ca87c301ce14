#!/usr/bin/env python3
"""Sweep matrix-vector work splits (shaders/matvec.comp) on the first device; prints GB/s of weights.

    python3 examples/bench_matvec.py [--types q4_0,q8_0] [--configs "128,2,1,1 128,2,4,1 ..."]
Each measurement records 40 dispatches (barrier-separated, rotating over 4 weight copies so the L2
cache does not hold the matrix), runs them 3 times and reports bytes of weights / median GPU time per
dispatch (timestamps).
"""

import argparse
import numpy as np

from llamavk.devices import open_devices, select
from llamavk.kernels import KernelCache, View, upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.quant import qtype_from_name, quant_info
from llamavk.vk import Buffer, CommandSequence, get_instance

SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (32000, 4096), (2048, 2048), (8192, 2048)]


def random_raw(qtype, rows, cols, rng):
    info = quant_info(qtype)
    raw = rng.integers(0, 256, (rows, cols // info.block_size, info.type_size), dtype=np.uint8)
    raw[:, :, 0:2] = np.array([0.01], np.float16).view(np.uint8)   # sane f16 scales (Q4_0/Q8_0: d first)
    return raw.reshape(rows, -1)


def time_config(dev, kc, weights, x, y, norm, cfg, reps=40):
    """Median GPU time (s) of one dispatch, from timestamps, after warm-up runs."""
    mm.matvec_config = lambda *a, **k: cfg
    seq = CommandSequence(dev, profile=True).begin()
    for i in range(reps):
        w = weights[i % len(weights)]
        mm.matmul(seq, kc, w, x, y, 1, norm=norm, eps=1e-5)
        seq.barrier()
    seq.end()
    for _ in range(3):
        seq.run()
    times = [us for _, us in seq.profile_results()]
    seq.close()
    return float(np.median(times)) * 1e-6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="q4_0,q8_0")
    ap.add_argument("--configs", default="128,2,1,1 128,1,1,4 128,2,1,2 128,2,1,4 128,4,1,2 64,2,2,1 "
                                         "128,2,4,1 128,1,4,2 256,2,8,1 256,4,4,2 128,4,2,2 64,1,2,4 256,1,8,2")
    ap.add_argument("--shapes", default=None)
    a = ap.parse_args()
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    kc = KernelCache(dev)
    rng = np.random.default_rng(0)
    configs = [mm.MatvecConfig(*map(int, c.split(","))) for c in a.configs.split()]
    shapes = SHAPES if a.shapes is None else [tuple(map(int, s.split("x"))) for s in a.shapes.split()]
    print(f"{dev.info.name}; columns: wg,nr,ks,u; values GB/s of weights (plain / with fused norm)")
    print("type  shape         " + " ".join(f"{c.wg},{c.nr},{c.ks},{c.u}".rjust(13) for c in configs))
    for tname in a.types.split(","):
        qtype = qtype_from_name(tname)
        for rows, cols in shapes:
            raw = random_raw(qtype, rows, cols, rng)
            weights = [upload_qweight(dev, raw, qtype, rows, cols) for _ in range(4)]
            nbytes = raw.nbytes
            x = Buffer(dev, 4 * cols)
            x.write(rng.standard_normal(cols).astype(np.float32))
            nw = Buffer(dev, 4 * cols)
            nw.write(np.ones(cols, np.float32))
            y = Buffer(dev, 4 * rows)
            cells = []
            for cfg in configs:
                plain = time_config(dev, kc, weights, View.whole(x), View.whole(y), None, cfg)
                fused = time_config(dev, kc, weights, View.whole(x), View.whole(y), View.whole(nw), cfg)
                cells.append(f"{nbytes / plain / 1e9:6.0f}/{nbytes / fused / 1e9:<6.0f}")
            print(f"{tname:5s} {rows:5d}x{cols:<6d} " + " ".join(c.rjust(13) for c in cells), flush=True)
            for w in weights:
                for ch in w.chunks:
                    ch.buffer.close()
    dev.close()


if __name__ == "__main__":
    main()
