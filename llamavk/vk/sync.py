"""Timeline semaphores and fences. Every wait is bounded: a timeout is an error, never a hang."""

from __future__ import annotations

import os
import time

import vulkan as vk

from ..errors import LlamavkError
from ._ffi import check, ffi, lib, new_struct

# Generous: a long prompt on llvmpipe can take minutes; a GPU hang still ends with a clear error.
WAIT_TIMEOUT_NS = int(float(os.environ.get("LLAMAVK_WAIT_TIMEOUT_S", "600")) * 1e9)


class TimelineSemaphore:
    """A 64-bit counter the GPU and host can signal and wait on."""

    def __init__(self, device, initial: int = 0):
        self.device = device
        type_info = new_struct("VkSemaphoreTypeCreateInfo", vk.VK_STRUCTURE_TYPE_SEMAPHORE_TYPE_CREATE_INFO,
                               semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE, initialValue=initial)
        create = new_struct("VkSemaphoreCreateInfo", vk.VK_STRUCTURE_TYPE_SEMAPHORE_CREATE_INFO, type_info)
        out = ffi.new("VkSemaphore*")
        check(lib.vkCreateSemaphore(device.handle, create, ffi.NULL, out), "vkCreateSemaphore")
        self.handle = out[0]
        # Prebuilt wait/signal structs: waits sit in decode's hot path.
        self._value = ffi.new("uint64_t[1]")
        self._handles = ffi.new("VkSemaphore[1]", [self.handle])
        self._wait_info = new_struct("VkSemaphoreWaitInfo", vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
                                     semaphoreCount=1, pSemaphores=self._handles, pValues=self._value)
        self._signal_info = new_struct("VkSemaphoreSignalInfo", vk.VK_STRUCTURE_TYPE_SEMAPHORE_SIGNAL_INFO,
                                       semaphore=self.handle)
        self._query = ffi.new("uint64_t*")

    @property
    def value(self) -> int:
        check(lib.vkGetSemaphoreCounterValue(self.device.handle, self.handle, self._query),
              "vkGetSemaphoreCounterValue")
        return self._query[0]

    def signal(self, value: int) -> None:
        """Signal from the host (e.g. relaying a peer device's progress)."""
        self._signal_info.value = value
        check(lib.vkSignalSemaphore(self.device.handle, self._signal_info), "vkSignalSemaphore")

    def wait_spinning(self, value: int, spin_s: float) -> None:
        """Poll the counter for up to `spin_s` seconds, then block. For short GPU steps (decode) this
        saves the tens of microseconds a blocked thread takes to wake up; long steps fall through to
        the blocking wait, so no CPU is burnt on them."""
        deadline = time.perf_counter() + spin_s
        device, handle, query = self.device.handle, self.handle, self._query
        while time.perf_counter() < deadline:
            check(lib.vkGetSemaphoreCounterValue(device, handle, query), "vkGetSemaphoreCounterValue")
            if query[0] >= value:
                return
        self.wait(value)

    def wait(self, value: int, timeout_ns: int = WAIT_TIMEOUT_NS) -> None:
        self._value[0] = value
        result = lib.vkWaitSemaphores(self.device.handle, self._wait_info, timeout_ns)
        if result == vk.VK_TIMEOUT:
            raise LlamavkError(f"{self.device.name}: timed out after {timeout_ns / 1e9:.0f} s waiting for the GPU "
                               f"(value {value}, reached {self.value})")
        check(result, "vkWaitSemaphores")

    def wait_any_thread(self, value: int, timeout_ns: int = WAIT_TIMEOUT_NS) -> None:
        """wait() for threads other than the one replaying steps: its own wait structures (wait()
        reuses prebuilt ones, which two threads must not share)."""
        values = ffi.new("uint64_t[1]", [value])
        check(lib.vkGetSemaphoreCounterValue(self.device.handle, self.handle, values), "vkGetSemaphoreCounterValue")
        if values[0] >= value:
            return
        values[0] = value
        info = new_struct("VkSemaphoreWaitInfo", vk.VK_STRUCTURE_TYPE_SEMAPHORE_WAIT_INFO,
                          semaphoreCount=1, pSemaphores=self._handles, pValues=values)
        result = lib.vkWaitSemaphores(self.device.handle, info, timeout_ns)
        if result == vk.VK_TIMEOUT:
            raise LlamavkError(f"{self.device.name}: timed out after {timeout_ns / 1e9:.0f} s waiting for a copy")
        check(result, "vkWaitSemaphores")

    def close(self) -> None:
        if self.handle is not None:
            vk.vkDestroySemaphore(self.device.handle, self.handle, None)
            self.handle = None


class Fence:
    """A binary fence, for code that prefers fences to timeline values."""

    def __init__(self, device, signaled: bool = False):
        self.device = device
        flags = vk.VK_FENCE_CREATE_SIGNALED_BIT if signaled else 0
        self.handle = vk.vkCreateFence(device.handle, vk.VkFenceCreateInfo(flags=flags), None)
        self._handles = ffi.new("VkFence[1]", [self.handle])

    def wait(self, timeout_ns: int = WAIT_TIMEOUT_NS) -> None:
        result = lib.vkWaitForFences(self.device.handle, 1, self._handles, vk.VK_TRUE, timeout_ns)
        if result == vk.VK_TIMEOUT:
            raise LlamavkError(f"{self.device.name}: timed out waiting for a fence")
        check(result, "vkWaitForFences")

    def reset(self) -> None:
        check(lib.vkResetFences(self.device.handle, 1, self._handles), "vkResetFences")

    @property
    def signaled(self) -> bool:
        return lib.vkGetFenceStatus(self.device.handle, self.handle) == vk.VK_SUCCESS

    def close(self) -> None:
        if self.handle is not None:
            vk.vkDestroyFence(self.device.handle, self.handle, None)
            self.handle = None
