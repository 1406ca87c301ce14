"""Rewrite a SPIR-V module from SPV_NV_cooperative_matrix to SPV_KHR_cooperative_matrix.

Why: the glslc this project builds with (shaderc 2023.2, Debian 12) knows GL_NV_cooperative_matrix
but not GL_KHR_cooperative_matrix, while devices of every vendor expose VK_KHR_cooperative_matrix.
The two SPIR-V extensions differ only in encoding, so shaders are written against the NV GLSL
extension and shaders/build.py passes their SPIR-V through `nv_to_khr`:

  Capability CooperativeMatrixNV (5357)          -> CooperativeMatrixKHR (6022)
  OpExtension "SPV_NV_cooperative_matrix"        -> "SPV_KHR_cooperative_matrix"
  OpTypeCooperativeMatrixNV %t %scope %r %c      -> OpTypeCooperativeMatrixKHR %t %scope %r %c %use
  OpCooperativeMatrixLoadNV %rt %id %p %stride %colmajor [mem]
                                                 -> OpCooperativeMatrixLoadKHR %rt %id %p %layout %stride [mem]
  OpCooperativeMatrixStoreNV %p %obj %stride %colmajor [mem]
                                                 -> OpCooperativeMatrixStoreKHR %p %obj %layout %stride [mem]
  OpCooperativeMatrixMulAddNV / LengthNV         -> the KHR opcodes (same operands)

KHR matrix types carry a use (A, B or accumulator); NV types do not. The use of each type is read off
the multiply-adds (the types of their A and B operands and of their result); a type used in two
roles cannot be expressed, so the shader must give A, B and accumulator distinct shapes or component
types (e.g. M x N x K = 16 x 8 x 16: A 16x16 f16, B 16x8 f16, C 16x8 f32). Types never multiplied
are accumulators. The column-major flag (a boolean constant) becomes a MemoryLayout constant.
"""

from __future__ import annotations

import struct

OP_EXTENSION, OP_TYPE_BOOL, OP_TYPE_INT, OP_CONSTANT_TRUE, OP_CONSTANT_FALSE, OP_CONSTANT = 10, 20, 21, 41, 42, 43
OP_CAPABILITY = 17
CAP_NV, CAP_KHR = 5357, 6022
NV_TYPE, NV_LOAD, NV_STORE, NV_MULADD, NV_LENGTH = 5358, 5359, 5360, 5361, 5362
KHR_TYPE, KHR_LOAD, KHR_STORE, KHR_MULADD, KHR_LENGTH = 4456, 4457, 4458, 4459, 4460
USE_A, USE_B, USE_ACC = 0, 1, 2
ROW_MAJOR, COLUMN_MAJOR = 0, 1

# Opcodes whose first two operands are <result type> <result id> and that may produce a matrix
# value (the ones glslang emits around cooperative matrices: loads, copies, phis, conversions,
# arithmetic, selects, composite ops).
_TYPED_RESULT = {61, 62, 79, 80, 81, 82, 83, 115, 116, 117, 124, 126, 127, 129, 131, 133, 136, 142, 143, 169,
                 245, NV_LOAD, NV_MULADD}


def _string_words(s: str) -> list[int]:
    raw = s.encode() + b"\0"
    raw += b"\0" * (-len(raw) % 4)
    return list(struct.unpack(f"<{len(raw) // 4}I", raw))


def _decode_string(words: list[int]) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    return raw.split(b"\0", 1)[0].decode()


def _instructions(words: list[int]):
    i = 5
    while i < len(words):
        n, op = words[i] >> 16, words[i] & 0xFFFF
        if n == 0:
            raise ValueError("malformed SPIR-V: zero-length instruction")
        yield op, words[i + 1:i + n]
        i += n


def _encode(op: int, operands: list[int]) -> list[int]:
    return [((len(operands) + 1) << 16) | op] + operands


def nv_to_khr(spirv: bytes) -> bytes:
    """The KHR form of a module using SPV_NV_cooperative_matrix (others are returned unchanged)."""
    words = list(struct.unpack(f"<{len(spirv) // 4}I", spirv))
    if words[0] != 0x07230203:
        raise ValueError("not a SPIR-V module (bad magic number)")
    insts = list(_instructions(words))
    if not any(op == OP_CAPABILITY and ops[0] == CAP_NV for op, ops in insts):
        return spirv

    type_of: dict[int, int] = {}
    bools: dict[int, bool] = {}
    matrix_types: list[int] = []
    int32 = None
    uses: dict[int, set[int]] = {}
    for op, ops in insts:
        if op in _TYPED_RESULT:
            type_of[ops[1]] = ops[0]
        if op in (OP_CONSTANT_TRUE, OP_CONSTANT_FALSE):
            bools[ops[1]] = op == OP_CONSTANT_TRUE
        elif op == OP_TYPE_INT and ops[1] == 32 and int32 is None:
            int32 = ops[0]
        elif op == NV_TYPE:
            matrix_types.append(ops[0])
    for op, ops in insts:
        if op == NV_MULADD:
            for role, value in ((USE_A, ops[2]), (USE_B, ops[3])):
                uses.setdefault(type_of[value], set()).add(role)
            uses.setdefault(ops[0], set()).add(USE_ACC)
    for t in matrix_types:
        if len(uses.get(t, ())) > 1:
            raise ValueError(f"cooperative matrix type %{t} is used as more than one of A / B / accumulator; "
                             "give the operands distinct shapes or component types")
    if int32 is None:
        raise ValueError("module declares no 32-bit integer type")

    bound = words[3]
    consts = {}
    for value in (USE_A, USE_B, USE_ACC):          # layout constants share ids with equal values
        consts[value] = bound
        bound += 1

    out: list[int] = []
    for op, ops in insts:
        if op == OP_CAPABILITY and ops[0] == CAP_NV:
            out += _encode(OP_CAPABILITY, [CAP_KHR])
        elif op == OP_EXTENSION and _decode_string(ops) == "SPV_NV_cooperative_matrix":
            out += _encode(OP_EXTENSION, _string_words("SPV_KHR_cooperative_matrix"))
        elif op == NV_TYPE:
            use = next(iter(uses.get(ops[0], {USE_ACC})))
            out += _encode(KHR_TYPE, ops[:5] + [consts[use]])
        elif op == NV_LOAD:
            rt, rid, ptr, stride, colmajor, *mem = ops
            out += _encode(KHR_LOAD, [rt, rid, ptr, _layout(consts, bools, colmajor), stride, *mem])
        elif op == NV_STORE:
            ptr, obj, stride, colmajor, *mem = ops
            out += _encode(KHR_STORE, [ptr, obj, _layout(consts, bools, colmajor), stride, *mem])
        elif op == NV_MULADD:
            out += _encode(KHR_MULADD, ops)
        elif op == NV_LENGTH:
            out += _encode(KHR_LENGTH, ops)
        else:
            out += _encode(op, ops)
        if op == OP_TYPE_INT and ops[0] == int32:
            # the new constants right after their type: before any matrix type that uses them
            for value, cid in consts.items():
                out += _encode(OP_CONSTANT, [int32, cid, value])
    header = words[:5]
    header[3] = bound
    return struct.pack(f"<{len(header) + len(out)}I", *header, *out)


def _layout(consts: dict[int, int], bools: dict[int, bool], colmajor_id: int) -> int:
    if colmajor_id not in bools:
        raise ValueError("cooperative matrix load/store: the column-major flag must be a constant")
    return consts[COLUMN_MAJOR if bools[colmajor_id] else ROW_MAJOR]
