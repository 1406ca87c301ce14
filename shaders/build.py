#!/usr/bin/env python3
"""Compile every kernel variant in VARIANTS to SPIR-V shipped in llamavk/spv/, plus a manifest.

Variants come from shaders/variants_*.py: one file per kernel family, each defining
`VARIANTS = {name: (source, defines)}` and, for variants that need a newer compiler than Debian 12's
glslc, `COMPILERS = {name: compiler}` (a key of COMPILERS below; default "glslc"). Each shipped
kernel has a manifest entry in llamavk/spv/<name>.json recording a hash of its inputs (the .comp source, every file it includes,
its defines, the compiler) and of its output. tests/test_shaders.py fails when the shipped SPIR-V does
not match the sources, so a forgotten rebuild cannot ship.

Usage: python3 shaders/build.py [--check] [NAME...]
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE.parent / "llamavk" / "spv"
GLSLC_FLAGS = ["--target-env=vulkan1.2", "-O", "-fshader-stage=compute"]


def glslc_trixie() -> str:
    """Debian 13's glslc: `bash ../shared/tools/glslc-trixie.sh` unpacks it to ~/.cache/glslc-trixie/glslc;
    $LLAMAVK_GLSLC_TRIXIE names another path."""
    return os.environ.get("LLAMAVK_GLSLC_TRIXIE") or str(Path.home() / ".cache" / "glslc-trixie" / "glslc")


# Compilers a variant can name: key -> (how to find the executable, flags).
#   glslc                   the one on PATH: Debian 12's shaderc 2023.2 built every kernel but the few below
#   glslc-trixie            Debian 13's shaderc 2025.2 (glslc_trixie above), SPIR-V 1.6: the
#                           GL_NV_cooperative_matrix2 kernels (that extension needs vulkan1.3)
#   glslc-trixie-vulkan1.2  the same compiler, SPIR-V 1.5 like the rest: the GL_KHR_cooperative_matrix
#                           kernels (shaderc 2023.2 does not know that extension; Vulkan 1.2 devices
#                           with VK_KHR_cooperative_matrix load them)
#   glslc-unoptimized       glslc without -O: kernels for software devices whose unrolled loops the
#                           driver unrolls itself (matmul_cpu.comp: -O takes 4 s and 160 KB a kernel
#                           for no speed)
COMPILERS = {
    "glslc": (lambda: "glslc", GLSLC_FLAGS),
    "glslc-trixie": (glslc_trixie, ["--target-env=vulkan1.3", "-O", "-fshader-stage=compute"]),
    "glslc-trixie-vulkan1.2": (glslc_trixie, GLSLC_FLAGS),
    "glslc-unoptimized": (lambda: "glslc", [f for f in GLSLC_FLAGS if f != "-O"]),
}


def load_variants() -> tuple[dict[str, tuple[str, dict[str, str]]], dict[str, str]]:
    """(name -> (source, defines), name -> compiler key), merged from every shaders/variants_*.py."""
    variants: dict[str, tuple[str, dict[str, str]]] = {}
    compilers: dict[str, str] = {}
    for path in sorted(HERE.glob("variants_*.py")):
        scope: dict = {}
        exec(compile(path.read_text(), str(path), "exec"), scope)
        for name, value in scope["VARIANTS"].items():
            if name in variants:
                sys.exit(f"kernel {name} is defined twice (second time in {path.name})")
            variants[name] = value
        for name, key in scope.get("COMPILERS", {}).items():
            if name not in variants or key not in COMPILERS:
                sys.exit(f"{path.name}: COMPILERS[{name!r}] = {key!r}: unknown kernel or compiler")
            compilers[name] = key
    return variants, compilers


VARIANTS, VARIANT_COMPILERS = load_variants()


def compiler_of(name: str) -> str:
    """The COMPILERS key that builds kernel `name`."""
    return VARIANT_COMPILERS.get(name, "glslc")


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


def compiler_version(key: str = "glslc") -> str | None:
    """The first line of the compiler's --version (what manifests record), None where it is absent."""
    try:
        out = subprocess.run([COMPILERS[key][0](), "--version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.splitlines()[0].strip()


def input_hash(name: str, compiler: str) -> str:
    source, defines = VARIANTS[name]
    h = hashlib.sha256()
    for p in includes(HERE / source):
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(json.dumps([defines, COMPILERS[compiler_of(name)][1], compiler], sort_keys=True).encode())
    return h.hexdigest()


def compile_variant(name: str) -> bytes:
    source, defines = VARIANTS[name]
    exe, flags = COMPILERS[compiler_of(name)]
    args = [exe(), *flags, *[f"-D{k}={v}" for k, v in defines.items()], str(HERE / source), "-o", "-"]
    result = subprocess.run(args, capture_output=True)
    if result.returncode != 0:
        sys.exit(f"{name}: {args[0]} failed\n{result.stderr.decode()}")
    return result.stdout


def manifest_path(name: str) -> Path:
    return OUT / f"{name}.json"


def main(argv: list[str]) -> None:
    check = "--check" in argv
    names = [a for a in argv if not a.startswith("--")] or list(VARIANTS)
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        sys.exit(f"unknown kernels: {unknown}")
    versions = {key: compiler_version(key) for key in {compiler_of(n) for n in names}}
    missing = sorted(key for key, v in versions.items() if v is None)
    if missing:
        sys.exit(f"compilers not found: {missing} (shaders/build.py COMPILERS says where they are looked for)")
    OUT.mkdir(parents=True, exist_ok=True)
    # one compiler process per core (the 2-core CI machine checks every kernel in tests/test_shaders.py)
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        built = list(pool.map(compile_variant, names))
    for name, spv in zip(names, built):
        compiler = versions[compiler_of(name)]
        if check:
            if (OUT / f"{name}.spv").read_bytes() != spv:
                sys.exit(f"{name}: shipped SPIR-V differs from a fresh build")
            # what tests/test_shaders.py checks too: a source edit that leaves the SPIR-V as it was
            # (a comment) still needs the manifest rebuilt
            entry = json.loads(manifest_path(name).read_text())
            if entry.get("input_sha256") != input_hash(name, entry.get("compiler", compiler)):
                sys.exit(f"{name}: its manifest records other sources than these (run shaders/build.py)")
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
