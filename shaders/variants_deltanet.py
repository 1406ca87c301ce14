# The qwen35 hybrids: Gated DeltaNet (convolution, the gated delta rule token by token and in chunks,
# the gated per-head norm; all three in one dispatch for one-token steps) and the gated attention's Q
# norm and output gate.
VARIANTS = {
    "ssm_conv_f32": ("ssm_conv.comp", {}),
    "gdn_recurrent_f32": ("gdn_recurrent.comp", {}),
    "gdn_decode_f32": ("gdn_decode.comp", {}),
    "gdn_chunk_prep_f32": ("gdn_chunk_prep.comp", {}),
    "gdn_chunk_scan_f32": ("gdn_chunk_scan.comp", {}),
    "head_norm_gated_f32": ("head_norm.comp", {"GATE_SILU": "1"}),
    "head_norm_strided_f32": ("head_norm.comp", {}),
    "attn_gate_f32": ("attn_gate.comp", {}),
}
