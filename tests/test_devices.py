"""Device policy (SPEC §2) on fabricated machines."""

import pytest

from llamavk.devices import catalogue, select
from llamavk.errors import UsageError
from llamavk.vk.physical import DeviceInfo, MemoryHeap


def info(index, name, type="discrete", vendor=0x10DE, uuid=None):
    return DeviceInfo(index=index, name=name, type=type, vendor_id=vendor, device_id=index, driver_name="d",
                      driver_info="", api_version="1.3.0", uuid=uuid or f"{index + 1:032x}",
                      heaps=[MemoryHeap(size=8 << 30, device_local=True)])


GPU_AND_LLVMPIPE = [info(0, "llvmpipe", type="cpu", vendor=0x10005), info(1, "NVIDIA H100")]


def names(entries):
    return [e.name for e in entries]


def test_llvmpipe_filtered_when_a_gpu_exists():
    entries = catalogue(GPU_AND_LLVMPIPE)
    assert entries[0].filtered and "CPU" in entries[0].filtered
    assert entries[1].filtered is None
    chosen, warnings = select(GPU_AND_LLVMPIPE, env={})
    assert names(chosen) == ["Vulkan1"] and warnings == []


def test_llvmpipe_only_falls_back_with_one_warning():
    only = [info(0, "llvmpipe", type="cpu")]
    chosen, warnings = select(only, env={})
    assert names(chosen) == ["Vulkan0"]
    assert len(warnings) == 1 and "slow" in warnings[0] and "\n" not in warnings[0]


def test_two_vendors_are_both_used_by_default():
    mixed = [info(0, "AMD Radeon", vendor=0x1002), info(1, "NVIDIA RTX"), info(2, "llvmpipe", type="cpu")]
    chosen, _ = select(mixed, env={})
    assert names(chosen) == ["Vulkan0", "Vulkan1"]
    assert [c.info.vendor for c in chosen] == ["AMD", "NVIDIA"]


def test_same_uuid_is_deduplicated():
    dup = [info(0, "GPU via driver A", uuid="ab" * 16), info(1, "GPU via driver B", uuid="ab" * 16)]
    entries = catalogue(dup)
    assert entries[0].filtered is None and "Vulkan0" in entries[1].filtered
    assert names(select(dup, env={})[0]) == ["Vulkan0"]


def test_explicit_choice_overrides_filter_and_allows_virtual_devices():
    chosen, _ = select(GPU_AND_LLVMPIPE, "Vulkan1,Vulkan0", env={})
    assert names(chosen) == ["Vulkan1", "Vulkan0"]
    chosen, _ = select(GPU_AND_LLVMPIPE, "vulkan1,Vulkan1", env={})
    assert names(chosen) == ["Vulkan1", "Vulkan1"]


def test_environment_selects_by_index_and_dev_wins():
    env = {"LLAMAVK_VISIBLE_DEVICES": "0, 1"}
    assert names(select(GPU_AND_LLVMPIPE, env=env)[0]) == ["Vulkan0", "Vulkan1"]
    assert names(select(GPU_AND_LLVMPIPE, "Vulkan1", env=env)[0]) == ["Vulkan1"]


@pytest.mark.parametrize("requested,env,fragment", [
    ("Vulkan7", {}, "unknown device 'Vulkan7'; valid: Vulkan0, Vulkan1"),
    ("cuda0", {}, "valid: Vulkan0, Vulkan1"),
    ("Vulkan0,", {}, "empty device name"),
    (None, {"LLAMAVK_VISIBLE_DEVICES": "3"}, "unknown device index '3'; valid: 0, 1"),
])
def test_unknown_devices_are_usage_errors_listing_valid_ones(requested, env, fragment):
    with pytest.raises(UsageError, match=fragment.replace("(", r"\(")):
        select(GPU_AND_LLVMPIPE, requested, env=env)


def test_no_devices_at_all():
    with pytest.raises(UsageError, match="no Vulkan devices"):
        select([], env={})
