"""Can two GPUs share device memory through Vulkan on this machine? (What split modes would need to
exchange activations GPU to GPU instead of through host memory: docs/PERFORMANCE.md, "What limits
split modes now".)

For the first two devices (or one named twice: the same-GPU control): the device groups the driver
reports, the external-memory handle types it can export and import for storage buffers, and for
dma-buf and opaque-fd handles in turn: a device-local buffer exported from A and imported on B, A
filling it and B reading it back (and the reverse), and B's copy rate out of and into it. A handle
type the driver refuses, or an import that shares nothing (B reads other bytes), is reported, not
raised.

    python3 benchmarks/peer_memory_probe.py [-dev Vulkan0,Vulkan1]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import NamedTuple

import vulkan as vk

import llamavk.vk.device as device_module
from llamavk.errors import LlamavkError
from llamavk.vk._ffi import check, ffi, lib, new_struct
from llamavk.vk.buffer import Buffer
from llamavk.vk.instance import get_instance
from llamavk.vk.sequence import CommandSequence

# Devices enable only the extensions the engine uses; the probe needs the fd-based external memory
# ones too, so it adds them before creating its devices.
PROBE_EXTENSIONS = ("VK_KHR_external_memory_fd", "VK_EXT_external_memory_dma_buf")
USAGE = (vk.VK_BUFFER_USAGE_STORAGE_BUFFER_BIT | vk.VK_BUFFER_USAGE_TRANSFER_SRC_BIT
         | vk.VK_BUFFER_USAGE_TRANSFER_DST_BIT)
HANDLE_TYPES = {"dma-buf": vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT,
                "opaque fd": vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_OPAQUE_FD_BIT}
SIZE = 256 << 20
PATTERN_A, PATTERN_B = 0x5A5A1234, 0x0BADBEEF


def device_groups(instance) -> list[int]:
    """Physical devices per device group (a group of several could share memory: VK_KHR_device_group)."""
    count = ffi.new("uint32_t*")
    check(lib.vkEnumeratePhysicalDeviceGroups(instance.handle, count, ffi.NULL), "vkEnumeratePhysicalDeviceGroups")
    groups = ffi.new("VkPhysicalDeviceGroupProperties[]", count[0])
    for i in range(count[0]):
        groups[i].sType = vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_GROUP_PROPERTIES
    check(lib.vkEnumeratePhysicalDeviceGroups(instance.handle, count, groups), "vkEnumeratePhysicalDeviceGroups")
    return [groups[i].physicalDeviceCount for i in range(count[0])]


def external_features(dev, handle_type: int) -> tuple[int, int]:
    """(externalMemoryFeatures, compatibleHandleTypes) for a storage buffer of this handle type."""
    info = new_struct("VkPhysicalDeviceExternalBufferInfo", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_BUFFER_INFO,
                      usage=USAGE, handleType=handle_type)
    out = new_struct("VkExternalBufferProperties", vk.VK_STRUCTURE_TYPE_EXTERNAL_BUFFER_PROPERTIES)
    lib.vkGetPhysicalDeviceExternalBufferProperties(dev.physical, info, out)
    props = out.externalMemoryProperties
    return props.externalMemoryFeatures, props.compatibleHandleTypes


class _External(NamedTuple):
    """A raw VkBuffer of SIZE bytes, in the shape CommandSequence records copies and fills of."""
    handle: object
    size: int = SIZE


def _external_buffer(dev, handle_type: int):
    ext = new_struct("VkExternalMemoryBufferCreateInfo", vk.VK_STRUCTURE_TYPE_EXTERNAL_MEMORY_BUFFER_CREATE_INFO,
                     handleTypes=handle_type)
    create = new_struct("VkBufferCreateInfo", vk.VK_STRUCTURE_TYPE_BUFFER_CREATE_INFO, ext, size=SIZE, usage=USAGE,
                        sharingMode=vk.VK_SHARING_MODE_EXCLUSIVE)
    out = ffi.new("VkBuffer*")
    check(lib.vkCreateBuffer(dev.handle, create, ffi.NULL, out), "vkCreateBuffer")
    return _External(out[0]), vk.vkGetBufferMemoryRequirements(dev.handle, out[0])


def _bind(dev, buf, size: int, memory_type: int, pnext) -> None:
    info = new_struct("VkMemoryAllocateInfo", vk.VK_STRUCTURE_TYPE_MEMORY_ALLOCATE_INFO, pnext,
                      allocationSize=size, memoryTypeIndex=memory_type)
    memory = ffi.new("VkDeviceMemory*")
    check(lib.vkAllocateMemory(dev.handle, info, ffi.NULL, memory), "vkAllocateMemory")
    check(lib.vkBindBufferMemory(dev.handle, buf.handle, memory[0], 0), "vkBindBufferMemory")
    return memory[0]


def export_buffer(dev, handle_type: int):
    """A device-local buffer on dev and a file descriptor for its memory."""
    buf, req = _external_buffer(dev, handle_type)
    dedicated = new_struct("VkMemoryDedicatedAllocateInfo", vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                           buffer=buf.handle)
    export = new_struct("VkExportMemoryAllocateInfo", vk.VK_STRUCTURE_TYPE_EXPORT_MEMORY_ALLOCATE_INFO, dedicated,
                        handleTypes=handle_type)
    memory = _bind(dev, buf, req.size, dev.memory_type(req.memoryTypeBits, device_module.DEVICE_LOCAL), export)
    get_fd = ffi.cast("PFN_vkGetMemoryFdKHR", lib.vkGetDeviceProcAddr(dev.handle, b"vkGetMemoryFdKHR"))
    info = new_struct("VkMemoryGetFdInfoKHR", vk.VK_STRUCTURE_TYPE_MEMORY_GET_FD_INFO_KHR, memory=memory,
                      handleType=handle_type)
    fd = ffi.new("int*")
    check(get_fd(dev.handle, info, fd), "vkGetMemoryFdKHR")
    return buf, fd[0]


def import_buffer(dev, handle_type: int, fd: int):
    """fd's memory bound to a new buffer on dev (the import takes the descriptor over)."""
    buf, req = _external_buffer(dev, handle_type)
    bits = req.memoryTypeBits
    if handle_type == vk.VK_EXTERNAL_MEMORY_HANDLE_TYPE_DMA_BUF_BIT_EXT:
        get_props = ffi.cast("PFN_vkGetMemoryFdPropertiesKHR",
                             lib.vkGetDeviceProcAddr(dev.handle, b"vkGetMemoryFdPropertiesKHR"))
        props = new_struct("VkMemoryFdPropertiesKHR", vk.VK_STRUCTURE_TYPE_MEMORY_FD_PROPERTIES_KHR)
        check(get_props(dev.handle, handle_type, fd, props), "vkGetMemoryFdPropertiesKHR")
        bits &= props.memoryTypeBits
    if not bits:
        raise LlamavkError("no memory type can hold the imported memory")
    dedicated = new_struct("VkMemoryDedicatedAllocateInfo", vk.VK_STRUCTURE_TYPE_MEMORY_DEDICATED_ALLOCATE_INFO,
                           buffer=buf.handle)
    info = new_struct("VkImportMemoryFdInfoKHR", vk.VK_STRUCTURE_TYPE_IMPORT_MEMORY_FD_INFO_KHR, dedicated,
                      handleType=handle_type, fd=fd)
    _bind(dev, buf, SIZE, (bits & -bits).bit_length() - 1, info)
    return buf


