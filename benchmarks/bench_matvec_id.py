#!/usr/bin/env python3
"""Sweep the one-token expert products (kernels/moe.py matmul_id, shaders/matvec_id.comp) over work
splits on the first device; prints µs per dispatch and GB/s of the chosen experts' weights.

    python3 benchmarks/bench_matvec_id.py [--type q4_0] [--dim 2048] [--ffn 768] [--experts 128] [--used 8]
        [--pair "32,2,128 16,2,128 ..."] [--down "8,2 8,1 ..."]

The two products of a decode step's MoE FFN, as the engine records them: gate/up as one PAIR product
with the RMS norm folded in (x: the token's state), and the down product summing the weighted slots
and the residual (x: the slots' SwiGLU inputs). A variant is TPR,RJ[,WG]: lanes per row, rows per
lane, workgroup size (PAIR only; the down product's workgroup is one subgroup per slot); C (units
per lane) follows from TPR. Each repetition routes the token to other experts (random, one route
buffer per repetition), so the L2 cache seldom holds the experts read next.
"""

import argparse

import numpy as np

from llamavk.devices import open_devices, select
from llamavk.kernels import KernelCache, View, upload_qweight
from llamavk.kernels import moe
from llamavk.quant import qtype_from_name, quant_info
from llamavk.vk import Buffer, get_instance

from bench_matvec import random_raw, time_recorded   # (run from the repository root)

REPS = 48


def routes(dev, rng, n_expert, n_used, reps):
    bufs = []
    for _ in range(reps):
        ids = rng.choice(n_expert, n_used, replace=False).astype(np.uint32)
        w = np.full(n_used, 1.0 / n_used, np.float32)
        b = Buffer(dev, 8 * n_used)
        b.write(np.concatenate([ids.view(np.float32), w]))
        bufs.append(b)
    return bufs


def time_variant(dev, record):
    """µs per dispatch (bench_matvec.time_recorded)."""
    return time_recorded(dev, record, REPS) * 1e6


def with_split(tpr, rj, wg):
    """Force matvec_id_split / the workgroup size for the next recording."""
    orig = moe.matvec_id_split

    def split(type_name, cols, subgroup, pair):
        c = -(-(cols // 32) // tpr)
        return tpr, c, rj
    moe.matvec_id_split = split
    if wg:
        moe.MATVEC_ID_WG = wg
    return orig


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--type", default="q4_0")
    ap.add_argument("--dim", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=768)
    ap.add_argument("--experts", type=int, default=128)
    ap.add_argument("--used", type=int, default=8)
    ap.add_argument("--pair", default="default 32,2,128 32,1,128 32,4,128 16,1,128 16,2,128 16,4,128 "
                                      "8,2,128 32,2,64 32,2,256 16,2,256 16,2,64")
    ap.add_argument("--down", default="default 8,2 8,1 8,4 4,1 4,2 4,4 2,2 2,4")
    a = ap.parse_args()
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    kc = KernelCache(dev)
    rng = np.random.default_rng(0)
    qtype = qtype_from_name(a.type)
    E, k, D, F = a.experts, a.used, a.dim, a.ffn
    row_bytes = quant_info(qtype).row_bytes
    gate = upload_qweight(dev, random_raw(qtype, E * F, D, rng), qtype, E * F, D, experts=E)
    up = upload_qweight(dev, random_raw(qtype, E * F, D, rng), qtype, E * F, D, experts=E)
    down = upload_qweight(dev, random_raw(qtype, E * D, F, rng), qtype, E * D, F, experts=E)
    route = routes(dev, rng, E, k, REPS)
    bufs = {}
    for name, n in (("x", D), ("nw", D), ("res", D), ("y", D), ("g", k * F), ("u", k * F)):
        bufs[name] = Buffer(dev, 4 * n)
        bufs[name].write(rng.standard_normal(n).astype(np.float32) * 0.1 + (1.0 if name == "nw" else 0.0))
    v = {n: View.whole(b) for n, b in bufs.items()}
    sg = dev.info.subgroup_size or 32
    print(f"{dev.info.name}; subgroup {sg}; {a.type}, dim {D}, expert ffn {F}, {k} of {E} experts")

    pair_bytes = 2 * k * F * row_bytes(D)
    print(f"gate/up pair (+norm), {pair_bytes / 1e6:.1f} MB per token: TPR,RJ,WG  µs  GB/s")
    orig, orig_wg = moe.matvec_id_split, moe.MATVEC_ID_WG
    for var in a.pair.split():
        if var != "default":
            tpr, rj, *wg = map(int, var.split(","))
            with_split(tpr, rj, wg[0] if wg else 0)
        us = time_variant(dev, lambda seq, i: moe.matmul_id(
            seq, kc, gate, v["x"], View.whole(route[i]), v["g"], 1, k, xslot=False, norm=v["nw"], eps=1e-6,
            pair=up))
        moe.matvec_id_split, moe.MATVEC_ID_WG = orig, orig_wg
        label = var if var != "default" else "default " + ",".join(map(str, orig(a.type, D, sg, True))) + \
            f" wg {orig_wg}"
        print(f"  {label:22s} {us:7.2f} {pair_bytes / us / 1e3:7.0f}", flush=True)

    down_bytes = k * D * row_bytes(F)
    print(f"down (+glu, weighted sum, residual), {down_bytes / 1e6:.1f} MB per token: TPR,RJ  µs  GB/s")
    for var in a.down.split():
        if var != "default":
            tpr, rj = map(int, var.split(","))
            with_split(tpr, rj, 0)
        us = time_variant(dev, lambda seq, i: moe.matmul_id(
            seq, kc, down, v["g"], View.whole(route[i]), v["y"], 1, k, xslot=True, glu=v["u"], sum_slots=True,
            residual=v["res"]))
        moe.matvec_id_split = orig
        label = var if var != "default" else "default " + ",".join(map(str, orig(a.type, F, sg, False)))
        print(f"  {label:22s} {us:7.2f} {down_bytes / us / 1e3:7.0f}", flush=True)
    dev.close()


if __name__ == "__main__":
    main()
