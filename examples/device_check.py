#!/usr/bin/env python3
"""Self-test of every selected Vulkan device: record a kernel once, replay it with new parameters.

    python3 examples/device_check.py                 # the devices llamavk would choose
    python3 examples/device_check.py -dev Vulkan0,Vulkan1
Exit status 0 when every device computed the right answers.
"""

import argparse
import sys
import time

import numpy as np

from llamavk.devices import open_devices, select
from llamavk.vk import Buffer, CommandSequence, Kernel, get_instance


def check(device, n=1 << 20, replays=5) -> float:
    x = np.random.default_rng(0).standard_normal(n, dtype=np.float32)
    params, X = Buffer(device, 16, host_visible=True), Buffer(device, x.nbytes)
    Y = Buffer(device, x.nbytes, host_visible=True)
    X.write(x)
    seq = CommandSequence(device).begin()
    seq.dispatch(Kernel(device, "axpb_params", "rrw"), [params, X, Y], ((n + 63) // 64,))
    seq.end()
    worst = 0.0
    for step in range(replays):
        alpha, beta = 1.0 + step, -0.5 * step
        params.array(np.float32, 2)[:] = (alpha, beta)
        params.array(np.uint32, 1, offset=8)[0] = n
        seq.run()
        worst = max(worst, float(np.abs(Y.array(np.float32, n) - (np.float32(alpha) * x + np.float32(beta))).max()))
    t0 = time.perf_counter()
    for _ in range(100):
        seq.submit()
    device.wait_idle()
    return worst, (time.perf_counter() - t0) * 1e4


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-dev", "--device", default=None)
    args = ap.parse_args()
    entries, warnings = select(get_instance().devices, args.device)
    for w in warnings:
        print(w, file=sys.stderr)
    ok = True
    for dev in open_devices(entries):
        err, us = check(dev)
        good = err <= 1e-5
        ok &= good
        print(f"{dev.name}: {dev.info.name}: replay {'OK' if good else 'WRONG'} (5 replays, max error {err:.1e}; "
              f"{us:.1f} us per replay of a 1M-element kernel)")
        dev.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
