# Kernels of the Vulkan runtime's own tests and the cross-device handshake.
VARIANTS = {
    "add_f32": ("add.comp", {}),
    "axpb_params": ("axpb_params.comp", {}),
    "matvec_f32": ("matvec_float.comp", {"WTYPE": "float"}),
    "matvec_f16": ("matvec_float.comp", {"WTYPE": "float16_t"}),
    "spin_flag": ("spin_flag.comp", {}),
}
