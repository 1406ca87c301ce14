"""Compute kernels: SPIR-V + descriptor layout + push constants + specialization constants.

A kernel's bindings are declared as an access string, e.g. "rrw" (two read, one written): command
sequences use it to place barriers only where a later dispatch depends on an earlier one. "t" is a
read binding seen as a uniform texel buffer of 16-byte texels (usamplerBuffer, RGBA32UI) instead of a
storage buffer. Why: llvmpipe runs a storage-buffer load with per-lane addresses inside a loop as a
loop over the lanes, and a texel fetch as one gather (kernels for software devices read weights so).
"""

from __future__ import annotations

import struct
from importlib import resources

import vulkan as vk

from ..errors import LlamavkError
from ._ffi import check, ffi, lib, new_struct

SPV_PACKAGE = "llamavk.spv"
SETS_PER_ALLOCATION = 16


def load_spirv(name: str) -> bytes:
    """The shipped SPIR-V of kernel `name` (llamavk/spv/<name>.spv, built by shaders/build.py)."""
    try:
        return resources.files(SPV_PACKAGE).joinpath(f"{name}.spv").read_bytes()
    except FileNotFoundError:
        raise LlamavkError(f"kernel {name!r} is missing from the package (rebuild shaders: make shaders)") from None


def pack_constants(values) -> bytes:
    """Specialization/push values to 32-bit words: ints as int32/uint32, floats as float32."""
    out = bytearray()
    for v in values:
        if isinstance(v, bool) or isinstance(v, int):
            out += struct.pack("<I" if v >= 0 else "<i", v)
        elif isinstance(v, float):
            out += struct.pack("<f", v)
        else:
            raise TypeError(f"constant {v!r} must be int or float")
    return bytes(out)


def _descriptor_type(access: str) -> int:
    return vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER if access == "t" else vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER


