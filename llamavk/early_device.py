"""A device opened before the load asks for it: by a loading command's early thread (cli/early.py).

vkCreateDevice and the queries around it are driver work (80-89 ms of a 1.1B `run` on the H100
machine) that needs nothing from the command line when it names no devices: the default choice,
`devices.select(infos, None)`'s first entry (LLAMAVK_VISIBLE_DEVICES applies), is known as soon as
the instance is. The command's early thread opens it while the main thread imports and parses;
the load's `open_devices` then takes it for its first device when that is the same entry, and
closes it otherwise (a split mode's plan, -mg, a failed attempt: the load opens what it chose, as
it always has). The Model that takes the device owns it (closes it with its others).

Only the CLI starts this (`expect()` then `open_default()` on its thread): a script or test that
loads several models never has a device waiting, and `take` is then a no-op. Errors on the early
thread are dropped: the load's own attempt opens the device again and reports them as before.
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_ready: threading.Event | None = None     # set by expect(); signalled when open_default() ends
_device = None                            # the opened Device, until taken


def expect() -> None:
    """Announce that open_default() will run (call before starting its thread): a load's `take`
    then waits for it rather than racing it."""
    global _ready
    with _lock:
        _ready = threading.Event()


def open_default() -> None:
    """Open the default selection's first device (on the early thread, after the instance)."""
    global _device
    ready = _ready
    try:
        from .devices import select
        from .vk.device import Device
        from .vk.instance import get_instance

        entries, _ = select(get_instance().devices, None)
        device = Device(entries[0].info, name=entries[0].name)
        with _lock:
            _device = device
    except BaseException:           # noqa: BLE001 -- the load opens it again and reports the error
        pass
    finally:
        if ready is not None:
            ready.set()


def take(entry):
    """The early device if it was opened for `entry` (a devices.DeviceEntry: same physical device,
    same name), else None; one that does not match is closed. Waits for the early thread when one
    was started. One-shot: later calls return None."""
    global _ready, _device
    with _lock:
        ready = _ready
    if ready is None:
        return None
    t0 = time.perf_counter()
    ready.wait()
    with _lock:
        device, _device, _ready = _device, None, None
    if device is None:
        return None
    from . import phases
    phases.add("wait for the device opened on the early thread", time.perf_counter() - t0)
    if device.info.index == entry.info.index and device.name == entry.name:
        return device
    device.close()
    return None

