#!/usr/bin/env python3
"""Compile every kernel variant in VARIANTS to SPIR-V shipped in llamavk/spv/, plus a manifest.

Variants come from shaders/variants_*.py: one file per kernel family, each defining
`VARIANTS = {name: (source, defines)}`. Each shipped kernel has a manifest entry in
llamavk/spv/<name>.json recording a hash of its inputs (the .comp source, every file it includes,
its defines, the compiler) and of its output. tests/test_shaders.py fails when the shipped SPIR-V does
not match the sources, so a forgotten rebuild cannot ship.

Usage: python3 shaders/build.py [--check] [NAME...]
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "llamavk" / "spv"
GLSLC_FLAGS = ["--target-env=vulkan1.2", "-O", "-fshader-stage=compute"]



def load_variants() -> dict[str, tuple[str, dict[str, str]]]:
    """name -> (source, defines), merged from every shaders/variants_*.py."""
    variants: dict[str, tuple[str, dict[str, str]]] = {}
    for path in sorted(HERE.glob("variants_*.py")):
        scope: dict = {}
        exec(compile(path.read_text(), str(path), "exec"), scope)
        for name, value in scope["VARIANTS"].items():
            if name in variants:
                sys.exit(f"kernel {name} is defined twice (second time in {path.name})")
            variants[name] = value
    return variants


VARIANTS = load_variants()


def includes(source: Path) -> list[Path]:
    """The source and every file it includes, recursively, in a stable order."""
    seen: list[Path] = []

    def walk(p: Path) -> None:
        if p in seen:
            return
        seen.append(p)
        for name in re.findall(r'^\s*#include\s+"([^"]+)"', p.read_text(), re.M):
            walk(p.parent / name)

    walk(source)
    return seen


def compiler_version() -> str:
    out = subprocess.run(["glslc", "--version"], capture_output=True, text=True, check=True).stdout
    return out.splitlines()[0].strip()


def uses_nv_coopmat(source: str) -> bool:
    """Written against GL_NV_cooperative_matrix: its SPIR-V is rewritten to the KHR extension."""
    return any("GL_NV_cooperative_matrix" in p.read_text() for p in includes(HERE / source))


def input_hash(name: str, compiler: str) -> str:
    source, defines = VARIANTS[name]
    h = hashlib.sha256()
    inputs = includes(HERE / source)
    if uses_nv_coopmat(source):
        inputs.append(HERE / "coopmat_khr.py")
    for p in inputs:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(json.dumps([defines, GLSLC_FLAGS, compiler], sort_keys=True).encode())
    return h.hexdigest()


def compile_variant(name: str) -> bytes:
    source, defines = VARIANTS[name]
    args = ["glslc", *GLSLC_FLAGS, *[f"-D{k}={v}" for k, v in defines.items()], str(HERE / source), "-o", "-"]
    result = subprocess.run(args, capture_output=True)
    if result.returncode != 0:
        sys.exit(f"{name}: glslc failed\n{result.stderr.decode()}")
    if uses_nv_coopmat(source):
        sys.path.insert(0, str(HERE))
        from coopmat_khr import nv_to_khr
        return nv_to_khr(result.stdout)
    return result.stdout


def manifest_path(name: str) -> Path:
    return OUT / f"{name}.json"


def main(argv: list[str]) -> None:
    check = "--check" in argv
    names = [a for a in argv if not a.startswith("--")] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown kernels: {unknown}")
    compiler = compiler_version()
    OUT.mkdir(parents=True, exist_ok=True)
    for name in names:
        spv = compile_variant(name)
        if check:
            if (OUT / f"{name}.spv").read_bytes() != spv:
                sys.exit(f"{name}: shipped SPIR-V differs from a fresh build")
            continue
        (OUT / f"{name}.spv").write_bytes(spv)
        entry = {"source": VARIANTS[name][0], "defines": VARIANTS[name][1], "compiler": compiler,
                 "input_sha256": input_hash(name, compiler), "spv_sha256": hashlib.sha256(spv).hexdigest()}
        manifest_path(name).write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    if not check and len(names) == len(VARIANTS):
        for stale in {p.stem for p in OUT.glob("*.spv")} - set(VARIANTS):
            (OUT / f"{stale}.spv").unlink()
            manifest_path(stale).unlink(missing_ok=True)
    print(f"{'checked' if check else 'built'} {len(names)} kernels")


if __name__ == "__main__":
    main(sys.argv[1:])
