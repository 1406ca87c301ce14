"""The memory devices of a split share, and how exchange ops are recorded on each device.

Devices of different vendors share nothing but host RAM (SPEC §5). One host allocation, imported
into every device (VK_EXT_external_memory_host), holds every exchange's data in four regions, one
slot per device in each: region = 2 * (micro-batch slot) + (exchange parity). Consecutive exchanges
alternate, so a device can fill the next exchange while a slow peer still reads the previous one;
the two micro-batches in flight (pipelining) never share a region. A second allocation holds one counter per device.

Two ways to order the devices around an exchange point (`Sync`):
- "spin": the producer's command buffer publishes its counter, the consumer's spins on it (a
  one-thread kernel, bounded; kernels/collective.py). One command buffer per device and step;
  a few microseconds per exchange. Needs every device to run concurrently and to spin for as long
  as a peer may take: separate physical GPUs (any vendors, drivers).
- "relay": the step is cut at every exchange point into rounds of command buffers; the host waits
  for round r on every device before it submits round r + 1. Works everywhere (also two logical
  devices sharing one GPU, which need not run concurrently), tens of microseconds per exchange.
"""

from __future__ import annotations

import os

import numpy as np

from ..kernels import STEP_SYNC_BASE, VIEW_ALIGN, View, collective
from ..vk import Buffer, SharedHostMemory

SYNC_MODES = ("spin", "relay")
ENV_SYNC = "LLAMAVK_SPLIT_SYNC"
# Polls before a spinning exchange gives up (then: a clear error). A GPU poll of host memory takes
# about a microsecond, so this is minutes: longer than any honest wait for a peer's prompt work.
MAX_SPINS = int(os.environ.get("LLAMAVK_SPIN_LIMIT", str(1 << 28)))


def _align(n: int) -> int:
    return (n + VIEW_ALIGN - 1) // VIEW_ALIGN * VIEW_ALIGN


def choose_sync(devices) -> str:
    """spin where every device is its own physical GPU (they run concurrently), else relay;
    LLAMAVK_SPLIT_SYNC=spin|relay overrides.

    Not on software devices: llvmpipe ends a shader's loops after ~65k iterations in all (about a
    millisecond of spinning), and its logical devices share one pool of compute threads."""
    forced = os.environ.get(ENV_SYNC)
    if forced in SYNC_MODES:
        return forced
    uuids = [d.info.uuid for d in devices]
    distinct = len(set(uuids)) == len(uuids) and all(int(u, 16) != 0 for u in uuids)
    return "spin" if distinct and not any(d.info.is_cpu for d in devices) else "relay"


class SharedExchangeMemory:
    """The host memory of a split: exchange slots, counters, and a status word per device."""

    def __init__(self, devices, slot_bytes: int, sync: str):
        self.devices = devices
        self.n = len(devices)
        self.sync = sync
        self.slot_bytes = _align(max(slot_bytes, 4))
        self.data = SharedHostMemory(4 * self.n * self.slot_bytes, devices)
        self.flags = SharedHostMemory(self.n * collective.FLAG_STRIDE * 4, devices)
        self.flag_words = self.flags.array(np.uint32)
        self.status = [Buffer(d, 16, host_visible=True) for d in devices]
        self.status_words = [s.array(np.uint32) for s in self.status]
        self.reset()

    def reset(self) -> None:
        """Zero the counters and status words; only while every device is idle."""
        self.flag_words[:] = 0
        for w in self.status_words:
            w[:] = 0

    def timed_out(self) -> list[tuple[int, int]]:
        """(device index, exchange) of every device whose spin gave up."""
        return [(i, int(w[1])) for i, w in enumerate(self.status_words) if w[0] == 2]

    def region(self, device_index: int, exchange: int, slot: int) -> View:
        buf = self.data.buffer(self.devices[device_index])
        return View(buf, (2 * slot + exchange % 2) * self.n * self.slot_bytes, self.n * self.slot_bytes)

    def close(self) -> None:
        self.data.close()
        self.flags.close()


