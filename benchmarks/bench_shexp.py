#!/usr/bin/env python3
"""A shared expert folded into the routed experts' one-token products (fusion.fuse_shared_expert)
against the unfused step (LLAMAVK_SHEXP_FUSE=0), on one model loaded once per setting:
dispatches, barriers and chained stages of the one-token step, the FFN's ops of one MoE layer,
and (unless --count-only) tg128 (3 x 128 steps from position 0 after 32 warm-up steps, best kept),
the settings alternated twice (A B A B: the first pass after a load reads low).

    python3 benchmarks/bench_shexp.py -m synthetic:35b-a3b-q4_0 [--count-only]
"""

import argparse
import os
import sys
import time

import numpy as np

import llamavk
from llamavk.benchmark import decode
from llamavk.synthetic import synthetic_model_path


def tg(m, rng, n: int = 128) -> float:
    """Best of 3 x n steps from position 0 (a DeltaNet state cannot continue from elsewhere), after
    32 warm-up steps."""
    decode(m, 32, rng, 0)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        decode(m, n, rng, 0)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def step_counts(m) -> tuple[int, int, int, list[str]]:
    """(dispatches, barriers, chained producers) of the one-token step, and the op kinds of the
    last MoE layer's FFN (from its router on)."""
    rt = m.runtime
    segs = rt.sequence("last", 1, 0)
    graph = rt.fused_one["last"]
    layer = max(op.layer for op in graph.ops if op.kind == "matmul_id")
    ops = [op for op in graph.ops if op.layer == layer]
    first = next(i for i, op in enumerate(ops) if op.kind == "matmul" and op.inputs[0].role == "router")
    first -= first > 0 and ops[first - 1].kind == "rms_norm"      # the FFN norm, where it has a dispatch
    names = [op.kind + (f":{op.inputs[0].role}" if op.inputs and op.inputs[0].kind == "weight" else "")
             for op in ops[first:]]
    return (sum(s.n_dispatches for s in segs), sum(s.n_barriers for s in segs), len(rt.chains[rt.recording_key("last", 1, 0)]),
            names)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--count-only", action="store_true")
    a = ap.parse_args()
    path = str(synthetic_model_path(a.model)) if a.model.startswith("synthetic:") else a.model
    rng = np.random.default_rng(0)
    passes = ("1", "0") if a.count_only else ("1", "0", "1", "0")
    for fuse in passes:
        os.environ["LLAMAVK_SHEXP_FUSE"] = fuse
        with llamavk.load(path, n_ctx=512, n_ubatch=16) as m:
            speed = "" if a.count_only else f"  tg128 {tg(m, rng):.1f} t/s"
            n_disp, n_bar, n_chain, ffn = step_counts(m)
            print(f"LLAMAVK_SHEXP_FUSE={fuse}: one-token step {n_disp} dispatches, {n_bar} barriers, "
                  f"{n_chain} chained{speed}\n    FFN of the last MoE layer: {' -> '.join(ffn)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
