#!/usr/bin/env python3
"""Decode speed of one model under kernel-choice changes and with parts of the step left out: the A/B
and "where does the step go" runs of docs/PERFORMANCE.md.

    python3 benchmarks/bench_decode_ab.py -m model.gguf|synthetic:PRESET [--rule SHAPE=KERNEL:wg,nr[,ks[,steps]]] ...
                                        [--no-pairs] [--ablate] [--no-wait LETTERS,...]

--rule puts a MATVEC_CONFIGS row first for one class of weight shape (one token): down (cols > rows),
gateup (rows > cols, rows < 20000), square, kv (rows < cols <= 8192). --no-pairs keeps gate and up as
two products. --ablate re-records the step with each part left out in turn (its dispatches not
recorded at all) and prints the t/s of each: the difference is what that part costs per token.
--no-wait re-records the step with the chained consumers of each group of producers (chain_edges'
letters: a attention, o output projection, g gate/up, e experts' gate/up, m experts' down) not
waiting for them (LLAMAVK_CHAIN_NOWAIT; TIMING ONLY, the logits are wrong): the most that hiding
those edges' latency could give.
tg: 3 x 128 single-token steps after 32 warm-up steps (an idle GPU's clocks read low), best kept.
"""

import argparse
import os
import sys
import time

import numpy as np

import llamavk
import llamavk.runtime as R
from llamavk.benchmark import decode
from llamavk.kernels import matmul as mm
from llamavk.kernels import selection
from llamavk.synthetic import synthetic_model_path

SHAPES = {"down": lambda r, c: c > r, "gateup": lambda r, c: c < r < 20000, "square": lambda r, c: c == r,
          "kv": lambda r, c: r < c <= 8192}
PARTS = ("down", "gateup", "qkv", "o", "attn", "rope", "output")
# a mixture of experts' step (parts told apart by weight name, not shape)
MOE_PARTS = ("qkv", "o", "attn", "rope", "router", "experts_pair", "experts_down", "output")
NAMED = (("attn_q", "qkv"), ("attn_k", "qkv"), ("attn_v", "qkv"), ("attn_output", "o"), ("output", "output"))


def product_part(w, kw) -> str:
    """Which product of a llama layer a weight is, from its shape and fused inputs."""
    if w.cols > w.rows:
        return "down"
    if w.rows > 20000:
        return "output"
    if w.rows > w.cols or kw.get("pair") is not None:
        return "gateup"
    return "qkv" if kw.get("norm") is not None else "o"


def named_part(rt, w) -> str:
    """Which part of a layer a weight is, from its name in the runtime's weights."""
    name = next((k for k, v in rt.weights.items() if v is w), "")
    leaf = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
    return next((part for prefix, part in NAMED if leaf == prefix), leaf)


def leave_out(rt, parts: set) -> None:
    """Re-record the runtime's steps without the dispatches of `parts`."""
    mm_orig, attn_orig, rope_orig, router_orig, mmid_orig = leave_out.originals
    moe_model = any(w.experts for w in rt.weights.values() if hasattr(w, "experts"))

    def matmul(seq, kc, w, x, y, n, **kw):
        part = named_part(rt, w) if moe_model else product_part(w, kw)
        if "router" in parts and kw.get("router") is not None:   # a router folded into the product
            kw["router"] = None
        if part not in parts:
            return mm_orig(seq, kc, w, x, y, n, **kw)
        return 0   # nothing recorded: no workgroups count

    def matmul_id(seq, kc, w, *a, **kw):
        if ("experts_down" if kw.get("sum_slots") else "experts_pair") not in parts:
            return mmid_orig(seq, kc, w, *a, **kw)
        return 0
    R.matmul.matmul = matmul
    R.moe.matmul_id = matmul_id
    R.moe.router = (lambda *a, **k: 0) if "router" in parts else router_orig
    R.attn_k.attention = (lambda *a, **k: 0) if "attn" in parts else attn_orig
    R.rope.rope_kv = (lambda *a, **k: 0) if "rope" in parts else rope_orig
    rt.recordings.clear()


leave_out.originals = (R.matmul.matmul, R.attn_k.attention, R.rope.rope_kv, R.moe.router, R.moe.matmul_id)


def tg(m, rng, n: int = 128) -> float:
    decode(m, 32, rng, 0)
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        decode(m, n, rng, 32)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("--rule", action="append", default=[])
    ap.add_argument("--no-pairs", action="store_true")
    ap.add_argument("--ablate", action="store_true")
    ap.add_argument("--no-wait", default="", help="comma-separated groups of edge letters, e.g. a,g,aog")
    a = ap.parse_args()
    for rule in a.rule:   # later rules first, like a table read top down
        shape, _, spec = rule.partition("=")
        kernel, _, nums = spec.partition(":")
        v = [int(x) for x in nums.split(",")] + [1, 1]
        applies = (lambda f: lambda kc, n, rows, cols: n == 1 and f(rows, cols))(SHAPES[shape])
        cfg = selection.MatvecConfig(wg=v[0], nr=v[1], ks=v[2], u=1, kernel=kernel, steps=v[3])
        selection.MATVEC_CONFIGS = (("gpu", "*", applies, cfg),) + selection.MATVEC_CONFIGS
    if a.no_pairs:
        mm.matvec_pairs = lambda *args: False
    path = str(synthetic_model_path(a.model)) if a.model.startswith("synthetic:") else a.model
    rng = np.random.default_rng(0)
    with llamavk.load(path, n_ctx=512, n_ubatch=16) as m:
        base = tg(m, rng)
        print(f"{a.model} {' '.join(a.rule)}{' no pairs' if a.no_pairs else ''}: tg128 {base:.1f} t/s", flush=True)
        if a.ablate:
            moe_model = any(getattr(w, "experts", 0) for w in m.runtime.weights.values())
            for parts in [(p,) for p in (MOE_PARTS if moe_model else PARTS)] + [("attn", "rope")]:
                leave_out(m.runtime, set(parts))
                r = tg(m, rng)
                per_layer = (1 / base - 1 / r) / m.runtime.cfg.n_layer * 1e6
                print(f"   without {'+'.join(parts):10s} {r:8.1f} t/s   costs {per_layer:5.1f} us per layer", flush=True)
            leave_out(m.runtime, set())
        for letters in filter(None, a.no_wait.split(",")):
            os.environ["LLAMAVK_CHAIN_NOWAIT"] = letters
            m.runtime.recordings.clear()
            print(f"   no wait after {letters:6s} {tg(m, rng):8.1f} t/s (timing only)", flush=True)
        os.environ.pop("LLAMAVK_CHAIN_NOWAIT", None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
