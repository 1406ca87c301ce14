"""Shared helpers for tests that need a real Vulkan device (llvmpipe in CI)."""

from __future__ import annotations

import pytest

from llamavk.devices import select
from llamavk.vk import Device, get_instance


def first_device_info():
    infos = get_instance().devices
    if not infos:
        pytest.skip("no Vulkan device")
    chosen, _ = select(infos, env={})
    return chosen[0].info


def open_device(name: str | None = None) -> Device:
    return Device(first_device_info(), name=name)
