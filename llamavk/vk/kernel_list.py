"""Which kernels a model's load created, kept beside the pipeline cache for its next load.

A load creates its pipelines when it first records a step, on the thread that records, one after
another: 12-20 kernels for a dense model, ~16 ms on an H100 from the driver's caches, 0.2 s of
compiling on llvmpipe. Their list does not depend on anything the load computes later, so the
next load of the same file on the same device creates them on threads (KernelCache.prefetch) as
soon as the device is open, while the main thread allocates weights and fuses graphs.

The lists live in $LLAMAVK_CACHE/pipelines/<device key>.kernels.json (pipeline_cache.py names the
device key; the same switch, LLAMAVK_PIPELINE_CACHE=0, turns them off, and
LLAMAVK_PIPELINE_PREFETCH=0 the prefetch alone, for comparisons): for each of the last
MAX_MODELS model files (path, size and modification time), the kernels' (name, bindings, push
constant bytes, specialization constants, SHA-256 of the SPIR-V), under the llamavk version that
wrote them. The file is only a hint, trusted as much as the pipeline cache beside it: an entry
that does not check out (unknown kernel, odd values, SPIR-V changed since) is skipped, a damaged
file or one of another version is ignored and replaced, and a kernel missing from the list is
created when first needed, as without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

from ..errors import LlamavkError
from .kernel import load_spirv
from .pipeline_cache import _version, cache_dir, device_key, enabled

ENV_PREFETCH = "LLAMAVK_PIPELINE_PREFETCH"   # "0": read no list (the kernels are made when first needed)
MAX_MODELS = 16
MAX_KERNELS = 256          # per model: far above what any load creates
_NAME = re.compile(r"[A-Za-z0-9_]{1,128}")
_BINDINGS = re.compile(r"[rwt]{1,32}")     # vk/kernel.py access letters


def list_path(info) -> Path:
    return cache_dir() / f"{device_key(info)}.kernels.json"


def model_key(path) -> str | None:
    """The model file as the lists know it: real path, size, modification time (None if unreadable)."""
    try:
        real = os.path.realpath(path)
        st = os.stat(real)
    except (OSError, TypeError, ValueError):
        return None
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def spirv_digest(name: str) -> str | None:
    """SHA-256 (hex) of the shipped SPIR-V of kernel `name`, None if there is none."""
    try:
        return hashlib.sha256(load_spirv(name)).hexdigest()
    except LlamavkError:
        return None


def _entry(item) -> tuple | None:
    """A kernel (name, bindings, push_size, spec) from the file, or None if it does not check out:
    its bindings and push constant size are what a recording asked for with exactly this SPIR-V
    (its digest is stored beside them), so a list written before a shader changed is not used."""
    if not (isinstance(item, list) and len(item) == 5):
        return None
    name, bindings, push, spec, digest = item
    if not (isinstance(name, str) and _NAME.fullmatch(name) and isinstance(bindings, str)
            and _BINDINGS.fullmatch(bindings) and type(push) is int and 0 <= push <= 256
            and isinstance(spec, list) and len(spec) <= 64
            and all(type(v) in (bool, int, float) and abs(v) < 2 ** 32 for v in spec)):
        return None
    if digest != spirv_digest(name):
        return None
    return name, bindings, push, tuple(spec)


def _read_all(info) -> dict:
    """model key -> kernels, from a file this llamavk version wrote ({} otherwise)."""
    try:
        data = json.loads(list_path(info).read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    if not isinstance(data, dict) or data.get("llamavk") != _version() or not isinstance(data.get("models"), dict):
        return {}
    return data["models"]


def read(info, key: str | None) -> list[tuple]:
    """The kernels the last loads of model `key` created on this device (empty if none known)."""
    if key is None or not enabled() or os.environ.get(ENV_PREFETCH, "1").strip().lower() in ("0", "off", "false", "no"):
        return []
    try:
        items = _read_all(info).get(key)
    except (RuntimeError, KeyError):        # no home directory: no lists
        return []
    if not isinstance(items, list):
        return []
    return [e for e in (_entry(i) for i in items[:MAX_KERNELS]) if e is not None]


def write(info, key: str | None, kernels) -> bool:
    """Record the kernels (name, bindings, push_size, spec) a load of model `key` created, the most
    recent model last; True when the file was written. Failures are ignored (it is only a hint)."""
    if key is None or not enabled():
        return False
    items = [[n, b, p, list(s), spirv_digest(n)] for n, b, p, s in kernels][:MAX_KERNELS]
    try:
        path = list_path(info)
        lists = _read_all(info)
        if lists.get(key) == items:
            return False
        lists.pop(key, None)
        lists[key] = items
        for old in list(lists)[:-MAX_MODELS]:
            del lists[old]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"llamavk": _version(), "models": lists}, f)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except (OSError, RuntimeError, KeyError, TypeError, ValueError):
        return False
    return True
