"""The memory devices of a split share, and how exchange ops are recorded on each device.

Devices of different vendors share nothing but host RAM (SPEC §5). One host allocation, imported
into every device (VK_EXT_external_memory_host), holds every exchange's data:
- relay steps: four regions, one slot per device in each: region = 2 * (micro-batch slot) +
  (exchange parity). Consecutive exchanges alternate, so a device can fill the next exchange while
  a slow peer still reads the previous one; two micro-batches in flight never share a region.
- spin steps (decode): one region per exchange point, never reused within the step, because a GPU
  does not re-read host memory it has read during a submission (docs/KERNELS.md).
A second allocation holds the exchange points' counters, each written to many cache lines.

Devices without VK_EXT_external_memory_host get staging copies instead (HostMirrors): a host-
visible buffer each, kept in step by the host relay.

Two ways to order the devices around an exchange point:
- "spin" (decode steps): the producer's command buffer publishes its counter, the consumer's
  spins on it (kernels/collective.py, shaders/exchange_sync.comp, bounded). One command buffer per
  device and step; microseconds per exchange. Needs every device to run concurrently: separate
  physical GPUs (any vendors, drivers).
- "relay": the step is cut at every exchange point into rounds of command buffers; the host waits
  for round r on every device before it submits round r + 1. Works everywhere (also two logical
  devices sharing one GPU, which need not run concurrently), tens of microseconds per exchange.
"""

from __future__ import annotations

import os

import numpy as np

from ..kernels import STEP_SYNC_BASE, VIEW_ALIGN, View, collective, matmul
from ..vk import Buffer, CommandSequence, SharedHostMemory

SYNC_MODES = ("spin", "relay")
ENV_SYNC = "LLAMAVK_SPLIT_SYNC"
ENV_HOST_IMPORT = "LLAMAVK_HOST_IMPORT"     # =0: use staging copies even where import works (tests)
SPIN_MAX_TOKENS = 1       # decode steps spin; prompt batches (long waits, big slots) relay


def _align(n: int) -> int:
    return (n + VIEW_ALIGN - 1) // VIEW_ALIGN * VIEW_ALIGN


def choose_sync(devices) -> str:
    """spin where every device is its own physical GPU (they run concurrently), else relay;
    LLAMAVK_SPLIT_SYNC=spin|relay overrides.

    Not on software devices: llvmpipe ends a shader's loops after ~65k iterations in all (about a
    millisecond of spinning), and its logical devices share one pool of compute threads."""
    if not can_share_host_memory(devices):
        return "relay"
    forced = os.environ.get(ENV_SYNC)
    if forced in SYNC_MODES:
        return forced
    uuids = [d.info.uuid for d in devices]
    distinct = len(set(uuids)) == len(uuids) and all(int(u, 16) != 0 for u in uuids)
    return "spin" if distinct and not any(d.info.is_cpu for d in devices) else "relay"


def can_share_host_memory(devices) -> bool:
    return os.environ.get(ENV_HOST_IMPORT) != "0" and all(d.info.external_memory_host for d in devices)


class HostMirrors:
    """Staging fallback for devices that cannot import host memory: each device gets its own
    host-visible buffer, and the host copies an exchange's slots from its producers' buffers into
    every other device's after the producers' round (relay sync only)."""

    def __init__(self, size: int, devices):
        self.size = size
        self._buffers = {id(d): Buffer(d, size, host_visible=True) for d in devices}
        self._arrays = {k: b.array(np.uint8) for k, b in self._buffers.items()}

    def buffer(self, device) -> Buffer:
        return self._buffers[id(device)]

    def copy(self, src_device, offset: int, nbytes: int) -> None:
        """src_device's bytes [offset, offset + nbytes) into every other device's buffer."""
        src = self._arrays[id(src_device)][offset:offset + nbytes]
        for key, arr in self._arrays.items():
            if key != id(src_device):
                arr[offset:offset + nbytes] = src

    def close(self) -> None:
        for b in self._buffers.values():
            b.close()


