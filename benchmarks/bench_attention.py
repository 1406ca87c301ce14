#!/usr/bin/env python3
"""Decode attention alone on the first device: a chain of dependent one-token attention dispatches
(q and out swap roles, so each waits for the previous one), 7.2B shapes by default, per n_kv and per
minimum split chunk; a chain of one-workgroup rms_norm stages first (the floor of any stage).
Prints host wall time per stage over whole replays (no timestamps, which add their own cost).

    python3 benchmarks/bench_attention.py [--nkv 16,64,128,160,256,1024,4096] [--chunks 32,64,128]
                                        [--heads 32/8] [--head-dim 128] [--n-ctx 4224]
                                        [-ctk f16] [-ctv f16]

The caches hold random bytes of their type (quantized blocks' scales kept finite): timing only.
"""

import argparse
import os
import time

import numpy as np

from llamavk.devices import open_devices, select
from llamavk.kernels import KernelCache
from llamavk.kernels import attention as attn
from llamavk.kernels import norm
from llamavk.kv_cache import KVTypes, cache_bytes
from llamavk.vk import Buffer, CommandSequence, get_instance

STAGES = 192


def per_stage_us(dev, record, reps=20) -> float:
    seq = CommandSequence(dev).begin()
    record(seq)
    seq.end()
    for _ in range(5):   # clocks up
        seq.run()
    best = 1e9
    for _ in range(reps):
        t0 = time.perf_counter()
        seq.run()
        best = min(best, time.perf_counter() - t0)
    seq.close()
    return best / STAGES * 1e6


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nkv", default="16,64,128,160,256,1024,4096")
    ap.add_argument("--chunks", default="32,64,128", help="minimum positions per active split")
    ap.add_argument("--heads", default="32/8")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--n-ctx", type=int, default=4224)
    ap.add_argument("-ctk", "--cache-type-k", default="f16")
    ap.add_argument("-ctv", "--cache-type-v", default="f16")
    a = ap.parse_args()
    n_head, n_head_kv = map(int, a.heads.split("/"))
    hd, n_ctx = a.head_dim, a.n_ctx
    dev = open_devices(select(get_instance().devices)[0][:1])[0]
    kc = KernelCache(dev)
    rng = np.random.default_rng(0)
    qs = [Buffer(dev, 4 * n_head * hd) for _ in range(2)]
    for q in qs:
        q.write(rng.standard_normal(n_head * hd).astype(np.float32))
    kv_types = KVTypes(a.cache_type_k, a.cache_type_v)
    caches = []
    for name in (kv_types.k, kv_types.v):
        nbytes = cache_bytes(name, n_ctx, n_head_kv * hd)
        # f16 values in [-2, 2): every type's blocks then start with a finite scale (q8_0, q4_0: f16 d)
        halves = (rng.standard_normal(nbytes // 2) * 0.5).clip(-2, 2).astype(np.float16)
        caches.append(Buffer(dev, nbytes))
        caches[-1].write(halves)
    step = Buffer(dev, 32)

    def norms(seq):
        for s in range(STAGES):
            norm.rms_norm(seq, kc, qs[s % 2], qs[1 - s % 2], 1, n_head * hd, 1e-5)

    print(f"{dev.info.name}: K/V {kv_types.k}/{kv_types.v}, {STAGES} stages; "
          f"rms_norm (one workgroup) {per_stage_us(dev, norms):.2f} us per stage")
    chunks = [int(c) for c in a.chunks.split(",")]
    print("n_kv    " + "".join(f"  >= {c:4d} per split" for c in chunks) + "   (us per attention stage)")
    start = attn.long_context_from(kc, 1, n_head, n_head_kv, hd, n_ctx)
    for n_kv in (int(v) for v in a.nkv.split(",")):
        if n_kv > n_ctx:
            continue
        long_context = start is not None and n_kv > start   # the decode form the engine's step takes there
        step.write(np.array([n_kv - 1, 1, n_kv, 0, 0, 0, 0, 0], np.uint32))
        line = f"{n_kv:6d}  "
        for chunk in chunks:
            os.environ["LLAMAVK_ATTN_MIN_CHUNK"] = str(chunk)   # the engine's plan for that minimum
            n_splits, _ = attn.split_plan(kc, n_ctx, n_head_kv, 1, attn.DEC_BLOCK)

            def chain(seq):
                for s in range(STAGES):
                    attn.attention(seq, kc, qs[s % 2], caches[0], caches[1], qs[1 - s % 2], step, 1, n_head,
                                   n_head_kv, hd, n_ctx, n_splits=n_splits, min_chunk=chunk, kv_types=kv_types,
                                   long_context=long_context)
            line += f"  {per_stage_us(dev, chain):17.2f}"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
