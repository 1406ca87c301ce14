"""Building blocks of decoder graphs, shared by the architecture modules: attention (plain, or gated
as in qwen35), the Gated DeltaNet mixer (qwen35), the gated FFN (SwiGLU or GeGLU) and the
mixture-of-experts FFN. Each appends one block's ops to a Graph and returns its output (the caller
adds the residual)."""

from __future__ import annotations

from ..graph import Graph, Tensor


def vec(g: Graph, name: str, n: int, role: str, layer: int | None = None) -> Tensor:
    return g.weight(name, 1, n, role, layer)


def attention(g: Graph, cfg, i: int, h: Tensor, window: int = 0, scale: float = 0.0, sinks: bool = False,
              o_bias: bool = False) -> Tensor:
    """Self-attention of normalized input h: Q/K/V (+ biases), per-head Q/K norm, RoPE, causal GQA
    attention over this layer's KV cache, output projection. window > 0: each position sees only the
    last `window` positions (its own included); scale: of q.k (0: 1/sqrt(head_dim)); sinks: each
    head's attention sink (`attn_sinks.weight`); o_bias: the output projection's bias (gpt-oss)."""
    b, E, D = f"blk.{i}.", cfg.n_embd, cfg.head_dim
    q_out, kv_out = cfg.n_head * D, cfg.n_head_kv * D

    def bias(n, k, role):
        return vec(g, b + f"attn_{n}.bias", k, role, i) if cfg.qkv_bias else None

    q = g.matmul(g.weight(b + "attn_q.weight", q_out, E, "q", i), h, bias("q", q_out, "q_bias"))
    k = g.matmul(g.weight(b + "attn_k.weight", kv_out, E, "k", i), h, bias("k", kv_out, "k_bias"))
    v = g.matmul(g.weight(b + "attn_v.weight", kv_out, E, "v", i), h, bias("v", kv_out, "v_bias"))
    if cfg.qk_norm:
        q = g.head_norm(q, vec(g, b + "attn_q_norm.weight", D, "q_norm", i), cfg.n_head, cfg.rms_eps)
        k = g.head_norm(k, vec(g, b + "attn_k_norm.weight", D, "k_norm", i), cfg.n_head_kv, cfg.rms_eps)
    q = g.rope(q, cfg.n_head)
    k = g.rope(k, cfg.n_head_kv)
    sink = vec(g, b + "attn_sinks.weight", cfg.n_head, "attn_sinks", i) if sinks else None
    a = g.attention(q, k, v, window=window, scale=scale, sinks=sink)
    return g.matmul(g.weight(b + "attn_output.weight", E, q_out, "o", i), a,
                    vec(g, b + "attn_output.bias", E, "o_bias", i) if o_bias else None)


def swiglu_ffn(g: Graph, cfg, i: int, h: Tensor, n_ff: int | None = None, suffix: str = "",
               roles: tuple[str, str, str] = ("gate", "up", "down"), glu: str = "swiglu") -> Tensor:
    """down(silu(gate h) * up h): the dense FFN, or (suffix "_shexp") a shared expert;
    glu "geglu": down(gelu_tanh(gate h) * up h) (gemma3)."""
    b, E, F = f"blk.{i}.", cfg.n_embd, n_ff or cfg.n_ff
    gate = g.matmul(g.weight(b + f"ffn_gate{suffix}.weight", F, E, roles[0], i), h)
    up = g.matmul(g.weight(b + f"ffn_up{suffix}.weight", F, E, roles[1], i), h)
    act = g.geglu(gate, up) if glu == "geglu" else g.swiglu(gate, up)
    return g.matmul(g.weight(b + f"ffn_down{suffix}.weight", E, F, roles[2], i), act)