class DeviceComm:
    """Records exchange ops (split/exchange.py) into one device's command buffers."""

    def __init__(self, shared: SharedExchangeMemory, index: int, kc):
        self.shared = shared
        self.me = index
        self.device = shared.devices[index]
        self.kc = kc
        self.slot = 0

    def _slot(self, exchange: int, owner: int) -> tuple[Buffer, int]:
        region = self.shared.region(self.me, exchange, self.slot)
        return region.buffer, region.offset + owner * self.shared.slot_bytes

    def record(self, seq, op, n_tokens: int, act, step: View, slot: int) -> bool:
        """Record one exchange op; True when the command buffer must end here (relay cut)."""
        k, a = op.kind, op.attrs
        self.slot = slot
        if k == "sync":
            if self.shared.sync == "relay":
                return True
            if a["signal"] or a["wait_mask"]:
                flags = View.whole(self.shared.flags.buffer(self.device))
                collective.exchange_sync(seq, self.kc, flags, View.whole(self.shared.status[self.me]), step,
                                         self.me, a["exchange"], a["signal"], a["wait_mask"], STEP_SYNC_BASE,
                                         MAX_SPINS)
            return False
        if k == "put":
            x = act(op.inputs[0])
            buf, off = self._slot(a["exchange"], self.me)
            n = n_tokens * op.inputs[0].width
            if a["dtype"] == "f32":
                seq.copy(x.buffer, buf, 4 * n, x.offset, off + 4 * n_tokens * a["at"])
            else:
                size = collective.PART_BYTES[a["dtype"]] * n
                collective.convert(seq, self.kc, x, View(buf, off, _align(size)), a["dtype"], n)
        elif k == "get":
            buf, off = self._slot(a["exchange"], a["src"])
            self._copy_columns(seq, buf, off + 4 * n_tokens * a["at"], act(op.out), op.out.width, a["cols"], n_tokens)
        elif k == "copy_cols":
            x = act(op.inputs[0])
            self._copy_columns(seq, x.buffer, x.offset, act(op.out), op.out.width, a["cols"], n_tokens)
        elif k == "reduce":
            self._reduce(seq, op, n_tokens, act)
        return False

    @staticmethod
    def _copy_columns(seq, src, src_off: int, dst: View, width: int, cols, n_tokens: int) -> None:
        """src holds [n_tokens][c1 - c0] contiguous floats; they go to columns c0..c1 of dst."""
        c0, c1 = cols if cols is not None else (0, width)
        w = c1 - c0
        if w == width:
            seq.copy(src, dst.buffer, 4 * n_tokens * w, src_off, dst.offset)
            return
        regions = [(src_off + 4 * t * w, dst.offset + 4 * (t * width + c0), 4 * w) for t in range(n_tokens)]
        seq.copy_regions(src, dst.buffer, regions)

    def _reduce(self, seq, op, n_tokens: int, act) -> None:
        a = op.attrs
        base = op.inputs[0]
        width = base.width
        dtype = a["dtype"]
        parts = self.shared.region(self.me, a["exchange"], self.slot)
        part_stride = self.shared.slot_bytes // collective.PART_BYTES[dtype]
        if a["to_exchange"] is None:
            collective.reduce_sum(seq, self.kc, parts, dtype, a["mask"], part_stride, act(op.out), n_tokens, width,
                                  in_stride=width, base=act(base), base_stride=width)
        else:       # ring: my column chunk, summed, into my slot of the next exchange
            c0, c1 = a["cols"]
            buf, off = self._slot(a["to_exchange"], self.me)
            out = View(buf, off, self.shared.slot_bytes)
            collective.reduce_sum(seq, self.kc, parts, dtype, a["mask"], part_stride, out, n_tokens, c1 - c0,
                                  in_stride=width, in_c0=c0, base=act(base), base_stride=width, base_c0=c0)
