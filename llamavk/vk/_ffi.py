"""The `vulkan` package's cffi handles plus the few helpers every module needs.

Hot paths call `lib.*` directly with prebuilt arguments: the package's Python wrappers cost
2-10 µs per call. Structures that carry pNext chains are built with `ffi.new` so that we control
their lifetime: every nested struct and C string must stay referenced until the call returns.
"""

from __future__ import annotations

import vulkan as vk

from ..errors import LlamavkError

ffi = vk.ffi
lib = vk.lib


def check(result: int, what: str) -> None:
    """Turn a VkResult from a raw `lib.*` call into an exception naming the call."""
    if result != vk.VK_SUCCESS:
        name = _RESULT_NAMES.get(result, str(result))
        raise LlamavkError(f"Vulkan call {what} failed: {name}")


_RESULT_NAMES = {v: k for k, v in vars(vk).items() if k.startswith("VK_ERROR_") and isinstance(v, int)}
_RESULT_NAMES.update({vk.VK_TIMEOUT: "VK_TIMEOUT", vk.VK_NOT_READY: "VK_NOT_READY"})


def new_struct(ctype: str, stype: int, pnext=ffi.NULL, **fields):
    """A zeroed Vulkan struct with sType/pNext set; returns the pointer (keep it alive)."""
    return ffi.new(ctype + "*", dict(sType=stype, pNext=pnext, **fields))


def c_string(text: str):
    return ffi.new("char[]", text.encode())


def c_string_array(texts: list[str]):
    """(char*[] array, owners) — keep both alive while the call runs."""
    owners = [c_string(t) for t in texts]
    return ffi.new("char*[]", owners), owners


def struct_string(array) -> str:
    return ffi.string(array).decode("utf-8", "replace")
