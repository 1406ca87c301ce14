#!/usr/bin/env python3
"""A Gated DeltaNet layer's one-token middle (convolution, delta rule, gated norm): three dispatches
(ssm_conv, gdn_recurrent, head_norm gated) against one (gdn_decode, deltanet.delta_net_step), and
per model the dispatches, barriers and decode speed of a one-token step with and without the fold
(LLAMAVK_GDN_FUSE).

    python3 benchmarks/bench_gdn_decode.py [--heads 16,32] [--dim 128] [--rows 8,16,32] [--reps 30]
    python3 benchmarks/bench_gdn_decode.py -m synthetic:35b-a3b-q4_0 [-n 128]

Kernels (default shape Qwen3.6-35B-A3B's: 16 key / 32 value heads of 128, 4 taps): --reps layers
back to back, each dependent on the one before (barriers), replayed for --warmup seconds, then 5
times; prints the median GPU microseconds per dispatch (timestamps) and per layer (the sum), and the
wall microseconds per layer of a replay. --rows: gdn_decode's state rows per thread to try
(LLAMAVK_GDN_ROWS; default 16: 1024 threads for heads of 128). The outputs of both forms are
compared on the same inputs (max relative difference).

-m: loads the model twice (LLAMAVK_GDN_FUSE=1, then 0) and prints per setting the one-token step's
dispatches and barriers, then tg t/s: 3 runs of -n single-token steps after 32 warm-up steps, best
kept (the same as `llamavk bench -p 0 -n 128` up to its averaging).
"""

import argparse
import os
import time

import numpy as np

from llamavk.devices import open_devices, select
from llamavk.kernels import STEP_WORDS, KernelCache, View
from llamavk.kernels import deltanet as dn
from llamavk.vk import Buffer, CommandSequence, get_instance


def upload(dev, arr) -> View:
    arr = np.ascontiguousarray(arr)
    buf = Buffer(dev, arr.nbytes)
    buf.write(arr)
    return View(buf, 0, arr.nbytes)


class Layer:
    """One layer's inputs and state at position 5 of a sequence (the ring and state read)."""

    def __init__(self, dev, hk, hv, d, k, rng):
        c = (2 * hk + hv) * d
        self.dev, self.hk, self.hv, self.d, self.k, self.c = dev, hk, hv, d, k, c
        step = np.zeros(STEP_WORDS, np.uint32)
        step[:3] = [5, 1, 6]
        self.step = upload(dev, step)
        self.x = upload(dev, rng.standard_normal(c).astype(np.float32))
        self.taps = upload(dev, (rng.standard_normal((c, k)) * 0.5).astype(np.float32))
        self.alpha = upload(dev, rng.standard_normal(hv).astype(np.float32))
        self.beta = upload(dev, rng.standard_normal(hv).astype(np.float32))
        self.dt = upload(dev, (rng.standard_normal(hv) * 0.5).astype(np.float32))
        self.a = upload(dev, -np.exp(rng.uniform(np.log(0.002), np.log(8.0), hv)).astype(np.float32))
        self.z = upload(dev, rng.standard_normal(hv * d).astype(np.float32))
        self.w = upload(dev, (1 + 0.1 * rng.standard_normal(d)).astype(np.float32))
        self.ring0 = rng.standard_normal((k, c)).astype(np.float32)
        self.state0 = (rng.standard_normal((hv, d, d)) * 0.1).astype(np.float32)
        self.ring, self.state = upload(dev, self.ring0), upload(dev, self.state0)
        self.conv = upload(dev, np.zeros(c, np.float32))
        self.o = upload(dev, np.zeros(hv * d, np.float32))
        self.out = upload(dev, np.zeros(hv * d, np.float32))

    def reset(self):
        self.ring.buffer.write(self.ring0)
        self.state.buffer.write(self.state0)

    def record(self, seq, kc, fused: bool):
        hk, hv, d, k = self.hk, self.hv, self.d, self.k
        if fused:
            dn.delta_net_step(seq, kc, self.x, self.taps, self.ring, self.alpha, self.beta, self.dt, self.a,
                              self.state, self.z, self.w, self.out, self.step, hk, hv, d, k, 1e-6, 1e-6)
        else:
            dn.ssm_conv(seq, kc, self.x, self.taps, self.ring, self.conv, self.step, 1, self.c, k)
            dn.delta_net(seq, kc, self.conv, self.alpha, self.beta, self.dt, self.a, self.state, self.o, self.step, 1,
                         hk, hv, d, 1e-6, chunked=False)
            dn.gated_norm(seq, kc, self.o, self.z, self.w, self.out, 1, hv, d, 1e-6)

    def output(self, kc, fused: bool) -> np.ndarray:
        """One step from the initial ring and state."""
        self.reset()
        seq = CommandSequence(self.dev).begin()
        self.record(seq, kc, fused)
        seq.end()
        seq.run()
        seq.close()
        return np.frombuffer(self.out.buffer.read(), np.float32).copy()

    def time(self, kc, fused: bool, reps: int, warmup: float):
        """({kernel: median us per dispatch}, median GPU us per layer, wall us per layer)."""
        seq = CommandSequence(self.dev, profile=True).begin()
        for _ in range(reps):
            self.record(seq, kc, fused)
            seq.barrier()
        seq.end()
        t0 = time.time()
        seq.run()
        while time.time() - t0 < warmup:
            seq.run()
        per_kernel: dict[str, list[float]] = {}
        totals, walls = [], []
        for _ in range(5):
            t = time.perf_counter()
            seq.run()
            walls.append((time.perf_counter() - t) * 1e6 / reps)
            res = seq.profile_results()
            totals.append(sum(us for _, us in res) / reps)
            for name, us in res:
                per_kernel.setdefault(name, []).append(us)
        seq.close()
        return ({k: float(np.median(v)) for k, v in per_kernel.items()}, float(np.median(totals)),
                float(np.median(walls)))