class Kernel:
    """A compute pipeline. `spec` values become specialization constants 0, 1, 2, ... in order."""

    def __init__(self, device, spirv: bytes | str, bindings: str, push_size: int = 0, spec=(),
                 name: str | None = None, subgroup_size: int | None = None):
        if isinstance(spirv, str):
            name = name or spirv
            spirv = load_spirv(spirv)
        if set(bindings) - set("rwt"):
            raise ValueError("bindings is a string of 'r'/'w'/'t'")
        self.device = device
        self.name = name or "kernel"
        self.bindings = bindings
        self.push_size = push_size
        dev = device.handle

        code = ffi.new("char[]", spirv)
        module_info = new_struct("VkShaderModuleCreateInfo", vk.VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO,
                                 codeSize=len(spirv), pCode=ffi.cast("uint32_t*", code))
        out_module = ffi.new("VkShaderModule*")
        check(lib.vkCreateShaderModule(dev, module_info, ffi.NULL, out_module), f"vkCreateShaderModule({self.name})")
        self.module = out_module[0]

        layout_bindings = ffi.new("VkDescriptorSetLayoutBinding[]", [
            dict(binding=i, descriptorType=_descriptor_type(a), descriptorCount=1,
                 stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i, a in enumerate(bindings)])
        dsl_info = new_struct("VkDescriptorSetLayoutCreateInfo", vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_LAYOUT_CREATE_INFO,
                              bindingCount=len(bindings), pBindings=layout_bindings)
        out_dsl = ffi.new("VkDescriptorSetLayout*")
        check(lib.vkCreateDescriptorSetLayout(dev, dsl_info, ffi.NULL, out_dsl), "vkCreateDescriptorSetLayout")
        self.set_layout = out_dsl[0]

        push_range = ffi.new("VkPushConstantRange*", dict(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT,
                                                           offset=0, size=push_size))
        set_layouts = ffi.new("VkDescriptorSetLayout[1]", [self.set_layout])
        pl_info = new_struct("VkPipelineLayoutCreateInfo", vk.VK_STRUCTURE_TYPE_PIPELINE_LAYOUT_CREATE_INFO,
                             setLayoutCount=1, pSetLayouts=set_layouts,
                             pushConstantRangeCount=1 if push_size else 0,
                             pPushConstantRanges=push_range if push_size else ffi.NULL)
        out_pl = ffi.new("VkPipelineLayout*")
        check(lib.vkCreatePipelineLayout(dev, pl_info, ffi.NULL, out_pl), "vkCreatePipelineLayout")
        self.layout = out_pl[0]

        spec_data = pack_constants(list(spec))
        n_spec = len(spec_data) // 4
        spec_entries = ffi.new("VkSpecializationMapEntry[]", [dict(constantID=i, offset=4 * i, size=4)
                                                               for i in range(n_spec)] or [dict()])
        spec_buf = ffi.new("char[]", spec_data or b"\0")
        spec_info = ffi.new("VkSpecializationInfo*", dict(mapEntryCount=n_spec, pMapEntries=spec_entries,
                                                           dataSize=len(spec_data), pData=spec_buf))
        entry = ffi.new("char[]", b"main")   # must outlive vkCreateComputePipelines (NVIDIA)
        stage_next = ffi.NULL
        subgroup_info = None
        if subgroup_size:
            subgroup_info = new_struct("VkPipelineShaderStageRequiredSubgroupSizeCreateInfo",
                                       vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_REQUIRED_SUBGROUP_SIZE_CREATE_INFO,
                                       requiredSubgroupSize=subgroup_size)
            stage_next = subgroup_info
        stage = new_struct("VkPipelineShaderStageCreateInfo", vk.VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO,
                           stage_next, stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.module, pName=entry,
                           pSpecializationInfo=spec_info)
        flags = vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR if device.features.get("pipeline_stats") else 0
        pipe_info = new_struct("VkComputePipelineCreateInfo", vk.VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO,
                               flags=flags, stage=stage[0], layout=self.layout)
        out_pipe = ffi.new("VkPipeline*")
        cache = getattr(device, "pipeline_cache", None)     # compiled code kept between runs
        cache = cache.handle if cache is not None and cache.handle is not None else ffi.NULL
        check(lib.vkCreateComputePipelines(dev, cache, 1, pipe_info, ffi.NULL, out_pipe),
              f"vkCreateComputePipelines({self.name})")
        self.pipeline = out_pipe[0]
        del code, spec_entries, spec_buf, spec_info, entry, stage, subgroup_info
        self._sets: dict = {}
        self._write = self._infos = None     # descriptor_set()'s reusable write
        self._spare_sets: list = []          # allocated, not yet written
        device.register(self)

    def statistics(self) -> dict[str, float]:
        """The driver's statistics of this pipeline (name -> value; NVIDIA reports registers per thread
        among others), where the device was opened with LLAMAVK_PIPELINE_STATS=1; else {}."""
        if not self.device.features.get("pipeline_stats"):
            return {}
        name = b"vkGetPipelineExecutableStatisticsKHR"
        get = ffi.cast("PFN_vkGetPipelineExecutableStatisticsKHR", lib.vkGetDeviceProcAddr(self.device.handle, name))
        info = new_struct("VkPipelineExecutableInfoKHR", vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR,
                          pipeline=self.pipeline, executableIndex=0)
        count = ffi.new("uint32_t*")
        check(get(self.device.handle, info, count, ffi.NULL), "vkGetPipelineExecutableStatisticsKHR")
        stats = ffi.new("VkPipelineExecutableStatisticKHR[]", count[0])
        for st in stats:
            st.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
        check(get(self.device.handle, info, count, stats), "vkGetPipelineExecutableStatisticsKHR")
        field = {vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR: "b32",
                 vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR: "i64",
                 vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR: "u64",
                 vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_FLOAT64_KHR: "f64"}
        return {ffi.string(st.name).decode(): getattr(st.value, field[st.format]) for st in stats[0:count[0]]}

    def descriptor_set(self, ranges):
        """A descriptor set binding `ranges` [(buffer, offset, size)...]; identical ones are reused."""
        key = tuple((id(b), o, s) for b, o, s in ranges)
        cached = self._sets.get(key)
        if cached is not None:
            return cached
        if len(ranges) != len(self.bindings):
            raise ValueError(f"{self.name} takes {len(self.bindings)} buffers, got {len(ranges)}")
        if not self._spare_sets:     # a few at a time: one call instead of one per set
            self._spare_sets = self.device.allocate_descriptor_sets(self.set_layout, SETS_PER_ALLOCATION)[::-1]
        dset = self._spare_sets.pop()
        if "t" in self.bindings:
            self._write_with_texels(dset, ranges)
        else:
            self._write_storage(dset, ranges)
        self._sets[key] = dset
        return dset

    def _write_storage(self, dset, ranges) -> None:
        """One write of all bindings (consecutive bindings of one type), into arrays reused by every
        set of this kernel: a load makes ~450 sets, and building the structs from dicts cost more
        than the driver's work."""
        if self._write is None:
            n = len(self.bindings)
            self._infos = ffi.new("VkDescriptorBufferInfo[]", n)
            self._write = ffi.new("VkWriteDescriptorSet*", dict(
                sType=vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dstBinding=0, descriptorCount=n,
                descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, pBufferInfo=self._infos))
        infos = self._infos
        for i, (b, o, s) in enumerate(ranges):
            info = infos[i]
            info.buffer, info.offset, info.range = b.handle, o, s
        self._write.dstSet = dset
        lib.vkUpdateDescriptorSets(self.device.handle, 1, self._write, 0, ffi.NULL)

    def _write_with_texels(self, dset, ranges) -> None:
        """One write per binding: storage buffers as ranges, "t" bindings as their buffers' views."""
        writes = ffi.new("VkWriteDescriptorSet[]", len(ranges))
        pointed = []     # what the writes point to, alive until the update returns
        for i, ((b, o, s), access) in enumerate(zip(ranges, self.bindings)):
            w = writes[i]
            w.sType, w.dstSet, w.dstBinding, w.descriptorCount = \
                vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET, dset, i, 1
            w.descriptorType = _descriptor_type(access)
            if access == "t":
                pointed.append(ffi.new("VkBufferView*", b.texel_view(o, s)))
                w.pTexelBufferView = pointed[-1]
            else:
                pointed.append(ffi.new("VkDescriptorBufferInfo*", dict(buffer=b.handle, offset=o, range=s)))
                w.pBufferInfo = pointed[-1]
        lib.vkUpdateDescriptorSets(self.device.handle, len(ranges), writes, 0, ffi.NULL)

    def close(self) -> None:
        if self.pipeline is None:
            return
        dev = self.device.handle
        vk.vkDestroyPipeline(dev, self.pipeline, None)
        vk.vkDestroyPipelineLayout(dev, self.layout, None)
        vk.vkDestroyDescriptorSetLayout(dev, self.set_layout, None)
        vk.vkDestroyShaderModule(dev, self.module, None)
        self.pipeline = None

    def __repr__(self):
        return f"Kernel({self.name} on {self.device.name})"
