"""The shipped cooperative-matrix kernels are SPV_KHR_cooperative_matrix modules of the shape the
selection assumes (16 x 8 x 16: A 16x16 f16, B 16x8 f16, accumulator 16x8 f32, subgroup scope), and
no shipped kernel uses the NV extension. Read straight from the SPIR-V words: no GPU and no
SPIR-V tools are needed (llvmpipe has no cooperative matrices, so these kernels never run in tests;
tests/test_kernels_matmul.py::test_matmul_coopmat and test_kernels_ops.py::test_attention_coop run them
on devices that do)."""

import importlib.util
import struct
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPV = ROOT / "llamavk" / "spv"
spec = importlib.util.spec_from_file_location("shader_build", ROOT / "shaders" / "build.py")
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)

# SPIR-V numbers (the unified grammar, spirv.core.grammar.json)
OP_CAPABILITY, OP_EXTENSION, OP_TYPE_INT, OP_TYPE_FLOAT, OP_CONSTANT = 17, 10, 21, 22, 43
CAP_COOPMAT_NV, CAP_COOPMAT_KHR = 5357, 6022
OPS_NV = set(range(5358, 5363))                     # OpTypeCooperativeMatrixNV .. OpCooperativeMatrixLengthNV
OP_TYPE_KHR, OP_LOAD_KHR, OP_STORE_KHR, OP_MULADD_KHR = 4456, 4457, 4458, 4459
SCOPE_SUBGROUP, USE_A, USE_B, USE_ACC = 3, 0, 1, 2
ROW_MAJOR, COLUMN_MAJOR = 0, 1

COOP_SOURCES = {"matmul_coop.comp", "attention_coop.comp"}
COOP_KERNELS = sorted(n for n, (src, _) in build.VARIANTS.items() if src in COOP_SOURCES)


def instructions(spirv: bytes):
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    assert words[0] == 0x07230203
    i = 5
    while i < len(words):
        n, op = words[i] >> 16, words[i] & 0xFFFF
        assert n > 0
        yield op, words[i + 1:i + n]
        i += n


def string(operands) -> str:
    return struct.pack(f"<{len(operands)}I", *operands).split(b"\0", 1)[0].decode()


def test_the_kernels_are_found():
    assert len(COOP_KERNELS) >= 4 and "mul_mm_coop_q4_0" in COOP_KERNELS and "attention_coop_f16_hd128" in COOP_KERNELS


@pytest.mark.parametrize("name", COOP_KERNELS)
def test_coop_kernel_is_khr_16x8x16(name):
    spirv = (SPV / f"{name}.spv").read_bytes()
    # SPIR-V 1.5 (vulkan1.2): Vulkan 1.2 devices with VK_KHR_cooperative_matrix load it
    assert struct.unpack("<I", spirv[4:8])[0] == 0x00010500
    insts = list(instructions(spirv))
    caps = {ops[0] for op, ops in insts if op == OP_CAPABILITY}
    exts = {string(ops) for op, ops in insts if op == OP_EXTENSION}
    assert CAP_COOPMAT_KHR in caps and CAP_COOPMAT_NV not in caps
    assert "SPV_KHR_cooperative_matrix" in exts and "SPV_NV_cooperative_matrix" not in exts
    assert not {op for op, _ in insts} & OPS_NV
    ints = {ops[0] for op, ops in insts if op == OP_TYPE_INT and ops[1] == 32}
    consts = {ops[1]: ops[2] for op, ops in insts if op == OP_CONSTANT and ops[0] in ints}
    floats = {ops[0]: ops[1] for op, ops in insts if op == OP_TYPE_FLOAT}
    types = {ops[0]: (floats[ops[1]], consts[ops[2]], consts[ops[3]], consts[ops[4]], consts[ops[5]])
             for op, ops in insts if op == OP_TYPE_KHR}
    # (component bits, scope, rows, columns, use)
    assert sorted(types.values()) == [(16, SCOPE_SUBGROUP, 16, 8, USE_B), (16, SCOPE_SUBGROUP, 16, 16, USE_A),
                                      (32, SCOPE_SUBGROUP, 16, 8, USE_ACC)]
    by_use = {t[4]: tid for tid, t in types.items()}
    muladds = [ops for op, ops in insts if op == OP_MULADD_KHR]
    assert muladds and all(ops[0] == by_use[USE_ACC] for ops in muladds)
    assert all(len(ops) == 5 for ops in muladds)            # no operand flags: f16 x f16 -> f32
    layouts = [consts[ops[3]] for op, ops in insts if op == OP_LOAD_KHR]
    layouts += [consts[ops[2]] for op, ops in insts if op == OP_STORE_KHR]
    assert set(layouts) <= {ROW_MAJOR, COLUMN_MAJOR} and COLUMN_MAJOR in layouts   # B is read transposed


def test_no_kernel_uses_the_nv_extension():
    """Kernels are written against GL_KHR_cooperative_matrix; nothing rewrites NV SPIR-V any more."""
    for path in sorted(SPV.glob("*.spv")):
        caps = set()
        for op, ops in instructions(path.read_bytes()):
            if op != OP_CAPABILITY:      # capabilities are the module's first section
                break
            caps.add(ops[0])
        assert caps and CAP_COOPMAT_NV not in caps, path.name
