"""Compiled pipelines kept on disk between runs (VkPipelineCache).

Creating a pipeline compiles SPIR-V to the GPU's code; a model needs dozens, so a load that compiles
them all again each run waits on the compiler (on llvmpipe without Mesa's own shader cache, seconds).
Each device's VkPipelineCache is filled from a file when the device opens and written back when it
closes, if the driver added something.

Files live in $LLAMAVK_CACHE/pipelines/ (default ~/.cache/llamavk/pipelines/), one per physical
device and driver: vendor id, device id, driver version and pipelineCacheUUID name the file. Its
header also holds the llamavk version and a SHA-256 of the data. A file whose header, key, length,
digest or embedded Vulkan header (vendor, device, UUID) does not match is ignored and later replaced:
the driver only ever sees data it wrote itself for this device, so a truncated, corrupt or foreign
file costs a recompilation, never a crash. LLAMAVK_PIPELINE_CACHE=0 turns the cache off. Writes go
to a temporary file renamed into place, so concurrent runs never read half a file (the last one to
close wins).
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from pathlib import Path

import vulkan as vk

from ._ffi import ffi, lib, new_struct

MAGIC = b"LLVKPC01"
ENV_CACHE = "LLAMAVK_CACHE"
ENV_ENABLE = "LLAMAVK_PIPELINE_CACHE"
VK_HEADER = struct.Struct("<IIII16s")   # headerSize, headerVersion, vendorID, deviceID, pipelineCacheUUID
VK_HEADER_VERSION_ONE = 1


def cache_dir() -> Path:
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "llamavk") / "pipelines"


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "1").strip().lower() not in ("0", "off", "false", "no")


def device_key(info) -> str:
    """The physical device and driver a cache belongs to (also the file's name)."""
    return f"{info.vendor_id:04x}-{info.device_id:04x}-{info.driver_version:08x}-{info.pipeline_cache_uuid}"


def cache_path(info) -> Path:
    return cache_dir() / f"{device_key(info)}.bin"


def _version() -> str:
    from .. import __version__
    return __version__


def pack(info, data: bytes, version: str | None = None) -> bytes:
    """A cache file: magic, key (device key + llamavk version), data length, SHA-256, data."""
    key = f"{device_key(info)} llamavk {version or _version()}".encode()
    return MAGIC + struct.pack("<I", len(key)) + key + struct.pack("<Q", len(data)) + hashlib.sha256(data).digest() + data


def unpack(info, blob: bytes, version: str | None = None) -> bytes | None:
    """The driver data of a cache file when every check passes, else None."""
    try:
        if not blob.startswith(MAGIC):
            return None
        pos = len(MAGIC)
        (key_len,) = struct.unpack_from("<I", blob, pos)
        pos += 4
        key = blob[pos:pos + key_len]
        pos += key_len
        if key != f"{device_key(info)} llamavk {version or _version()}".encode():
            return None
        (size,) = struct.unpack_from("<Q", blob, pos)
        pos += 8
        digest, data = blob[pos:pos + 32], blob[pos + 32:]
        if len(data) != size or hashlib.sha256(data).digest() != digest:
            return None
        if not vulkan_header_matches(info, data):
            return None
        return data
    except struct.error:
        return None


def vulkan_header_matches(info, data: bytes) -> bool:
    """Vulkan's own header at the start of the data names this device (spec: VkPipelineCacheHeaderVersionOne)."""
    if len(data) < VK_HEADER.size:
        return False
    size, version, vendor, device, uuid = VK_HEADER.unpack_from(data)
    return (size >= VK_HEADER.size and version == VK_HEADER_VERSION_ONE and vendor == info.vendor_id
            and device == info.device_id and uuid.hex() == info.pipeline_cache_uuid)


class PipelineCache:
    """One device's VkPipelineCache, filled from and written back to its file."""

    def __init__(self, device):
        self.device = device
        try:
            self.path = cache_path(device.info) if enabled() else None
        except (RuntimeError, KeyError):     # no home directory to put it in: run without a cache
            self.path = None
        self.loaded = b""
        initial = self._read() if self.path is not None else None
        self.handle = self._create(initial) if initial else None
        if self.handle is None:
            self.handle = self._create(b"")
        else:
            self.loaded = initial

    def _read(self) -> bytes | None:
        try:
            return unpack(self.device.info, self.path.read_bytes())
        except OSError:
            return None

    def _create(self, data: bytes):
        buf = ffi.new("char[]", data) if data else ffi.NULL
        info = new_struct("VkPipelineCacheCreateInfo", vk.VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO,
                          initialDataSize=len(data), pInitialData=buf)
        out = ffi.new("VkPipelineCache*")
        if lib.vkCreatePipelineCache(self.device.handle, info, ffi.NULL, out) != vk.VK_SUCCESS:
            return None
        return out[0]

    def data(self) -> bytes:
        size = ffi.new("size_t*")
        if lib.vkGetPipelineCacheData(self.device.handle, self.handle, size, ffi.NULL) != vk.VK_SUCCESS:
            return b""
        buf = ffi.new("char[]", size[0])
        if lib.vkGetPipelineCacheData(self.device.handle, self.handle, size, buf) not in (vk.VK_SUCCESS,
                                                                                          vk.VK_INCOMPLETE):
            return b""
        return bytes(ffi.buffer(buf, size[0]))

    def save(self) -> bool:
        """Write the cache back if the driver added to it; True when a file was written. Failures
        (read-only home, full disk) are ignored: the cache only saves time."""
        if self.path is None or self.handle is None:
            return False
        data = self.data()
        if not data or data == self.loaded or not vulkan_header_matches(self.device.info, data):
            return False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=self.path.name, suffix=".tmp", dir=self.path.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(pack(self.device.info, data))
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        except OSError:
            return False
        self.loaded = data
        return True

    def close(self) -> None:
        if self.handle is not None:
            self.save()
            vk.vkDestroyPipelineCache(self.device.handle, self.handle, None)
            self.handle = None
