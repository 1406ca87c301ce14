"""Kernel recorders: Python functions that record one op (one or a few dispatches) into a sequence.

Each family lives in its own module (matmul.py, norm.py, rope.py, attention.py, elementwise.py) and
records into a `CommandSequence` given `View`s of device buffers. Conventions (docs/KERNELS.md):

- Activations are float32, row-major [n_tokens][width], contiguous.
- Weights stay in their GGUF block layout (rows = output features, a row is contiguous).
- Values that change from one replay to the next (position, KV length) are never baked into a
  recording: kernels read them from the step-parameter buffer `StepParams` (see below).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from .. import phases
from ..vk import Buffer, Kernel

# Storage-buffer descriptors need aligned offsets (minStorageBufferOffsetAlignment is at most 256).
VIEW_ALIGN = 256

# Layout of the step-parameter buffer (uint32 words), written by the host before each replay.
STEP_N_PAST = 0      # tokens already in the KV cache = position of the batch's first token
STEP_N_TOKENS = 1    # tokens in this batch
STEP_N_KV = 2        # n_past + n_tokens: KV entries attention reads
STEP_SYNC_BASE = 3   # split modes: offset of this micro-batch's exchange counters (kernels/collective.py)
STEP_SEQ_LEN = 4     # 0: one sequence. L > 0: the batch holds whole sequences of L tokens back to back
                     # (KV row p = sequence p // L, position p % L): RoPE turns by p % L and attention
                     # sees only rows of the query's own sequence (perplexity's parallel chunks)
STEP_WORDS = 5


@dataclass(frozen=True)
class View:
    """A byte range of a device buffer; offsets are multiples of VIEW_ALIGN."""
    buffer: Buffer
    offset: int
    nbytes: int

    @property
    def range(self) -> tuple:
        return (self.buffer, self.offset, self.nbytes)

    @staticmethod
    def whole(buffer: Buffer) -> "View":
        return View(buffer, 0, buffer.size)


@dataclass(frozen=True)
class WeightChunk:
    """Rows [row_start, row_start + n_rows) of a weight matrix, in their own buffer."""
    buffer: Buffer
    row_start: int
    n_rows: int


@dataclass(frozen=True)
class QWeight:
    """A weight matrix on a device in GGUF block layout, split into row chunks so that no chunk is
    larger than the device's maxStorageBufferRange. Stacked expert matrices (experts > 0) are one
    matrix of experts * expert_rows rows, cut between experts."""
    qtype: object          # quant.GGMLQuantizationType
    rows: int
    cols: int
    chunks: tuple[WeightChunk, ...]
    experts: int = 0

    @property
    def expert_rows(self) -> int:
        return self.rows // self.experts if self.experts else self.rows


class KernelCache:
    """Pipelines of one device, created on first use and shared by every recording on it."""

    def __init__(self, device):
        self.device = device
        self.info = device.info
        self._kernels: dict = {}
        self._shared: dict = {}
        self._pending: dict = {}      # key -> Future of a kernel being made by prefetch()
        # the recording in progress's plan of prompt products dequantized ahead (runtime.record,
        # kernels/matmul.py DequantAhead); None outside a prompt step's recording
        self.dequant_ahead = None

    def shared(self, kind: str, key, make, fits=None):
        """A device object made once per (kind, key) and shared by every recording on this device:
        scratch buffers and counters (recordings never run at once, and within one the recorder's
        barriers order two users that write it). make() builds it; where fits(it) is False (a
        buffer too small for this batch), it is made again."""
        store = self._shared.setdefault(kind, {})
        obj = store.get(key)
        if obj is None or (fits is not None and not fits(obj)):
            obj = store[key] = make()
        return obj

    def get(self, name: str, bindings: str, push_size: int = 0, spec=()) -> Kernel:
        key = (name, tuple(spec))
        kernel = self._kernels.get(key)
        if kernel is None:
            future = self._pending.pop(key, None)
            if future is not None:
                t0 = time.perf_counter()
                kernel = future.result()
                phases.add("wait for prefetched pipelines", time.perf_counter() - t0)
                if kernel is not None and (kernel.bindings, kernel.push_size) != (bindings, push_size):
                    kernel = None         # listed with other bindings: made again as asked
            if kernel is None:
                t0 = time.perf_counter()
                kernel = Kernel(self.device, name, bindings, push_size=push_size, spec=spec)
                phases.add("pipeline creation", time.perf_counter() - t0)
            self._kernels[key] = kernel
        return kernel

    def entries(self) -> list[tuple]:
        """(name, bindings, push_size, spec) of every kernel made so far (vk/kernel_list.py)."""
        return [(key[0], k.bindings, k.push_size, key[1]) for key, k in self._kernels.items()]

    def prefetch(self, entries, threads: int | None = None) -> None:
        """Start making the kernels `entries` [(name, bindings, push_size, spec)] on threads
        (what the last load of this model made: vk/kernel_list.py), so that get() finds them made
        or waits for the one in progress. The driver calls release the interpreter and
        VkPipelineCache is internally synchronized. An entry that fails is made by get() itself,
        which reports the error as it always has; the device waits for the threads before it
        closes."""
        from concurrent.futures import ThreadPoolExecutor

        todo = {(n, tuple(s)): (n, b, p, tuple(s)) for n, b, p, s in entries}
        todo = [e for key, e in todo.items() if key not in self._kernels and key not in self._pending]
        if not todo:
            return
        import os
        pool = ThreadPoolExecutor(threads or max(1, min(4, (os.cpu_count() or 2) // 2)),
                                  thread_name_prefix=f"llamavk-pipelines-{self.device.name}")
        for name, bindings, push, spec in todo:
            self._pending[(name, spec)] = pool.submit(self._make, name, bindings, push, spec)
        pool.shutdown(wait=False)
        self.device.before_close.append(self.wait_prefetch)

    def _make(self, name, bindings, push_size, spec):
        t0 = time.perf_counter()
        try:
            return Kernel(self.device, name, bindings, push_size=push_size, spec=spec)
        except Exception:             # noqa: BLE001 -- get() makes it again and reports
            return None
        finally:
            phases.add("pipeline creation (prefetch threads)", time.perf_counter() - t0)

    def wait_prefetch(self) -> None:
        """Wait for every kernel prefetch() is making (before the device closes)."""
        for future in list(self._pending.values()):
            future.exception()


def filled_buffer(device, data) -> Buffer:
    """A device buffer holding `data` (a numpy array): counters and sentinels a kernel expects at rest.
    Recordings make these while the weights upload: the copy is queued, not waited for (the first
    step waits for it: Device.write_soon)."""
    buf = Buffer(device, data.nbytes)
    device.write_soon(buf, data)
    return buf


def groups_2d(n: int, max_x: int = 65535) -> tuple[int, int, int]:
    """A grid of at least n workgroups that respects the per-dimension limit (65535 is portable)."""
    if n <= max_x:
        return (n, 1, 1)
    return (max_x, (n + max_x - 1) // max_x, 1)


# Types stored planar on the device (shaders/quants.glsl): per chunk, every block's quants (16-byte
# aligned, so kernels read them as uvec4), then every block's head, the bytes before its quants (f16
# scale; Q4_1 scale and min; Q5_0 scale and the fifth bits; Q5_1 all three; MXFP4 its exponent
# byte). qtype name -> (head bytes at the start of a GGUF block, block bytes). In GGUF layout
# MXFP4's 17-byte blocks would leave its quants at every byte alignment, Q4_1's / Q5_0's / Q5_1's
# 20- / 22- / 24-byte blocks at 4-, 2- and 8-byte ones (no uvec4 loads).
PLANAR = {"Q4_0": (2, 18), "Q8_0": (2, 34), "IQ4_NL": (2, 18), "MXFP4": (1, 17),
          "Q4_1": (4, 20), "Q5_0": (6, 22), "Q5_1": (8, 24)}
# Types whose block is cut into more planes: qtype name -> (block bytes, the byte ranges [start, end)
# of a block that make the planes, in plane order). Q6_K's 210-byte block (2 mod 16: fields at
# 2-byte alignment in every other block) as ql + qh (192 bytes: 12 aligned uvec4s), the 16 int8
# scales (one aligned uvec4) and d (f16), so that the one-token kernel reads each with one aligned
# load (shaders/matvec_stream.comp: Q6_K).
# The lattice types' blocks (2 mod 16 bytes) so that the one-token kernel reads a 64-weight unit's
# fields with aligned loads (matvec_stream.comp IQ2_XXS): IQ2_XXS's and IQ3_XXS's bytes after d
# (64 / 96: a unit's indices, signs and scales one uvec4; IQ3_XXS's signs and scales a uvec2), IQ2_S's
# (80: indices, signs as uvec2s, its high bits and scales as 16-bit words), IQ2_XS's indices and
# signs (64: a uvec4) apart from its 8 scale bytes, IQ3_S's qs (64: a uvec4) apart from its other 44
# bytes (qh, signs, scales: words), IQ1_S's bytes after d (48: a unit's indices a uvec2, their high
# bits a word); d last. (IQ1_M's 56-byte blocks keep 8-byte alignment as they are.) The ternary types'
# blocks (66 / 54 bytes) as qs (64: a half block's two uvec4s; TQ1_0 48: three) and qh (TQ1_0's word)
# apart from d (matvec_stream.comp TQ2_0).
# Q2_K's 84-byte blocks (at every 4-byte offset of a uvec4) as qs (64: a half block's 2 uvec4s), the
# 16 scale bytes (a uvec4) and d, dmin (a word).
PLANES = {"Q6_K": (210, ((0, 192), (192, 208), (208, 210))), "Q2_K": (84, ((16, 80), (0, 16), (80, 84))),
          "IQ2_XXS": (66, ((2, 66), (0, 2))), "IQ3_XXS": (98, ((2, 98), (0, 2))),
          "IQ2_XS": (74, ((2, 66), (66, 74), (0, 2))), "IQ2_S": (82, ((2, 82), (0, 2))),
          "IQ3_S": (110, ((2, 66), (66, 110), (0, 2))), "IQ1_S": (50, ((2, 50), (0, 2))),
          "TQ2_0": (66, ((0, 64), (64, 66))), "TQ1_0": (54, ((0, 48), (48, 52), (52, 54)))}


def planes(qtype) -> tuple | None:
    """(block bytes, plane byte ranges) of a type stored planar on the device, None for the others."""
    name = getattr(qtype, "name", str(qtype))
    if name in PLANES:
        return PLANES[name]
    if name in PLANAR:
        head, size = PLANAR[name]
        return size, ((head, size), (0, head))
    return None


def device_pieces(qtype, chunk) -> list:
    """A chunk of raw GGUF blocks (uint8) as the pieces that, one after another, make the layout
    the kernels read: the chunk itself, or (planar types) a strided view of every block's bytes of
    each plane -- views, copied once, into staging (vk/transfer.py). The views have one opaque
    element per block (numpy void types): numpy copies those 8x faster than 16-byte rows of uint8
    (0.04 against 0.35 s for 10M Q4_0 blocks)."""
    from ..vk.transfer import plane_dtype

    layout = planes(qtype)
    if layout is None:
        return [chunk]
    size, ranges = layout
    blocks = chunk.view(plane_dtype(size, ranges))
    return [blocks[f"p{i}"] for i in range(len(ranges))]


def to_device_layout(qtype, chunk):
    """A chunk of raw GGUF blocks (uint8) in the layout the kernels read, as one array."""
    import numpy as np

    return np.concatenate([np.ascontiguousarray(p).view(np.uint8) for p in device_pieces(qtype, chunk)])


# The IQ1 / IQ2 / IQ3 types index a fixed grid (llamavk/iq_grids.py) that each chunk's buffer holds
# after its blocks, from the first GRID_TAIL_ALIGN-byte boundary (shaders/quants.glsl iq_grid).
GRID_TAIL_ALIGN = 4


def grid_tail(qtype):
    """The bytes a chunk of this type carries after its blocks (a lattice type's grid), or None."""
    from ..iq_grids import grid_bytes

    return grid_bytes(qtype)


def grid_offset(block_bytes: int) -> int:
    return -(-block_bytes // GRID_TAIL_ALIGN) * GRID_TAIL_ALIGN


def upload_qweight(device, raw, qtype, rows: int, cols: int, max_chunk_bytes: int | None = None,
                   experts: int = 0, flush: bool = True) -> QWeight:
    """Copy a weight matrix (raw GGUF blocks, `rows` rows of `cols` elements) to `device`, split into
    row chunks no larger than the device's maxStorageBufferRange (128 MiB on llvmpipe), each in the
    kernels' layout (`device_pieces`). experts > 0: `rows` holds that many stacked expert
    matrices, and chunks hold whole experts. flush=False: the copies may still be running on return
    (a model's load queues every weight, then flushes once: reading the file overlaps the copies)."""
    weight, fill = allocate_qweight(device, raw, qtype, rows, cols, max_chunk_bytes, experts)
    fill()
    if flush:
        device.transfer.flush()
    return weight


def allocate_qweight(device, raw, qtype, rows: int, cols: int, max_chunk_bytes: int | None = None,
                     experts: int = 0, source: tuple[int, int] | None = None, blocks=None):
    """upload_qweight in two steps: (the QWeight, its buffers allocated but not yet written; a
    function that queues the copies of `raw` into them; blocks: a vk.MemoryBlocks that places
    the buffers, bound by its bind() before the copies run). A load records the forward pass, which
    needs only the buffers, while another thread runs the copies (runtime.py). source = (file
    descriptor, offset): `raw` is those bytes of that file, read from it by the transfer's upload
    threads (vk/transfer.py upload_file) rather than copied from `raw` by this thread."""
    import numpy as np

    from ..quant import quant_info

    data = np.ascontiguousarray(np.asarray(raw)).view(np.uint8).reshape(-1)
    row_bytes = quant_info(qtype).row_bytes(cols)
    if data.size != rows * row_bytes:
        raise ValueError(f"weight data is {data.size} bytes, expected {rows} x {row_bytes}")
    grid = grid_tail(qtype)
    # max_chunk_bytes (tests) bounds the blocks; the device's range, the buffer with its grid
    limit = max_chunk_bytes or (device.info.max_storage_buffer_range or (1 << 27)) - \
        (0 if grid is None else GRID_TAIL_ALIGN + grid.size)
    group = rows // experts if experts else 1
    rows_per_chunk = max(1, min(rows, limit // row_bytes)) // group * group or group
    chunks = []
    for start in range(0, rows, rows_per_chunk):
        n = min(rows_per_chunk, rows - start)
        size = n * row_bytes if grid is None else grid_offset(n * row_bytes) + grid.size
        chunks.append(WeightChunk(Buffer(device, size, blocks=blocks), start, n))


    def fill() -> None:
        for c in chunks:     # in staging (or queued) on return; flushed by the caller
            if source is not None:
                fd, offset = source
                device.transfer.upload_file(c.buffer, fd, offset + c.row_start * row_bytes, c.n_rows * row_bytes,
                                            planes(qtype))
            else:
                device.transfer.upload_pieces(c.buffer, device_pieces(
                    qtype, data[c.row_start * row_bytes:(c.row_start + c.n_rows) * row_bytes]))
            if grid is not None:
                device.transfer.upload_pieces(c.buffer, [grid], offset=grid_offset(c.n_rows * row_bytes))

    return QWeight(qtype, rows, cols, tuple(chunks), experts), fill
