#!/usr/bin/env python3
"""Prompt products of few rows (selection.SMALL_ROWS: a mixture of experts' router, the DeltaNet
alpha/beta products) over a prompt batch, per way of recording them, on the first device:

    slices  the matrix-vector kernel, one dispatch per 8-token slice (LLAMAVK_SMALL_ROWS_SLICES=1)
    one     the same kernel, every full slice in one dispatch (the slice from the grid's z)
    tiles   the matrix-matrix tiles (LLAMAVK_SMALL_ROWS=0: cooperative matrices where the device has them)
    small   the small-tile kernel (matmul_small.comp; the GPU default past 16 tokens), its tiles as
            selection.SMALL_GEMM_CONFIGS says; --small adds rows with other tiles
            (LLAMAVK_SMALL_GEMM spellings bm,bn,tm,tn,ks; ks 0: parts of the columns as the plan picks)

    python3 benchmarks/bench_small_rows.py [--tokens 512] [--shapes "f32:128x2048 f32:256x2048 q4_0:32x2048"]
                                           [--variants "base:256,4,2,2 base:256,1,8,1"] [--reps 100]
                                           [--small "32,64,4,4,0 16,32,4,4,0"]

Shapes default to what the synthetic 30B-A3B / 35B-A3B models store (llamavk/synthetic.py: the router
f32, 128 x 2048 / 256 x 2048; ssm_alpha and ssm_beta of the model's type, 32 x 2048). --variants
(LLAMAVK_MATVEC spellings) adds rows of "one" with other matrix-vector work splits (default: what
selection.MATVEC_CONFIGS picks for 8 tokens).

Per row: `wall` = wall time of --reps products recorded back to back (each behind a barrier: they
write the same y) and replayed, divided by the products: what the GPU spends with the dispatches
overlapping as in a model's step, command processing included. `gpu` = the sum of GPU timestamps
after every dispatch of one product (timestamps serialize the dispatches: the old path's 64 slices
then run one after another, so this overstates it; the model profiles in docs/PERFORMANCE.md are of
this kind). `disp` = dispatches per product. `L2 MB` = bytes the matrix-vector workgroups read
(every workgroup reads its rows' weights and its slice's 8 tokens of x: x dominates where a
workgroup holds few rows, e.g. a router's one row per workgroup). x (4 MB at 512 tokens) and the weights stay in L2 here, as
in a model's step, where the product's input was written just before. Each row also checks the
product against numpy (max relative error printed).
"""

import argparse
import dataclasses
import os
import time

import numpy as np
from gguf import quants

from llamavk.devices import open_devices, select
from llamavk.errors import LlamavkError
from llamavk.kernels import KernelCache, View, upload_qweight
from llamavk.kernels import matmul as mm
from llamavk.kernels import selection as sel
from llamavk.quant import qtype_from_name, quant_info
from llamavk.vk import Buffer, CommandSequence, get_instance

SHAPES = "f32:128x2048 f32:256x2048 q4_0:32x2048 f16:128x2048 q4_0:128x2048"
MODES = {"slices": {"LLAMAVK_SMALL_ROWS_SLICES": "1", "LLAMAVK_SMALL_GEMM": "0"},
         "one": {"LLAMAVK_SMALL_ROWS_SLICES": "0", "LLAMAVK_SMALL_GEMM": "0"},
         "tiles": {"LLAMAVK_SMALL_ROWS": "0"}, "small": {"LLAMAVK_SMALL_GEMM": "1"}}
# Tiles of the small-tile kernel swept by default (rows x tokens per workgroup, outputs per thread,
# parts of the columns): 64-512 workgroups at 32-256 rows x 512 tokens.
SMALL_TILES = ("32,64,4,4,0 16,64,4,4,0 16,32,4,4,0 32,32,4,4,0 64,64,4,4,0 32,64,4,8,0 64,64,8,8,0 "
               "32,128,4,8,0 32,64,4,4,1 16,32,4,4,1 32,64,4,4,2 32,64,4,4,8 16,64,4,4,16")


