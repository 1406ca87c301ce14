# Quantized matrix kernels (llamavk/kernels/matmul.py): one variant per kernel x weight type.
_TYPES = ["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q4_k", "q5_k", "q6_k"]

VARIANTS = {}
for _t in _TYPES:
    _d = {f"QTYPE_{_t.upper()}": "1"}
    VARIANTS[f"mul_mv_{_t}"] = ("matvec.comp", dict(_d))
    VARIANTS[f"mul_mm_{_t}"] = ("matmul.comp", dict(_d))
    VARIANTS[f"get_rows_{_t}"] = ("get_rows.comp", dict(_d))

