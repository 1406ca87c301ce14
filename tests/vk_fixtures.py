"""Shared helpers for tests that need a real Vulkan device (llvmpipe in CI)."""

from __future__ import annotations

import numpy as np
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


def chainable_stream_kernel(monkeypatch) -> None:
    """The dense one-token products on the stream kernel in the form GPUs chain (x loaded first, one
    row block per workgroup when chained): on a software device, tests of the chained stages."""
    from llamavk.kernels import matmul as mm
    monkeypatch.setattr(mm, "_MATVEC_ENV", {"*": mm.MatvecConfig(64, 2, 1, 1, "stream", steps=2, xfirst=1,
                                                                   chained_steps=1)})


def one_token_rows(rt, prompt) -> np.ndarray:
    """The logits of each prompt token, run in order through an open runtime's one-token step."""
    rows = []
    for i, t in enumerate(prompt):
        rt.run_batch("last", [t], i)
        rows.append(rt.logits(1)[0].copy())
    return np.array(rows)
