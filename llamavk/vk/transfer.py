"""Host <-> device copies through host-visible staging buffers (loading, not the hot path).

Uploads stream through a ring of staging slots: the host fills slot i + 1 (reading the model file's
pages, re-laying blocks) while the device copies slot i into place, so reading the file and the copy
over the bus overlap. A write returns once its bytes are in staging; `flush()` waits for the copies
(submissions on one queue may run concurrently, so nothing may read an uploaded buffer before it:
`upload(..., wait=True)`, the default, flushes at once).

Pieces (`upload_pieces`) are 1-D arrays, possibly strided views: a planar weight's quant bytes and
its scales are copied from the file's blocks straight into staging, without a repacked copy of the
whole tensor first.
"""

from __future__ import annotations

import numpy as np

from .buffer import Buffer
from .sequence import CommandSequence

SLOT_BYTES = 32 << 20
SLOTS = 3


class _Slot:
    def __init__(self, device, i: int):
        self.buffer = Buffer(device, SLOT_BYTES, host_visible=True)
        self.bytes = self.buffer.array(np.uint8)
        self.seq = CommandSequence(device, f"upload{i}")
        self.pending = 0     # timeline value of its last copy (0: none)
        self.fill = 0        # bytes filled for the copy being assembled
        self.dst = None      # (buffer, offset) the filled bytes go to


class Transfer:
    def __init__(self, device):
        self.device = device
        self.slots = [_Slot(device, i) for i in range(SLOTS)]
        self.current = 0
        self.seq = CommandSequence(device, "transfer")
        self.staging = self.slots[0].buffer   # downloads use slot 0 (after a flush)

    # -- uploads --------------------------------------------------------------------------------
    def upload(self, dst, data, offset: int = 0, wait: bool = True) -> None:
        self.upload_pieces(dst, [np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)], offset)
        if wait:
            self.flush()

    def upload_pieces(self, dst, pieces, offset: int = 0) -> None:
        """Copy the pieces (1-D arrays; an element of a void type is an opaque run of bytes) one after
        another into dst from `offset` on. Returns once they are in staging (see flush)."""
        slot = self._slot()
        slot.dst = (dst, offset)
        for piece in pieces:
            size = piece.dtype.itemsize
            start = 0
            while start < piece.size:
                n = min((SLOT_BYTES - slot.fill) // size, piece.size - start)
                if n == 0:
                    slot = self._submit(slot)
                    continue
                out = slot.bytes[slot.fill:slot.fill + n * size].view(piece.dtype)
                np.copyto(out, piece[start:start + n])
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
        for slot in self.slots:
            if slot.pending:
                self.device.timeline.wait(slot.pending)
                slot.pending = 0

    # -- downloads ------------------------------------------------------------------------------
    def download(self, src, size: int, offset: int = 0) -> bytes:
        self.flush()
        out = bytearray()
        for start in range(0, size, SLOT_BYTES):
            n = min(SLOT_BYTES, size - start)
            self.seq.begin()
            self.seq.copy(src, self.staging, n, offset + start, 0)
            self.seq.end().run()
            out += self.staging.read(n)
        return bytes(out)

    def close(self) -> None:
        self.flush()
        self.seq.close()
        for slot in self.slots:
            slot.seq.close()
            slot.buffer.close()