def moe_ffn(g: Graph, cfg, i: int, h: Tensor, biases: bool = False, alpha: float = 0.0,
            limit: float = 0.0) -> Tensor:
    """Mixture of experts: the router picks cfg.n_expert_used of cfg.n_expert experts per token (by
    probability + a bias per expert where cfg.expert_sel_bias: glm4moe); their SwiGLU outputs are
    summed with the router's weights; a shared expert, where the model has one, is added gated by
    sigmoid(w . h) (not gated: cfg.shexp_gated False). biases: the router's and each expert's
    products' biases (gpt-oss); cfg.expert_glu "swiglu_oai": the experts' unit is swiglu_oai(alpha,
    limit)."""
    b, E, X, F = f"blk.{i}.", cfg.n_embd, cfg.n_expert, cfg.n_ff_exp

    def bias(y, name, rows, role, route):      # one vector of n_expert rows
        return g.add_id(y, vec(g, b + f"{name}.bias", X * rows, role, i), route) if biases else y

    logits = g.matmul(g.weight(b + "ffn_gate_inp.weight", X, E, "router", i), h,
                      vec(g, b + "ffn_gate_inp.bias", X, "router_bias", i) if biases else None)
    sel_bias = vec(g, b + "exp_probs_b.bias", X, "expert_sel_bias", i) if cfg.expert_sel_bias else None
    route = g.moe_route(logits, cfg.n_expert_used, cfg.expert_gating, cfg.expert_norm, cfg.expert_weights_scale,
                        sel_bias=sel_bias)
    gate = g.matmul_id(g.weight(b + "ffn_gate_exps.weight", F, E, "gate_exps", i, experts=X), h, route)
    up = g.matmul_id(g.weight(b + "ffn_up_exps.weight", F, E, "up_exps", i, experts=X), h, route)
    gate = bias(gate, "ffn_gate_exps", F, "gate_exps_bias", route)
    up = bias(up, "ffn_up_exps", F, "up_exps_bias", route)
    act = g.swiglu_oai(gate, up, alpha, limit) if cfg.expert_glu == "swiglu_oai" else g.swiglu(gate, up)
    down = g.matmul_id(g.weight(b + "ffn_down_exps.weight", E, F, "down_exps", i, experts=X), act, route)
    out = g.moe_sum(bias(down, "ffn_down_exps", E, "down_exps_bias", route), route)
    if cfg.n_ff_shexp:
        shared = swiglu_ffn(g, cfg, i, h, cfg.n_ff_shexp, "_shexp", ("gate_shexp", "up_shexp", "down_shexp"))
        if cfg.shexp_gated:
            shared = g.scale_sigmoid(shared, h, vec(g, b + "ffn_gate_inp_shexp.weight", E, "router_shexp", i))
        out = g.add(out, shared)
    return out


def gated_attention(g: Graph, cfg, i: int, h: Tensor) -> Tensor:
    """qwen35's full attention: attn_q yields [q | gate] per head; per-head Q/K RMS norms, RoPE, causal
    GQA attention; the output times sigmoid(gate) before the output projection."""
    b, E, D, H = f"blk.{i}.", cfg.n_embd, cfg.head_dim, cfg.n_head
    kv_out = cfg.n_head_kv * D
    qg = g.matmul(g.weight(b + "attn_q.weight", H * 2 * D, E, "q", i), h)
    k = g.matmul(g.weight(b + "attn_k.weight", kv_out, E, "k", i), h)
    v = g.matmul(g.weight(b + "attn_v.weight", kv_out, E, "v", i), h)
    q = g.head_norm(qg, vec(g, b + "attn_q_norm.weight", D, "q_norm", i), H, cfg.rms_eps, stride=2 * D)
    k = g.head_norm(k, vec(g, b + "attn_k_norm.weight", D, "k_norm", i), cfg.n_head_kv, cfg.rms_eps)
    q = g.rope(q, H)
    k = g.rope(k, cfg.n_head_kv)
    a = g.attn_gate(g.attention(q, k, v), qg, H, D)
    return g.matmul(g.weight(b + "attn_output.weight", E, H * D, "o", i), a)