def run_once(dev, record) -> float:
    """Record commands (record(seq)) in a CommandSequence, run it; host seconds from submit to done."""
    seq = CommandSequence(dev, "peer memory probe").begin()
    record(seq)
    seq.end()
    start = time.perf_counter()
    seq.run()
    seconds = time.perf_counter() - start
    seq.close()
    return seconds


def first_words(dev, buf) -> list[int]:
    host = Buffer(dev, 4096, host_visible=True)
    run_once(dev, lambda seq: seq.copy(buf, host, 4096))
    words = [int(w) for w in host.array(dtype="<u4", count=4)]
    host.close()
    return words


def share(a, b, handle_type: int) -> str:
    """One handle type from a to b: what each side reads of the other's writes, and b's copy rates."""
    buf_a, fd = export_buffer(a, handle_type)
    buf_b = import_buffer(b, handle_type, fd)
    run_once(a, lambda seq: seq.fill(buf_a, PATTERN_A))
    b_reads = first_words(b, buf_b)
    run_once(b, lambda seq: seq.fill(buf_b, PATTERN_B))
    a_reads = first_words(a, buf_a)
    shared = all(w == PATTERN_A for w in b_reads) and all(w == PATTERN_B for w in a_reads)
    local = Buffer(b, SIZE)
    run_once(b, lambda seq: seq.copy(buf_b, local, SIZE))   # warm-up
    read = run_once(b, lambda seq: seq.copy(buf_b, local, SIZE))
    write = run_once(b, lambda seq: seq.copy(local, buf_b, SIZE))
    local.close()
    verdict = "shared" if shared else "NOT shared (each side reads its own bytes)"
    return (f"{verdict}: B read {b_reads[0]:#x} after A wrote {PATTERN_A:#x}, A read {a_reads[0]:#x} after B wrote "
            f"{PATTERN_B:#x}; B copies 256 MiB out of it {SIZE / read / 1e9:.0f} GB/s, into it "
            f"{SIZE / write / 1e9:.0f} GB/s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-dev", default=None, help="two devices, e.g. Vulkan0,Vulkan1 (default: the first two)")
    args = ap.parse_args()
    instance = get_instance()
    names = args.dev.split(",") if args.dev else [f"Vulkan{i}" for i in range(min(2, len(instance.devices)))]
    if len(names) == 1:
        names *= 2
    infos = [instance.devices[int(n.removeprefix("Vulkan"))] for n in names]
    print(f"device groups (physical devices in each): {device_groups(instance)}")
    device_module.OPTIONAL_EXTENSIONS = tuple(device_module.OPTIONAL_EXTENSIONS) + PROBE_EXTENSIONS
    same = infos[0] is infos[1]   # one GPU named twice: two logical devices on it, the second "VulkanNb"
    devs = [device_module.Device(info, instance, name=name + ("b" if same and i else ""))
            for i, (info, name) in enumerate(zip(infos, names))]
    for d in devs[:1] if same else devs:
        print(f"{d.name} ({d.info.name}): " + "; ".join(
            f"{label} features {external_features(d, ht)[0]:#x}" for label, ht in HANDLE_TYPES.items()))
    a, b = devs
    for label, handle_type in HANDLE_TYPES.items():
        try:
            print(f"{a.name} -> {b.name}, {label}: {share(a, b, handle_type)}")
        except (LlamavkError, vk.VkError) as exc:
            print(f"{a.name} -> {b.name}, {label}: refused ({exc})")


if __name__ == "__main__":
    main()
    os._exit(0)   # the probe's buffers are not tracked for release: let the process end take them
