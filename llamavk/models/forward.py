"""The forward graph of llama-like decoders (llama, qwen2, qwen3, qwen3moe), read top to bottom.

Architecture differences are flags of ModelConfig: QKV biases (qwen2), per-head Q/K RMS norm before
RoPE (qwen3), RoPE ordering (normal for llama, NEOX for qwen), tied output, and a mixture of experts
in place of the dense FFN (n_expert > 0: qwen3moe; after n_layer_dense_lead dense layers:
glm4moe). The blocks are in blocks.py.
"""

from __future__ import annotations

from ..graph import Graph
from .blocks import attention, moe_ffn, swiglu_ffn, vec


def llama_like(cfg, all_logits: bool = False, mixer=None, ffn_norm: str = "ffn_norm") -> Graph:
    """mixer(g, cfg, i, h) -> layer i's token mixer (default: attention; the qwen35 hybrids pass
    their own); ffn_norm: the GGUF name of the norm before the FFN (role ffn_norm either way)."""
    g = Graph(cfg)
    E, V = cfg.n_embd, cfg.n_vocab
    mixer = mixer or attention
    x = g.embed(g.weight("token_embd.weight", V, E, "token_embd"))
    for i in range(cfg.n_layer):
        g.layer = i
        b = f"blk.{i}."
        h = g.rms_norm(x, vec(g, b + "attn_norm.weight", E, "attn_norm", i), cfg.rms_eps)
        x = g.add(x, mixer(g, cfg, i, h))
        h = g.rms_norm(x, vec(g, b + f"{ffn_norm}.weight", E, "ffn_norm", i), cfg.rms_eps)
        x = g.add(x, (moe_ffn if cfg.is_moe(i) else swiglu_ffn)(g, cfg, i, h))
    g.layer = None
    if not all_logits:
        x = g.last_row(x)
    x = g.rms_norm(x, vec(g, "output_norm.weight", E, "output_norm"), cfg.rms_eps)
    out_name, role = ("token_embd.weight", "token_embd") if cfg.tied_output else ("output.weight", "output")
    g.output(g.matmul(g.weight(out_name, V, E, role), x))
    return g
