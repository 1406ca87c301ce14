#!/usr/bin/env python3
"""What one exchange point between two GPUs costs by itself: a ping-pong of the split modes' counter
(kernels/collective.py exchange_sync, shaders/exchange_sync.comp) through shared host memory.

    python3 benchmarks/bench_hop.py [-dev Vulkan0,Vulkan1] [--lines 256,1024,8192] [--rounds 200]
                                    [--work-mb 0,64] [--bytes 0,16384] [--gap N]

Device A signals exchange 2i and waits for B's 2i + 1; B waits for 2i and signals 2i + 1; `rounds`
round trips in one submission each (the exchange points' own barriers around every dispatch, as in a
step). A hop is (wall time - A's work alone) / (2 rounds): the signal's barrier and dispatch, its
line writes reaching host memory, the peer's poll seeing one, the barrier after the wait.
--lines: the cache lines each counter is written to (the signal writes every one of them; a layer-mode
  wait reads a fresh one per poll; collective.FLAG_LINES / FLAG_LINES_LONG).
--work-mb: A fills that many MiB of its memory before each signal, so that B's wait lasts long
  enough to back off (a layer-mode hop's consumer has waited a whole block of layers); A's fills
  alone are timed and taken out.
--bytes: A copies that many bytes into host memory before each signal and B copies them out after
  its wait (a hop's activation: the put and the get).
"""

import argparse
import sys
import time

import numpy as np

from llamavk.devices import open_devices, select
from llamavk.kernels import KernelCache, View, collective
from llamavk.vk import Buffer, CommandSequence, SharedHostMemory
from llamavk.vk.instance import get_instance

BASE_WORD = 3


def record(dev, kc, me, flags, status, step, rounds, lines, work, data, slot):
    """One device's ping-pong: A (me 0) works, puts, signals 2i, waits for 2i + 1; B the mirror."""
    seq = CommandSequence(dev).begin()
    for i in range(rounds):
        if me == 0:
            if work is not None:
                seq.fill(work, i + 1, work.size)
            if data is not None:
                seq.barrier()
                seq.copy(data, slot, data.size)
            collective.exchange_sync(seq, kc, flags, status, step, 0, 2 * i, True, 0, 2, BASE_WORD, lines)
            collective.exchange_sync(seq, kc, flags, status, step, 0, 2 * i + 1, False, 0b10, 2, BASE_WORD, lines)
        else:
            collective.exchange_sync(seq, kc, flags, status, step, 1, 2 * i, False, 0b01, 2, BASE_WORD, lines)
            if data is not None:
                seq.copy(slot, data, data.size)
                seq.barrier()
            collective.exchange_sync(seq, kc, flags, status, step, 1, 2 * i + 1, True, 0, 2, BASE_WORD, lines)
    return seq.end()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-dev", default="Vulkan0,Vulkan1")
    ap.add_argument("--lines", default="256,1024,8192")
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--work-mb", default="0,64")
    ap.add_argument("--bytes", default="0,16384")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    entries, _ = select(get_instance().devices, a.dev, env={})
    devs = open_devices(entries)
    if len(devs) != 2:
        print("error: two devices", file=sys.stderr)
        return 1
    kcs = [KernelCache(d) for d in devs]
    statuses = [Buffer(d, 16, host_visible=True) for d in devs]
    steps = [Buffer(d, 256, host_visible=True) for d in devs]
    print(f"{devs[0].info.name} <-> {devs[1].info.name}, {a.rounds} round trips per run, best of {a.reps}")
    print("| lines | A's work MiB | bytes | work alone us | per hop us |")
    print("|---|---|---|---|---|")
    for lines in (int(v) for v in a.lines.split(",")):
        n_ex = 2 * a.rounds
        flags = SharedHostMemory(collective.flag_bytes(n_ex, 2, lines), devs)
        for work_mb in (int(v) for v in a.work_mb.split(",")):
            work = Buffer(devs[0], work_mb << 20) if work_mb else None
            for nbytes in (int(v) for v in a.bytes.split(",")):
                host = SharedHostMemory(max(nbytes, 256), devs) if nbytes else None
                datas = [Buffer(d, nbytes) for d in devs] if nbytes else [None, None]
                seqs = [record(d, kcs[k], k, View.whole(flags.buffer(d)), View.whole(statuses[k]),
                               View.whole(steps[k]), a.rounds, lines, work if k == 0 else None, datas[k],
                               host.buffer(d) if host else None) for k, d in enumerate(devs)]
                alone = 0.0
                if work is not None:           # A's fills (and put) alone, the same count
                    solo = CommandSequence(devs[0]).begin()
                    for i in range(a.rounds):
                        solo.fill(work, i + 1, work.size)
                        solo.barrier()
                    solo.end()
                    solo.run()
                    t0 = time.perf_counter()
                    solo.run()
                    alone = time.perf_counter() - t0
                    solo.close()
                best = None
                for rep in range(a.reps + 1):          # the first run warms up
                    flags.array(np.uint32)[:] = 0
                    for k in range(2):
                        statuses[k].array(np.uint32)[:] = 0
                        steps[k].array(np.uint32)[BASE_WORD] = 10
                    t0 = time.perf_counter()
                    vb = seqs[1].submit()
                    va = seqs[0].submit()
                    devs[0].timeline.wait(va)
                    devs[1].timeline.wait(vb)
                    dt = time.perf_counter() - t0
                    if any(int(s.array(np.uint32)[0]) for s in statuses):
                        print(f"error: a wait timed out (lines {lines}, work {work_mb} MiB)", file=sys.stderr)
                        return 1
                    if rep:
                        best = dt if best is None else min(best, dt)
                hop = (best - alone) / (2 * a.rounds) * 1e6
                print(f"| {lines} | {work_mb} | {nbytes} | {alone / a.rounds * 1e6:.1f} | {hop:.2f} |")
                for s in seqs:
                    s.close()
                for d in datas:
                    if d is not None:
                        d.close()
                if host is not None:
                    host.close()
            if work is not None:
                work.close()
        flags.close()
    for d in devs:
        d.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
