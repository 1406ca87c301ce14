"""`llamavk list-devices` on this machine and on fabricated ones."""

import json
import subprocess
import sys

from typer.testing import CliRunner

from llamavk.cli import app
from llamavk.vk.physical import DeviceInfo, MemoryHeap


def run(*args):
    return subprocess.run([sys.executable, "-m", "llamavk", *args], capture_output=True, text=True)


def test_lists_this_machine():
    r = run("list-devices")
    assert r.returncode == 0, r.stderr
    assert "Vulkan0:" in r.stdout and "MiB" in r.stdout


def test_json_is_valid():
    r = run("list-devices", "--json")
    assert r.returncode == 0
    data = json.loads(r.stdout)
    assert data["devices"][0]["name"] == "Vulkan0"
    assert {"description", "type", "vendor", "subgroup_size", "fp16", "coopmat", "filtered"} <= set(data["devices"][0])


def test_unknown_device_is_one_line_usage_error():
    r = run("list-devices", "-dev", "Vulkan9")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0 and "valid: Vulkan0" in r.stderr and "Traceback" not in r.stderr


def test_llvmpipe_shown_filtered_next_to_a_gpu(monkeypatch):
    heaps = [MemoryHeap(size=81559 << 20, device_local=True, budget=81000 << 20, usage=0)]
    fake = [DeviceInfo(0, "NVIDIA H100 80GB HBM3", "discrete", 0x10DE, 1, "NVIDIA", "580", "1.4.312", "1" * 32, heaps),
            DeviceInfo(1, "llvmpipe (LLVM 15.0.6, 256 bits)", "cpu", 0x10005, 0, "llvmpipe", "Mesa", "1.3.230",
                       "2" * 32, [MemoryHeap(2 << 30, True)])]

    class FakeInstance:
        devices = fake

    monkeypatch.setattr("llamavk.cli.list_devices.get_instance", lambda: FakeInstance)
    out = CliRunner().invoke(app, ["list-devices"]).output
    assert "Vulkan0: NVIDIA H100 80GB HBM3 (81559 MiB, 81000 MiB free)" in out
    line = next(l for l in out.splitlines() if l.strip().startswith("Vulkan1:"))
    assert "[filtered: CPU" in line
    assert "Selected: Vulkan0" in out
