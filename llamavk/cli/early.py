"""Work a loading command starts before its own imports: the Vulkan instance and, when the command
line chooses no devices, the default device (llamavk/early_device.py), on a thread."""

from __future__ import annotations

import threading

# Options that choose devices or how a model spreads over them: with any of these the load's first
# device may be another, so none is opened early (it would cost the driver's work and memory for
# nothing; the load would close it).
DEVICE_OPTIONS = ("-dev", "--device", "-sm", "--split-mode", "-ts", "--tensor-split", "-mg", "--main-gpu",
                  "--max-gpu")


IMPORT_WAIT_S = 0.5   # at most: a thread that does not get there leaves the command to go on


def chooses_devices(args: list[str]) -> bool:
    """Whether a command line (sys.argv[2:]) has a device or split option."""
    return any(a.split("=", 1)[0] in DEVICE_OPTIONS for a in args if a.startswith("-"))


def start_vulkan(open_device: bool = False) -> None:
    """Import the Vulkan bindings and create the process's instance (vk/instance.py get_instance) on
    a worker thread: the import and the driver's work in vkCreateInstance and the device queries (C
    calls, run without the GIL) overlap the command's own imports and argument parsing. The load's
    get_instance() then waits for it; if it failed, that call tries again and reports the error
    where it always has. open_device: then open the default device too (early_device.open_default),
    which the load takes if it chooses that one."""
    from .. import early_device

    if open_device:
        early_device.expect()
    imported = threading.Event()

    def work() -> None:
        try:
            try:
                # imported now, while the main thread waits: the vk package (numpy and the
                # runtime's modules with it) and devices. Why all of it: on an H100 machine, with
                # numpy left for the main thread to import while this thread created the instance
                # (the driver loads its libraries then), the command's imports took 290 ms against 145.
                from .. import devices  # noqa: F401
                from ..vk.instance import get_instance
            finally:
                imported.set()
            get_instance()
        except BaseException:      # noqa: BLE001 -- reported by the load's own attempt
            pass
        if open_device:
            early_device.open_default()
    threading.Thread(target=work, name="llamavk-vulkan", daemon=True).start()
    # The thread's imports are Python work: run alongside the command's own imports, both would take
    # turns on the interpreter lock, and the driver calls after them (instance, device: ~150 ms on
    # an H100 machine) would start only when both were nearly done -- the load then waited ~90 ms
    # for its device. Waiting here for those imports lets the driver calls overlap everything after.
    imported.wait(IMPORT_WAIT_S)
