#!/usr/bin/env python3
"""How fast a model's weights reach the device, and what limits it: the host alone (reading the
file and splitting planar blocks into memory, per thread count) against the whole upload through
the staging slots (vk/transfer.py), per upload-thread count and slot size, and the old path that
copied from the file's map on one thread (LLAMAVK_UPLOAD=map's).

    python3 benchmarks/bench_upload.py -m model.gguf|synthetic:8b-q4_0 [-r 2] [--threads 1,2,4,8] [--slots-mib 8,16,32]

Every line gives GB/s of weight bytes (as stored in the file) and, for uploads, where the upload
threads' time went (summed over threads): reading the file, copying into staging, waiting for a
free slot (i.e. for the device's copies), recording and submitting. Run it after the file is in
the page cache (the first repetition reads it once). On a GPU: a host rate far above the upload's,
with much slot waiting, means the copies over the bus limit; little waiting means the host does.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from llamavk.devices import open_devices, select
from llamavk.gguf_file import GGUFFile
from llamavk.kernels import PLANAR, allocate_qweight
from llamavk.quant import GGMLQuantizationType, quant_info
from llamavk.synthetic import synthetic_model_path
from llamavk.vk import get_instance
from llamavk.vk import transfer


def matrices(f: GGUFFile):
    """(name, qtype, rows, cols, offset, nbytes) of every 2-D or 3-D tensor (the uploaded matrices)."""
    out = []
    for name, e in f.tensors.items():
        if len(e.shape) < 2 or e.qtype in (GGMLQuantizationType.F32,):
            continue
        rows = int(np.prod(e.shape[:-1]))
        out.append((name, e.qtype, rows, e.shape[-1], e.offset, e.nbytes))
    return out


def host_only(f: GGUFFile, mats, threads: int) -> float:
    """Seconds to read every matrix's bytes into memory (planar ones split), `threads` at once, as
    the upload threads do, with no device involved."""
    fd = f.fileno()
    step = 16 << 20
    jobs = []
    for _, qtype, _, _, offset, nbytes in mats:
        for start in range(0, nbytes, step):
            jobs.append((qtype.name, offset + start, min(step, nbytes - start)))
    local = threading.local()

    def run(job):
        name, offset, n = job
        if not hasattr(local, "out"):       # each thread's own 16 MiB, as a staging slot
            local.out = np.empty(step, np.uint8)
            local.bounce = np.empty(transfer.BOUNCE_BYTES, np.uint8)
        out = local.out
        if name not in PLANAR:
            transfer.read_exactly(fd, out[:n], offset)
            return
        head, size = PLANAR[name]
        bounce = local.bounce
        nb = n // size
        q = size - head
        dt = np.dtype([("s", f"V{head}"), ("q", f"V{q}")])
        per = bounce.size // size
        for i in range(0, nb, per):
            m = min(per, nb - i)
            transfer.read_exactly(fd, bounce[:m * size], offset + i * size)
            b = bounce[:m * size].view(dt)
            np.copyto(out[i * q:(i + m) * q].view(f"V{q}"), b["q"])
            np.copyto(out[nb * q + i * head:nb * q + (i + m) * head].view(f"V{head}"), b["s"])

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        list(ex.map(run, jobs))
    return time.perf_counter() - t0


def upload(device, f: GGUFFile, mats, from_file: bool) -> tuple[float, str]:
    """Seconds to allocate and upload every matrix (as a load does), and the transfer's stats."""
    t = device.transfer
    t.stats = transfer.UploadStats()
    weights = []
    t0 = time.perf_counter()
    for name, qtype, rows, cols, offset, _ in mats:
        raw = f.tensor_data(name)
        w, fill = allocate_qweight(device, raw, qtype, rows, cols, source=(f.fileno(), offset) if from_file else None)
        fill()
        weights.append(w)
    t.flush()
    seconds = time.perf_counter() - t0
    for w in weights:
        for c in w.chunks:
            c.buffer.close()
    return seconds, t.stats.line()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-r", type=int, default=2)
    ap.add_argument("--threads", default="1,2,4,8")
    ap.add_argument("--slots-mib", default="16")
    ap.add_argument("-dev", default=None)
    a = ap.parse_args()
    path = str(synthetic_model_path(a.model)) if a.model.startswith("synthetic:") else a.model
    f = GGUFFile(path)
    mats = matrices(f)
    total = sum(m[5] for m in mats)
    threads = [int(x) for x in a.threads.split(",")]
    print(f"{os.path.basename(path)}: {len(mats)} matrices, {total / 1e9:.2f} GB; {os.cpu_count()} CPUs", flush=True)
    for n in threads:
        for r in range(a.r):
            s = host_only(f, mats, n)
            print(f"host only (read + planar split into memory), {n} threads, rep {r}: {s:.2f} s = "
                  f"{total / s / 1e9:.2f} GB/s", flush=True)
    entries, _ = select(get_instance().devices, a.dev)
    (device,) = open_devices([entries[0]])
    print(f"device: {device.info.name}", flush=True)
    try:
        for r in range(a.r):      # a fresh map each time: a load's process faults the file's pages in
            s, stats = upload(device, GGUFFile(path), mats, from_file=False)
            print(f"upload from the map on one thread (LLAMAVK_UPLOAD=map), rep {r}: {s:.2f} s = "
                  f"{total / s / 1e9:.2f} GB/s; {stats}", flush=True)
        for mib in [int(x) for x in a.slots_mib.split(",")]:
            for n in threads:
                device.transfer.close()          # a fresh transfer with these settings
                device._transfer = None
                transfer.UPLOAD_THREADS, transfer.SLOT_BYTES = n, mib << 20
                for r in range(a.r):
                    s, stats = upload(device, f, mats, from_file=True)
                    print(f"upload from the file, {n} threads, {2 * n} slots of {mib} MiB, rep {r}: {s:.2f} s = "
                          f"{total / s / 1e9:.2f} GB/s; {stats}", flush=True)
    finally:
        device.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
