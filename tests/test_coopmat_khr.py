"""shaders/coopmat_khr.py: SPV_NV_cooperative_matrix -> SPV_KHR_cooperative_matrix rewriting.

The GPU test of the kernel itself is tests/test_kernels_matmul.py::test_matmul_coopmat (skipped on
devices without cooperative matrices, llvmpipe included); these checks run everywhere.
"""

import importlib.util
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("coopmat_khr", ROOT / "shaders" / "coopmat_khr.py")
ck = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ck)


def parse(spirv: bytes):
    words = list(struct.unpack(f"<{len(spirv) // 4}I", spirv))
    return words, list(ck._instructions(words))


def test_shipped_kernel_is_khr():
    words, insts = parse((ROOT / "llamavk" / "spv" / "mul_mm_coop_q4_0.spv").read_bytes())
    ops = [op for op, _ in insts]
    caps = {o[0] for op, o in insts if op == ck.OP_CAPABILITY}
    assert ck.CAP_KHR in caps and ck.CAP_NV not in caps
    assert not set(ops) & {ck.NV_TYPE, ck.NV_LOAD, ck.NV_STORE, ck.NV_MULADD, ck.NV_LENGTH}
    exts = [ck._decode_string(o) for op, o in insts if op == ck.OP_EXTENSION]
    assert "SPV_KHR_cooperative_matrix" in exts and "SPV_NV_cooperative_matrix" not in exts
    consts = {o[1]: o[2] for op, o in insts if op == ck.OP_CONSTANT}
    floats = {o[0]: o[1] for op, o in insts if op == 22}   # OpTypeFloat: id -> width
    types = {o[0]: (floats[o[1]], consts[o[3]], consts[o[4]], consts[o[5]]) for op, o in insts if op == ck.KHR_TYPE}
    # A 16x16 f16, B 16x8 f16, accumulator 16x8 f32
    assert sorted(types.values()) == [(16, 16, 8, ck.USE_B), (16, 16, 16, ck.USE_A), (32, 16, 8, ck.USE_ACC)]
    # every id is below the bound; loads and stores name a layout constant (0 or 1)
    assert max(max(o, default=0) for op, o in insts if op in (ck.KHR_TYPE, ck.KHR_LOAD)) < words[3]
    for op, o in insts:
        if op == ck.KHR_LOAD:
            assert consts[o[3]] in (ck.ROW_MAJOR, ck.COLUMN_MAJOR)
        if op == ck.KHR_STORE:
            assert consts[o[2]] in (ck.ROW_MAJOR, ck.COLUMN_MAJOR)
    # both layouts are used: W row-major, x column-major
    assert {consts[o[3]] for op, o in insts if op == ck.KHR_LOAD} == {ck.ROW_MAJOR, ck.COLUMN_MAJOR}


def test_module_without_coopmat_is_unchanged():
    data = (ROOT / "llamavk" / "spv" / "mul_mm_q4_0.spv").read_bytes()
    assert ck.nv_to_khr(data) == data


SHADER = """#version 450
#extension GL_NV_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer A { float16_t a[]; };
layout(std430, binding = 1) buffer C { float c[]; };
void main() {
    fcoopmatNV<16, gl_ScopeSubgroup, 16, 16> ma;
    fcoopmatNV<16, gl_ScopeSubgroup, 16, %(BN)s> mb;
    fcoopmatNV<32, gl_ScopeSubgroup, 16, %(BN)s> mc = fcoopmatNV<32, gl_ScopeSubgroup, 16, %(BN)s>(0.0);
    coopMatLoadNV(ma, a, 0, 16, false);
    coopMatLoadNV(mb, a, 256, 16, true);
    mc = coopMatMulAddNV(ma, mb, mc);
    coopMatStoreNV(mc, c, 0, 16, false);
}
"""


def compile_nv(tmp_path, bn):
    src = tmp_path / "t.comp"
    src.write_text(SHADER % {"BN": bn})
    out = tmp_path / "t.spv"
    subprocess.run(["glslc", "--target-env=vulkan1.2", str(src), "-o", str(out)], check=True)
    return out.read_bytes()


@pytest.mark.skipif(shutil.which("glslc") is None, reason="glslc is needed to build an NV test module")
def test_conversion_of_a_fresh_module(tmp_path):
    nv = compile_nv(tmp_path, 8)
    words_nv, insts_nv = parse(nv)
    khr = ck.nv_to_khr(nv)
    words, insts = parse(khr)
    assert words[3] == words_nv[3] + 3                       # three new constants (0, 1, 2)
    count = lambda ins, op: sum(1 for o, _ in ins if o == op)
    assert count(insts, ck.KHR_LOAD) == count(insts_nv, ck.NV_LOAD) == 2
    assert count(insts, ck.KHR_STORE) == count(insts_nv, ck.NV_STORE) == 1
    assert count(insts, ck.KHR_MULADD) == 1 and count(insts, ck.KHR_TYPE) == 3
    assert ck.nv_to_khr(khr) == khr                          # already KHR: unchanged


@pytest.mark.skipif(shutil.which("glslc") is None, reason="glslc is needed to build an NV test module")
def test_a_type_in_two_roles_is_refused(tmp_path):
    nv = compile_nv(tmp_path, 16)                            # A and B are both 16x16 f16: one NV type
    with pytest.raises(ValueError, match="more than one"):
        ck.nv_to_khr(nv)
