"""A thin Vulkan compute runtime: one small class per concept.

Instance (process-wide) -> DeviceInfo (what a GPU can do) -> Device (logical device + queue)
-> Buffer / SharedHostMemory -> Kernel (SPIR-V pipeline) -> CommandSequence (record once, replay)
-> TimelineSemaphore / Fence.
"""

from .buffer import Buffer, MemoryBlocks, SharedHostMemory
from .device import Device
from .instance import Instance, get_instance
from .kernel import Kernel, load_spirv, pack_constants
from .physical import DeviceInfo, MemoryHeap
from .sequence import CommandSequence
from .sync import Fence, TimelineSemaphore

__all__ = ["Buffer", "MemoryBlocks", "SharedHostMemory", "Device", "Instance", "get_instance", "Kernel",
           "load_spirv", "pack_constants", "DeviceInfo", "MemoryHeap", "CommandSequence", "Fence",
           "TimelineSemaphore"]
