"""Host <-> device copies through host-visible staging buffers (loading, not the hot path).

Uploads go through staging slots: a slot is filled on the host, then a copy into place is
submitted and the slot goes back to the free list; the next user of a slot waits for that copy
first. So filling slots (reading the model file, re-laying blocks) overlaps the device's copies. A
write returns once its bytes are in staging or queued to be; `flush()` waits for the copies
(submissions on one queue may run concurrently, so nothing may read an uploaded buffer before it:
`upload(..., wait=True)`, the default, flushes at once).

Two ways in:
- `upload_pieces(dst, pieces)`: 1-D arrays (possibly strided views) copied into staging by the
  calling thread, one after another (numpy; large pieces cut among COPY_THREADS threads).
- `upload_file(dst, fd, offset, nbytes, planar)`: bytes of a file (a model's weights) cut into
  slot-sized jobs that UPLOAD_THREADS threads run at once: each reads its part of the file with
  os.preadv straight into a slot (GIL released, no page faults on a map of the file), or, for a
  planar type, into a small per-thread buffer that it then splits into quants and scales in the
  slot (the buffer stays in the CPU's cache). The calling thread only queues the jobs.

A model's weights may be uploaded from a worker thread while the main thread records the forward
pass (runtime.py). Command buffers come from a command pool of this transfer's own (a pool must not
be used by two threads at once), recorded and submitted under its lock; during such a load every
queue submission goes through here, under that lock: nothing else submits before the weights are in.

`stats` adds up where the upload threads' time goes (reading the file, copying into staging, waiting
for a free slot, recording and submitting): LLAMAVK_PHASES=1 prints it (runtime.py).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import vulkan as vk

from .buffer import Buffer
from .sequence import CommandSequence

SLOT_BYTES = 16 << 20
# Copies into staging of at least this many bytes are cut among COPY_THREADS threads (numpy releases
# the GIL while it copies): one thread moves ~2.4 GB/s from the page cache into staging (H100 host).
PARALLEL_BYTES = 4 << 20
COPY_THREADS = min(4, os.cpu_count() or 1)
# Threads reading a file's jobs at once (LLAMAVK_UPLOAD_THREADS); slots: two per thread, so that
# every thread can fill one while the device copies another. H100 host (16 cores), the 7.2B Q4_0's
# 4.07 GB from the page cache (benchmarks/bench_upload.py): 1 thread 4.2 GB/s, 4 threads 9.0-9.4,
# 8 threads 11.8-14.4 (16 or 32 MiB slots alike).
UPLOAD_THREADS = max(1, int(os.environ.get("LLAMAVK_UPLOAD_THREADS", "0")) or min(8, os.cpu_count() or 1))
# A planar job reads this many bytes of blocks at a time into its thread's buffer, then splits them.
BOUNCE_BYTES = 1 << 20
_pool: ThreadPoolExecutor | None = None


def plane_dtype(size: int, ranges) -> np.dtype:
    """A planar type's block (kernels.planes) as a numpy structured type with a field per plane (p0,
    p1, ...): opaque (void) fields, so that a strided field view copies one element per block."""
    return np.dtype({"names": [f"p{i}" for i in range(len(ranges))],
                     "formats": [f"V{e - s}" for s, e in ranges],
                     "offsets": [s for s, _ in ranges], "itemsize": size})



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


def read_exactly(fd: int, out, offset: int) -> None:
    """Fill `out` (a writable buffer) with the file's bytes from `offset` on; a short file is an error."""
    view = memoryview(out).cast("B")
    done = 0
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"model file ended early: {len(view) - done} bytes missing at offset {offset + done}")
        done += n


class _Slot:
    def __init__(self, device, i: int, pool, size: int):
        self.buffer = Buffer(device, size, host_visible=True)
        self.bytes = self.buffer.array(np.uint8, size)
        self.seq = CommandSequence(device, f"upload{i}", pool=pool)
        self.pending = 0     # timeline value of its last copy (0: none)


class UploadStats:
    """Seconds the upload threads spent per activity (summed over threads), and bytes moved."""

    def __init__(self):
        self._lock = threading.Lock()
        self.seconds = {"file read": 0.0, "copy into staging": 0.0, "wait for a slot": 0.0, "submit": 0.0}
        self.bytes = 0
        self.file_bytes = 0    # of which queued as file jobs (upload_file)
        self.jobs = 0

    def add(self, what: str, seconds: float) -> None:
        with self._lock:
            self.seconds[what] += seconds

    def line(self) -> str:
        parts = ", ".join(f"{k} {1e3 * v:.0f} ms" for k, v in self.seconds.items())
        return f"{self.bytes / 1e9:.2f} GB in {self.jobs} jobs: {parts}"


