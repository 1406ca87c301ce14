"""VK_NV_cooperative_matrix2's feature and property structs, which the `vulkan` package (1.3.275)
predates: built here as raw words in the layout of the C headers, to put into pNext chains.

VkPhysicalDeviceCooperativeMatrix2FeaturesNV: sType, pNext, then seven VkBool32 in FEATURES' order.
VkPhysicalDeviceCooperativeMatrix2PropertiesNV: sType, pNext, then three uint32 in PROPERTIES' order.
"""

from __future__ import annotations

from ._ffi import ffi

EXTENSION = "VK_NV_cooperative_matrix2"
FEATURES_STYPE = 1000593000     # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_FEATURES_NV
PROPERTIES_STYPE = 1000593002   # VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_2_PROPERTIES_NV
FEATURES = ("workgroup_scope", "flexible_dimensions", "reductions", "conversions",
            "per_element_operations", "tensor_addressing", "block_loads")
PROPERTIES = ("workgroup_scope_max_workgroup_size", "flexible_dimensions_max_dimension",
              "workgroup_scope_reserved_shared_memory")
# What shaders/matmul_cm2.comp uses: workgroup-scope matrices of its own tile sizes, tensor-layout
# loads and stores, block sizes with a decode function, the bias added per element.
REQUIRED = ("workgroup_scope", "flexible_dimensions", "tensor_addressing", "block_loads",
            "per_element_operations")
_HEAD = 4   # words before the members: sType, padding, the 8-byte pNext


class RawStruct:
    """A zeroed struct of `n` 32-bit members after sType/pNext. `.ptr` goes into a chain (as the
    pNext of the next struct); keep the object alive until the Vulkan call has returned."""

    def __init__(self, stype: int, n: int, pnext=ffi.NULL):
        self.words = ffi.new(f"uint32_t[{_HEAD + n}]")
        self.words[0] = stype
        ffi.cast("uint64_t *", self.words + 2)[0] = int(ffi.cast("uintptr_t", pnext))
        self.ptr = ffi.cast("void *", self.words)
        self.n = n

    def member(self, i: int) -> int:
        return int(self.words[_HEAD + i])

    def set_member(self, i: int, value: int) -> None:
        self.words[_HEAD + i] = value


def features_struct(pnext=ffi.NULL) -> RawStruct:
    return RawStruct(FEATURES_STYPE, len(FEATURES), pnext)


def properties_struct(pnext=ffi.NULL) -> RawStruct:
    return RawStruct(PROPERTIES_STYPE, len(PROPERTIES), pnext)


def feature_names(s: RawStruct) -> list[str]:
    """The features a filled-in features struct reports."""
    return [name for i, name in enumerate(FEATURES) if s.member(i)]


def property_values(s: RawStruct) -> dict[str, int]:
    return {name: s.member(i) for i, name in enumerate(PROPERTIES)}
