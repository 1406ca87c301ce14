#!/usr/bin/env python3
"""The split timeline: what each device does around every exchange point of a decoded token, from
the device clock read inside the kernels (llamavk/split/clock.py, LLAMAVK_CLOCK_PROFILE=1).

    python3 benchmarks/split_timeline.py -m model.gguf [-sm graph,tensor] [-dev Vulkan0,Vulkan1]
        [-ts 1,1] [-n 16] [--layers]

Per device and exchange point (the all-reduce after attention and after the FFN, in µs):
  wait      the exchange point's start (my partial done, my counter out) -> the peers' counters
            arrived (waiting for the other device)
  sum       arrived -> the sum written (the peers' partials read over the bus, added)
  ahead     how long before the exchange's end the next product's first workgroups started (their
            weight loads in flight: the overlap; negative: it started after the end)
  release   the product's first wait release after the exchange's end (chained: the latency of its
            in-shader wait; behind a barrier: when it started)
  end       the product's last workgroup end, after the exchange's end
Then the means over the -n decoded tokens (after a warm-up) and "overlap: N of M exchange points had
their next product's first loads issued X µs (mean) before the exchange ended". -sm graph chains the
products after each all-reduce (on devices that chain products); -sm tensor, the control, keeps
the barrier: its products start after the exchange ends. Only stream _dp products are stamped (the
others show "-"); the clock's unit is the nanosecond (NVIDIA globaltimer, llvmpipe).
The CLOCK kernels add a few stores and atomics per workgroup: the step takes a little longer than
unprofiled; compare modes with bench_split.py.
"""

import argparse
import os
import sys

import numpy as np


def us(v) -> str:
    return "      -" if v is None else f"{v / 1e3:7.1f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-sm", default="graph,tensor")
    ap.add_argument("-ts", default=None)
    ap.add_argument("-dev", default=None)
    ap.add_argument("-n", type=int, default=16, help="decoded tokens measured (after 8 of warm-up)")
    ap.add_argument("--layers", action="store_true", help="every exchange point of the last token")
    a = ap.parse_args()
    os.environ["LLAMAVK_CLOCK_PROFILE"] = "1"      # read when the split runtime is made
    import llamavk
    from llamavk.errors import LlamavkError
    from llamavk.split import clock

    ts = [float(v) for v in a.ts.split(",")] if a.ts else None
    rng = np.random.default_rng(0)
    for mode in a.sm.split(","):
        try:
            m = llamavk.load(a.model, devices=a.dev, split_mode=mode, tensor_split=ts, n_ctx=128 + a.n)
        except LlamavkError as e:
            print(f"{mode}: {e}", file=sys.stderr)
            return 1
        with m:
            rt = m.runtime
            if not hasattr(rt, "clock_timelines") or rt.runtimes[0].clock is None:
                print(f"{mode}: not a split with exchange points (tensor or graph)")
                continue
            chained = sum(op.kind == "sync_reduce" for op, _ in rt.runtimes[0].chains.get(rt.runtimes[0].recording_key("last", 1, 0), []))
            m._eval([int(t) for t in rng.integers(0, m.config.n_vocab, 32)], 0, False)
            per_device = [[] for _ in rt.runtimes]
            discarded = 0
            for i in range(8 + a.n):
                rt.run_batch("last", [int(rng.integers(0, m.config.n_vocab))], 32 + i)
                timelines = rt.clock_timelines()
                if i < 8:
                    continue
                for d, points in enumerate(timelines):
                    if points is None:
                        discarded += 1          # straddled a wrap of the 32-bit clock
                    else:
                        per_device[d].append(points)
            if not any(points for tokens in per_device for points in tokens):
                print(f"-sm {mode}: no exchange point stamped (no all-reduce in its decode step)")
                continue
            print(f"-sm {mode} ({rt.sync} sync, {len(rt.runtimes)} devices, {chained} exchange points with the "
                  f"next product chained): {a.n} decoded tokens" + (f", {discarded} discarded" if discarded else ""))
            for sub, tokens in zip(rt.runtimes, per_device):
                if not tokens:
                    continue
                name = f"{sub.device.name} ({sub.device.info.name})"
                if a.layers:
                    print(f"  {name}, last token:")
                    print("    layer exch    wait     sum   ahead release     end   (µs)")
                    for p in tokens[-1]:
                        print(f"    {p.layer if p.layer is not None else '-':>5} {p.exchange:4d} {us(p.wait)} {us(p.sum)}"
                              f" {us(p.lead)} {us(p.release)} {us(p.finish)}")
                s = clock.summary([p for points in tokens for p in points])
                f = lambda v: "-" if v is None else f"{v:.1f}"   # noqa: E731
                print(f"  {name}: wait {f(s['wait_us'])}, sum {f(s['sum_us'])}; next product: first loads "
                      f"{f(s['lead_us'])} before the end, release +{f(s['release_us'])}, end +{f(s['finish_us'])} µs "
                      f"(means over {s['points']} exchange points, {s['with_product']} with a stamped product)")
                n_points = s["with_product"]
                print(f"  overlap: {s['overlapped'] // len(tokens)} of {n_points // len(tokens)} exchange points had "
                      f"their next product's first loads issued {f(s['overlap_us'])} µs (mean) before the exchange "
                      f"ended ({s['overlapped']} of {n_points} over {len(tokens)} tokens)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
