"""The kernels a model's load made, listed beside the pipeline cache (vk/kernel_list.py), are made on
threads by the next load of that file (KernelCache.prefetch): the same kernels, the same logits; a
damaged, foreign or stale list changes nothing but the time; a device closes safely while its
kernels are still being made."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import llamavk
from llamavk import kernels as kernels_mod
from llamavk.kernels import KernelCache
from llamavk.vk import kernel_list

from .vk_fixtures import open_device


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMAVK_CACHE", str(tmp_path))
    monkeypatch.delenv("LLAMAVK_PIPELINE_PREFETCH", raising=False)
    monkeypatch.delenv("LLAMAVK_PIPELINE_CACHE", raising=False)
    return tmp_path


@pytest.fixture
def made(monkeypatch):
    """The threads that made each kernel (name, spec) during the test."""
    out: dict = {}
    real = kernels_mod.Kernel

    def counting(device, name, bindings, push_size=0, spec=()):
        out.setdefault((name, tuple(spec)), []).append(threading.current_thread().name)
        return real(device, name, bindings, push_size=push_size, spec=spec)

    monkeypatch.setattr(kernels_mod, "Kernel", counting)
    return out


TOKENS = [5, 17, 300, 42, 9, 77, 123, 250, 31, 8, 64]


def _load_and_run(path):
    with llamavk.load(path, n_ctx=64, warn=lambda m: None, prepare_prompt=lambda m: TOKENS) as m:
        logits = m.logits(TOKENS)
        used = sorted(m.runtime.kc.entries(), key=repr)
        info = m.devices[0].info
    return logits, used, info


def test_second_load_makes_the_listed_kernels_on_threads(synthetic_model, cache, made):
    path = synthetic_model("llama", "q4_0")
    want, used, info = _load_and_run(path)
    assert all(threads == ["MainThread"] for threads in made.values())
    listed = kernel_list.read(info, kernel_list.model_key(path))
    assert sorted(listed, key=repr) == used and used
    made.clear()
    got, used_again, _ = _load_and_run(path)
    assert used_again == used
    assert sorted(made) == sorted((n, s) for n, _, _, s in used)       # each made once ...
    assert all(len(t) == 1 and t[0].startswith("llamavk-pipelines") for t in made.values())   # ... on a thread
    assert np.array_equal(got, want)


@pytest.mark.parametrize("damage", ["garbage", "other version", "changed shader", "odd entries"])
def test_damaged_or_stale_lists_change_nothing_but_time(synthetic_model, cache, made, damage):
    path = synthetic_model("llama", "q4_0")
    want, used, info = _load_and_run(path)
    file = kernel_list.list_path(info)
    data = json.loads(file.read_text())
    key = kernel_list.model_key(path)
    if damage == "garbage":
        file.write_bytes(b"\xff{not json" * 10)
    else:
        if damage == "other version":
            data["llamavk"] = "0.0.0-other"
        elif damage == "changed shader":
            for e in data["models"][key]:
                e[4] = "0" * 64
        else:
            data["models"][key] = [["no_such_kernel", "rrw", 4, [1], "0" * 64], ["add_f32", "rrw", 4, [1], 7],
                                   ["add_f32", "rrx", 4, [1], kernel_list.spirv_digest("add_f32")], "x", None]
        file.write_text(json.dumps(data))
    assert kernel_list.read(info, key) == []
    made.clear()
    got, used_again, _ = _load_and_run(path)
    assert used_again == used and np.array_equal(got, want)
    assert all(threads == ["MainThread"] for threads in made.values())   # nothing from the list was made
    assert sorted(kernel_list.read(info, key), key=repr) == used          # and the list is whole again


def test_switch_off_and_unknown_models(synthetic_model, cache, monkeypatch):
    path = synthetic_model("llama", "q4_0")
    _, used, info = _load_and_run(path)
    key = kernel_list.model_key(path)
    assert kernel_list.read(info, key)
    assert kernel_list.read(info, key + "x") == [] and kernel_list.model_key(cache / "missing.gguf") is None
    monkeypatch.setenv("LLAMAVK_PIPELINE_PREFETCH", "0")
    assert kernel_list.read(info, key) == []


def test_device_closes_while_kernels_are_being_made(synthetic_model, cache):
    path = synthetic_model("llama", "q4_0")
    _, used, _ = _load_and_run(path)
    for _ in range(3):
        dev = open_device()
        kc = KernelCache(dev)
        kc.prefetch(used)
        dev.close()                   # waits for the threads, then frees what they made
        assert dev.handle is None
    dev = open_device()
    kc = KernelCache(dev)
    kc.prefetch(used)
    name, bindings, push, spec = used[0]
    kernel = kc.get(name, bindings, push, spec)
    assert kernel.pipeline is not None and kc.get(name, bindings, push, spec) is kernel
    dev.close()
