"""What a physical device is and can do, read once into a plain dataclass.

Everything the device policy, `list-devices` and kernel selection need is here, so nothing else has to
query Vulkan properties. `DeviceInfo` holds no Vulkan handles: tests fabricate lists of them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import vulkan as vk

from . import coopmat2
from ._ffi import ffi, lib, new_struct, struct_string

DEVICE_TYPES = {
    vk.VK_PHYSICAL_DEVICE_TYPE_OTHER: "other",
    vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU: "integrated",
    vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: "discrete",
    vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: "virtual",
    vk.VK_PHYSICAL_DEVICE_TYPE_CPU: "cpu",
}
VENDORS = {0x10DE: "NVIDIA", 0x1002: "AMD", 0x8086: "Intel", 0x13B5: "ARM", 0x5143: "Qualcomm",
           0x106B: "Apple", 0x10005: "Mesa"}
SHADER_CLOCK_EXTENSION = "VK_KHR_shader_clock"   # in-shader device clock (clockRealtime2x32EXT)
COMPONENT_TYPES = {0: "f16", 1: "f32", 2: "f64", 3: "s8", 4: "s16", 5: "s32", 6: "s64",
                   7: "u8", 8: "u16", 9: "u32", 10: "u64", 1000141000: "bf16",
                   1000491002: "e4m3", 1000491003: "e5m2"}


@dataclass
class MemoryHeap:
    size: int
    device_local: bool
    budget: int | None = None   # VK_EXT_memory_budget: what this process may still use
    usage: int | None = None


@dataclass
class DeviceInfo:
    index: int                   # enumeration order: the N of "VulkanN"
    name: str
    type: str                    # discrete / integrated / virtual / cpu / other
    vendor_id: int
    device_id: int
    driver_name: str
    driver_info: str
    api_version: str
    uuid: str
    heaps: list[MemoryHeap] = field(default_factory=list)
    extensions: list[str] = field(default_factory=list)
    fp16: bool = False           # shaderFloat16 + 16-bit storage
    int8: bool = False           # shaderInt8 + 8-bit storage
    int_dot: bool = False        # VK_KHR_shader_integer_dot_product
    int_dot_fast: bool = False   # 4x8-bit packed dot products (signed and mixed) reported accelerated
    bf16: bool = False           # VK_KHR_shader_bfloat16
    subgroup_size: int = 0
    subgroup_min: int = 0
    subgroup_max: int = 0
    subgroup_arithmetic: bool = False
    max_shared_memory: int = 0
    max_workgroup_invocations: int = 0
    max_storage_buffer_range: int = 0
    max_texel_buffer_bytes: int = 0  # a texel buffer's reach in RGBA32UI texels (vk/kernel.py "t")
    max_push_constants: int = 0
    timestamp_period: float = 0.0   # ns per timestamp tick (0: no compute timestamps)
    timeline_semaphore: bool = False
    buffer_device_address: bool = False
    memory_model: bool = False
    external_memory_host: bool = False
    host_import_alignment: int = 0
    coopmat: list[str] = field(default_factory=list)   # "16x16x16 f16->f32", ...
    coopmat2: bool = False       # VK_NV_cooperative_matrix2
    coopmat2_features: list[str] = field(default_factory=list)   # coopmat2.FEATURES it reports
    coopmat2_max_workgroup: int = 0   # the most threads a workgroup-scope matrix may be shared by
    driver_version: int = 0      # VkPhysicalDeviceProperties.driverVersion (vendor-encoded)
    pipeline_cache_uuid: str = ""   # hex: pipeline caches are compatible only with the same UUID
    shader_clock: bool = False   # VK_KHR_shader_clock shaderDeviceClock (the split timeline, split/clock.py)

    @property
    def vendor(self) -> str:
        return VENDORS.get(self.vendor_id, f"0x{self.vendor_id:04x}")

    @property
    def is_cpu(self) -> bool:
        return self.type == "cpu"

    @property
    def device_local_bytes(self) -> int:
        return sum(h.size for h in self.heaps if h.device_local) or sum(h.size for h in self.heaps)

    @property
    def free_bytes(self) -> int | None:
        """Free device memory from VK_EXT_memory_budget (None when the driver does not say)."""
        local = [h for h in self.heaps if h.device_local] or self.heaps
        if any(h.budget is None for h in local):
            return None
        return sum(max(0, h.budget - (h.usage or 0)) for h in local)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(vendor=self.vendor, free_bytes=self.free_bytes, device_local_bytes=self.device_local_bytes)
        return d


def _version(v: int) -> str:
    return f"{vk.VK_VERSION_MAJOR(v)}.{vk.VK_VERSION_MINOR(v)}.{vk.VK_VERSION_PATCH(v)}"


def device_extensions(handle) -> list[str]:
    return sorted(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(handle, None))


def query_device_info(instance, handle, index: int) -> DeviceInfo:
    exts = device_extensions(handle)
    has = set(exts).__contains__

    # Properties: one pNext chain read by vkGetPhysicalDeviceProperties2.
    subgroup = new_struct("VkPhysicalDeviceSubgroupProperties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES)
    sg_ctl = new_struct("VkPhysicalDeviceSubgroupSizeControlProperties",
                        vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES, subgroup)
    ids = new_struct("VkPhysicalDeviceIDProperties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_ID_PROPERTIES, sg_ctl)
    driver = new_struct("VkPhysicalDeviceDriverProperties", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES, ids)
    head = driver
    dot_props = None
    if has("VK_KHR_shader_integer_dot_product") or p_api_at_least_13(handle):
        dot_props = new_struct("VkPhysicalDeviceShaderIntegerDotProductProperties",
                               vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_INTEGER_DOT_PRODUCT_PROPERTIES, head)
        head = dot_props
    host_props = None
    if has("VK_EXT_external_memory_host"):
        host_props = new_struct("VkPhysicalDeviceExternalMemoryHostPropertiesEXT",
                                vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT, head)
        head = host_props
    cm2_props = None
    if has(coopmat2.EXTENSION):
        cm2_props = coopmat2.properties_struct(head)
        head = cm2_props.ptr
    props2 = new_struct("VkPhysicalDeviceProperties2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, head)
    lib.vkGetPhysicalDeviceProperties2(handle, props2)
    p = props2.properties
    limits = p.limits

    # Features: one chain read by vkGetPhysicalDeviceFeatures2.
    f11 = new_struct("VkPhysicalDeviceVulkan11Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES)
    f12 = new_struct("VkPhysicalDeviceVulkan12Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, f11)
    cm2_feats = coopmat2.features_struct(f12) if has(coopmat2.EXTENSION) else None
    fhead = cm2_feats.ptr if cm2_feats is not None else f12
    clock = None
    if has(SHADER_CLOCK_EXTENSION):
        clock = new_struct("VkPhysicalDeviceShaderClockFeaturesKHR",
                           vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR, fhead)
        fhead = clock
    feats2 = new_struct("VkPhysicalDeviceFeatures2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, fhead)
    lib.vkGetPhysicalDeviceFeatures2(handle, feats2)

    heaps = read_memory_heaps(handle, has("VK_EXT_memory_budget"))
    info = DeviceInfo(
        index=index,
        name=struct_string(p.deviceName),
        type=DEVICE_TYPES.get(p.deviceType, "other"),
        vendor_id=p.vendorID,
        device_id=p.deviceID,
        driver_name=struct_string(driver.driverName),
        driver_info=struct_string(driver.driverInfo),
        api_version=_version(p.apiVersion),
        uuid=bytes(ffi.buffer(ids.deviceUUID, 16)).hex(),
        heaps=heaps,
        extensions=exts,
        fp16=bool(f12.shaderFloat16 and f11.storageBuffer16BitAccess),
        int8=bool(f12.shaderInt8 and f12.storageBuffer8BitAccess),
        int_dot=has("VK_KHR_shader_integer_dot_product") or p.apiVersion >= vk.VK_MAKE_VERSION(1, 3, 0),
        bf16=has("VK_KHR_shader_bfloat16"),
        int_dot_fast=bool(dot_props is not None and dot_props.integerDotProduct4x8BitPackedSignedAccelerated
                          and dot_props.integerDotProduct4x8BitPackedMixedSignednessAccelerated),
        subgroup_size=subgroup.subgroupSize,
        subgroup_min=sg_ctl.minSubgroupSize or subgroup.subgroupSize,
        subgroup_max=sg_ctl.maxSubgroupSize or subgroup.subgroupSize,
        subgroup_arithmetic=bool(subgroup.supportedOperations & vk.VK_SUBGROUP_FEATURE_ARITHMETIC_BIT),
        max_shared_memory=limits.maxComputeSharedMemorySize,
        max_workgroup_invocations=limits.maxComputeWorkGroupInvocations,
        max_storage_buffer_range=limits.maxStorageBufferRange,
        max_texel_buffer_bytes=16 * limits.maxTexelBufferElements,
        max_push_constants=limits.maxPushConstantsSize,
        timestamp_period=float(limits.timestampPeriod) if limits.timestampComputeAndGraphics else 0.0,
        timeline_semaphore=bool(f12.timelineSemaphore),
        buffer_device_address=bool(f12.bufferDeviceAddress),
        memory_model=bool(f12.vulkanMemoryModel),
        external_memory_host=host_props is not None,
        host_import_alignment=host_props.minImportedHostPointerAlignment if host_props is not None else 0,
        coopmat=_coopmat_shapes(instance, handle) if has("VK_KHR_cooperative_matrix") else [],
        coopmat2=has(coopmat2.EXTENSION),
        coopmat2_features=coopmat2.feature_names(cm2_feats) if cm2_feats is not None else [],
        coopmat2_max_workgroup=(coopmat2.property_values(cm2_props)["workgroup_scope_max_workgroup_size"]
                                if cm2_props is not None else 0),
        driver_version=p.driverVersion,
        pipeline_cache_uuid=bytes(ffi.buffer(p.pipelineCacheUUID, 16)).hex(),
        shader_clock=bool(clock is not None and clock.shaderDeviceClock),
    )
    return info


def p_api_at_least_13(handle) -> bool:
    return vk.vkGetPhysicalDeviceProperties(handle).apiVersion >= vk.VK_MAKE_VERSION(1, 3, 0)


def read_memory_heaps(handle, with_budget: bool) -> list[MemoryHeap]:
    """The memory heaps of a physical device, with budget and usage now (VK_EXT_memory_budget)."""
    budget = None
    head = ffi.NULL
    if with_budget:
        budget = new_struct("VkPhysicalDeviceMemoryBudgetPropertiesEXT",
                            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_BUDGET_PROPERTIES_EXT)
        head = budget
    mem2 = new_struct("VkPhysicalDeviceMemoryProperties2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MEMORY_PROPERTIES_2, head)
    lib.vkGetPhysicalDeviceMemoryProperties2(handle, mem2)
    mp = mem2.memoryProperties
    heaps = []
    for i in range(mp.memoryHeapCount):
        h = mp.memoryHeaps[i]
        heaps.append(MemoryHeap(
            size=h.size,
            device_local=bool(h.flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT),
            budget=budget.heapBudget[i] if budget is not None else None,
            usage=budget.heapUsage[i] if budget is not None else None,
        ))
    return heaps


def _coopmat_shapes(instance, handle) -> list[str]:
    try:
        fn = vk.vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    except Exception:
        return []
    shapes = []
    for p in fn(handle):
        if p.scope != vk.VK_SCOPE_SUBGROUP_KHR:
            continue
        a, c = COMPONENT_TYPES.get(p.AType, "?"), COMPONENT_TYPES.get(p.ResultType, "?")
        shapes.append(f"{p.MSize}x{p.NSize}x{p.KSize} {a}->{c}")
    return sorted(set(shapes))
