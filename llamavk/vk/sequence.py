"""Recorded command sequences: record a forward pass once, replay it every token.

Per-step values (position, KV length...) are not baked into the recording: kernels read them from a
small host-visible parameter buffer, and grid sizes that change per step come from indirect-dispatch
arguments in such a buffer. Replaying is one vkQueueSubmit with prebuilt structures.

Barriers are placed automatically: each dispatch or copy declares the buffer ranges it reads and
writes, and a barrier goes in only before a command that touches something an earlier command (since
the last barrier) wrote, or writes something it read. Independent dispatches therefore overlap.
"""

from __future__ import annotations

import vulkan as vk

from ._ffi import check, ffi, lib, new_struct


def as_range(binding):
    """Accept a Buffer (whole), or (buffer, offset, size)."""
    if isinstance(binding, tuple):
        return binding
    return (binding, 0, binding.size)


def _overlaps(ranges, rng) -> bool:
    b, o, s = rng
    return any(b is b2 and o < o2 + s2 and o2 < o + s for b2, o2, s2 in ranges)


_ALL_ACCESS = (vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT | vk.VK_ACCESS_TRANSFER_READ_BIT
               | vk.VK_ACCESS_TRANSFER_WRITE_BIT | vk.VK_ACCESS_INDIRECT_COMMAND_READ_BIT)
_STAGES = (vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT | vk.VK_PIPELINE_STAGE_TRANSFER_BIT
           | vk.VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT)
COMPUTE = vk.VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT
TRANSFER = vk.VK_PIPELINE_STAGE_TRANSFER_BIT
INDIRECT = vk.VK_PIPELINE_STAGE_DRAW_INDIRECT_BIT
# access masks per stage: what a barrier must make available (src) and visible (dst)
_SRC_ACCESS = {COMPUTE: vk.VK_ACCESS_SHADER_WRITE_BIT, TRANSFER: vk.VK_ACCESS_TRANSFER_WRITE_BIT}
_DST_ACCESS = {COMPUTE: vk.VK_ACCESS_SHADER_READ_BIT | vk.VK_ACCESS_SHADER_WRITE_BIT,
               TRANSFER: vk.VK_ACCESS_TRANSFER_READ_BIT | vk.VK_ACCESS_TRANSFER_WRITE_BIT,
               INDIRECT: vk.VK_ACCESS_INDIRECT_COMMAND_READ_BIT}


def _mask(table, stages: int) -> int:
    return sum(bits for stage, bits in table.items() if stages & stage)


