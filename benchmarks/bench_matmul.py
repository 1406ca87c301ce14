#!/usr/bin/env python3
"""Prompt-batch weight products (matmul.comp / matmul_coop.comp) on the first device: TFLOP/s.

    python3 benchmarks/bench_matmul.py [--types q4_0,q8_0] [--tokens 512] [--shapes "4096x4096 14336x4096"]
Every matrix-matrix row of llamavk.kernels.selection.PRODUCT_KERNELS the device can run is timed (forced,
whatever the table would choose): 20 products (barrier-separated, rotating over 2 weight copies),
replayed for 0.3 s first (an idle GPU's clocks measure several times
slower), mean GPU time per product from timestamps; 2 * rows * cols * tokens / time.
On devices with NV coopmat2, `mul_mm_cm2` (matmul_cm2.comp, tiles by selection.CM2_TILES) too, and one
more column per tile of `--cm2-tiles 128x128,128x256:2` (LLAMAVK_CM2_TILE for that column; after a
colon, LLAMAVK_CM2_SPLIT: the parts the columns are split into; after each slash, KEY=VALUE sets
LLAMAVK_CM2_KEY: `128x128x64:1/WG=128/UNROLL=8/PIPE=1` for the F16 form's other constants). A column
whose kernel cannot be made (the driver refuses a shape) reads `fail`.
`cm2d` (mul_mm_cm2d): the weight dequantized to f16 rows first (dequant_f16.comp), then
matmul_cm2.comp's F16 form, both passes in the time; `deq GB/s`: the dequantization alone, weight
bytes read + f16 bytes written per second.
`--extra mul_mm_coopP1,mul_mm_coopP2` adds the cooperative-matrix kernel's phases alone (Q4_0 only:
multiplications without loads, loads without multiplications) to see which one bounds it.
"""

import argparse
import os
import time
from pathlib import Path

import numpy as np

import llamavk
from llamavk.devices import open_devices, select
from llamavk.kernels import KernelCache, View, upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.quant import qtype_from_name, quant_info
from llamavk.vk import Buffer, CommandSequence, get_instance

SPV = Path(llamavk.__file__).parent / "spv"
SHAPES = [(4096, 4096), (14336, 4096), (4096, 14336), (2048, 2048), (8192, 2048)]


