"""The Vulkan instance: the process-wide entry point, created once and shared by all devices."""

from __future__ import annotations

import os
import threading

import vulkan as vk

from ..errors import LlamavkError
from .physical import DeviceInfo, query_device_info

API_VERSION = vk.VK_MAKE_VERSION(1, 3, 0)


class Instance:
    """A VkInstance plus the list of physical devices in enumeration order (Vulkan0, Vulkan1, ...)."""

    def __init__(self):
        layers = [l for l in os.environ.get("VK_INSTANCE_LAYERS", "").split(":") if l]
        app = vk.VkApplicationInfo(pApplicationName="llamavk", applicationVersion=1, pEngineName="llamavk",
                                   engineVersion=1, apiVersion=API_VERSION)
        info = vk.VkInstanceCreateInfo(pApplicationInfo=app, ppEnabledLayerNames=layers or None,
                                       enabledLayerCount=len(layers))
        try:
            self.handle = vk.vkCreateInstance(info, None)
        except OSError as exc:
            raise LlamavkError(f"no Vulkan loader found ({exc}); install libvulkan1") from None
        except vk.VkError as exc:
            raise LlamavkError(f"cannot create a Vulkan instance ({type(exc).__name__}); "
                               "is a Vulkan driver installed (e.g. mesa-vulkan-drivers)?") from None
        self.physical_handles = list(vk.vkEnumeratePhysicalDevices(self.handle))
        self.devices: list[DeviceInfo] = [query_device_info(self.handle, h, i)
                                          for i, h in enumerate(self.physical_handles)]

    def proc(self, name: str):
        """An instance-level extension function."""
        return vk.vkGetInstanceProcAddr(self.handle, name)

    def close(self) -> None:
        if self.handle is not None:
            vk.vkDestroyInstance(self.handle, None)
            self.handle = None


_shared: Instance | None = None
_lock = threading.Lock()


def get_instance() -> Instance:
    """The process's one Instance (devices keep it alive; it is never destroyed before exit)."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = Instance()
        return _shared
