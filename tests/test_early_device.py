"""The device a loading command opens on its early thread (llamavk/early_device.py): the load takes
it only for the same entry, closes it otherwise, and opens (and reports errors) as before when the
early attempt failed. The CLI side is checked in test_cli_run.py (test_phase_breakdown)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import llamavk
from llamavk import early_device
from llamavk.cli.early import chooses_devices
from llamavk.devices import DeviceEntry, select
from llamavk.errors import LlamavkError
from llamavk.vk import get_instance


@pytest.fixture(autouse=True)
def no_leftover():
    yield
    dev = early_device._device
    early_device._device = early_device._ready = None
    if dev is not None:
        dev.close()


def open_early():
    """What the CLI's early thread does, here on this thread: the device it opened."""
    early_device.expect()
    early_device.open_default()
    return early_device._device


def test_load_takes_the_early_device_and_owns_it(synthetic_model):
    path = synthetic_model("llama", "q4_0")
    tokens = [1, 5, 9, 13, 2]
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        want = np.array(m.logits(tokens, all=True))
        plain = m.devices[0]
    early = open_early()
    assert early is not None and early.name == select(get_instance().devices, None)[0][0].name
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:
        assert m.devices[0] is early and early is not plain
        np.testing.assert_array_equal(m.logits(tokens, all=True), want)
    assert early.handle is None                    # the Model closed it with its devices
    with llamavk.load(path, n_ctx=64, warn=lambda m: None) as m:   # one-shot: the next load opens its own
        assert m.devices[0] is not early


def test_an_early_device_for_another_entry_is_closed():
    early = open_early()
    other = DeviceEntry("Vulkan7", dataclasses.replace(early.info, index=early.info.index + 7), None)
    assert early_device.take(other) is None
    assert early.handle is None and early_device._device is None
    same_device_other_name = DeviceEntry(early.name + "#1", early.info, None)
    early = open_early()
    assert early_device.take(same_device_other_name) is None and early.handle is None
    assert early_device.take(other) is None        # nothing waits any more


def test_split_load_takes_it_for_its_first_device_only(synthetic_model):
    """Two virtual devices on one GPU (-dev Vulkan0,Vulkan0): the first is the early one, the
    second ("Vulkan0#1") a device of its own."""
    early = open_early()
    with llamavk.load(synthetic_model("llama", "q4_0"), devices=f"{early.name},{early.name}", n_ctx=64,
                      warn=lambda m: None) as m:
        assert [d.name for d in m.devices] == [early.name, early.name + "#1"]
        assert m.devices[0] is early and m.devices[1] is not early


def test_a_failed_early_attempt_leaves_the_load_to_open_it(synthetic_model, monkeypatch):
    from llamavk.vk import device as vk_device

    real = vk_device.Device

    def fails(*args, **kwargs):
        raise LlamavkError("vkCreateDevice failed")

    monkeypatch.setattr(vk_device, "Device", fails)
    assert open_early() is None
    monkeypatch.setattr(vk_device, "Device", real)
    with llamavk.load(synthetic_model("llama", "q4_0"), n_ctx=64, warn=lambda m: None) as m:
        assert m.devices[0].handle is not None


def test_a_failed_early_attempt_and_a_failed_load_report_the_loads_error(synthetic_model, monkeypatch):
    """The load's own attempt raises its error (the CLI prints it as one line, exit 1)."""
    from llamavk.vk import device as vk_device

    calls = []

    def fails(*args, **kwargs):
        calls.append(args)
        raise LlamavkError(f"vkCreateDevice failed (attempt {len(calls)})")

    monkeypatch.setattr(vk_device, "Device", fails)
    assert open_early() is None
    with pytest.raises(LlamavkError, match=r"attempt 2\)"):
        llamavk.load(synthetic_model("llama", "q4_0"), n_ctx=64, warn=lambda m: None)


@pytest.mark.parametrize("args,chooses", [
    (["-m", "x.gguf", "-p", "hello", "-n", "4"], False),
    (["-m", "x.gguf", "-p", "-dev is text here"], False),
    (["-m", "x.gguf", "-dev", "Vulkan1"], True),
    (["--device=Vulkan1"], True),
    (["-sm", "row"], True),
    (["--split-mode", "none"], True),
    (["-ts", "3/1"], True),
    (["--tensor-split=1,1"], True),
    (["-mg", "1"], True),
    (["--main-gpu=1"], True),
    (["--max-gpu", "2"], True),
])
def test_device_options_skip_the_early_device(args, chooses):
    assert chooses_devices(args) is chooses
