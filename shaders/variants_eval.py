# Evaluation (perplexity): what the host needs of each row of logits, reduced on the device.
VARIANTS = {
    "token_logprob_f32": ("token_logprob.comp", {}),
}
