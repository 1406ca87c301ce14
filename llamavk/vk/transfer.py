"""Host <-> device copies through a reusable host-visible staging buffer (setup, not hot path)."""

from __future__ import annotations

import numpy as np

from .buffer import Buffer
from .sequence import CommandSequence

STAGING_BYTES = 32 << 20


class Transfer:
    def __init__(self, device):
        self.device = device
        self.staging = Buffer(device, STAGING_BYTES, host_visible=True)
        self.seq = CommandSequence(device, "transfer")

    def upload(self, dst, data, offset: int = 0) -> None:
        src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
        staging = self.staging.array(np.uint8)
        for start in range(0, src.size, STAGING_BYTES):
            chunk = src[start:start + STAGING_BYTES]
            staging[:chunk.size] = chunk
            self.seq.begin()
            self.seq.copy(self.staging, dst, chunk.size, 0, offset + start)
            self.seq.end().run()

    def download(self, src, size: int, offset: int = 0) -> bytes:
        out = bytearray()
        for start in range(0, size, STAGING_BYTES):
            n = min(STAGING_BYTES, size - start)
            self.seq.begin()
            self.seq.copy(src, self.staging, n, offset + start, 0)
            self.seq.end().run()
            out += self.staging.read(n)
        return bytes(out)

    def close(self) -> None:
        self.seq.close()
        self.staging.close()
