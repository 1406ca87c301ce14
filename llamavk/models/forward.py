"""The forward graph of llama-like decoders (llama, qwen2, qwen3), read top to bottom.

Architecture differences are flags of ModelConfig: QKV biases (qwen2), per-head Q/K RMS norm before
RoPE (qwen3), RoPE ordering (normal for llama, NEOX for qwen), tied output.
"""

from __future__ import annotations

from ..graph import Graph


def llama_like(cfg, all_logits: bool = False) -> Graph:
    g = Graph(cfg)
    E, D, F, V = cfg.n_embd, cfg.head_dim, cfg.n_ff, cfg.n_vocab
    q_out, kv_out = cfg.n_head * D, cfg.n_head_kv * D

    def w(name, rows, cols, role, layer=None):
        return g.weight(name, rows, cols, role, layer)

    def vec(name, n, role, layer=None):
        return g.weight(name, 1, n, role, layer)

    token_embd = w("token_embd.weight", V, E, "token_embd")
    x = g.embed(token_embd)
    for i in range(cfg.n_layer):
        g.layer = i
        b = f"blk.{i}."
        # attention block
        h = g.rms_norm(x, vec(b + "attn_norm.weight", E, "attn_norm", i), cfg.rms_eps)
        bias = (lambda n, k, role: vec(b + f"attn_{n}.bias", k, role, i)) if cfg.qkv_bias else (lambda *a: None)
        q = g.matmul(w(b + "attn_q.weight", q_out, E, "q", i), h, bias("q", q_out, "q_bias"))
        k = g.matmul(w(b + "attn_k.weight", kv_out, E, "k", i), h, bias("k", kv_out, "k_bias"))
        v = g.matmul(w(b + "attn_v.weight", kv_out, E, "v", i), h, bias("v", kv_out, "v_bias"))
        if cfg.qk_norm:
            q = g.head_norm(q, vec(b + "attn_q_norm.weight", D, "q_norm", i), cfg.n_head, cfg.rms_eps)
            k = g.head_norm(k, vec(b + "attn_k_norm.weight", D, "k_norm", i), cfg.n_head_kv, cfg.rms_eps)
        q = g.rope(q, cfg.n_head)
        k = g.rope(k, cfg.n_head_kv)
        a = g.attention(q, k, v)
        x = g.add(x, g.matmul(w(b + "attn_output.weight", E, q_out, "o", i), a))
        # feed-forward block
        h = g.rms_norm(x, vec(b + "ffn_norm.weight", E, "ffn_norm", i), cfg.rms_eps)
        gate = g.matmul(w(b + "ffn_gate.weight", F, E, "gate", i), h)
        up = g.matmul(w(b + "ffn_up.weight", F, E, "up", i), h)
        x = g.add(x, g.matmul(w(b + "ffn_down.weight", E, F, "down", i), g.swiglu(gate, up)))
    g.layer = None
    if not all_logits:
        x = g.last_row(x)
    x = g.rms_norm(x, vec("output_norm.weight", E, "output_norm"), cfg.rms_eps)
    out_name = "token_embd.weight" if cfg.tied_output else "output.weight"
    g.output(g.matmul(w(out_name, V, E, "token_embd" if cfg.tied_output else "output"), x))
    return g
