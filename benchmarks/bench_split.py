#!/usr/bin/env python3
"""pp/tg of one model in several split modes, and where decode time goes across devices.

    python3 benchmarks/bench_split.py -m model.gguf -sm none,layer,row,tensor,graph [-dev Vulkan0,Vulkan1]
        [-ts 1,1] [-p 512] [-n 128] [-r 3] [--profile]

--profile (a second, profiled load per mode) prints per device the microseconds per decoded token
spent in exchange points (exchange_sync, exchange_reduce, reduce_sum kernels: communication, load
imbalance and the sums) against the whole step, from GPU timestamps (spin sync only; the relay waits
on the host instead), and how many exchange points have the next product chained to them (-sm
graph: its weight loads overlap the wait). The timestamps serialise the dispatches, so the overlap
itself shows in tg: -sm tensor and -sm graph differ in decode only by it.
"""

import argparse
import collections
import time

import numpy as np

import llamavk


def timed_prompt(m, n, rng):
    toks = [int(t) for t in rng.integers(0, m.config.n_vocab, n)]
    t0 = time.perf_counter()
    m._eval(toks, 0, False)
    return n / (time.perf_counter() - t0)


def timed_decode(m, n, rng):
    toks = [int(t) for t in rng.integers(0, m.config.n_vocab, n)]
    rt = m.runtime
    t0 = time.perf_counter()
    for i, tok in enumerate(toks):
        rt.run_batch("last", [tok], i)
    return n / (time.perf_counter() - t0)


def profile_decode(m, rng):
    """Per device: (us in exchange points, us in the whole step) of one decoded token."""
    rt = m.runtime
    m._eval([int(t) for t in rng.integers(0, m.config.n_vocab, 64)], 0, False)
    rt.run_batch("last", [1], 64)
    out = []
    for sub in getattr(rt, "runtimes", [rt]):
        total = collections.Counter()
        for seg in sub.recordings[sub.recording_key("last", 1, 0, 65)]:
            for name, us in seg.profile_results():
                total[name.split()[0]] += us          # "<kernel> <op label>"
        exchange = sum(total[k] for k in ("exchange_sync", "exchange_reduce", "reduce_sum_f32"))
        points = sum(op.kind in ("sync", "sync_reduce") for op in sub.fused_one["last"].ops)
        chained = sum(op.kind == "sync_reduce" for op, _ in sub.chains.get(sub.recording_key("last", 1, 0, 65), []))
        out.append((sub.device.name, exchange, sum(total.values()), points, chained))
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-sm", default="none,layer,row,tensor,graph")
    ap.add_argument("-ts", default=None)
    ap.add_argument("-dev", default=None)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    ts = [float(v) for v in a.ts.split(",")] if a.ts else None
    for mode in a.sm.split(","):
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        kw = dict(devices=a.dev, split_mode=mode, tensor_split=ts, n_ctx=max(a.p, a.n) + 80, n_ubatch=a.p)
        with llamavk.load(a.model, **kw) as m:
            load_s = time.perf_counter() - t0
            timed_prompt(m, a.p, rng)                        # warm-up: records both step shapes
            timed_decode(m, 4, rng)
            pp = [timed_prompt(m, a.p, rng) for _ in range(a.r)]
            tg = [timed_decode(m, a.n, rng) for _ in range(a.r)]
            sync = getattr(m.runtime, "sync", "-")
            print(f"{mode:6s} devices {len(m.devices)} ({sync:5s})  pp{a.p} {np.mean(pp):9.1f} ± {np.std(pp, ddof=1):6.1f}"
                  f"   tg{a.n} {np.mean(tg):7.1f} ± {np.std(tg, ddof=1):5.1f} t/s   (load {load_s:.0f} s)", flush=True)
        if a.profile and mode != "none":
            with llamavk.load(a.model, profile=True, **kw) as m:
                for name, wait, total, points, chained in profile_decode(m, rng):
                    print(f"        {name}: {wait:7.0f} us of {total:7.0f} us per token in {points} exchange points"
                          f" ({chained} with the next product chained)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
