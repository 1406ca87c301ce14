# Non-matmul ops of the forward pass: norms, RoPE, KV store, attention, element-wise.
VARIANTS = {
    "rms_norm_f32": ("rms_norm.comp", {}),
    "rms_norm_mul_f32": ("rms_norm.comp", {"HAS_WEIGHT": "1"}),
    "rms_norm_f32_to_f16": ("rms_norm.comp", {"OUT_F16": "1"}),
    "rms_norm_mul_f32_to_f16": ("rms_norm.comp", {"HAS_WEIGHT": "1", "OUT_F16": "1"}),
    "add_rms_norm_mul_f32": ("rms_norm.comp", {"HAS_WEIGHT": "1", "ADD_IN": "1"}),
    "add_rms_norm_mul_f32_to_f16": ("rms_norm.comp", {"HAS_WEIGHT": "1", "ADD_IN": "1", "OUT_F16": "1"}),
    "rope_f32": ("rope.comp", {}),
    "rope_freqs_f32": ("rope.comp", {"HAS_FREQS": "1"}),
    "rope_kv_f32": ("rope_kv.comp", {}),
    "rope_kv_freqs_f32": ("rope_kv.comp", {"HAS_FREQS": "1"}),
    "rope_kv_norm_f32": ("rope_kv.comp", {"QK_NORM": "1"}),
    "rope_kv_norm_freqs_f32": ("rope_kv.comp", {"QK_NORM": "1", "HAS_FREQS": "1"}),
    # one-token steps: waiting in the shader for the Q/K/V products (WAIT) and / or counting themselves
    # done for the decode attention waiting in its shader (CHAIN)
    **{f"rope_kv{norm}{freqs}{wait}{chain}_f32": ("rope_kv.comp", {
        **({"QK_NORM": "1"} if norm else {}), **({"HAS_FREQS": "1"} if freqs else {}),
        **({"WAIT": "1"} if wait else {}), **({"CHAIN": "1"} if chain else {})})
       for norm in ("", "_norm") for freqs in ("", "_freqs") for wait, chain in (("", "_chain"), ("_wait", ""),
                                                                                  ("_wait", "_chain"))},
    # either cache quantized (q8_0 / q4_0; the K and V types: specialization constants 1 and 2)
    "rope_kv_kvq": ("rope_kv.comp", {"KV_QUANT": "1"}),
    "rope_kv_freqs_kvq": ("rope_kv.comp", {"HAS_FREQS": "1", "KV_QUANT": "1"}),
    "rope_kv_norm_kvq": ("rope_kv.comp", {"QK_NORM": "1", "KV_QUANT": "1"}),
    "rope_kv_norm_freqs_kvq": ("rope_kv.comp", {"QK_NORM": "1", "HAS_FREQS": "1", "KV_QUANT": "1"}),
    # ... and their one-token forms, chained as the f16 ones above
    **{f"rope_kv{norm}{freqs}{wait}{chain}_kvq": ("rope_kv.comp", {
        **({"QK_NORM": "1"} if norm else {}), **({"HAS_FREQS": "1"} if freqs else {}),
        **({"WAIT": "1"} if wait else {}), **({"CHAIN": "1"} if chain else {}), "KV_QUANT": "1"})
       for norm in ("", "_norm") for freqs in ("", "_freqs") for wait, chain in (("", "_chain"), ("_wait", ""),
                                                                                  ("_wait", "_chain"))},
    "kv_store_f16": ("kv_store.comp", {}),
    # quantized KV cache (q8_0 / q4_0: specialization constant 1)
    "kv_store_q": ("kv_store.comp", {"KV_QUANT": "1"}),
    # a quantized cache's rows as f16, for prompt attention on cooperative matrices
    "kv_dequant_f16": ("kv_dequant.comp", {}),
    "attention_f16_br4": ("attention.comp", {"BR": "4"}),
    "attention_f16_br8": ("attention.comp", {"BR": "8"}),
    # software devices (llvmpipe): a workgroup of one subgroup (kernels/attention.py cpu_prompt_ok)
    "attention_cpu_f16_br8": ("attention_cpu.comp", {"BR": "8"}),
    "attention_cpu_split_f16_br8": ("attention_cpu.comp", {"BR": "8", "SPLIT": "1"}),
    "attention_split_f16_br4": ("attention.comp", {"BR": "4", "SPLIT": "1"}),
    "attention_split_f16_br8": ("attention.comp", {"BR": "8", "SPLIT": "1"}),
    # decode (<= 4 query rows per KV head, head_dim % 32 == 0, <= 256): blocks of 32 positions
    "attention_dec_f16": ("attention_decode.comp", {}),
    "attention_dec_split_f16": ("attention_decode.comp", {"SPLIT": "1"}),
    # the same, counting themselves done for a next dispatch that waits in its shader (CHAIN)
    "attention_dec_chain_f16": ("attention_decode.comp", {"CHAIN": "1"}),
    "attention_dec_split_chain_f16": ("attention_decode.comp", {"SPLIT": "1", "CHAIN": "1"}),
    # ... and waiting in the shader for the rope_kv dispatch before it (WAIT), recorded without a barrier
    **{f"attention_dec{split}{chain}_wait_f16": ("attention_decode.comp", {
        **({"SPLIT": "1"} if split else {}), **({"CHAIN": "1"} if chain else {}), "WAIT": "1"})
       for split in ("", "_split") for chain in ("", "_chain")},
    # either cache quantized (q8_0 / q4_0; the K and V types: specialization constants 2 and 3):
    # every kernel above (not the cooperative-matrix one below: attention.plan keeps quantized caches off it)
    "attention_kvq_br4": ("attention.comp", {"BR": "4", "KV_QUANT": "1"}),
    "attention_kvq_br8": ("attention.comp", {"BR": "8", "KV_QUANT": "1"}),
    "attention_split_kvq_br4": ("attention.comp", {"BR": "4", "SPLIT": "1", "KV_QUANT": "1"}),
    "attention_split_kvq_br8": ("attention.comp", {"BR": "8", "SPLIT": "1", "KV_QUANT": "1"}),
    "attention_dec_kvq": ("attention_decode.comp", {"KV_QUANT": "1"}),
    "attention_dec_split_kvq": ("attention_decode.comp", {"SPLIT": "1", "KV_QUANT": "1"}),
    "attention_dec_chain_kvq": ("attention_decode.comp", {"CHAIN": "1", "KV_QUANT": "1"}),
    "attention_dec_split_chain_kvq": ("attention_decode.comp", {"SPLIT": "1", "CHAIN": "1", "KV_QUANT": "1"}),
    **{f"attention_dec{split}{chain}_wait_kvq": ("attention_decode.comp", {
        **({"SPLIT": "1"} if split else {}), **({"CHAIN": "1"} if chain else {}), "WAIT": "1", "KV_QUANT": "1"})
       for split in ("", "_split") for chain in ("", "_chain")},
    # prompts on cooperative matrices (devices with 16x8x16 f16 tiles), per head_dim
    "attention_coop_f16_hd64": ("attention_coop.comp", {"HD": "64"}),
    "attention_coop_f16_hd128": ("attention_coop.comp", {"HD": "128"}),
    "attention_coop_f16_hd64_to_f16": ("attention_coop.comp", {"HD": "64", "OUT_F16": "1"}),
    "attention_coop_f16_hd128_to_f16": ("attention_coop.comp", {"HD": "128", "OUT_F16": "1"}),
    "ew_add_f32": ("elementwise.comp", {"OP_ADD": "1"}),
    "swiglu_f32": ("elementwise.comp", {"OP_SWIGLU": "1"}),
    "geglu_f32": ("elementwise.comp", {"OP_GEGLU": "1"}),
    "swiglu_f32_to_f16": ("elementwise.comp", {"OP_SWIGLU": "1", "OUT_F16": "1"}),
    "geglu_f32_to_f16": ("elementwise.comp", {"OP_GEGLU": "1", "OUT_F16": "1"}),
    "swiglu_oai_f32": ("elementwise.comp", {"OP_SWIGLU_OAI": "1"}),
    "swiglu_oai_f32_to_f16": ("elementwise.comp", {"OP_SWIGLU_OAI": "1", "OUT_F16": "1"}),
    "scale_f32": ("unary.comp", {"OP_SCALE": "1"}),
    "softcap_f32": ("unary.comp", {"OP_SOFTCAP": "1"}),
    "add_bias_f32": ("elementwise_bias.comp", {}),
    # mixture of experts: router top-k, tokens grouped by expert, weighted sum; shared expert's gate
    "moe_route_f32": ("moe_route.comp", {}),
    # decode: the router's product and its top-k as one dispatch, per router weight type
    "moe_router_f32": ("moe_router.comp", {"QTYPE_F32": "1"}),
    "moe_router_f16": ("moe_router.comp", {"QTYPE_F16": "1"}),
    "moe_router_bf16": ("moe_router.comp", {"QTYPE_BF16": "1"}),
    "moe_group": ("moe_group.comp", {}),
    "moe_sum_f32": ("moe_sum.comp", {}),
    "add_id_f32": ("add_id.comp", {}),
    "scale_sigmoid_f32": ("scale_sigmoid.comp", {}),
}
# gpt-oss's attention sinks (a logit per query head joining the softmax once: SINKS, one more binding,
# the last): every attention kernel above, named with "_sinks" appended (kernels/attention.py)
VARIANTS.update({f"{_n}_sinks": (_src, {**_defs, "SINKS": "1"})
                 for _n, (_src, _defs) in list(VARIANTS.items()) if _src.startswith("attention")})
# attention_coop.comp: GL_KHR_cooperative_matrix, which shaderc 2023.2 does not know.
COMPILERS = {_n: "glslc-trixie-vulkan1.2" for _n, (_src, _) in VARIANTS.items() if _src == "attention_coop.comp"}