class SharedExchangeMemory:
    """The host memory of a split: exchange slots, counters, and a status word per device.

    Relay steps: four regions of one slot per device, reused (each round is its own submission,
    and a new submission reads host memory afresh). Spin steps: one region per exchange point, never
    reused within the step, since a GPU does not re-read host memory it has read in a submission."""

    def __init__(self, devices, slot_bytes: int, spin_slot_bytes: int, n_exchanges: int, sync: str,
                 long_waits: bool = False):
        self.devices = devices
        self.n = len(devices)
        self.sync = sync
        self.n_exchanges = n_exchanges
        self.slot_bytes = _align(max(slot_bytes, 4))
        self.spin_slot_bytes = _align(max(spin_slot_bytes, 4))
        size = 4 * self.n * self.slot_bytes
        self.spin_base = size
        if sync == "spin":
            size += n_exchanges * self.n * self.spin_slot_bytes
        self.staged = not can_share_host_memory(devices)
        self.data = HostMirrors(size, devices) if self.staged else SharedHostMemory(size, devices)
        self.lines = collective.long_lines() if long_waits else collective.FLAG_LINES
        self.flags = SharedHostMemory(collective.flag_bytes(max(n_exchanges, 1), self.n, self.lines)
                                      if sync == "spin" else 4096, devices)
        self.flags.array(np.uint32)[:] = 0
        self.status = [Buffer(d, 16, host_visible=True) for d in devices]
        self.status_words = [s.array(np.uint32) for s in self.status]
        self.counter = 0
        self.reset()

    def next_base(self) -> int:
        """Counter base of the next step: exchange e publishes base + e + 1 (always increasing)."""
        self.counter += self.n_exchanges + 1
        if self.counter + self.n_exchanges + 1 >= 1 << 32:        # after billions of exchanges
            self.flags.array(np.uint32)[:] = 0                     # (every device is idle here)
            self.counter = self.n_exchanges + 1
        return self.counter

    def publish(self, exchange: int, slot: int, producers, nbytes: int) -> None:
        """Staging only: after the producers' round, copy their slots of this exchange (the first
        nbytes of each) to every other device. Shared host memory needs nothing."""
        if not self.staged:
            return
        region, size = self.region(0, exchange, slot, False)
        for p in producers:
            self.data.copy(self.devices[p], region.offset + p * size, min(nbytes, size))

    def reset(self) -> None:
        """Clear the status words; only while every device is idle."""
        for w in self.status_words:
            w[:] = 0

    def timed_out(self) -> list[tuple[int, int]]:
        """(device index, exchange) of every device whose wait gave up."""
        return [(i, int(w[1])) for i, w in enumerate(self.status_words) if w[0] == 2]

    def region(self, device_index: int, exchange: int, slot: int, spin: bool) -> tuple[View, int]:
        """The region of one exchange as seen by a device, and its per-device slot size."""
        buf = self.data.buffer(self.devices[device_index])
        if spin:
            size = self.spin_slot_bytes
            return View(buf, self.spin_base + exchange * self.n * size, self.n * size), size
        size = self.slot_bytes
        return View(buf, (2 * slot + exchange % 2) * self.n * size, self.n * size), size

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
        self.spin = False
        self._direct: set = set()      # the puts of the recording in progress whose producer wrote the slot
        self._hold = None              # exchange_sync's hold words (_hold_word), made when first needed

    def _hold_word(self) -> View:
        """The device-local words an exchange point's holders poll (exchange_sync hold): written with
        the exchange's value, which only grows from step to step, so never reset."""
        if self._hold is None:
            self._hold = Buffer(self.device, 256)
            seq = CommandSequence(self.device, "hold word").begin()
            seq.fill(self._hold, 0, 256)
            seq.end().run()
            seq.close()
        return View.whole(self._hold)

    def close(self) -> None:
        if self._hold is not None:
            self._hold.close()
            self._hold = None

    def _slot(self, exchange: int, owner: int) -> tuple[Buffer, int]:
        region, size = self.shared.region(self.me, exchange, self.slot, self.spin)
        return region.buffer, region.offset + owner * size

    def record(self, seq, op, n_tokens: int, act, step: View, slot: int, clock=None) -> bool:
        """Record one exchange op; True when the command buffer must end here (relay cut). clock (a
        split.clock.Stamp): a one-token step's sum stamps the device clock there (split/clock.py)."""
        k, a = op.kind, op.attrs
        self.slot = slot
        self.spin = self.shared.sync == "spin" and n_tokens <= SPIN_MAX_TOKENS
        if k == "sync":
            if not self.spin:
                return True
            if a["signal"] or a["wait_mask"]:
                flags = View.whole(self.shared.flags.buffer(self.device))
                hold = self._hold_word() if a.get("hold") and a["wait_mask"] and collective.hold_enabled() else None
                collective.exchange_sync(seq, self.kc, flags, View.whole(self.shared.status[self.me]), step,
                                         self.me, a["exchange"], a["signal"], a["wait_mask"], self.shared.n,
                                         STEP_SYNC_BASE, self.shared.lines, hold=hold)
            return False
        if k == "put":
            if op in self._direct:         # its producer wrote it into my slot (direct_views)
                return False
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
            self._reduce(seq, op, n_tokens, act, step, clock)
        return False

    def direct_views(self, graph, n_tokens: int, slot: int) -> dict:
        """tensor -> the view of my slot that its producer writes instead of its activation memory,
        for every put of the graph marked direct (split/matvec_steps.py). Only where the slot
        position is a legal buffer offset (a gather's later columns may not be)."""
        self.slot = slot
        self.spin = self.shared.sync == "spin" and n_tokens <= SPIN_MAX_TOKENS
        views, self._direct = {}, set()
        for op in graph.ops:
            if op.kind == "put" and op.attrs.get("direct"):
                buf, off = self._slot(op.attrs["exchange"], self.me)
                off += 4 * n_tokens * op.attrs["at"]
                if off % VIEW_ALIGN == 0:
                    views[op.inputs[0]] = View(buf, off, 4 * n_tokens * op.inputs[0].width)
                    self._direct.add(op)
        return views

    def direct_puts(self) -> set:
        """The puts of the recording in progress that record nothing (direct_views)."""
        return self._direct

    def direct_put_of(self, t):
        """The direct put of tensor t in the recording in progress, or None."""
        return next((op for op in self._direct if op.inputs[0] is t), None)

    def sync_reduce(self, seq, op, n_tokens: int, act, step: View, slot: int, chain=None, wait=None,
                    clock=None) -> int:
        """Record a sync_reduce op (split/matvec_steps.py): publish, wait and sum in one dispatch
        (wait: chained to the product that wrote my partial, kernels/chain.py). Returns its workgroup
        count, for a chained consumer. clock: as record's."""
        a = op.attrs
        self.slot, self.spin = slot, True
        parts, slot_bytes = self.shared.region(self.me, a["exchange"], slot, True)
        return collective.exchange_reduce(
            seq, self.kc, View.whole(self.shared.flags.buffer(self.device)), View.whole(self.shared.status[self.me]),
            step, self.me, a["exchange"], a["signal"], a["wait_mask"], self.shared.n, STEP_SYNC_BASE, parts,
            a["mask"], slot_bytes // 4, act(op.out), n_tokens, a["n_cols"],
            base=act(op.inputs[0]) if op.inputs else None, lines=self.shared.lines, chain=chain, wait=wait,
            clock=clock)

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

    def _reduce(self, seq, op, n_tokens: int, act, step: View, clock=None) -> None:
        a = op.attrs
        base = act(op.inputs[0]) if op.inputs else None      # none: the sum of the partials alone
        width = a["n_cols"]
        dtype = a["dtype"]
        parts, slot_bytes = self.shared.region(self.me, a["exchange"], self.slot, self.spin)
        part_stride = slot_bytes // collective.PART_BYTES[dtype]
        if a["to_exchange"] is None and dtype == "f32" and n_tokens <= matmul.MATVEC_MAX_TOKENS:
            # a matrix-vector step (its devices already ordered by the host relay): the sum alone
            # through the one-token steps' kernel, one workgroup (shaders/exchange_reduce.comp)
            collective.exchange_reduce(seq, self.kc, View.whole(self.shared.flags.buffer(self.device)),
                                       View.whole(self.shared.status[self.me]), step, self.me, a["exchange"],
                                       False, 0, self.shared.n, STEP_SYNC_BASE, parts, a["mask"], part_stride,
                                       act(op.out), n_tokens, width, base=base, lines=self.shared.lines,
                                       clock=clock)
        elif a["to_exchange"] is None:
            collective.reduce_sum(seq, self.kc, parts, dtype, a["mask"], part_stride, act(op.out), n_tokens, width,
                                  in_stride=width, base=base, base_stride=width)
        else:       # ring: my column chunk, summed, into my slot of the next exchange
            c0, c1 = a["cols"]
            buf, off = self._slot(a["to_exchange"], self.me)
            out = View(buf, off, self.shared.region(self.me, a["to_exchange"], self.slot, self.spin)[1])
            collective.reduce_sum(seq, self.kc, parts, dtype, a["mask"], part_stride, out, n_tokens, c1 - c0,
                                  in_stride=width, in_c0=c0, base=base, base_stride=width, base_c0=c0)
