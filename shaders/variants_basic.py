# Kernels of the Vulkan runtime's own tests.
VARIANTS = {
    "add_f32": ("add.comp", {}),
    "axpb_params": ("axpb_params.comp", {}),
    "matvec_f32": ("matvec_float.comp", {"WTYPE": "float"}),
    "matvec_f16": ("matvec_float.comp", {"WTYPE": "float16_t"}),
    # benchmarks/bench_chain.py: dependent streaming reads, the ceiling of a chain of products
    "bench_chain": ("bench_chain.comp", {}),
    # benchmarks/bench_persistent.py: dependent Q4_0 products, barriers against one persistent dispatch
    "bench_persistent": ("bench_persistent.comp", {}),
    "bench_persistent_b4": ("bench_persistent.comp", {"MAXB_BLOCKS": "4"}),   # --maxb 4
    # benchmarks/bench_dataflow.py: the same chain as tasks waiting for their part of x, no grid barrier
    "bench_dataflow": ("bench_dataflow.comp", {}),
}
