"""A thin Vulkan compute runtime: one small class per concept.

Instance (process-wide) -> DeviceInfo (what a GPU can do) -> Device (logical device + queue)
-> Buffer / SharedHostMemory -> Kernel (SPIR-V pipeline) -> CommandSequence (record once, replay)
-> TimelineSemaphore / Fence.

The names below are imported on first use (PEP 562): a command's early thread (cli/early.py) opens
the instance and the default device with vk.instance / vk.device alone, without numpy and the rest,
so that its driver calls start sooner.
"""

import importlib

_WHERE = {"Buffer": "buffer", "SharedHostMemory": "buffer", "MemoryBlocks": "buffer", "Device": "device",
          "Instance": "instance", "get_instance": "instance", "Kernel": "kernel", "load_spirv": "kernel",
          "pack_constants": "kernel", "DeviceInfo": "physical", "MemoryHeap": "physical",
          "CommandSequence": "sequence", "Fence": "sync", "TimelineSemaphore": "sync"}

__all__ = list(_WHERE)


def __getattr__(name: str):
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
