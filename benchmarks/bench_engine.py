#!/usr/bin/env python3
"""pp/tg throughput of one model on one device, with an optional per-kernel GPU profile.

    python3 benchmarks/bench_engine.py -m model.gguf|synthetic:PRESET [-p 512] [-n 128] [-r 3] [-d 0]
        [-ctk f16] [-ctv f16] [--profile]
"""

import argparse
import collections
import sys

import numpy as np

import llamavk
from llamavk.benchmark import decode, fill_depth, time_decode, time_prompt
from llamavk.synthetic import synthetic_model_path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-d", type=int, default=0)
    ap.add_argument("-dev", default=None)
    ap.add_argument("-ctk", default="f16", help="the KV cache's K type (llama.cpp's -ctk)")
    ap.add_argument("-ctv", default="f16", help="the KV cache's V type (llama.cpp's -ctv)")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    if a.model.startswith("synthetic:"):
        a.model = str(synthetic_model_path(a.model))
    rng = np.random.default_rng(0)
    # Timed without profiling: timestamps after every dispatch serialize the GPU. The per-kernel
    # breakdown comes from a second, profiled load afterwards.
    with llamavk.load(a.model, devices=a.dev, n_ctx=a.d + max(a.p, a.n) + 16, n_ubatch=a.p,
                      type_k=a.ctk, type_v=a.ctv) as m:
        rt = m.runtime
        print(f"{a.model}: {rt.device.info.name}, weights {rt.weight_bytes() / 1e9:.2f} GB, "
              f"load {m.timings.load_ms / 1e3:.1f} s (upload {rt.upload_seconds:.1f} s)", flush=True)
        time_prompt(m, a.p, rng)                      # warm-up: records both step shapes
        time_decode(m, 4, rng)
        for n_kv in (a.d + 1, a.d + a.n):             # and the one-token steps the timed decodes take
            rt.record_decode(n_kv)
        pp = [a.p / time_prompt(m, a.p, rng, a.d) for _ in range(a.r)]
        tg, host = [], []
        for _ in range(a.r):
            wall, h = time_decode(m, a.n, rng, a.d)
            tg.append(a.n / wall if a.n else 0.0)
            host.append(h / max(a.n, 1) * 1e6)
        bw = rt.weight_bytes() * np.mean(tg) / 1e12
        print(f"pp{a.p}{' @ d%d' % a.d if a.d else ''}: {np.mean(pp):9.1f} ± {np.std(pp, ddof=1):.1f} t/s")
        print(f"tg{a.n}{' @ d%d' % a.d if a.d else ''}: {np.mean(tg):9.1f} ± {np.std(tg, ddof=1):.1f} t/s   "
              f"(weights streamed at {bw:.2f} TB/s; host Python {np.mean(host):.0f} us/token)")
    if a.profile:
        with llamavk.load(a.model, devices=a.dev, n_ctx=a.d + max(a.p, a.n) + 16, n_ubatch=a.p, profile=True,
                         type_k=a.ctk, type_v=a.ctv) as m:
            rt = m.runtime
            fill_depth(m, a.d, rng)
            # Decode steps (clocks up) and two prompts use both parameter slots of each step shape:
            # every recording read below has run (reading a query pool that never ran would wait forever).
            decode(m, max(1, min(64, a.n)), rng, a.d)   # at least one: -n 0 still profiles it
            time_prompt(m, a.p, rng, a.d)
            time_prompt(m, a.p, rng, a.d)
            for n in (1, a.p):
                per = collections.defaultdict(float)
                # the one-token step the decode at depth started with
                for seq in rt.recordings.get(rt.recording_key("last", n, 0, a.d + 1), []):
                    for name, us in seq.profile_results():
                        per[name] += us
                if not per:
                    continue
                total = sum(per.values())
                print(f"profile: {n}-token step, {total:.0f} us (GPU timestamps after every dispatch)")
                for name, us in sorted(per.items(), key=lambda kv: -kv[1])[:16]:
                    print(f"   {name:44s} {us:9.1f} us  {100 * us / total:5.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
