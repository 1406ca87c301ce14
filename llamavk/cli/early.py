"""Work a loading command starts before its own imports: the Vulkan instance, on a thread."""

from __future__ import annotations

import threading


def start_vulkan() -> None:
    """Import the Vulkan bindings and create the process's instance (vk/instance.py get_instance) on
    a worker thread: the import and the driver's work in vkCreateInstance and the device queries (C
    calls, run without the GIL) overlap the command's own imports and argument parsing. The load's
    get_instance() then waits for it; if it failed, that call tries again and reports the error
    where it always has."""
    def work() -> None:
        try:
            from ..vk.instance import get_instance
            get_instance()
        except BaseException:      # noqa: BLE001 -- reported by the load's own attempt
            pass
    threading.Thread(target=work, name="llamavk-vulkan", daemon=True).start()