class Transfer:
    def __init__(self, device):
        self.device = device
        self._lock = threading.RLock()
        info = vk.VkCommandPoolCreateInfo(flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT,
                                          queueFamilyIndex=device.queue_family)
        self.pool = vk.vkCreateCommandPool(device.handle, info, None)
        self.slots: list[_Slot] = []          # created as needed, up to max_slots
        self.slot_bytes = SLOT_BYTES
        self.max_slots = 2 * UPLOAD_THREADS
        self._free: queue.SimpleQueue = queue.SimpleQueue()
        self.seq = CommandSequence(device, "transfer", pool=self.pool)
        self._jobs: ThreadPoolExecutor | None = None
        self._futures: list = []
        self._bounce = threading.local()
        self.stats = UploadStats()
        self.on_job_done = None      # called with a file job's bytes once its copy is queued (a load's progress)

    # -- slots ----------------------------------------------------------------------------------
    def _acquire(self) -> _Slot:
        """A free slot whose last copy is done (a new one while fewer than max_slots exist)."""
        t0 = time.perf_counter()
        try:
            slot = self._free.get_nowait()
        except queue.Empty:
            slot = None
            with self._lock:
                if len(self.slots) < self.max_slots:
                    slot = _Slot(self.device, len(self.slots), self.pool, self.slot_bytes)
                    self.slots.append(slot)
            if slot is None:
                slot = self._free.get()
        if slot.pending:
            self.device.timeline.wait_any_thread(slot.pending)
            slot.pending = 0
        self.stats.add("wait for a slot", time.perf_counter() - t0)
        return slot

    def _submit(self, slot: _Slot, dst, regions) -> int:
        """Queue the copies (slot offset, dst offset, bytes) out of slot and hand the slot back;
        the copy's timeline value (0: nothing to copy)."""
        t0 = time.perf_counter()
        value = 0
        try:
            if regions:
                with self._lock:
                    slot.seq.begin()
                    slot.seq.copy_regions(slot.buffer, dst, regions)
                    value = slot.pending = slot.seq.end().submit()
        finally:
            self._free.put(slot)
        self.stats.add("submit", time.perf_counter() - t0)
        return value

    # -- uploads --------------------------------------------------------------------------------
    def upload(self, dst, data, offset: int = 0, wait: bool = True) -> None:
        """Copy host bytes into dst; wait: return once they are there (this copy's own wait: a
        small write during a load does not wait for the weights)."""
        value = self.upload_pieces(dst, [np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)], offset)
        if wait and value:
            self.device.timeline.wait_any_thread(value)

    def upload_pieces(self, dst, pieces, offset: int = 0) -> int:
        """Copy the pieces (1-D arrays; an element of a void type is an opaque run of bytes) one after
        another into dst from `offset` on. Returns once they are in staging (see flush), with the
        timeline value of the last of their copies."""
        slot, fill, start_offset = self._acquire(), 0, offset
        try:
            for piece in pieces:
                size = piece.dtype.itemsize
                start = 0
                while start < piece.size:
                    n = min((slot.bytes.size - fill) // size, piece.size - start)
                    if n == 0:
                        value = self._submit(slot, dst, [(0, start_offset, fill)])
                        slot, start_offset, fill = None, start_offset + fill, 0
                        slot = self._acquire()
                        continue
                    t0 = time.perf_counter()
                    _copy(slot.bytes[fill:fill + n * size].view(piece.dtype), piece[start:start + n])
                    self.stats.add("copy into staging", time.perf_counter() - t0)
                    fill += n * size
                    start += n
        except BaseException:
            if slot is not None:
                self._free.put(slot)
            raise
        value = self._submit(slot, dst, [(0, start_offset, fill)] if fill else [])
        with self.stats._lock:
            self.stats.bytes += sum(p.nbytes for p in pieces)
        return value

    def upload_file(self, dst, fd: int, offset: int, nbytes: int, planar: tuple | None = None,
                    dst_offset: int = 0) -> None:
        """Queue the copy of the file's bytes [offset, offset + nbytes) into dst at dst_offset, read
        by the upload threads. planar = (block bytes, plane byte ranges) (kernels.planes): the bytes
        are blocks, laid out on the device as every block's bytes of the first range, then every
        block's of the next, ... Returns at once; flush() waits for the jobs and their copies."""
        if self._jobs is None:
            self._jobs = ThreadPoolExecutor(UPLOAD_THREADS, thread_name_prefix="llamavk-read")
        with self.stats._lock:
            self.stats.bytes += nbytes
            self.stats.file_bytes += nbytes
        if planar is None:
            step = self.slot_bytes
            for start in range(0, nbytes, step):
                n = min(step, nbytes - start)
                self._queue(self._read_job, dst, fd, offset + start, n, dst_offset + start)
            return
        size, ranges = planar
        n_blocks = nbytes // size
        if n_blocks * size != nbytes:
            raise ValueError(f"{nbytes} bytes are not whole blocks of {size}")
        step = max(1, self.slot_bytes // size)
        for first in range(0, n_blocks, step):
            n = min(step, n_blocks - first)
            self._queue(self._planar_job, dst, fd, offset, n_blocks, first, n, size, tuple(ranges), dst_offset)

    def _queue(self, job, *args) -> None:
        future = self._jobs.submit(job, *args)
        with self._lock:
            self._futures.append(future)

    def _read_job(self, dst, fd: int, offset: int, n: int, dst_offset: int) -> None:
        slot = self._acquire()
        try:
            t0 = time.perf_counter()
            read_exactly(fd, slot.bytes[:n], offset)
            self.stats.add("file read", time.perf_counter() - t0)
        except BaseException:
            self._free.put(slot)
            raise
        self._submit(slot, dst, [(0, dst_offset, n)])
        self._job_done(n)

    def _planar_job(self, dst, fd: int, offset: int, n_blocks: int, first: int, n: int, size: int, ranges: tuple,
                    dst_offset: int) -> None:
        """Blocks [first, first + n) of a planar weight of n_blocks blocks: their bytes of plane k
        (block bytes [s_k, e_k)) to dst[P_k * n_blocks + (e_k - s_k) * first ...], P_k the bytes of
        the planes before it."""
        bounce = getattr(self._bounce, "buf", None)
        if bounce is None or bounce.size < size:
            bounce = self._bounce.buf = np.empty(max(BOUNCE_BYTES, size), np.uint8)
        per = bounce.size // size
        dtype = plane_dtype(size, ranges)
        widths = [e - s for s, e in ranges]
        starts = [sum(widths[:k]) for k in range(len(widths))]   # plane k's bytes per block before it
        slot = self._acquire()
        try:
            views = [slot.bytes[n * s0:n * (s0 + w)].view(f"V{w}") for s0, w in zip(starts, widths)]
            for i in range(0, n, per):
                m = min(per, n - i)
                t0 = time.perf_counter()
                read_exactly(fd, bounce[:m * size], offset + (first + i) * size)
                t1 = time.perf_counter()
                blocks = bounce[:m * size].view(dtype)
                for k, v in enumerate(views):
                    np.copyto(v[i:i + m], blocks[f"p{k}"])
                self.stats.add("file read", t1 - t0)
                self.stats.add("copy into staging", time.perf_counter() - t1)
        except BaseException:
            self._free.put(slot)
            raise
        self._submit(slot, dst, [(n * s0, dst_offset + s0 * n_blocks + w * first, n * w)
                                 for s0, w in zip(starts, widths)])
        self._job_done(n * size)

    def _job_done(self, nbytes: int) -> None:
        with self.stats._lock:      # also keeps the progress callback to one thread at a time
            self.stats.jobs += 1
            if self.on_job_done is not None:
                self.on_job_done(nbytes)

    def flush(self) -> None:
        """Wait for every queued job and copy; the first error of a job is raised here."""
        with self._lock:
            futures = list(self._futures)
        error = None
        for f in futures:
            exc = f.exception()
            if exc is not None and error is None:
                error = exc
        with self._lock:
            done = set(futures)
            self._futures = [f for f in self._futures if f not in done]
        with self._lock:
            for slot in self.slots:
                if slot.pending:
                    self.device.timeline.wait_any_thread(slot.pending)
                    slot.pending = 0
        if error is not None:
            raise error

    # -- downloads ------------------------------------------------------------------------------
    def download(self, src, size: int, offset: int = 0) -> bytes:
        self.flush()
        slot = self._acquire()
        try:
            out = bytearray()
            room = slot.buffer.size
            with self._lock:
                for start in range(0, size, room):
                    n = min(room, size - start)
                    self.seq.begin()
                    self.seq.copy(src, slot.buffer, n, offset + start, 0)
                    self.device.timeline.wait_any_thread(self.seq.end().submit())
                    out += slot.buffer.read(n)
        finally:
            self._free.put(slot)
        return bytes(out)

    def close(self) -> None:
        with self._lock:
            if self.pool is None:
                return
        try:
            self.flush()
        finally:
            with self._lock:
                if self._jobs is not None:
                    self._jobs.shutdown(wait=True)
                    self._jobs = None
                self.seq.close()
                for slot in self.slots:
                    slot.seq.close()
                    slot.buffer.close()
                vk.vkDestroyCommandPool(self.device.handle, self.pool, None)
                self.pool = None