class CommandSequence:
    """A primary command buffer recorded once and submitted any number of times."""

    def __init__(self, device, name: str = "sequence", profile: bool = False, pool=None):
        """pool: the VkCommandPool to allocate from (default the device's). A pool is used by one
        thread at a time: work recorded on another thread (vk/transfer.py's uploads) has its own."""
        self.device = device
        self.name = name
        self.pool = pool if pool is not None else device.command_pool
        # profile: a GPU timestamp after every dispatch, for per-kernel timings (profile_results()).
        self.profiler = _Profiler(device) if profile and device.info.timestamp_period else None
        self.label = ""               # what the caller is recording now (profile entries: "kernel label")
        alloc = vk.VkCommandBufferAllocateInfo(commandPool=self.pool,
                                               level=vk.VK_COMMAND_BUFFER_LEVEL_PRIMARY, commandBufferCount=1)
        self.cmd = vk.vkAllocateCommandBuffers(device.handle, alloc)[0]
        self._written: list = []
        self._read: list = []
        self._src_stages = 0          # stages of the commands recorded since the last barrier
        self._writes: list = []       # every range written in this recording, in order (written_since)
        self.memo: dict = {}          # recorders' notes about this recording (reset by begin)
        self.n_dispatches = 0
        self.n_copies = 0
        self.n_barriers = 0
        self._barrier = new_struct("VkMemoryBarrier", vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                   srcAccessMask=_ALL_ACCESS, dstAccessMask=_ALL_ACCESS)
        self._host_barrier = new_struct("VkMemoryBarrier", vk.VK_STRUCTURE_TYPE_MEMORY_BARRIER,
                                        srcAccessMask=_ALL_ACCESS, dstAccessMask=vk.VK_ACCESS_HOST_READ_BIT)
        self._submit = None
        self.recording = False
        device.register(self)

    # -- recording ---------------------------------------------------------------------------
    def begin(self) -> "CommandSequence":
        check(lib.vkResetCommandBuffer(self.cmd, 0), "vkResetCommandBuffer")
        info = new_struct("VkCommandBufferBeginInfo", vk.VK_STRUCTURE_TYPE_COMMAND_BUFFER_BEGIN_INFO)
        check(lib.vkBeginCommandBuffer(self.cmd, info), "vkBeginCommandBuffer")
        self._written, self._read = [], []
        self._src_stages = 0
        self._writes, self.memo = [], {}
        self.n_dispatches = self.n_copies = self.n_barriers = 0
        self.recording = True
        if self.profiler:
            self.profiler.begin(self.cmd)
        return self

    def _depend(self, reads, writes, stage: int, chained: bool = False) -> None:
        if not chained and (any(_overlaps(self._written, r) for r in reads + writes)
                            or any(_overlaps(self._read, w) for w in writes)):
            self.barrier()
        self._read.extend(reads)
        self._written.extend(writes)
        self._writes.extend(writes)
        self._src_stages |= stage

    def write_mark(self) -> int:
        """A point in this recording, for written_since."""
        return len(self._writes)

    def written_since(self, mark: int, *ranges) -> bool:
        """Whether a command recorded after `mark` (write_mark) writes any of these (buffer, offset,
        size) ranges."""
        return any(_overlaps(self._writes[mark:], r) for r in ranges)

    def barrier(self, dst_stages: int = COMPUTE | TRANSFER) -> None:
        """Make the writes of the commands since the last barrier visible to later compute and transfer
        commands. The source scope names only the stages recorded since the last barrier (a compute-only
        span does not wait for transfer work); the destination always includes both compute and
        transfer, so a later copy is ordered after a compute write from before an earlier barrier.
        Indirect-command reads are left out (naming them can flush the command front end); an
        indirect dispatch gets a barrier of its own that names them (see dispatch)."""
        src = self._src_stages or COMPUTE
        self._barrier.srcAccessMask = _mask(_SRC_ACCESS, src)
        self._barrier.dstAccessMask = _mask(_DST_ACCESS, dst_stages)
        lib.vkCmdPipelineBarrier(self.cmd, src, dst_stages, 0, 1, self._barrier, 0, ffi.NULL, 0, ffi.NULL)
        self._written, self._read = [], []
        self._src_stages = 0
        self.n_barriers += 1

    def dispatch(self, kernel, buffers, groups=(1, 1, 1), push: bytes = b"", indirect=None,
                 chained: bool = False) -> None:
        """Record `kernel` over `buffers` (one per binding). `indirect=(buffer, offset)` reads the
        group counts (3 x uint32) from a buffer at execution time instead of `groups`. `chained`: no
        barrier before this dispatch, whatever it shares with the commands since the last barrier --
        its shader waits for them itself (matvec_stream.comp WAIT); later commands are ordered after
        both as usual."""
        ranges = [as_range(b) for b in buffers]
        # buffers whose accesses the shaders order themselves (kernels/chain.py's counters: atomic
        # counts and polls) need no barrier between dispatches
        tracked = [(r, a) for r, a in zip(ranges, kernel.bindings) if not getattr(r[0], "shader_ordered", False)]
        reads = [r for r, a in tracked if a != "w"]
        writes = [r for r, a in tracked if a == "w"]
        if indirect is not None:
            # The group counts may have been written by any earlier command: make everything visible
            # to the indirect-command read (all earlier stages, to every stage).
            self._src_stages |= COMPUTE | TRANSFER
            self.barrier(_STAGES)
        self._depend(reads, writes, COMPUTE, chained and indirect is None)
        dset = kernel.descriptor_set(ranges)
        lib.vkCmdBindPipeline(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.pipeline)
        lib.vkCmdBindDescriptorSets(self.cmd, vk.VK_PIPELINE_BIND_POINT_COMPUTE, kernel.layout, 0, 1,
                                    ffi.new("VkDescriptorSet[1]", [dset]), 0, ffi.NULL)
        if kernel.push_size:
            # Always push, even all-zero constants: llvmpipe crashes on a pipeline with push
            # constants dispatched before any vkCmdPushConstants.
            data = bytes(push).ljust(kernel.push_size, b"\0")
            if len(data) != kernel.push_size:
                raise ValueError(f"{kernel.name}: push constants are {kernel.push_size} bytes, got {len(push)}")
            lib.vkCmdPushConstants(self.cmd, kernel.layout, vk.VK_SHADER_STAGE_COMPUTE_BIT, 0, len(data), data)
        if indirect is not None:
            lib.vkCmdDispatchIndirect(self.cmd, indirect[0].handle, indirect[1])
        else:
            gx, gy, gz = (tuple(groups) + (1, 1))[:3]
            if gx and gy and gz:
                lib.vkCmdDispatch(self.cmd, gx, gy, gz)
        self.n_dispatches += 1
        if self.profiler:
            self.profiler.mark(self.cmd, f"{kernel.name} {self.label}".rstrip())

    def copy(self, src, dst, size: int, src_offset: int = 0, dst_offset: int = 0) -> None:
        self._depend([(src, src_offset, size)], [(dst, dst_offset, size)], TRANSFER)
        region = ffi.new("VkBufferCopy*", dict(srcOffset=src_offset, dstOffset=dst_offset, size=size))
        lib.vkCmdCopyBuffer(self.cmd, src.handle, dst.handle, 1, region)
        self.n_copies += 1

    def copy_regions(self, src, dst, regions) -> None:
        """Several (src_offset, dst_offset, size) copies in one command (e.g. a column block of a
        row-major matrix); dependencies are tracked on the regions' bounding ranges."""
        lo_s = min(r[0] for r in regions)
        lo_d = min(r[1] for r in regions)
        hi_s = max(r[0] + r[2] for r in regions)
        hi_d = max(r[1] + r[2] for r in regions)
        self._depend([(src, lo_s, hi_s - lo_s)], [(dst, lo_d, hi_d - lo_d)], TRANSFER)
        array = ffi.new("VkBufferCopy[]", [dict(srcOffset=s, dstOffset=d, size=n) for s, d, n in regions])
        lib.vkCmdCopyBuffer(self.cmd, src.handle, dst.handle, len(regions), array)
        self.n_copies += 1

    def fill(self, dst, value: int = 0, size: int | None = None, offset: int = 0) -> None:
        size = dst.size - offset if size is None else size
        self._depend([], [(dst, offset, size)], TRANSFER)
        lib.vkCmdFillBuffer(self.cmd, dst.handle, offset, size, value)
        self.n_copies += 1

    @property
    def empty(self) -> bool:
        return self.n_dispatches == 0 and self.n_copies == 0

    def end(self) -> "CommandSequence":
        # Device writes become visible to the host once the host has waited for this submission.
        lib.vkCmdPipelineBarrier(self.cmd, _STAGES, vk.VK_PIPELINE_STAGE_HOST_BIT, 0, 1, self._host_barrier,
                                 0, ffi.NULL, 0, ffi.NULL)
        check(lib.vkEndCommandBuffer(self.cmd), "vkEndCommandBuffer")
        self.recording = False
        self._submit = None
        return self

    # -- replay ------------------------------------------------------------------------------
    def submit(self, waits=(), signals=()) -> int:
        """Queue the recorded commands. `waits`/`signals`: [(TimelineSemaphore, value)].
        Also signals the device's own timeline; returns that value (see Device.wait_idle)."""
        if self.device.writes_pending and self.pool is self.device.command_pool:
            # a step reads what Device.write_soon queued (the transfer's copies, from pools of their
            # own, need not wait)
            self.device.settle_writes()
        value = self.device.next_timeline_value()
        key = (tuple(id(s) for s, _ in waits), tuple(id(s) for s, _ in signals))
        if self._submit is None or self._submit[0] != key:
            self._submit = (key, _SubmitInfo(self, waits, signals))
        info = self._submit[1]
        info.set_values(value, waits, signals)
        check(lib.vkQueueSubmit(self.device.queue, 1, info.submit, ffi.NULL), f"vkQueueSubmit({self.name})")
        return value

    def run(self) -> None:
        """Submit and wait for completion."""
        self.device.timeline.wait(self.submit())

    def profile_results(self) -> list[tuple[str, float]]:
        """(kernel name, microseconds) per dispatch of the last completed run: the time from the
        previous timestamp to this dispatch's completion (exact when dispatches are serialized)."""
        return self.profiler.results() if self.profiler else []

    def close(self) -> None:
        if self.profiler:
            self.profiler.close()
            self.profiler = None
        if self.cmd is not None and self.device.handle is not None:
            lib.vkFreeCommandBuffers(self.device.handle, self.pool, 1,
                                     ffi.new("VkCommandBuffer[1]", [self.cmd]))
        self.cmd = None


