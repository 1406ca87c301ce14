"""SplitRuntime: one model over several devices, with DeviceRuntime's interface.

Each device runs its own DeviceRuntime over its graph from the split plan (weights, KV cache,
recordings, replay); exchange ops in those graphs meet in shared host memory (split/comm.py). Per
step the host writes every device's parameters, submits every device's recording and waits; with
the "relay" sync it submits round by round instead. With the "spin" sync, micro-batches of a
prompt are pipelined: micro-batch u + 1 is queued on every device before u has finished, so in
layer mode device 0 works on u + 1 while device 1 still works on u.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import LlamavkError
from ..kernels import matmul
from ..runtime import SLOTS, SPIN_SECONDS, DeviceRuntime
from .comm import DeviceComm, SharedExchangeMemory
from .exchange import PART_BYTES


class SplitRuntime:
    def __init__(self, model_file, devices, plans: dict, n_ctx: int, n_ubatch: int, sync: str,
                 profile: bool = False):
        """plans: graph key -> DeviceGraphs (split/base.py), all over the same devices."""
        self.devices = devices
        self.plans = plans
        self.sync = sync
        self.cfg = model_file.config
        slot_bytes = max(dg.put_bytes_per_token for dg in plans.values()) * n_ubatch
        self.shared = SharedExchangeMemory(devices, slot_bytes, sync)
        self.runtimes: list[DeviceRuntime] = []
        t0 = time.perf_counter()
        for i, dev in enumerate(devices):
            rt = DeviceRuntime(model_file, dev, n_ctx, n_ubatch, {k: dg.graphs[i] for k, dg in plans.items()},
                               profile=profile)
            rt.comm = DeviceComm(self.shared, i, rt.kc)
            self.runtimes.append(rt)
        self.upload_seconds = time.perf_counter() - t0
        self.n_ctx, self.n_ubatch = n_ctx, n_ubatch
        self.n_ubatch_all = min(rt.n_ubatch_all for rt in self.runtimes)
        self.logits_parts = plans["last"].logits_parts
        # exchange counters of micro-batch u start at u * stride (kernels compare >=)
        self.counter_stride = max(len(dg.exchanges) for dg in plans.values()) + 1
        self.host_seconds = 0.0
        self.device = devices[0]

    # -- execution -----------------------------------------------------------------------------
    def _submit(self, key: str, tokens, n_past: int, slot: int, base: int) -> list:
        """Queue one micro-batch on every device; returns [(runtime, timeline value)] to wait for."""
        segs = [rt.prepare(key, tokens, n_past, slot, base) for rt in self.runtimes]
        if self.sync == "spin":
            return [(rt, s[0].submit()) for rt, s in zip(self.runtimes, segs)]
        # relay: round r on every device, wait for all of it, then round r + 1
        for r in range(len(segs[0])):
            pending = [(rt, s[r].submit()) for rt, s in zip(self.runtimes, segs) if not s[r].empty]
            if r + 1 < len(segs[0]):
                self._wait(pending, len(tokens))
        return pending

    def _wait(self, pending, n_tokens: int) -> None:
        for rt, value in pending:
            if n_tokens <= matmul.MATVEC_MAX_TOKENS:
                rt.device.timeline.wait_spinning(value, SPIN_SECONDS)
            else:
                rt.device.timeline.wait(value)
        stuck = self.shared.timed_out()
        if stuck:
            i, e = stuck[0]
            raise LlamavkError(f"{self.devices[i].name}: gave up waiting for its peers at exchange {e} "
                               f"(a device stopped responding, or the devices cannot run concurrently: "
                               f"try LLAMAVK_SPLIT_SYNC=relay)")

    def run_batch(self, key: str, tokens, n_past: int) -> int:
        n = len(tokens)
        self.runtimes[0].check_batch(key, n, n_past)
        t0 = time.perf_counter()
        self.shared.reset()
        pending = self._submit(key, tokens, n_past, 0, 0)
        self.host_seconds += time.perf_counter() - t0
        self._wait(pending, n)
        return n if key == "all" else 1

    def eval(self, key: str, tokens, n_past: int) -> np.ndarray:
        ub = self.n_ubatch_all if key == "all" else self.n_ubatch
        batches = [(i, tokens[i:i + ub]) for i in range(0, len(tokens), ub)]
        self.runtimes[0].check_batch(key, len(batches[-1][1]), n_past + batches[-1][0])
        rows: list[np.ndarray] = []
        if self.sync != "spin" or len(batches) == 1:
            for i, chunk in batches:
                self.run_batch(key, chunk, n_past + i)
                if key == "all":
                    rows.append(self.logits(len(chunk)))
            return np.concatenate(rows) if key == "all" else self.logits(1)[0]
        self.shared.reset()
        inflight: list = []                         # (slot, n, pending) per micro-batch, in order
        for u, (i, chunk) in enumerate(batches):
            if len(inflight) == SLOTS:              # both slots busy: retire the oldest
                slot, n, pending = inflight.pop(0)
                self._wait(pending, n)
                if key == "all":
                    rows.append(self.logits(n, slot))
            slot = u % SLOTS
            inflight.append((slot, len(chunk), self._submit(key, chunk, n_past + i, slot, u * self.counter_stride)))
        for slot, n, pending in inflight:
            self._wait(pending, n)
            if key == "all":
                rows.append(self.logits(n, slot))
        return np.concatenate(rows) if key == "all" else self.logits(1, inflight[-1][0])[0]

    def logits(self, rows: int, slot: int = 0) -> np.ndarray:
        """Logits assembled from the devices that hold parts of the output (a copy)."""
        out = np.empty((rows, self.cfg.n_vocab), np.float32)
        for d, c0, c1 in self.logits_parts:
            out[:, c0:c1] = self.runtimes[d].logits(rows, slot)
        return out

    # -- reporting -----------------------------------------------------------------------------
    def weight_bytes(self) -> int:
        return sum(rt.weight_bytes() for rt in self.runtimes)

    def describe(self) -> list[str]:
        """What each device holds (-v), and the host-memory traffic of one decoded token."""
        lines = []
        for rt, holds in zip(self.runtimes, self.plans["last"].holds):
            lines.append(f"  {rt.device.name} ({rt.device.info.name}): {', '.join(holds) or 'nothing'}; "
                         f"weights {rt.weight_bytes() / 2**20:.1f} MiB, KV cache {rt.kv_bytes() / 2**20:.1f} MiB")
        written, read, points = traffic_per_token(self.runtimes)
        lines.append(f"  per token: {points} exchange points, {written / 1024:.1f} KiB written to and "
                     f"{read / 1024:.1f} KiB read from shared host memory ({self.sync} sync)")
        return lines

    def close(self) -> None:
        for dev in self.devices:          # nothing may still use the shared memory when it goes
            if dev.handle is not None:
                dev.wait_idle()
        for rt in self.runtimes:
            rt.close()
        self.shared.close()


def traffic_per_token(runtimes) -> tuple[int, int, int]:
    """Bytes written into / read from the shared host memory by all devices, and exchange points,
    for one decoded token (the fused one-token graphs)."""
    written = read = 0
    points = set()
    for rt in runtimes:
        for op in rt.fused["last"].ops:
            a = op.attrs
            if op.kind == "put":
                written += op.inputs[0].width * PART_BYTES[a["dtype"]]
            elif op.kind == "get":
                c0, c1 = a["cols"] or (0, op.out.width)
                read += 4 * (c1 - c0)
            elif op.kind == "reduce":
                read += bin(a["mask"]).count("1") * op.inputs[0].width * PART_BYTES[a["dtype"]]
            elif op.kind == "sync":
                points.add(a["exchange"])
    return written, read, len(points)
