"""Buffers: device-local, host-visible (persistently mapped), and host memory shared by devices.

`Buffer` is one VkBuffer with its own allocation, or bound at an offset of a block that
`MemoryBlocks` allocated for many buffers (a model's weights, its KV cache: one vkAllocateMemory per
GiB instead of one per tensor). `SharedHostMemory` is one page-aligned host allocation imported into
several devices (VK_EXT_external_memory_host): each device sees it as a `Buffer`, the host sees it as
numpy, and nothing is copied between them.
"""

from __future__ import annotations

import mmap

import numpy as np
import vulkan as vk

from ..errors import LlamavkError
from ._ffi import check, ffi, lib, new_struct
from .device import DEVICE_LOCAL, HOST_VISIBLE

TEXEL_BYTES = 16   # a texel view's element: VK_FORMAT_R32G32B32A32_UINT (vk/kernel.py "t")
USAGE = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
         | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT | vk.VK_BUFFER_USAGE_INDIRECT_BUFFER_BIT)


class Buffer:
    """A VkBuffer bound to its own memory, or to part of a `MemoryBlocks` block (`blocks=`: bound
    when the blocks' bind() runs; nothing may use the buffer before). Host-visible buffers stay
    mapped (`.array()`)."""

    def __init__(self, device, size: int, host_visible: bool = False, _import=None, blocks=None):
        self.device = device
        self.size = max(int(size), 4)
        self.host_visible = host_visible
        self._mapped = None
        self._texel_views: dict = {}  # texel_view()'s, by (offset, size)
        self._block = None            # the MemoryBlocks block this buffer lives in (None: its own memory)
        self.memory = None
        if blocks is not None and (host_visible or _import is not None):
            raise ValueError("MemoryBlocks place device-local buffers only")
        external = None
        if _import is not None:
            external = new_struct("VkExternalMemoryBufferCreateInfo",
                                  vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                                  handleTypes=vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT)
        # Software devices read weights as texels too (vk/kernel.py "t"): whole 16-byte texels.
        texels = device.info.is_cpu
        self.alloc_size = -(-self.size // TEXEL_BYTES) * TEXEL_BYTES if texels and _import is None else self.size
        usage = USAGE | (vk.VK_BUFFER_USAGE_UNIFORM_TEXEL_BUFFER_BIT if texels else 0)
        create = new_struct("VkBufferCreateInfo", vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO,
                            external if external is not None else ffi.NULL,
                            size=self.alloc_size, usage=usage, sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
        out = ffi.new("VkBuffer*")
        check(lib.vkCreateBuffer(device.handle, create, ffi.NULL, out), "vkCreateBuffer")
        self.handle = out[0]
        req = vk.vkGetBufferMemoryRequirements(device.handle, self.handle)
        if blocks is not None:
            device.register(self)     # first: if placing it fails, the device still destroys it
            blocks._add(self, req)
            return
        try:
            if _import is not None:
                self.memory = _import(req)
            else:
                mtype = _memory_type(device, req.memoryTypeBits, host_visible)
                self.memory = _allocate(device, req.size, mtype)
        except BaseException:
            vk.vkDestroyBuffer(device.handle, self.handle, None)
            raise
        check(lib.vkBindBufferMemory(device.handle, self.handle, self.memory, 0), "vkBindBufferMemory")
        if host_visible and _import is None:
            self._mapped = vk.vkMapMemory(device.handle, self.memory, 0, self.size, 0)
        device.register(self)

    def array(self, dtype=np.uint8, count: int | None = None, offset: int = 0) -> np.ndarray:
        """A numpy view of a host-visible buffer's memory (writes go straight to the buffer)."""
        if self._mapped is None:
            raise LlamavkError("buffer is not host-visible")
        dtype = np.dtype(dtype)
        if count is None:
            count = (self.size - offset) // dtype.itemsize
        return np.frombuffer(self._mapped, dtype=dtype, count=count, offset=offset)

    def write(self, data, offset: int = 0) -> None:
        """Copy host data in (directly when mapped, else through the device's staging buffer)."""
        if self._mapped is not None:
            src = np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)
            self.array(np.uint8, src.size, offset)[:] = src
        else:
            self.device.upload(self, data, offset)

    def read(self, size: int | None = None, offset: int = 0) -> bytes:
        size = self.size - offset if size is None else size
        if self._mapped is not None:
            return bytes(self._mapped[offset:offset + size])
        return self.device.download(self, size, offset)

    def texel_view(self, offset: int, size: int):
        """A VkBufferView of [offset, offset + size) as RGBA32UI texels (a kernel's "t" binding:
        vk/kernel.py), made once per range and destroyed with the buffer. The range grows to whole
        texels within the buffer (made in whole texels where views are possible: __init__)."""
        view = self._texel_views.get((offset, size))
        if view is None:
            if offset % TEXEL_BYTES:   # minTexelBufferOffsetAlignment: 16 on llvmpipe
                raise LlamavkError(f"a texel view at byte {offset} of a buffer (not a multiple of {TEXEL_BYTES})")
            span = min(-(-size // TEXEL_BYTES) * TEXEL_BYTES, self.alloc_size - offset) // TEXEL_BYTES * TEXEL_BYTES
            info = new_struct("VkBufferViewCreateInfo", vk.VK_STRUCTURE_TYPE_BUFFER_VIEW_CREATE_INFO,
                              buffer=self.handle, format=vk.VK_FORMAT_R32G32B32A32_UINT, offset=offset, range=span)
            out = ffi.new("VkBufferView*")
            check(lib.vkCreateBufferView(self.device.handle, info, ffi.NULL, out), "vkCreateBufferView")
            view = self._texel_views[(offset, size)] = out[0]
        return view

    def close(self) -> None:
        if self.handle is None:
            return
        for view in self._texel_views.values():
            lib.vkDestroyBufferView(self.device.handle, view, ffi.NULL)
        self._texel_views.clear()
        vk.vkDestroyBuffer(self.device.handle, self.handle, None)
        if self._block is not None:
            self._block.release()
        elif self.memory is not None:
            if self._mapped is not None:
                vk.vkUnmapMemory(self.device.handle, self.memory)
            vk.vkFreeMemory(self.device.handle, self.memory, None)
        self.handle = None
        self._mapped = None
        self._block = None

    def __repr__(self):
        return f"Buffer({self.size} bytes on {self.device.name}{', host' if self.host_visible else ''})"


def _memory_type(device, type_bits: int, host_visible: bool) -> int:
    """Device-local memory; or, for host-visible buffers, cached system memory where there is one:
    the CPU reads uncached (write-combined) memory at a small fraction of its speed (logits!)."""
    if not host_visible:
        return device.memory_type(type_bits, DEVICE_LOCAL)
    try:
        return device.memory_type(type_bits, HOST_VISIBLE | vk.VK_MEMORY_PROPERTY_HOST_CACHED_BIT, avoid=DEVICE_LOCAL)
    except LlamavkError:
        return device.memory_type(type_bits, HOST_VISIBLE, avoid=DEVICE_LOCAL)


def _allocate(device, size: int, memory_type: int, pnext=ffi.NULL):
    info = new_struct("VkMemoryAllocateInfo", vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, pnext,
                      allocationSize=size, memoryTypeIndex=memory_type)
    out = ffi.new("VkDeviceMemory*")
    result = lib.vkAllocateMemory(device.handle, info, ffi.NULL, out)
    if result in (vk.VK_ERROR_OUT_OF_DEVICE_MEMORY, vk.VK_ERROR_OUT_OF_HOST_MEMORY):
        raise LlamavkError(f"{device.name}: out of memory allocating {size / 2**20:.1f} MiB")
    check(result, "vkAllocateMemory")
    return out[0]


BLOCK_BYTES = 1 << 30   # Vulkan guarantees maxMemoryAllocationSize >= 1 GiB on every device


class MemoryBlocks:
    """Device-local buffers placed side by side in a few large allocations.

    Drivers pay per vkAllocateMemory (~0.2 ms each on NVIDIA, more for larger ones) and a model has
    a buffer per weight (chunk) and two per layer for its KV cache: a 1.1B model ~200 allocations.
    Here `buffer(size)` creates the VkBuffer at once (recordings need only its handle) and `bind()`
    then allocates blocks of at most BLOCK_BYTES, each exactly as large as the buffers it holds,
    and binds every buffer at an offset aligned to its own memory requirements. A buffer larger
    than a block gets a block of its own, as a lone Buffer would. Descriptors keep addressing each
    buffer from its offset 0, so minStorageBufferOffsetAlignment and maxStorageBufferRange apply
    per buffer exactly as before; there are no images, so bufferImageGranularity does not apply.
    A block's memory is freed when the last buffer in it is closed.
    """

    def __init__(self, device, block_bytes: int | None = None):
        self.device = device
        self.block_bytes = int(block_bytes or BLOCK_BYTES)
        self._pending: list = []          # (buffer, size, alignment, memory type) not yet bound
        self.blocks: list[_Block] = []    # every block this object allocated (tests, accounting)

    def buffer(self, size: int) -> Buffer:
        return Buffer(self.device, size, blocks=self)

    def _add(self, buf: Buffer, req) -> None:
        mtype = _memory_type(self.device, req.memoryTypeBits, False)
        self._pending.append((buf, int(req.size), int(req.alignment), mtype))

    def bind(self) -> None:
        """Allocate the blocks for every buffer made since the last bind() and bind them."""
        pending, self._pending = [p for p in self._pending if p[0].handle is not None], []
        by_type: dict[int, list] = {}
        for item in pending:
            by_type.setdefault(item[3], []).append(item)
        for mtype, items in by_type.items():
            placed: list = []             # (buffer, offset) of the block being filled
            top = 0
            for buf, size, align, _ in items:
                offset = (top + align - 1) // align * align
                if placed and offset + size > self.block_bytes:
                    self._allocate(mtype, top, placed)
                    placed, offset = [], 0
                placed.append((buf, offset))
                top = offset + size
            if placed:
                self._allocate(mtype, top, placed)

    def _allocate(self, mtype: int, size: int, placed) -> None:
        memory = _allocate(self.device, size, mtype)   # on failure the unbound buffers close with the device
        block = _Block(self.device, memory, size, len(placed))
        self.blocks.append(block)
        handle = self.device.handle
        for buf, offset in placed:
            check(lib.vkBindBufferMemory(handle, buf.handle, memory, offset), "vkBindBufferMemory")
            buf.memory, buf._block, buf.offset_in_block = memory, block, offset


class _Block:
    """One VkDeviceMemory shared by `users` buffers; freed when the last of them is closed."""

    def __init__(self, device, memory, size: int, users: int):
        self.device, self.memory, self.size, self.users = device, memory, size, users

    def release(self) -> None:
        self.users -= 1
        if self.users == 0 and self.memory is not None:
            vk.vkFreeMemory(self.device.handle, self.memory, None)
            self.memory = None


class SharedHostMemory:
    """One host allocation imported into several devices: cross-device transfers with no extra copy.

    The host side is an anonymous mmap (page-aligned, as the extension requires); `buffer(device)`
    is that memory as a storage buffer on `device`. Devices of different vendors and drivers can
    all import it: they share nothing else.
    """

    def __init__(self, size: int, devices):
        align = max([d.info.host_import_alignment or 4096 for d in devices] + [mmap.PAGESIZE])
        self.size = (int(size) + align - 1) // align * align
        for d in devices:
            if "VK_EXT_external_memory_host" not in d.extensions:
                raise LlamavkError(f"{d.name} cannot import host memory (no VK_EXT_external_memory_host)")
        self._map = mmap.mmap(-1, self.size)
        self.host = np.frombuffer(self._map, dtype=np.uint8)
        self._address = ffi.cast("void*", self.host.ctypes.data)
        self._buffers = {}
        for d in devices:
            self._buffers[id(d)] = Buffer(d, self.size, host_visible=False, _import=self._importer(d))

    def _importer(self, device):
        def import_memory(req):
            get_props = device.proc("vkGetMemoryHostPointerPropertiesEXT")
            props = get_props(device.handle, vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
                              self._address)
            bits = props.memoryTypeBits
            bits &= req.memoryTypeBits
            mtype = device.memory_type(bits, vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT)
            info = new_struct("VkImportMemoryHostPointerInfoEXT",
                              vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_HOST_POINTER_INFO_EXT,
                              handleType=vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_HOST_ALLOCATION_BIT_EXT,
                              pHostPointer=self._address)
            return _allocate(device, self.size, mtype, info)
        return import_memory

    def buffer(self, device) -> Buffer:
        return self._buffers[id(device)]

    def array(self, dtype=np.uint8, count: int | None = None, offset: int = 0) -> np.ndarray:
        dtype = np.dtype(dtype)
        if count is None:
            count = (self.size - offset) // dtype.itemsize
        return np.frombuffer(self._map, dtype=dtype, count=count, offset=offset)

    def close(self) -> None:
        """Release every device's view (each device also releases its own when it closes)."""
        for buf in self._buffers.values():
            buf.close()
        self._buffers.clear()