class _SubmitInfo:
    """Prebuilt VkSubmitInfo + timeline values: a replay only rewrites the values."""

    def __init__(self, seq, waits, signals):
        sem_wait = [s.handle for s, _ in waits]
        sem_signal = [seq.device.timeline.handle] + [s.handle for s, _ in signals]
        self.wait_handles = ffi.new("VkSemaphore[]", sem_wait or [ffi.NULL])
        self.wait_stages = ffi.new("VkPipelineStageFlags[]", [vk.VK_PIPELINE_STAGE_ALL_COMMANDS_BIT] * max(1, len(waits)))
        self.signal_handles = ffi.new("VkSemaphore[]", sem_signal)
        self.wait_values = ffi.new("uint64_t[]", max(1, len(waits)))
        self.signal_values = ffi.new("uint64_t[]", len(sem_signal))
        self.cmds = ffi.new("VkCommandBuffer[1]", [seq.cmd])
        self.timeline = new_struct("VkTimelineSemaphoreSubmitInfo", vk.VK_STRUCTURE_TYPE_TIMELINE_SEMAPHORE_SUBMIT_INFO,
                                   waitSemaphoreValueCount=len(waits), pWaitSemaphoreValues=self.wait_values,
                                   signalSemaphoreValueCount=len(sem_signal), pSignalSemaphoreValues=self.signal_values)
        self.submit = new_struct("VkSubmitInfo", vk.VK_STRUCTURE_TYPE_SUBMIT_INFO, self.timeline,
                                 waitSemaphoreCount=len(waits), pWaitSemaphores=self.wait_handles,
                                 pWaitDstStageMask=self.wait_stages, commandBufferCount=1, pCommandBuffers=self.cmds,
                                 signalSemaphoreCount=len(sem_signal), pSignalSemaphores=self.signal_handles)

    def set_values(self, own_value, waits, signals) -> None:
        for i, (_, v) in enumerate(waits):
            self.wait_values[i] = v
        self.signal_values[0] = own_value
        for i, (_, v) in enumerate(signals):
            self.signal_values[i + 1] = v


