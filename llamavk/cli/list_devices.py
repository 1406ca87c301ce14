"""`llamavk list-devices`: every Vulkan device, llama.cpp-style, with what it can do."""

from __future__ import annotations

import json

import typer

from ..devices import DeviceEntry, catalogue, select
from ..vk.instance import get_instance
from .common import VERBOSE, user_errors

MiB = 1 << 20


def headline(e: DeviceEntry) -> str:
    """`Vulkan0: NVIDIA H100 80GB HBM3 (81559 MiB, 81000 MiB free)` as llama.cpp prints it."""
    total = e.info.device_local_bytes // MiB
    free = e.info.free_bytes
    free_text = f"{free // MiB} MiB free" if free is not None else "free unknown"
    return f"{e.name}: {e.info.name} ({total} MiB, {free_text})"


def details(e: DeviceEntry) -> str:
    i = e.info
    yes = lambda b: "yes" if b else "no"  # noqa: E731
    coop = ", ".join(i.coopmat) if i.coopmat else "no"
    if i.coopmat2:
        coop += f" (+NV coopmat2: {', '.join(i.coopmat2_features) or 'no features'}" + \
            (f", workgroups up to {i.coopmat2_max_workgroup}" if i.coopmat2_max_workgroup else "") + ")"
    return (f"type {i.type}, vendor {i.vendor}, driver {i.driver_name} {i.driver_info}, Vulkan {i.api_version}, "
            f"fp16 {yes(i.fp16)}, bf16 {yes(i.bf16)}, int8-dot {yes(i.int_dot)}, "
            f"subgroup {i.subgroup_size}, shared memory {i.max_shared_memory // 1024} KiB, "
            f"host memory import {yes(i.external_memory_host)}, coopmat {coop}")


def list_devices(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    device: str = typer.Option(None, "--device", "-dev", help="Show which devices this -dev value selects."),
    verbose: bool = VERBOSE,
) -> None:
    """List Vulkan devices: names, memory, capabilities; filtered devices with the reason."""
    with user_errors(verbose):
        infos = get_instance().devices
        entries = catalogue(infos)
        chosen, warnings = select(infos, device)
        chosen_names = [c.name for c in chosen]
        if as_json:
            out = []
            for e in entries:
                d = e.info.to_dict()
                d["description"] = d.pop("name")
                if not verbose:
                    d.pop("extensions")
                out.append(dict(name=e.name, filtered=e.filtered, selected=e.name in chosen_names, **d))
            print(json.dumps({"devices": out, "selected": chosen_names, "warnings": warnings}, indent=1))
            return
        print("Available devices:")
        for e in entries:
            mark = f"  [filtered: {e.filtered}]" if e.filtered else ""
            print(f"  {headline(e)}{mark}")
            print(f"      {details(e)}")
        print(f"Selected: {', '.join(chosen_names)}")
        for w in warnings:
            print(w)
