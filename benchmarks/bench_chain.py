#!/usr/bin/env python3
"""What a chain of dependent products can reach on the first device: N dispatches, each streaming a
buffer of a product's size (shaders/bench_chain.comp: 16-byte loads, all issued at once) and reading
the previous one's output. Prints microseconds per stage and GB/s, for each buffer size and

    mode 0  a barrier between stages (how the engine records a decode step)
    mode 1  no barriers: workgroups wait for a counter of the previous stage, loads issued first
    mode 2  the same, loads issued after the wait
    mode 3  barriers as mode 0, on a fixed grid (--grids) whose workgroups loop over the buffer's
            chunks: no partly filled last wave, what a persistent product could reach
    mode 4  one dispatch runs every stage on a fixed grid (--grids; all its workgroups must be
            resident at once), the stages ordered by a counter: a persistent kernel whose grid
            barriers replace the dispatch barriers; each stage's first loads issued before its wait
    mode 5  the same, loads issued after the wait
    mode 6  mode 1's counter waits on mode 3's fixed grid (--grids): with grids of at most half what
            the device holds, a stage's workgroups are resident while its producer runs
    mode 7  mode 1 with a streamer beside it (--stream grid:depth:window MB): one more dispatch,
            recorded first, reads the stages' weights into L2 up to a window ahead of the chunks
            the stages have finished, so memory keeps streaming while a stage waits for its producer

    python3 benchmarks/bench_chain.py [--stages 192] [--sizes "0.004:1 9.4:4 33:4 66:8"] [--modes 0,3]
                                      [--grids 264,528,1056] [--flags device|host]

A size is MB:U (U loads of 16 bytes per lane), or a layer of stages of different sizes, MB,MB,...:U
(at most 8; "14.2,0.004,9.4,66,33:4" is a 7.2B Q4_0 layer: Q/K/V, an empty stage where attention
goes, O, gate/up, down), the stages taking its sizes in turn; then time per layer is printed too.
Weight copies rotate so that the L2 cache never holds the buffer read next. Host wall time over whole
replays (no per-dispatch timestamps, which add their own cost to every dispatch).
"""

import argparse
import math

import numpy as np

from bench_persistent import replay_seconds
from llamavk.devices import open_devices, select
from llamavk.vk import Buffer, CommandSequence, get_instance
from llamavk.vk.kernel import Kernel

