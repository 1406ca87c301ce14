"""Device policy (SPEC §2): naming, filtering, explicit selection, virtual devices.

- Every physical device is named VulkanN by enumeration order, filtered or not.
- CPU-type devices (llvmpipe, lavapipe, SwiftShader) are filtered whenever a GPU exists; if no GPU
  exists the first one is used, with a one-line warning.
- The same GPU exposed twice by two drivers (same deviceUUID) is shown once; the later entry is
  filtered as a duplicate.
- `-dev Vulkan0,Vulkan2` or LLAMAVK_VISIBLE_DEVICES=0,2 chooses devices explicitly and overrides the
  filter (`-dev` wins when both are given). Naming a device twice gives two logical devices on it.

Pure functions over DeviceInfo lists, so tests can fabricate machines.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .errors import UsageError
from .vk.physical import DeviceInfo

ENV_VISIBLE = "LLAMAVK_VISIBLE_DEVICES"


@dataclass
class DeviceEntry:
    name: str                 # "Vulkan0"
    info: DeviceInfo
    filtered: str | None      # why it is not chosen automatically (None: it is)


def catalogue(infos: list[DeviceInfo]) -> list[DeviceEntry]:
    """All devices with their names and, for filtered ones, the reason."""
    entries = []
    seen_uuid: dict[str, str] = {}
    any_gpu = any(not i.is_cpu for i in infos)
    for i, info in enumerate(infos):
        name = f"Vulkan{i}"
        reason = None
        if info.uuid in seen_uuid and int(info.uuid, 16) != 0:
            reason = f"same device as {seen_uuid[info.uuid]} (exposed by two drivers)"
        elif info.is_cpu and any_gpu:
            reason = "CPU (software) device; a GPU is present. Name it with -dev to use it"
        seen_uuid.setdefault(info.uuid, name)
        entries.append(DeviceEntry(name, info, reason))
    return entries


def select(infos: list[DeviceInfo], requested: str | None = None,
           env: dict | None = None) -> tuple[list[DeviceEntry], list[str]]:
    """The devices to use, in order (repeats allowed), and warnings to show the user.

    `requested` is the -dev value ("Vulkan0,Vulkan2"); the environment's LLAMAVK_VISIBLE_DEVICES
    ("0,2") applies when it is None.
    """
    env = os.environ if env is None else env
    entries = catalogue(infos)
    if not entries:
        raise UsageError("no Vulkan devices found (install a Vulkan driver, e.g. mesa-vulkan-drivers)")
    if requested:
        return [_lookup(entries, token, by_index=False) for token in _split(requested, "-dev")], []
    visible = env.get(ENV_VISIBLE, "").strip()
    if visible:
        return [_lookup(entries, token, by_index=True) for token in _split(visible, ENV_VISIBLE)], []
    chosen = [e for e in entries if e.filtered is None and not e.info.is_cpu]
    if chosen:
        return chosen, []
    fallback = next(e for e in entries if e.filtered is None)
    return [fallback], [f"warning: no GPU found, running on the software device {fallback.name} "
                        f"({fallback.info.name}): this will be slow"]


def _split(text: str, what: str) -> list[str]:
    tokens = [t.strip() for t in text.split(",")]
    if not all(tokens):
        raise UsageError(f"{what}: empty device name in {text!r}")
    return tokens


def _lookup(entries: list[DeviceEntry], token: str, by_index: bool) -> DeviceEntry:
    by_name = {e.name.lower(): e for e in entries}
    key = token.lower()
    if by_index and token.isdigit():
        key = f"vulkan{int(token)}"
    if key in by_name:
        return by_name[key]
    valid = ", ".join(e.name if not by_index else str(i) for i, e in enumerate(entries))
    what = "device index" if by_index else "device"
    raise UsageError(f"unknown {what} {token!r}; valid: {valid}")


def open_devices(entries: list[DeviceEntry]):
    """Create one logical device per entry. A device named twice becomes two virtual devices,
    named "Vulkan0" and "Vulkan0#1". The first one may be the device a command opened early
    (early_device.py), when it is the same entry."""
    from .early_device import take
    from .vk.device import Device
    devices, counts = [], {}
    try:
        early = take(entries[0]) if entries else None
        for e in entries:
            k = counts.get(e.name, 0)
            counts[e.name] = k + 1
            if early is not None:
                devices.append(early)
                early = None
                continue
            devices.append(Device(e.info, name=e.name if k == 0 else f"{e.name}#{k}"))
    except BaseException:
        for d in devices:
            d.close()
        raise
    return devices