def random_raw(qtype, rows, cols, rng):
    info = quant_info(qtype)
    raw = rng.integers(0, 256, (rows, cols // info.block_size, info.type_size), dtype=np.uint8)
    raw[:, :, 0:2] = np.array([0.01], np.float16).view(np.uint8)   # sane f16 scales where d comes first
    return raw.reshape(rows, -1)


def time_family(dev, kc, family, weights, x, y, n_tokens, reps=20, product_only=False):
    """Mean GPU seconds per product of kernel family `family`, forced (not the table's choice)."""
    chosen = mm.product_kernel
    mm.product_kernel = lambda *a: family
    try:
        seq = CommandSequence(dev, profile=True).begin()
        for i in range(reps):
            mm.matmul(seq, kc, weights[i % len(weights)], x, y, n_tokens)
            seq.barrier()
        seq.end()
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.3:    # clocks up: an idle GPU measures several times slower
            seq.run()
        seq.run()
        results = seq.profile_results()
        seq.close()
    finally:
        mm.product_kernel = chosen
    if product_only:   # the product kernel's dispatches alone (no x conversion, dequantization, sum of parts)
        results = [(name, us) for name, us in results if name.startswith(family.split("_cm2")[0])]
    return sum(us for _, us in results) / reps * 1e-6


def time_dequant(dev, kc, weights, reps=20):
    """Mean GPU seconds of dequant_f16 over a whole weight (every chunk, in mul_mm_cm2d's row slices)."""
    w0 = weights[0]
    slices = [(ch, r0, n) for ch in w0.chunks for r0, n in mm.cm2d_slices(ch.n_rows, w0.cols, 128)]
    scratch = mm._dequant_scratch(kc, 2 * max(n for _, _, n in slices) * w0.cols)
    seq = CommandSequence(dev, profile=True).begin()
    for i in range(reps):
        w = weights[i % len(weights)]
        for ch, r0, n in slices:
            ch = next(c for c in w.chunks if c.row_start == ch.row_start)
            mm.dequant_f16(seq, kc, w, ch, r0, n, View(scratch, 0, 2 * n * w.cols))
    seq.end()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        seq.run()
    seq.run()
    t = sum(us for _, us in seq.profile_results()) / reps * 1e-6
    seq.close()
    return t


def cm2_env(tile: str) -> dict[str, str]:
    """The environment of one --cm2-tiles column: SHAPE[:SPLIT][/KEY=VALUE...]."""
    head, *knobs = tile.split("/")
    shape, _, split = head.partition(":")
    env = {"LLAMAVK_CM2_TILE": shape}
    if split:
        env["LLAMAVK_CM2_SPLIT"] = split
    for knob in knobs:
        key, _, value = knob.partition("=")
        env[f"LLAMAVK_CM2_{key.upper()}"] = value
    return env


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--types", default="q4_0,q8_0,q4_k,q6_k")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--shapes", default=None)
    ap.add_argument("--extra", default="", help="more kernel families (benchmark variants), comma-separated")
    ap.add_argument("--no-portable", action="store_true", help="leave out the portable f32 tiles (slow)")
    ap.add_argument("--cm2-tiles", default="", help="NV coopmat2 tile shapes to time, BMxBN, comma-separated")
    ap.add_argument("--cm2-only", action="store_true",
                    help="only the coopmat2 columns: the default tiles and --cm2-tiles (no KHR kernels, no cm2d)")
    ap.add_argument("--product-only", action="store_true",
                    help="time the product kernels' dispatches alone (not x's f16 conversion, the dequantization "
                         "or the sum of split-K parts)")
    a = ap.parse_args()
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    kc = KernelCache(dev)
    rng = np.random.default_rng(0)
    shapes = SHAPES if a.shapes is None else [tuple(map(int, s.split("x"))) for s in a.shapes.split()]
    families = ([] if a.no_portable else ["mul_mm"]) + (["mul_mm_coop", "mul_mm_coop_big"]
                                                        if mm.has_coopmat(kc) and not a.cm2_only else [])
    families += [f for f in a.extra.split(",") if f]
    for f in families:   # benchmark variants: the tiles of the kernel they vary
        mm.MATMUL_TILES.setdefault(f, mm.MATMUL_TILES["mul_mm_coop_big" if "big" in f else "mul_mm_coop"])
    # (column label, family, LLAMAVK_CM2_TILE for it)
    columns = [(f, f, None) for f in families]
    if mm.has_coopmat2(kc):
        columns += [("mul_mm_cm2", "mul_mm_cm2", None)]
        columns += [(f"cm2 {t}", "mul_mm_cm2", t) for t in a.cm2_tiles.split(",") if t]
        columns += [] if a.cm2_only else [("cm2d", "mul_mm_cm2d", None), ("deq GB/s", "dequant", None)]
    n = a.tokens
    print(f"{dev.info.name}; {n} tokens; TFLOP/s (2 * rows * cols * tokens / GPU time)")
    print("type  shape         " + " ".join(label.rjust(12) for label, _, _ in columns))
    for tname in a.types.split(","):
        qtype = qtype_from_name(tname)
        for rows, cols in shapes:
            raw = random_raw(qtype, rows, cols, rng)
            weights = [upload_qweight(dev, raw, qtype, rows, cols) for _ in range(2)]
            x = Buffer(dev, 4 * cols * n)
            x.write(rng.standard_normal(cols * n).astype(np.float32))
            y = Buffer(dev, 4 * rows * n)
            print(f"{tname:5s} {rows:5d}x{cols:<6d}", end="", flush=True)
            for _, fam, tile in columns:
                kernel = f"dequant_f16_{tname}" if fam in ("mul_mm_cm2d", "dequant") else f"{fam}_{tname}"
                if not (SPV / f"{kernel}.spv").exists():
                    print(" " + f"{'-':>12}", end="", flush=True)
                    continue
                if fam == "dequant":
                    t = time_dequant(dev, kc, weights)
                    print(" " + f"{(quant_info(qtype).row_bytes(cols) + 2 * cols) * rows / t / 1e9:12.0f}", end="", flush=True)
                    continue
                env = cm2_env(tile) if tile else {}
                os.environ.update(env)
                try:
                    t = time_family(dev, kc, fam, weights, View.whole(x), View.whole(y), n, product_only=a.product_only)
                except Exception as e:   # noqa: BLE001 - a shape the driver refuses: a cell, not the end
                    print(f"  {fam} {tile}: {type(e).__name__}: {str(e)[:120]}", flush=True)
                    t = None
                finally:
                    for k in env:
                        os.environ.pop(k, None)
                print(" " + (f"{2 * rows * cols * n / t / 1e12:12.1f}" if t else f"{'fail':>12}"), end="", flush=True)
            print(flush=True)
            for w in weights:
                for ch in w.chunks:
                    ch.buffer.close()
            for b in (x, y):
                b.close()
    dev.close()


if __name__ == "__main__":
    main()
