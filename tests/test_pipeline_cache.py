"""Compiled pipelines kept on disk (llamavk/vk/pipeline_cache.py): file format, keys, write-back,
and that a damaged or foreign file is ignored (never handed to the driver, never a crash)."""

import dataclasses
import struct

import numpy as np
import pytest

from llamavk.vk import pipeline_cache as pc
from llamavk.vk.physical import DeviceInfo


def info(**kw):
    base = dict(index=0, name="GPU", type="discrete", vendor_id=0x10DE, device_id=0x2330, driver_name="nv",
                driver_info="", api_version="1.3.0", uuid="00" * 16, driver_version=0x91CE4000,
                pipeline_cache_uuid="ab" * 16)
    base.update(kw)
    return DeviceInfo(**base)


def vk_data(i, body=b"compiled code"):
    """Cache data as a driver writes it: VkPipelineCacheHeaderVersionOne, then its own bytes."""
    return struct.pack("<IIII16s", 32, 1, i.vendor_id, i.device_id, bytes.fromhex(i.pipeline_cache_uuid)) + body


def test_key_names_vendor_device_driver_and_uuid(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMAVK_CACHE", str(tmp_path))
    i = info()
    assert pc.cache_path(i) == tmp_path / "pipelines" / f"10de-2330-91ce4000-{'ab' * 16}.bin"
    for other in (dict(vendor_id=0x1002), dict(device_id=0x2331), dict(driver_version=1),
                  dict(pipeline_cache_uuid="cd" * 16)):
        assert pc.cache_path(info(**other)) != pc.cache_path(i)


def test_round_trip_and_every_check():
    i = info()
    data = vk_data(i)
    blob = pc.pack(i, data, version="1.0")
    assert pc.unpack(i, blob, version="1.0") == data
    assert pc.unpack(i, blob, version="1.1") is None                 # another llamavk version
    assert pc.unpack(info(driver_version=7), blob, version="1.0") is None   # another driver
    assert pc.unpack(i, blob[:-1], version="1.0") is None             # truncated
    flipped = bytearray(blob)
    flipped[-3] ^= 1
    assert pc.unpack(i, bytes(flipped), version="1.0") is None        # corrupt (digest)
    assert pc.unpack(i, b"", version="1.0") is None
    assert pc.unpack(i, b"LLVKPC01\xff\xff", version="1.0") is None
    assert pc.unpack(i, np.random.default_rng(0).bytes(4096), version="1.0") is None
    # data whose Vulkan header names another device is refused even with a valid envelope
    foreign = vk_data(info(device_id=0x1234))
    assert pc.unpack(i, pc.pack(i, foreign, version="1.0"), version="1.0") is None


def _device():
    from llamavk.devices import open_devices, select
    from llamavk.vk import get_instance

    entries, _ = select(get_instance().devices, None)
    return open_devices(entries[:1])[0]


def _add_kernel(d):
    from llamavk.vk import Kernel
    Kernel(d, "add_f32", "rrw", push_size=4)


def test_device_writes_its_cache_and_reads_it_back(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMAVK_CACHE", str(tmp_path))
    d = _device()
    _add_kernel(d)
    path = d.pipeline_cache.path
    data = d.pipeline_cache.data()
    d.close()
    assert path.is_file() and pc.unpack(d.info, path.read_bytes()) == data
    stamp = path.stat().st_mtime_ns
    d = _device()
    assert d.pipeline_cache.loaded == data           # handed to vkCreatePipelineCache
    _add_kernel(d)
    d.close()
    if data == pc.unpack(d.info, path.read_bytes()):
        assert path.stat().st_mtime_ns == stamp      # nothing new: not rewritten


@pytest.mark.parametrize("content", [b"", b"garbage" * 100, "wrong-key"])
def test_damaged_or_foreign_files_are_ignored_and_replaced(tmp_path, monkeypatch, content):
    monkeypatch.setenv("LLAMAVK_CACHE", str(tmp_path))
    d = _device()
    path = d.pipeline_cache.path
    d.close()
    path.parent.mkdir(parents=True, exist_ok=True)
    if content == "wrong-key":
        other = dataclasses.replace(d.info, driver_version=d.info.driver_version + 1)
        content = pc.pack(other, vk_data(other, b"\xde\xad" * 64))
    path.write_bytes(content)
    d = _device()
    assert d.pipeline_cache.loaded == b""             # nothing of it reached the driver
    _add_kernel(d)                                    # and the device works
    d.close()
    assert pc.unpack(d.info, path.read_bytes()) is not None


def test_cache_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMAVK_CACHE", str(tmp_path))
    monkeypatch.setenv("LLAMAVK_PIPELINE_CACHE", "0")
    d = _device()
    _add_kernel(d)
    d.close()
    assert not (tmp_path / "pipelines").exists()


def test_unwritable_cache_dir_is_not_an_error(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("LLAMAVK_CACHE", str(blocker))
    d = _device()
    _add_kernel(d)
    d.close()