def fused_rows(cfg) -> dict[str, list[tuple[int, int]]]:
    """Where the q|k|v, z, beta and alpha products' rows lie in qwen3next's fused matrices: ssm_in holds
    per key head g [q_g | k_g | v_g | z_g] (head sizes Dk, Dk, r Dv, r Dv with r = Hv / Hk value heads per
    key head), ssm_ba per key head [beta_g | alpha_g] (r rows each); llama.cpp's qwen3next build_qkvz
    and beta/alpha views. role -> row ranges of the fused matrix, in the unfused product's order."""
    D, Hk, Hv = cfg.ssm_d_state, cfg.ssm_n_group, cfg.ssm_dt_rank
    r = Hv // Hk
    g_in, g_ba = 2 * D + 2 * r * D, 2 * r       # one key head's rows of ssm_in / ssm_ba

    def each(offset: int, n: int, group: int) -> list[tuple[int, int]]:
        return [(g * group + offset, g * group + offset + n) for g in range(Hk)]

    return {"ssm_qkv": each(0, D, g_in) + each(D, D, g_in) + each(2 * D, r * D, g_in),
            "ssm_z": each(2 * D + r * D, r * D, g_in),
            "ssm_beta": each(0, r, g_ba), "ssm_alpha": each(r, r, g_ba)}


def gated_delta_net(g: Graph, cfg, i: int, h: Tensor) -> Tensor:
    """qwen35's linear attention (models/hybrid.py has the math): the q|k|v, gate, beta and alpha
    products of h, the causal convolution, the gated delta rule over the layer's recurrent state,
    the gated per-head norm and the output projection."""
    b, E = f"blk.{i}.", cfg.n_embd
    D, Hk, Hv = cfg.ssm_d_state, cfg.ssm_n_group, cfg.ssm_dt_rank
    channels = 2 * Hk * D + Hv * D
    rows = fused_rows(cfg) if cfg.ssm_fused_in or cfg.ssm_fused_ba else {}   # qwen3next's fused matrices
    if cfg.ssm_fused_in:
        qkv_w = g.weight_rows(b + "ssm_in.weight", channels + Hv * D, E, "ssm_qkv", i, rows["ssm_qkv"])
        z_w = g.weight_rows(b + "ssm_in.weight", channels + Hv * D, E, "ssm_z", i, rows["ssm_z"])
    else:
        qkv_w = g.weight(b + "attn_qkv.weight", channels, E, "ssm_qkv", i)
        z_w = g.weight(b + "attn_gate.weight", Hv * D, E, "ssm_z", i)
    if cfg.ssm_fused_ba:
        beta_w = g.weight_rows(b + "ssm_ba.weight", 2 * Hv, E, "ssm_beta", i, rows["ssm_beta"])
        alpha_w = g.weight_rows(b + "ssm_ba.weight", 2 * Hv, E, "ssm_alpha", i, rows["ssm_alpha"])
    else:
        beta_w = g.weight(b + "ssm_beta.weight", Hv, E, "ssm_beta", i)
        alpha_w = g.weight(b + "ssm_alpha.weight", Hv, E, "ssm_alpha", i)
    qkv, z = g.matmul(qkv_w, h), g.matmul(z_w, h)
    beta, alpha = g.matmul(beta_w, h), g.matmul(alpha_w, h)
    # the taps are a float table (channels x d_conv), read as one vector
    x = g.ssm_conv(qkv, vec(g, b + "ssm_conv1d.weight", channels * cfg.ssm_d_conv, "ssm_conv", i), cfg.ssm_d_conv)
    o = g.delta_net(x, alpha, beta, vec(g, b + "ssm_dt.bias", Hv, "ssm_dt", i), vec(g, b + "ssm_a", Hv, "ssm_a", i),
                    Hk, Hv, D, cfg.rms_eps, grouped=cfg.ssm_grouped)
    o = g.gated_norm(o, z, vec(g, b + "ssm_norm.weight", D, "ssm_norm", i), Hv, cfg.rms_eps)
    return g.matmul(g.weight(b + "ssm_out.weight", E, Hv * D, "ssm_out", i), o)
