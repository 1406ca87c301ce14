"""A logical device: one VkDevice with one compute queue, its pools, and memory-type choice.

Naming the same physical device twice creates two `Device`s on it ("virtual devices"): that is how
split modes are tested on one GPU or on llvmpipe.
"""

from __future__ import annotations

import os

import vulkan as vk

from ..errors import LlamavkError
from . import coopmat2
from ._ffi import c_string_array, check, ffi, lib, new_struct
from .instance import Instance, get_instance
from .physical import SHADER_CLOCK_EXTENSION, DeviceInfo

# Device extensions we use when present; none is required (portable paths exist for each).
OPTIONAL_EXTENSIONS = (
    "VK_EXT_external_memory_host",   # one host allocation imported into several devices
    "VK_EXT_memory_budget",          # free memory for list-devices and layer sizing
    "VK_KHR_cooperative_matrix",     # tensor-core matrix products
    coopmat2.EXTENSION,              # NV cooperative matrix 2: prompt products (matmul_cm2.comp)
    "VK_KHR_shader_integer_dot_product",
    "VK_EXT_subgroup_size_control",
    "VK_KHR_shader_bfloat16",
    SHADER_CLOCK_EXTENSION,          # device clock read in shaders: the split timeline (split/clock.py)
)

# Diagnostics: LLAMAVK_PIPELINE_STATS=1 asks the driver for every pipeline's statistics (on NVIDIA:
# registers per thread, shared memory, ...), read by Kernel.statistics() (benchmarks/kernel_stats.py).
PIPELINE_STATS_EXTENSION = "VK_KHR_pipeline_executable_properties"

HOST_VISIBLE = vk.VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT | vk.VK_MEMORY_PROPERTY_HOST_COHERENT_BIT
DEVICE_LOCAL = vk.VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT


class Device:
    """Logical device + compute queue. `name` is how users and logs refer to it ("Vulkan0")."""

    def __init__(self, info: DeviceInfo, instance: Instance | None = None, name: str | None = None):
        self.instance = instance or get_instance()
        self.info = info
        self.name = name or f"Vulkan{info.index}"
        self.physical = self.instance.physical_handles[info.index]
        self.extensions = [e for e in OPTIONAL_EXTENSIONS if e in info.extensions]
        if os.environ.get("LLAMAVK_PIPELINE_STATS") == "1" and PIPELINE_STATS_EXTENSION in info.extensions:
            self.extensions.append(PIPELINE_STATS_EXTENSION)
        self.queue_family = self._pick_queue_family()
        self.handle = self._create_device()
        self.queue = vk.vkGetDeviceQueue(self.handle, self.queue_family, 0)
        self.memory_types = vk.vkGetPhysicalDeviceMemoryProperties(self.physical)
        pool_info = vk.VkCommandPoolCreateInfo(
            flags=vk.VK_COMMAND_POOL_CREATE_RESET_COMMAND_BUFFER_BIT, queueFamilyIndex=self.queue_family)
        self.command_pool = vk.vkCreateCommandPool(self.handle, pool_info, None)
        from .pipeline_cache import PipelineCache
        # Compiled pipelines from earlier runs (vk/pipeline_cache.py); written back by close().
        self.pipeline_cache = PipelineCache(self)
        self._descriptor_pools: list = []
        self._descriptor_free = 0
        self._closables: list = []      # resources released (in reverse) by close()
        from .sync import TimelineSemaphore
        # Every submission signals this timeline; host waits use its values (no fences to recycle).
        self.timeline = TimelineSemaphore(self)
        self._submitted = 0
        self._transfer = None
        self.writes_pending = 0         # timeline value of write_soon()'s copies not yet waited for
        self.before_close: list = []    # called first by close(): threads still creating objects on it

    # -- creation ---------------------------------------------------------------------------
    def _pick_queue_family(self) -> int:
        families = vk.vkGetPhysicalDeviceQueueFamilyProperties(self.physical)
        compute = [i for i, f in enumerate(families) if f.queueFlags & vk.VK_QUEUE_COMPUTE_BIT]
        if not compute:
            raise LlamavkError(f"{self.info.name} has no compute queue")
        # A compute-only family avoids sharing the queue with a display's graphics work.
        dedicated = [i for i in compute if not families[i].queueFlags & vk.VK_QUEUE_GRAPHICS_BIT]
        return (dedicated or compute)[0]

    def _create_device(self):
        # Read the supported features into a chain, then enable all of them except robustness
        # (bounds checks cost speed and our kernels never index out of range).
        info = self.info
        major_minor = tuple(int(x) for x in info.api_version.split(".")[:2])
        f11 = new_struct("VkPhysicalDeviceVulkan11Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES)
        f12 = new_struct("VkPhysicalDeviceVulkan12Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES, f11)
        head = f12
        keep = [f11, f12]
        if major_minor >= (1, 3):
            f13 = new_struct("VkPhysicalDeviceVulkan13Features", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_3_FEATURES, head)
            head = f13
            keep.append(f13)
        if "VK_KHR_cooperative_matrix" in self.extensions:
            cm = new_struct("VkPhysicalDeviceCooperativeMatrixFeaturesKHR",
                            vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_KHR, head)
            head = cm
            keep.append(cm)
        cm2 = None
        if coopmat2.EXTENSION in self.extensions:
            # not in the `vulkan` package: raw words (vk/coopmat2.py), kept alive in `keep`
            cm2 = coopmat2.features_struct(head)
            head = cm2.ptr
            keep.append(cm2)
        clock = None
        if SHADER_CLOCK_EXTENSION in self.extensions:
            clock = new_struct("VkPhysicalDeviceShaderClockFeaturesKHR",
                               vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CLOCK_FEATURES_KHR, head)
            head = clock
            keep.append(clock)      # alive until vkCreateDevice returns (NVIDIA reads the chain then)
        stats = None
        if PIPELINE_STATS_EXTENSION in self.extensions:
            stats = new_struct("VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR",
                               vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR, head)
            head = stats
        feats2 = new_struct("VkPhysicalDeviceFeatures2", vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2, head)
        lib.vkGetPhysicalDeviceFeatures2(self.physical, feats2)
        feats2.features.robustBufferAccess = 0
        f12.bufferDeviceAddressCaptureReplay = 0
        f12.bufferDeviceAddressMultiDevice = 0
        if major_minor >= (1, 3):
            keep[2].robustImageAccess = 0

        priority = ffi.new("float[]", [1.0])
        queue_info = new_struct("VkDeviceQueueCreateInfo", vk.VK_STRUCTURE_TYPE_DEVICE_QUEUE_CREATE_INFO,
                                queueFamilyIndex=self.queue_family, queueCount=1, pQueuePriorities=priority)
        ext_array, ext_owners = c_string_array(self.extensions)
        create = new_struct("VkDeviceCreateInfo", vk.VK_STRUCTURE_TYPE_DEVICE_CREATE_INFO, feats2,
                            queueCreateInfoCount=1, pQueueCreateInfos=queue_info,
                            enabledExtensionCount=len(self.extensions), ppEnabledExtensionNames=ext_array)
        handle = ffi.new("VkDevice*")
        check(lib.vkCreateDevice(self.physical, create, ffi.NULL, handle), f"vkCreateDevice({info.name})")
        self.features = {"fp16": bool(f12.shaderFloat16), "int8": bool(f12.shaderInt8),
                         "bda": bool(f12.bufferDeviceAddress),
                         "coopmat": "VK_KHR_cooperative_matrix" in self.extensions,
                         # every NV coopmat2 feature matmul_cm2.comp uses (all reported ones are enabled)
                         "coopmat2": bool(cm2 is not None and "VK_KHR_cooperative_matrix" in self.extensions
                                          and set(coopmat2.REQUIRED) <= set(coopmat2.feature_names(cm2))),
                         # 4x8-bit integer dot products (matvec_stream.comp's _dp variants): a 1.3 feature
                         "int_dot": bool(major_minor >= (1, 3) and keep[2].shaderIntegerDotProduct),
                         "pipeline_stats": bool(stats is not None and stats.pipelineExecutableInfo),
                         "shader_clock": bool(clock is not None and clock.shaderDeviceClock)}
        del keep, ext_owners, stats, clock
        return handle[0]

    def proc(self, name: str):
        """A device-level extension function."""
        return vk.vkGetDeviceProcAddr(self.handle, name)

    # -- memory -----------------------------------------------------------------------------
    def memory_type(self, type_bits: int, want: int, avoid: int = 0) -> int:
        """Index of the first memory type allowed by `type_bits` that has all `want` flags."""
        candidates = []
        for i in range(self.memory_types.memoryTypeCount):
            flags = self.memory_types.memoryTypes[i].propertyFlags
            if type_bits & (1 << i) and (flags & want) == want:
                candidates.append((bool(flags & avoid), i))
        if not candidates:
            raise LlamavkError(f"{self.name}: no memory type with flags 0x{want:x}")
        return min(candidates)[1]

    # -- descriptor sets ----------------------------------------------------------------------
    def allocate_descriptor_set(self, layout):
        return self.allocate_descriptor_sets(layout, 1)[0]

    def allocate_descriptor_sets(self, layout, count: int) -> list:
        """`count` descriptor sets of one layout, in one call (pools of 4096 sets, 8 storage-buffer
        descriptors and one texel buffer a set on average)."""
        if self._descriptor_free < count:
            sets = max(4096, count)
            sizes = [vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=sets * 8),
                     vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_UNIFORM_TEXEL_BUFFER, descriptorCount=sets)]
            pool = vk.vkCreateDescriptorPool(self.handle, vk.VkDescriptorPoolCreateInfo(
                maxSets=sets, poolSizeCount=len(sizes), pPoolSizes=sizes), None)
            self._descriptor_pools.append(pool)
            self._descriptor_free = sets
        self._descriptor_free -= count
        # Raw cffi: the package's struct and call wrappers cost ~50 us a set, and a 1.1B model's
        # decode and prompt recordings allocate ~450 sets at load.
        layouts = ffi.new("VkDescriptorSetLayout[]", [layout] * count)
        alloc = new_struct("VkDescriptorSetAllocateInfo", vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO,
                           descriptorPool=self._descriptor_pools[-1], descriptorSetCount=count, pSetLayouts=layouts)
        out = ffi.new("VkDescriptorSet[]", count)
        check(lib.vkAllocateDescriptorSets(self.handle, alloc, out), "vkAllocateDescriptorSets")
        return list(out)

    # -- submission ---------------------------------------------------------------------------
    def next_timeline_value(self) -> int:
        self._submitted += 1
        return self._submitted

    def wait_idle(self) -> None:
        """Wait for everything submitted so far (bounded: a hang becomes an error)."""
        self.timeline.wait(self._submitted)

    @property
    def transfer(self):
        """Staged host <-> device copies (vk/transfer.py), created on first use."""
        from .transfer import Transfer
        if self._transfer is None:
            self._transfer = Transfer(self)
        return self._transfer

    def upload(self, buffer, data, offset: int = 0) -> None:
        """Copy host bytes into any buffer (through a staging buffer when it is not host-visible)."""
        self.transfer.upload(buffer, data, offset)

    def write_soon(self, buffer, data, offset: int = 0) -> None:
        """Queue a copy of host bytes into a device-local buffer and return without waiting; the
        next step submitted (CommandSequence.submit) waits for it first. For the small buffers a
        recording makes (counters at rest): during a load the queue holds the weights' copies,
        and a copy's wait would be theirs too (a timeline value is reached once every earlier
        submission is done). Called by the thread that records and submits steps."""
        import numpy as np

        value = self.transfer.upload_pieces(buffer, [np.frombuffer(memoryview(data).cast("B"), dtype=np.uint8)],
                                            offset)
        self.writes_pending = max(self.writes_pending, value)

    def settle_writes(self) -> None:
        """Wait for the copies write_soon() queued."""
        value, self.writes_pending = self.writes_pending, 0
        if value:
            self.timeline.wait_any_thread(value)

    def download(self, buffer, size: int, offset: int = 0) -> bytes:
        return self.transfer.download(buffer, size, offset)

    def register(self, resource) -> None:
        """Release `resource` (anything with .close()) when the device closes."""
        self._closables.append(resource)

    def close(self, release: bool = True) -> None:
        """Destroy the device and everything registered with it. release=False: wait for its work
        and save the pipeline cache only (the process is about to exit, which frees the rest)."""
        if self.handle is None:
            return
        for wait in self.before_close:
            wait()
        self.before_close.clear()
        vk.vkDeviceWaitIdle(self.handle)
        if not release:
            if self._transfer is not None:
                self._transfer.flush()
            self.pipeline_cache.save()
            self.handle = None
            return
        if self._transfer is not None:
            self._transfer.close()
        for res in reversed(self._closables):
            res.close()
        self._closables.clear()
        self.pipeline_cache.close()
        self.timeline.close()
        for pool in self._descriptor_pools:
            vk.vkDestroyDescriptorPool(self.handle, pool, None)
        vk.vkDestroyCommandPool(self.handle, self.command_pool, None)
        vk.vkDestroyDevice(self.handle, None)
        self.handle = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"Device({self.name}: {self.info.name})"