def kernels(a) -> None:
    hk, hv = map(int, a.heads.split(","))
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    print(f"{dev.info.name}: one token, {hk}/{hv} heads of {a.dim}, {a.taps} taps, {a.reps} layers per replay")
    layer = Layer(dev, hk, hv, a.dim, a.taps, np.random.default_rng(0))
    kc = KernelCache(dev)
    want = layer.output(kc, False)
    print(f"{'form':28}{'GPU us/layer':>14}{'wall us/layer':>15}  per dispatch (us)")
    per, total, wall = layer.time(kc, False, a.reps, a.warmup)
    print(f"{'3 dispatches':28}{total:14.2f}{wall:15.2f}  " + ", ".join(f"{k} {v:.2f}" for k, v in per.items()))
    for rows in [int(r) for r in a.rows.split(",") if r]:
        os.environ["LLAMAVK_GDN_ROWS"] = str(rows)
        layout = dn.decode_layout(kc, a.dim)
        if layout is None:
            print(f"gdn_decode rows {rows}: no layout on this device")
            continue
        got = layer.output(kc, True)
        per, total, wall = layer.time(kc, True, a.reps, a.warmup)
        err = np.abs(got - want).max() / np.abs(want).max()
        label = f"1 dispatch ({layout[0]} thr, {layout[1]} rows)"
        print(f"{label:28}{total:14.2f}{wall:15.2f}  max rel diff {err:.1e}")
    os.environ.pop("LLAMAVK_GDN_ROWS", None)


def model(a) -> None:
    import llamavk
    from llamavk.benchmark import decode
    from llamavk.synthetic import synthetic_model_path

    path = str(synthetic_model_path(a.model)) if a.model.startswith("synthetic:") else a.model
    for fuse in ("1", "0"):
        os.environ["LLAMAVK_GDN_FUSE"] = fuse
        rng = np.random.default_rng(0)
        with llamavk.load(path, n_ctx=32 + 3 * a.n, warn=lambda m: None) as m:
            rt = m.runtime
            rts = getattr(rt, "runtimes", [rt])
            decode(m, 32, rng)                                   # records the step; clocks up
            seqs = [s for r in rts for s in r.sequence("last", 1, 0)]
            n_disp, n_bar = sum(s.n_dispatches for s in seqs), sum(s.n_barriers for s in seqs)
            steps = sum(op.kind == "delta_net_step" for r in rts for op in r.graph_for("last", 1).ops)
            best = 0.0
            for r in range(3):                                   # the state continues: no rewind
                t0 = time.perf_counter()
                decode(m, a.n, rng, 32 + r * a.n)
                best = max(best, a.n / (time.perf_counter() - t0))
        print(f"LLAMAVK_GDN_FUSE={fuse}: one-token step {n_disp} dispatches, {n_bar} barriers "
              f"({steps} delta_net_step ops); tg{a.n} {best:.1f} t/s (best of 3)")
    os.environ.pop("LLAMAVK_GDN_FUSE", None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", help="model: dispatches, barriers, tg with and without the fold")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--heads", default="16,32", help="key heads,value heads")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--taps", type=int, default=4)
    ap.add_argument("--rows", default="8,16,32")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=float, default=0.3)
    a = ap.parse_args()
    (model if a.model else kernels)(a)


if __name__ == "__main__":
    main()
