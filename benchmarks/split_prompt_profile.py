#!/usr/bin/env python3
"""Where a split prompt step's GPU time goes: per device, serialized kernel time of a 512-token
prompt (GPU timestamps after every dispatch), top kernels.

    python3 benchmarks/split_prompt_profile.py MODEL tensor,graph Vulkan0,Vulkan1
"""

import collections, sys
import numpy as np
import llamavk
model, modes, dev = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
n = 512
for mode in modes:
    with llamavk.load(model, devices=dev, split_mode=mode, n_ctx=n + 80, n_ubatch=n, profile=True) as m:
        rng = np.random.default_rng(0)
        for _ in range(3):
            m._eval([int(t) for t in rng.integers(0, m.config.n_vocab, n)], 0, False, short_ok=False)
        for sub in getattr(m.runtime, "runtimes", [m.runtime]):
            per = collections.Counter()
            for key, segs in sub.recordings.items():
                if key[1] != n:
                    continue
                for seg in segs:
                    for name, us in seg.profile_results():
                        per[name.split()[0]] += us
            tot = sum(per.values())
            print(f"{mode} {sub.device.name}: {tot:.0f} us serialized", flush=True)
            for name, us in per.most_common(14):
                print(f"   {name:40s} {us:9.1f} {100*us/tot:5.1f}%")