SIZES = "0.004:1 2.36:4 9.4:4 14.2:4 33:4 66:8"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=192, help="dispatches per replay (a 7.2B decode step: 193)")
    ap.add_argument("--sizes", default=SIZES)
    ap.add_argument("--modes", default="0,1,2")
    ap.add_argument("--grids", default="264,528,1056", help="workgroups per stage of modes 3 to 6")
    ap.add_argument("--stream", default="132:2:16",
                    help="mode 7's streamers, grid:depth:window MB[:pref:stride][,...] (depth: chunks a workgroup in "
                         "flight; pref 0 loads, 1-3 atomics that change nothing, one every stride words)")
    ap.add_argument("--flags", choices=("device", "host"), default="device",
                    help="where the stage counters live (host: system memory, over PCIe)")
    a = ap.parse_args()
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    n = a.stages
    io = Buffer(dev, 4 * 4096 * (n + 1))
    # the counters in device memory, as the engine's (kernels/chain.py); --flags host puts them in
    # system memory, where every atomic and poll crosses PCIe (how this measured before 2026-11-27)
    flags = Buffer(dev, 4 * 1024, host_visible=a.flags == "host")
    print(f"{dev.info.name}; {n} stages per replay")
    for spec in a.sizes.split():
        mbs, u = spec.split(":")
        u = int(u)
        per_wg = 256 * 16 * u
        groups = [max(1, round(float(mb) * 1e6 / per_wg)) for mb in mbs.split(",")]
        if max(groups) > 4096 or len(groups) > 8:
            raise SystemExit(f"{spec}: more than 4096 workgroups (raise U) or more than 8 stages a layer")
        npat, layer_bytes = len(groups), sum(groups) * per_wg
        copies = max(2, min(48, math.ceil(160e6 / layer_bytes)))
        # stage s: entry s % npat of layer copy (s // npat) % copies
        ws = [[Buffer(dev, g * per_wg) for g in groups] for _ in range(copies)]
        modes = [int(m) for m in a.modes.split(",")]
        runs = [(m, None) for m in modes if m in (0, 1, 2)]
        runs += [(m, int(g)) for m in modes if 3 <= m <= 6 for g in a.grids.split(",")]
        runs += [(7, s) for s in a.stream.split(",") if 7 in modes]
        # the persistent modes and the streamer read one buffer holding every copy
        whole = Buffer(dev, layer_bytes * copies) if any(m in (4, 5, 7) for m in modes) else None
        for mode, cap in runs:
            if mode == 7:
                sgrid, depth, window, *how = cap.split(":")
                pref, stride = (int(how[0]), int(how[1])) if how else (0, 8)
                # the atomics' binding declared read: they change no word, and a declared write
                # would put a barrier between the streamer and the stages
                streamer = Kernel(dev, "bench_chain", "rrrr", push_size=56, spec=(u, 7, int(depth), pref, stride))
                stream_push = np.array([n, copies, round(float(window) * 1e6 / per_wg),
                                        sum(groups[s % npat] for s in range(n)), sum(groups), npat]
                                       + groups + [0] * (8 - npat), np.uint32).tobytes()
                sdesc, cap = cap, None
            grids = [g if cap is None else min(cap, g) for g in groups]
            # modes 0 and 3 declare their outputs written (the recorder then puts a barrier between
            # stages); modes 1 and 2 declare them read, so no barriers are recorded and the counters
            # order them
            k = Kernel(dev, "bench_chain", "rww" if mode in (0, 3) else "rrr", push_size=56,
                       spec=(u, 1 if mode == 7 else mode))
            seq = CommandSequence(dev).begin()
            seq.fill(io, 0)
            seq.fill(flags, 0)
            seq.barrier()
            if mode == 7:
                seq.dispatch(streamer, [whole, io, flags, whole], (int(sgrid), 1, 1), stream_push)
            if mode in (4, 5):
                grid = cap if npat > 1 else grids[0]
                push = np.array([n, copies, 0, 0, 0, npat] + groups + [0] * (8 - npat), np.uint32).tobytes()
                seq.dispatch(k, [whole, io, flags], (grid, 1, 1), push)
            for s in range(0 if mode in (4, 5) else n):
                e = s % npat
                push = np.array([s, grids[e - 1], s * 4096, (s + 1) * 4096, groups[e], 0] + [0] * 8, np.uint32)
                weights = ws[s // npat % copies][e]
                if mode == 7:   # the copy's stage inside the streamer's buffer
                    weights = (whole, (s // npat % copies * sum(groups) + sum(groups[:e])) * per_wg, groups[e] * per_wg)
                seq.dispatch(k, [weights, io, flags], (grids[e], 1, 1), push.tobytes())
            seq.end()
            us = replay_seconds(seq, 15) / n * 1e6
            fl = np.frombuffer(flags.read(), np.uint32)
            note = ""
            if mode in (1, 2, 6, 7):
                done = all(fl[s] == grids[s % npat] for s in range(n))
                note = f"  (waits given up: {int(fl[1023])}, counters complete: {done})"
            if mode in (4, 5):
                note = f"  (waits given up: {int(fl[1023])}, counter: {int(fl[0])} of {n * grid})"
            if npat > 1:
                note = f"  {us * npat:7.2f} us/layer" + note
            wg = f"{grids[0]:5d}" if npat == 1 else ("grid " + str(cap) if 3 <= mode <= 6 else "  -  ")
            if mode == 7:
                note += f"  streamer {sdesc}, {fl[1020]} steps read, {fl[1021]} behind"
                streamer.close()
            print(f"{layer_bytes / npat / 1e6:8.2f} MB  U={u}  {wg} workgroups  mode {mode}: {us:7.2f} us/stage "
                  f"{layer_bytes / npat / us / 1e3:6.0f} GB/s{note}", flush=True)
            seq.close()
            k.close()
        for w in [b for c in ws for b in c] + [whole] * (whole is not None):
            w.close()


if __name__ == "__main__":
    main()
