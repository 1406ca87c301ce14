#!/usr/bin/env python3
"""Where a `run`-style load's time goes inside its phases: device memory allocations, the
recordings' parts (pipeline creation, descriptor sets, dispatch recording, host waits for copies,
the recorders' own Python), and the same recordings made again once the weights are in (kernels
and descriptor sets then exist: what is left is recording alone, without the upload threads
competing for the interpreter).

    python3 benchmarks/load_breakdown.py -m model.gguf|synthetic:1b-q4_0 [-p "Once upon a time"] [-r 2]

Each repetition is a fresh Model in this process (pipelines then come from the driver's and the
on-disk caches; run it twice and read the second). Lines: "allocations N (MiB, ms)" -- the
vkAllocateMemory calls of the load and their time; "record <shape>" per recording; "waits" -- host
waits on the device's timeline inside the recordings (a wait there waits for every weight copy
queued before it).
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from llamavk import phases, runtime  # noqa: E402
from llamavk.api import Model  # noqa: E402
from llamavk.synthetic import synthetic_model_path  # noqa: E402
from llamavk.vk import buffer as vk_buffer, device as vk_device, kernel as vk_kernel  # noqa: E402
from llamavk.vk import sequence as vk_sequence, sync as vk_sync  # noqa: E402

TIMES: dict = collections.defaultdict(float)
COUNTS: collections.Counter = collections.Counter()
ACTIVE = {"record": None}     # the thread recording now (its calls are counted, not the upload threads')


def timed(owner, name: str, label: str, during_record_only: bool = False) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            if not during_record_only or ACTIVE["record"] is threading.current_thread():
                TIMES[label] += time.perf_counter() - t0
                COUNTS[label] += 1

    setattr(owner, name, wrapper)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", "--prompt", default="Once upon a time")
    ap.add_argument("-r", "--repetitions", type=int, default=2)
    args = ap.parse_args()
    path = synthetic_model_path(args.model[len("synthetic:"):]) if args.model.startswith("synthetic:") else args.model

    timed(vk_buffer, "_allocate", "allocations")
    timed(vk_kernel.Kernel, "__init__", "kernels created (pipelines)", True)
    timed(vk_device.Device, "allocate_descriptor_set", "descriptor sets allocated", True)
    timed(vk_kernel.Kernel, "descriptor_set", "descriptor_set() (allocation + writes)", True)
    timed(vk_sequence.CommandSequence, "dispatch", "dispatch() (incl. descriptor_set)", True)
    timed(vk_sync.TimelineSemaphore, "wait_any_thread", "waits", True)
    timed(vk_sync.TimelineSemaphore, "wait", "waits", True)
    record = runtime.DeviceRuntime.record

    def record_timed(self, key, n_tokens, slot=0):
        ACTIVE["record"] = threading.current_thread()
        t0 = time.perf_counter()
        try:
            return record(self, key, n_tokens, slot)
        finally:
            ACTIVE["record"] = None
            TIMES[f"record {key} x{n_tokens}"] += time.perf_counter() - t0

    runtime.DeviceRuntime.record = record_timed

    for rep in range(args.repetitions):
        TIMES.clear()
        COUNTS.clear()
        phases._marks[:] = phases._marks[:1]
        phases._extra.clear()
        t0 = time.perf_counter()
        with Model(path, prepare_prompt=lambda m: m.tokenize(args.prompt)) as m:
            load = time.perf_counter() - t0
            rt = m.runtime
            shapes = {k: [(s.n_dispatches, s.n_barriers) for s in segs] for k, segs in rt.recordings.items()}
            during = dict(TIMES), dict(COUNTS)
            # the same recordings again: kernels and descriptor sets exist, the weights are in
            again = {}
            for key in list(rt.recordings):
                t1 = time.perf_counter()
                rt.record(*key)
                again[key] = time.perf_counter() - t1
        times, counts = during
        print(f"== repetition {rep + 1}: load {1e3 * load:.1f} ms")
        for line in phases.report()[1:]:
            print("  " + line)
        for label in sorted(times):
            n = f"{counts[label]:5d} x" if counts.get(label) else "       "
            print(f"  {label:<42} {n} {1e3 * times[label]:8.1f} ms")
        for key, segs in shapes.items():
            print(f"  recording {key}: dispatches/barriers per segment {segs}; "
                  f"recorded again {1e3 * again[key]:.1f} ms")


if __name__ == "__main__":
    main()