def make_weight(qtype, rows, cols, rng):
    """(raw GGUF rows, their dequantized values): quantized from normal values where gguf can,
    random blocks with sane f16 scales otherwise."""
    w = rng.standard_normal((rows, cols)).astype(np.float32) / np.sqrt(cols)
    try:
        raw = np.ascontiguousarray(quants.quantize(w, qtype)).view(np.uint8).reshape(rows, -1)
    except NotImplementedError:
        info = quant_info(qtype)
        raw = rng.integers(0, 256, (rows, cols // info.block_size, info.type_size), dtype=np.uint8)
        raw[:, :, 0:4] = np.array([0.001, 0.001], np.float16).view(np.uint8)
        raw = raw.reshape(rows, -1)
    return raw, np.asarray(quants.dequantize(raw, qtype), np.float64).reshape(rows, cols)


def record_product(seq, kc, w, x, y, n_tokens, mode, variant):
    saved = {k: os.environ.get(k) for k in ("LLAMAVK_SMALL_ROWS_SLICES", "LLAMAVK_SMALL_ROWS", "LLAMAVK_SMALL_GEMM")}
    os.environ.update(MODES[mode])
    env = mm._MATVEC_ENV
    if mode == "small" and variant is not None:
        os.environ["LLAMAVK_SMALL_GEMM"] = variant
    elif variant is not None:
        mm._MATVEC_ENV = mm.parse_matvec_env(variant)
    try:
        mm.matmul(seq, kc, w, x, y, n_tokens)
    finally:
        mm._MATVEC_ENV = env
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure(dev, kc, w, x, y, n_tokens, mode, variant, reps, warmup):
    """(wall seconds per product over replays, serialized GPU seconds of one product, dispatches)."""
    seq = CommandSequence(dev).begin()
    for _ in range(reps):
        record_product(seq, kc, w, x, y, n_tokens, mode, variant)
        seq.barrier()
    seq.end()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < warmup:   # clocks up
        seq.run()
    runs, t0 = 5, time.perf_counter()
    for _ in range(runs):
        seq.run()
    wall = (time.perf_counter() - t0) / (runs * reps)
    seq.close()
    prof = CommandSequence(dev, profile=True).begin()
    record_product(prof, kc, w, x, y, n_tokens, mode, variant)
    prof.end()
    gpu = []
    for _ in range(5):
        prof.run()
        res = prof.profile_results()
        gpu.append(sum(us for _, us in res) * 1e-6)
    prof.close()
    return wall, float(np.median(gpu)) if gpu and gpu[0] > 0 else float("nan"), len(res)


def l2_bytes(kc, cfg, qtype, rows, cols, n_tokens):
    """Bytes of weights and x the matrix-vector workgroups of one product read (see the docstring)."""
    step = mm.MATVEC_MAX_TOKENS
    _, rows_per_wg, _, _ = mm._matvec_spec(kc, cfg, mm.type_suffix(qtype), cols, step, False, False, False)
    slices = -(-n_tokens // step)
    return slices * (rows * quant_info(qtype).row_bytes(cols) + -(-rows // rows_per_wg) * step * cols * 4)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--shapes", default=SHAPES, help="TYPE:ROWSxCOLS separated by spaces")
    ap.add_argument("--modes", default="slices,one,tiles,small")
    ap.add_argument("--variants", default="", help="extra matrix-vector splits for mode 'one' (LLAMAVK_MATVEC spelling)")
    ap.add_argument("--small", default=SMALL_TILES, help="tiles of extra 'small' rows (LLAMAVK_SMALL_GEMM spelling)")
    ap.add_argument("--reps", type=int, default=100, help="products per recorded sequence")
    ap.add_argument("--warmup", type=float, default=0.3, help="seconds of replays before timing")
    a = ap.parse_args()
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    kc = KernelCache(dev)
    if dev.info.is_cpu:   # the small-rows rule is for GPUs: force it here (smoke runs on llvmpipe)
        pick = mm.product_kernel
        mm.product_kernel = lambda kc, n, r, c: (
            pick(kc, n, r, c) if n <= mm.MATVEC_MAX_TOKENS or os.environ.get("LLAMAVK_SMALL_ROWS") == "0" else
            "mul_mm_small" if os.environ.get("LLAMAVK_SMALL_GEMM", "1") != "0" else "mul_mv_batched")
    rng = np.random.default_rng(0)
    n = a.tokens
    print(f"{dev.info.name}; {n} tokens; wall = us per product over {a.reps}-product replays, "
          f"gpu = serialized timestamps of one product")
    print(f"{'weight':16s} {'mode':7s} {'config':24s} {'disp':>5s} {'wall us':>9s} {'gpu us':>9s} {'L2 MB':>7s} {'max rel err':>12s}")
    for shape in a.shapes.split():
        tname, dims = shape.split(":")
        rows, cols = map(int, dims.split("x"))
        qtype = qtype_from_name(tname)
        raw, wref = make_weight(qtype, rows, cols, rng)
        w = upload_qweight(dev, raw, qtype, rows, cols)
        xv = rng.standard_normal((n, cols)).astype(np.float32)
        ref = xv.astype(np.float64) @ wref.T
        X, Y = Buffer(dev, xv.nbytes), Buffer(dev, 4 * n * rows, host_visible=True)
        X.write(xv)
        x, y = View.whole(X), View.whole(Y)
        rows_out = [(m, None) for m in a.modes.split(",")] + [("one", v) for v in a.variants.split()] + \
            [("small", v) for v in a.small.split()]
        for mode, variant in rows_out:
            cfg = mm.matvec_config(kc, qtype, rows, cols, mm.MATVEC_MAX_TOKENS)
            if mode == "small":
                scfg = mm.small_gemm_config(kc) if variant is None else sel.parse_small_gemm_env(variant)
                gx, gy, parts, _ = mm.small_gemm_plan(kc, scfg, rows, cols, n)
                label, l2 = f"{scfg.spec()} ({gx * gy}x{parts})", "-"
            elif variant is not None:
                cfg = mm.parse_matvec_env(variant)["*"]
                if not mm.matvec_kernel_supports(cfg.kernel, tname):
                    continue
                cfg = dataclasses.replace(cfg, wg=max(cfg.wg, dev.info.subgroup_size or 32))
            if mode != "small":
                label = "tiles" if mode == "tiles" else cfg.spec()
                l2 = "-" if mode == "tiles" else f"{l2_bytes(kc, cfg, qtype, rows, cols, n) / 1e6:.1f}"
            Y.array(np.float32)[:] = np.nan
            try:
                wall, gpu, disp = measure(dev, kc, w, x, y, n, mode, variant, a.reps, a.warmup)
            except LlamavkError as e:   # a config this device does not take
                print(f"{shape:16s} {mode:7s} {label:24s} skipped: {e}", flush=True)
                continue
            out = Y.array(np.float32, n * rows).reshape(n, rows)
            err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
            print(f"{shape:16s} {mode:7s} {label:24s} {disp:5d} {wall * 1e6:9.1f} {gpu * 1e6:9.1f} {l2:>7s} {err:12.2e}",
                  flush=True)
        for buf in (X, Y):
            buf.close()
        for ch in w.chunks:
            ch.buffer.close()
    dev.close()


if __name__ == "__main__":
    main()
