#!/usr/bin/env python3
"""Decode with the per-head Q/K norms, RoPE and KV store in the decode attention (fusion.py
fuse_qk_norm_into_attention) against the separate rope_kv stage (LLAMAVK_QKNORM_FUSE=0): dispatches
and barriers of the one-token step's recording, and tg t/s (3 x 128 single-token steps after 32
warm-up steps, best kept; at depth -d positions already in the cache), one load per setting.

    python3 benchmarks/bench_qknorm_fuse.py -m synthetic:30b-a3b-q4_0 [-d 0,4096] [-ctk q8_0 -ctv q8_0]
"""

import argparse
import os
import sys
import time

import numpy as np

import llamavk
from llamavk.benchmark import decode, fill_depth
from llamavk.synthetic import synthetic_model_path


def tg(m, rng, depth: int, n: int = 128) -> float:
    if depth:
        fill_depth(m, depth, rng)
    decode(m, 32, rng, depth)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        decode(m, n, rng, depth + 32)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-d", "--depth", default="0")
    ap.add_argument("-ctk", default="f16")
    ap.add_argument("-ctv", default="f16")
    a = ap.parse_args()
    depths = [int(d) for d in a.depth.split(",")]
    path = str(synthetic_model_path(a.model)) if a.model.startswith("synthetic:") else a.model
    for fuse in ("1", "0"):
        os.environ["LLAMAVK_QKNORM_FUSE"] = fuse
        rng = np.random.default_rng(0)
        with llamavk.load(path, n_ctx=max(depths) + 512, n_ubatch=512, type_k=a.ctk, type_v=a.ctv) as m:
            rt = m.runtime
            rates = [tg(m, rng, d) for d in depths]
            segs = rt.recordings[("last", 1, 0)]
            n_disp = sum(s.n_dispatches for s in segs)
            n_bar = sum(s.n_barriers for s in segs)
            fused = sum(bool(op.attrs.get("qk_fused")) for op in rt.fused_one["last"].ops)
            print(f"{a.model} LLAMAVK_QKNORM_FUSE={fuse}: {fused} fused attention layers, one-token step "
                  f"{n_disp} dispatches, {n_bar} barriers; "
                  + ", ".join(f"tg128@d{d} {r:.1f} t/s" for d, r in zip(depths, rates)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
