# Kernels of the split modes: cross-device exchange points and the reduction of partial results.
VARIANTS = {
    "exchange_sync": ("exchange_sync.comp", {}),
    "exchange_reduce": ("exchange_reduce.comp", {}),
    "exchange_reduce_clock": ("exchange_reduce.comp", {"CLOCK": "1"}),   # the split timeline's stamps
    "reduce_sum_f32": ("reduce_sum.comp", {"PART_T": "float"}),
    "reduce_sum_f16": ("reduce_sum.comp", {"PART_T": "float16_t"}),
    "reduce_sum_bf16": ("reduce_sum.comp", {"PART_T": "uint16_t", "PART_BF16": "1"}),
    "convert_f16": ("convert.comp", {"OUT_T": "float16_t"}),
    "convert_bf16": ("convert.comp", {"OUT_T": "uint16_t", "OUT_BF16": "1"}),
}
