# Weight chunks dequantized to f16 rows (shaders/dequant_f16.comp; kernels/matmul.py dequant_f16):
# the first pass of the mul_mm_cm2d prompt product. Q4_0, Q8_0, Q4_K, Q6_K have code of their own,
# the other quantized types go through quants.glsl's dequant_part.
DEQUANT_F16_TYPES = ["q4_0", "q8_0", "q4_k", "q6_k", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k", "q5_k",
                     "iq4_nl", "iq4_xs", "mxfp4", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s",
                     "iq1_m", "tq1_0", "tq2_0"]

VARIANTS = {f"dequant_f16_{_t}": ("dequant_f16.comp", {f"QTYPE_{_t.upper()}": "1"}) for _t in DEQUANT_F16_TYPES}
