"""The SPIR-V shipped in the package matches the shader sources (no forgotten rebuild)."""

import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPV = ROOT / "llamavk" / "spv"

spec = importlib.util.spec_from_file_location("shader_build", ROOT / "shaders" / "build.py")
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
MANIFEST = {p.stem: json.loads(p.read_text()) for p in SPV.glob("*.json")}


def test_every_variant_is_shipped_and_nothing_else():
    assert set(MANIFEST) == set(build.VARIANTS)
    assert {p.stem for p in SPV.glob("*.spv")} == set(build.VARIANTS)


@pytest.mark.parametrize("name", sorted(build.VARIANTS))
def test_shipped_spirv_matches_sources(name):
    entry = MANIFEST[name]
    assert entry["input_sha256"] == build.input_hash(name, entry["compiler"]), \
        f"{name}: sources changed since the SPIR-V was built; run `make shaders`"
    assert entry["spv_sha256"] == hashlib.sha256((SPV / f"{name}.spv").read_bytes()).hexdigest(), \
        f"{name}: shipped SPIR-V is not the one the manifest recorded"


@pytest.mark.skipif(shutil.which("glslc") is None, reason="glslc not installed")
def test_fresh_build_reproduces_shipped_spirv():
    # Each kernel's compiler (build.COMPILERS) is checked where this machine has the version its
    # manifest recorded; the rest are named in the skip or the warning.
    by_compiler: dict[str, list[str]] = {}
    for name in build.VARIANTS:
        by_compiler.setdefault(build.compiler_of(name), []).append(name)
    names, absent = [], []
    for key, group in sorted(by_compiler.items()):
        recorded = {MANIFEST[n]["compiler"] for n in group}
        have = build.compiler_version(key)
        if recorded == {have}:
            names += group
        else:
            absent.append(f"{len(group)} kernels of {key}: built with {sorted(recorded)}, this machine has {have}")
    if not names:
        pytest.skip("; ".join(absent))
    if absent:
        warnings.warn("not rebuilt: " + "; ".join(absent))
    subprocess.run([sys.executable, str(ROOT / "shaders" / "build.py"), "--check", *names], check=True)
