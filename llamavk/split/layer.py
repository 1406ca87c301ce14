"""-sm layer: contiguous blocks of layers (and their KV cache) per device.

The token embedding goes with the first block, the output norm and matrix with the last. The
residual stream crosses once per device boundary; nothing else does. The prompt's micro-batches
are pipelined (split/runtime.py), so every device works at once.

A decode step runs one device at a time. The devices whose blocks come later wait for their turn
spinning (their step is queued with everyone's), but one that has done its block would idle until
the next step: on 4 H200s the first device then sat idle ~70% of the time and its SM clock fell from
1,980 to ~1,300 MHz, so its block ran slower (the 31.5B: -8% against one GPU, while 2 GPUs, each idle
half the time, kept their clocks). So every device whose block is done also waits at the hand-over
into the last device: each GPU is busy (working or spinning) at least (n - 1) / n of the step.
"""

from __future__ import annotations

import os

from .base import DeviceGraphs, partition
from .exchange import transfer


def idle_wait() -> bool:
    """LLAMAVK_LAYER_IDLE_WAIT=0: a device whose block is done does not wait (A/B)."""
    return os.environ.get("LLAMAVK_LAYER_IDLE_WAIT", "1") != "0"


def plan(graph, shares: list[float], opts, blocks=None) -> DeviceGraphs:
    cfg = graph.config
    n = len(shares)
    dg = DeviceGraphs(graph, n)
    dg.long_waits = True
    # a one-token step's hop is one exchange_reduce dispatch (split/matvec_steps.py), and the products
    # after it are chained to it: their weight loads go out while the device waits for its turn
    dg.overlap = True
    linger = idle_wait()
    ranges = partition(cfg.n_layer, shares)
    owner = {layer: d for d, (a, b) in enumerate(ranges) for layer in range(a, b)}
    first, last = owner[0], owner[cfg.n_layer - 1]
    home = {}                                   # model activation -> device that computed it
    seen_layer = False
    for op in graph.ops:
        if op.layer is not None:
            seen_layer = True
            d = owner[op.layer]
        else:
            d = last if seen_layer else first
        for t in op.reads():
            if t.kind == "act" and not dg.has(d, t):
                src = home[t]
                done = [e for e in range(n) if linger and d == last and ranges[e][1] <= ranges[src][0]]
                dg.bind(d, t, transfer(dg, src, dg.tensor(src, t), [d], op.layer, idle=done)[d])
        dg.place(d, op)
        if op.out is not None:
            home[op.out] = d
    dg.set_logits(last, dg.tensor(last, graph.logits))
    dg.logits_parts = [(last, 0, cfg.n_vocab)]
    for d, (a, b) in enumerate(ranges):
        held = [f"layers {a}-{b - 1}" if b > a else "no layers"]
        if d == first:
            held.append("token embedding")
        if d == last:
            held.append("output")
        dg.holds[d] = held
    return dg