class _Profiler:
    MAX = 8192

    def __init__(self, device):
        self.device = device
        info = new_struct("VkQueryPoolCreateInfo", vk.VK_STRUCTURE_TYPE_QUERY_POOL_CREATE_INFO,
                          queryType=vk.VK_QUERY_TYPE_TIMESTAMP, queryCount=self.MAX)
        out = ffi.new("VkQueryPool*")
        check(lib.vkCreateQueryPool(device.handle, info, ffi.NULL, out), "vkCreateQueryPool")
        self.pool = out[0]
        self.names: list[str] = []

    def begin(self, cmd) -> None:
        self.names = []
        lib.vkCmdResetQueryPool(cmd, self.pool, 0, self.MAX)
        lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.pool, 0)

    def mark(self, cmd, name: str) -> None:
        if len(self.names) + 1 < self.MAX:
            self.names.append(name)
            lib.vkCmdWriteTimestamp(cmd, vk.VK_PIPELINE_STAGE_BOTTOM_OF_PIPE_BIT, self.pool, len(self.names))

    def results(self) -> list[tuple[str, float]]:
        n = len(self.names) + 1
        data = ffi.new("uint64_t[]", n)
        check(lib.vkGetQueryPoolResults(self.device.handle, self.pool, 0, n, n * 8, data, 8,
                                        vk.VK_QUERY_RESULT_64_BIT | vk.VK_QUERY_RESULT_WAIT_BIT),
              "vkGetQueryPoolResults")
        period = self.device.info.timestamp_period / 1000.0
        return [(name, (data[i + 1] - data[i]) * period) for i, name in enumerate(self.names)]

    def close(self) -> None:
        if self.device.handle is not None:
            vk.vkDestroyQueryPool(self.device.handle, self.pool, None)
