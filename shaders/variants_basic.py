# Kernels of the Vulkan runtime's own tests.
VARIANTS = {
    "add_f32": ("add.comp", {}),
    "axpb_params": ("axpb_params.comp", {}),
    "matvec_f32": ("matvec_float.comp", {"WTYPE": "float"}),
    "matvec_f16": ("matvec_float.comp", {"WTYPE": "float16_t"}),
}
