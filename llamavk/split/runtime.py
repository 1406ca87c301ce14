"""SplitRuntime: one model over several devices, with DeviceRuntime's interface.

Each device runs its own DeviceRuntime over its graph from the split plan (weights, KV cache,
recordings, replay); exchange ops in those graphs meet in shared host memory (split/comm.py). Per
step the host writes every device's parameters, submits every device's recording and waits (decode
steps with the "spin" sync), or submits round by round between exchange points (host relay). In
layer mode a prompt's micro-batches are pipelined across the rounds: device 0 works on micro-batch
u + 1 while device 1 works on u.
"""

from __future__ import annotations

import time

import numpy as np

from ..errors import LlamavkError
from ..kernels import matmul
from ..kv_cache import KVTypes
from ..runtime import LARGE_BATCH, SLOTS, SPIN_SECONDS, DeviceRuntime
from . import clock, matvec_steps
from .comm import SPIN_MAX_TOKENS, DeviceComm, SharedExchangeMemory
from .exchange import PART_BYTES


class SplitRuntime:
    def __init__(self, model_file, devices, plans: dict, n_ctx: int, n_ubatch: int, sync: str,
                 profile: bool = False, progress=None, kv_types: KVTypes = KVTypes()):
        """plans: graph key -> DeviceGraphs (split/base.py), all over the same devices. kv_types: the KV
        cache types (each device holds its layers' or heads' cache of these types)."""
        self.devices = devices
        self.plans = plans
        self.cfg = model_file.config
        per_token = self.put_bytes_per_token = max(dg.put_bytes_per_token for dg in plans.values())
        n_exchanges = max(len(dg.exchanges) for dg in plans.values())
        profile_clock = clock.enabled()
        if profile_clock:
            clock.check_devices(devices)     # before anything is allocated
        self.sync = sync
        self.shared = SharedExchangeMemory(devices, per_token * n_ubatch, per_token * SPIN_MAX_TOKENS, n_exchanges,
                                           sync, long_waits=any(dg.long_waits for dg in plans.values()))
        self.runtimes: list[DeviceRuntime] = []
        overlap = any(dg.overlap for dg in plans.values())
        step_pass = lambda g, one_token: matvec_steps.rewrite(g, one_token, sync == "spin", overlap)  # noqa: E731
        t0 = time.perf_counter()
        for i, dev in enumerate(devices):
            rt = DeviceRuntime(model_file, dev, n_ctx, n_ubatch, {k: dg.graphs[i] for k, dg in plans.items()},
                               profile=profile, progress=progress, step_pass=step_pass, kv_types=kv_types)
            rt.comm = DeviceComm(self.shared, i, rt.kc)
            self.runtimes.append(rt)
            if profile_clock:   # the split timeline's stamps (split/clock.py), before any recording
                rt.clock = clock.ClockStamps(dev, n_exchanges)
        self.upload_seconds = time.perf_counter() - t0
        self.n_ctx, self.n_ubatch = n_ctx, n_ubatch
        self.n_ubatch_all = min(rt.n_ubatch_all for rt in self.runtimes)
        self.logits_parts = plans["last"].logits_parts
        self.host_seconds = 0.0
        self.device = devices[0]

    def prerecord(self) -> None:
        """Record every device's one-token step now (DeviceRuntime.prerecord)."""
        for rt in self.runtimes:
            rt.prerecord()

    def record_decode(self, n_kv: int) -> None:
        """Record every device's one-token step for n_kv (DeviceRuntime.record_decode)."""
        for rt in self.runtimes:
            rt.record_decode(n_kv)

    # -- execution -----------------------------------------------------------------------------
    def _submit(self, key: str, tokens, n_past: int, slot: int = 0, seq_len: int = 0) -> list:
        """Run one micro-batch on every device; returns [(runtime, timeline value)] still to wait for.
        One command buffer per device (spin): all queued at once. Several (relay): round r on every
        device, wait for all of it, then round r + 1."""
        base = self.shared.next_base()
        for rt in self.runtimes:
            if rt.clock is not None and len(tokens) == 1:
                rt.clock.reset()        # every device idle: the last step was waited for
        segs = [rt.prepare(key, tokens, n_past, slot, base, seq_len) for rt in self.runtimes]
        exchanges = self._exchanges(key, len(tokens))
        for r in range(len(segs[0])):
            pending = [(rt, s[r].submit()) for rt, s in zip(self.runtimes, segs) if not s[r].empty]
            if r + 1 < len(segs[0]):
                self._wait(pending, len(tokens))
                self.shared.publish(r, slot, exchanges[r].producers, len(tokens) * self.put_bytes_per_token)
        return pending

    def _exchanges(self, key: str, n_tokens: int):
        """The exchange points of the graph variant a step of n_tokens runs (runtime.graph_for)."""
        large = f"{key}@large"
        return self.plans[large if n_tokens > LARGE_BATCH and large in self.plans else key].exchanges

    def _wait(self, pending, n_tokens: int) -> None:
        for rt, value in pending:
            if n_tokens <= matmul.MATVEC_MAX_TOKENS:
                rt.device.timeline.wait_spinning(value, SPIN_SECONDS)
            else:
                rt.device.timeline.wait(value)
        stuck = self.shared.timed_out()
        if stuck:
            self.shared.reset()
            i, e = stuck[0]
            raise LlamavkError(f"{self.devices[i].name}: gave up waiting for its peers at exchange {e} "
                               f"(a device stopped responding, or the devices cannot run concurrently: "
                               f"try LLAMAVK_SPLIT_SYNC=relay)")

    def run_batch(self, key: str, tokens, n_past: int, seq_len: int = 0) -> int:
        n = len(tokens)
        self.runtimes[0].check_batch(key, n, n_past)
        t0 = time.perf_counter()
        pending = self._submit(key, tokens, n_past, seq_len=seq_len)
        self.host_seconds += time.perf_counter() - t0
        self._wait(pending, n)
        return n if key == "all" else 1

    def eval(self, key: str, tokens, n_past: int, seq_len: int = 0, short_ok: bool = False) -> np.ndarray:
        # short_ok (DeviceRuntime.eval): split steps always take the prompt's own micro-batches
        ub = self.n_ubatch_all if key == "all" else self.n_ubatch
        batches = [(n_past + i, tokens[i:i + ub]) for i in range(0, len(tokens), ub)]
        self.runtimes[0].check_batch(key, len(batches[-1][1]), batches[-1][0])
        if len(batches) > 1 and self._pipelined(key, batches):
            rows = self._eval_pipelined(key, batches, seq_len)
        else:
            rows = []
            for pos, chunk in batches:
                self.run_batch(key, chunk, pos, seq_len)
                if key == "all":
                    rows.append(self.logits(len(chunk)))
            rows = rows or [self.logits(1)]
        return np.concatenate(rows) if key == "all" else rows[-1][-1]

    def _pipelined(self, key: str, batches) -> bool:
        """Micro-batches can overlap when each device works in one round only (layer mode): then
        device d runs micro-batch u + 1 while device d + 1 runs u."""
        for pos, chunk in batches:
            for rt in self.runtimes:
                segs = rt.sequence(key, len(chunk), 0)
                if sum(not s.empty for s in segs) > 1 or len(segs) == 1:
                    return False
        return True

    def _eval_pipelined(self, key: str, batches, seq_len: int = 0) -> list[np.ndarray]:
        """Round t: every device d runs the micro-batch u whose round on d is t (u = t - round of
        d). Two slots of parameters, exchange regions and logits alternate between micro-batches."""
        rounds = [next((r for r, s in enumerate(rt.sequence(key, len(batches[0][1]), 0)) if not s.empty), None)
                  for rt in self.runtimes]          # None: a device with nothing to do (no layers)
        holder = self.logits_parts[0][0]
        out: dict[int, np.ndarray] = {}
        base = self.shared.next_base()
        exchanges = self._exchanges(key, len(batches[0][1]))
        for t in range(len(batches) + max(r for r in rounds if r is not None)):
            pending = []
            for rt, r in zip(self.runtimes, rounds):
                u = t - r if r is not None else -1
                if 0 <= u < len(batches):
                    pos, chunk = batches[u]
                    segs = rt.prepare(key, chunk, pos, u % SLOTS, base, seq_len)
                    pending.append((rt, segs[r].submit()))
            self._wait(pending, len(batches[0][1]))
            for d, r in enumerate(rounds):          # staging: hand this round's outputs on
                u = t - r if r is not None else -1
                if 0 <= u < len(batches) and r < len(exchanges):
                    self.shared.publish(r, u % SLOTS, exchanges[r].producers,
                                        len(batches[u][1]) * self.put_bytes_per_token)
            u = t - rounds[holder]
            if 0 <= u < len(batches) and (key == "all" or u == len(batches) - 1):
                out[u] = self.logits(len(batches[u][1]) if key == "all" else 1, u % SLOTS)
        return [out[u] for u in sorted(out)]

    def logits(self, rows: int, slot: int = 0) -> np.ndarray:
        """Logits assembled from the devices that hold parts of the output (a copy)."""
        out = np.empty((rows, self.cfg.n_vocab), np.float32)
        for d, c0, c1 in self.logits_parts:
            out[:, c0:c1] = self.runtimes[d].logits(rows, slot)
        return out

    # -- reporting -----------------------------------------------------------------------------
    def clock_timelines(self) -> list:
        """Per device, the exchange points of the last one-token step with their clock stamps
        (split/clock.py; LLAMAVK_CLOCK_PROFILE=1 at load): a list of clock.Point, or None where the
        step straddled a wrap of the 32-bit clock."""
        if any(rt.clock is None for rt in self.runtimes):
            raise LlamavkError(f"the split timeline needs {clock.ENV}=1 when the model is loaded")
        return [clock.Timeline.of(rt.clock.read(), rt.clock.layers) for rt in self.runtimes]

    def weight_bytes(self, experts_only: bool = False) -> int:
        return sum(rt.weight_bytes(experts_only) for rt in self.runtimes)

    def state_bytes(self) -> int:
        return sum(rt.state_bytes() for rt in self.runtimes)

    def kv_bytes(self) -> int:
        return sum(rt.kv_bytes() for rt in self.runtimes)

    @property
    def state_pos(self) -> int:
        return max(rt.state_pos for rt in self.runtimes)

    def describe(self) -> list[str]:
        """What each device holds (-v), and the host-memory traffic of one decoded token."""
        lines = []
        for rt, holds in zip(self.runtimes, self.plans["last"].holds):
            experts = rt.weight_bytes(experts_only=True)
            of_which = f" ({experts / 2**20:.1f} MiB of experts)" if self.cfg.n_expert else ""
            lines.append(f"  {rt.device.name} ({rt.device.info.name}): {', '.join(holds) or 'nothing'}; "
                         f"weights {rt.weight_bytes() / 2**20:.1f} MiB{of_which}, "
                         f"KV cache {rt.kv_bytes() / 2**20:.1f} MiB"
                         + (f", recurrent state {rt.state_bytes() / 2**20:.1f} MiB" if rt.ssm else ""))
        written, read, points = traffic_per_token(self.runtimes)
        lines.append(f"  per token: {points} exchange points, {written / 1024:.1f} KiB written to and "
                     f"{read / 1024:.1f} KiB read from shared host memory ({self.sync} sync)")
        return lines

    def close(self) -> None:
        for dev in self.devices:          # nothing may still use the shared memory when it goes
            if dev.handle is not None:
                dev.wait_idle()
        for rt in self.runtimes:
            if rt.clock is not None:
                rt.clock.close()
            if rt.comm is not None:
                rt.comm.close()
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
            elif op.kind in ("reduce", "sync_reduce"):
                read += bin(a["mask"]).count("1") * a["n_cols"] * PART_BYTES[a["dtype"]]
            if op.kind in ("sync", "sync_reduce"):
                points.add(a["exchange"])
    return written, read, len(points)
