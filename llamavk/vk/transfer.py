"""Host <-> device copies through host-visible staging buffers (loading, not the hot path).

Uploads stream through a ring of staging slots: the host fills slot i + 1 (reading the model file's
pages, re-laying blocks) while the device copies slot i into place, so reading the file and the copy
over the bus overlap. A write returns once its bytes are in staging; `flush()` waits for the copies
(submissions on one queue may run concurrently, so nothing may read an uploaded buffer before it:
`upload(..., wait=True)`, the default, flushes at once).

A model's weights may be uploaded from a worker thread while the main thread records the forward
pass (runtime.py): every method holds the transfer's lock, and its command buffers come from a
command pool of its own (a pool must not be used by two threads at once). During such a load every
queue submission goes through here, under the lock: nothing else submits before the weights are in.

Pieces (`upload_pieces`) are 1-D arrays, possibly strided views: a planar weight's quant bytes and
its scales are copied from the file's blocks straight into staging, without a repacked copy of the
whole tensor first.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import vulkan as vk

from .buffer import Buffer
from .sequence import CommandSequence

SLOT_BYTES = 32 << 20
SLOTS = 3
# Copies into staging of at least this many bytes are cut among COPY_THREADS threads (numpy releases
# the GIL while it copies): one thread moves ~2.4 GB/s from the page cache into staging (H100 host).
PARALLEL_BYTES = 4 << 20
COPY_THREADS = min(4, os.cpu_count() or 1)
_pool: ThreadPoolExecutor | None = None


def _copy(out: np.ndarray, src: np.ndarray) -> None:
    """out[:] = src (1-D, same length), in COPY_THREADS parts where it is large."""
    global _pool
    if COPY_THREADS < 2 or out.nbytes < PARALLEL_BYTES:
        np.copyto(out, src)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="llamavk-upload")
    cuts = np.linspace(0, len(out), COPY_THREADS + 1).astype(int)
    list(_pool.map(lambda i: np.copyto(out[cuts[i]:cuts[i + 1]], src[cuts[i]:cuts[i + 1]]), range(COPY_THREADS)))


class _Slot:
    def __init__(self, device, i: int, pool):
        self.buffer = Buffer(device, SLOT_BYTES, host_visible=True)
        self.bytes = self.buffer.array(np.uint8, SLOT_BYTES)
        self.seq = CommandSequence(device, f"upload{i}", pool=pool)
        self.pending = 0     # timeline value of its last copy (0: none)
        self.fill = 0        # bytes filled for the copy being assembled
        self.dst = None      # (buffer, offset) the filled bytes go to


class Transfer:
    def __init__(self, device):
        self.device = device
        self._lock = threading.RLock()
        info = vk.VkCommandPoolCreateInfo(flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                          queueFamilyIndex=device.queue_family)
        self.pool = vk.vkCreateCommandPool(device.handle, info, None)
        self.slots = [_Slot(device, i, self.pool) for i in range(SLOTS)]
        self.current = 0
        self.seq = CommandSequence(device, "transfer", pool=self.pool)
        self.staging = self.slots[0].buffer   # downloads use slot 0 (after a flush)

    # -- uploads --------------------------------------------------------------------------------
    def upload(self, dst, data, offset: int = 0, wait: bool = True) -> None:
        with self._lock:
            self.upload_pieces(dst, [np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)], offset)
            if wait:
                self.flush()

    def upload_pieces(self, dst, pieces, offset: int = 0) -> None:
        """Copy the pieces (1-D arrays; an element of a void type is an opaque run of bytes) one after
        another into dst from `offset` on. Returns once they are in staging (see flush)."""
        with self._lock:
            self._upload_pieces(dst, pieces, offset)

    def _upload_pieces(self, dst, pieces, offset: int) -> None:
        slot = self._slot()
        slot.dst = (dst, offset)
        for piece in pieces:
            size = piece.dtype.itemsize
            start = 0
            while start < piece.size:
                n = min((slot.bytes.size - slot.fill) // size, piece.size - start)
                if n == 0:
                    slot = self._submit(slot)
                    continue
                _copy(slot.bytes[slot.fill:slot.fill + n * size].view(piece.dtype), piece[start:start + n])
                slot.fill += n * size
                start += n
        self._submit(slot)

    def _slot(self) -> _Slot:
        slot = self.slots[self.current]
        if slot.pending:
            self.device.timeline.wait(slot.pending)
            slot.pending = 0
        return slot

    def _submit(self, slot: _Slot) -> _Slot:
        """Queue the copy of slot's filled bytes; the next slot (waited for) continues at the next
        destination offset."""
        dst, offset = slot.dst
        if slot.fill:
            slot.seq.begin()
            slot.seq.copy(slot.buffer, dst, slot.fill, 0, offset)
            slot.pending = slot.seq.end().submit()
        nxt_offset = offset + slot.fill
        slot.fill = 0
        self.current = (self.current + 1) % len(self.slots)
        nxt = self._slot()
        nxt.dst = (dst, nxt_offset)
        return nxt

    def flush(self) -> None:
        with self._lock:
            for slot in self.slots:
                if slot.pending:
                    self.device.timeline.wait(slot.pending)
                    slot.pending = 0

    # -- downloads ------------------------------------------------------------------------------
    def download(self, src, size: int, offset: int = 0) -> bytes:
        with self._lock:
            self.flush()
            out = bytearray()
            room = self.staging.size
            for start in range(0, size, room):
                n = min(room, size - start)
                self.seq.begin()
                self.seq.copy(src, self.staging, n, offset + start, 0)
                self.seq.end().run()
                out += self.staging.read(n)
            return bytes(out)

    def close(self) -> None:
        with self._lock:
            if self.pool is None:
                return
            self.flush()
            self.seq.close()
            for slot in self.slots:
                slot.seq.close()
                slot.buffer.close()
            vk.vkDestroyCommandPool(self.device.handle, self.pool, None)
            self.pool = None
