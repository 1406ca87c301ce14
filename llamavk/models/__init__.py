"""Architecture registry and the model loader.

Each architecture is a small module with `ARCH`, `config(metadata) -> ModelConfig`,
`weight_specs(config) -> list[WeightSpec]` and `build_graph(config, all_logits) -> Graph` (the forward
pass as ops, see graph.py). `load_model_file` opens a GGUF, picks the module by
`general.architecture` and checks every tensor (present, supported type, expected shape).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import ModuleType

from ..errors import LlamavkError
from ..gguf_file import GGUFFile
from ..quant import quant_info
from . import gemma3, glm4moe, gpt_oss, llama, mistral3, qwen2, qwen2moe, qwen3, qwen3moe, qwen3next, qwen35, qwen35moe
from .base import ModelConfig, ModelFile, RopeScaling, WeightSpec, check_config

ARCHITECTURES: dict[str, ModuleType] = {m.ARCH: m for m in (llama, qwen2, qwen3, qwen3moe, qwen35, qwen35moe, gemma3,
                                                            mistral3, qwen2moe, qwen3next, gpt_oss, glm4moe)}

__all__ = ["ARCHITECTURES", "ModelConfig", "ModelFile", "RopeScaling", "WeightSpec",
           "arch_module", "build_graph", "config_from_metadata", "load_model_file"]


def arch_module(arch: str | None) -> ModuleType:
    module = ARCHITECTURES.get(arch) if isinstance(arch, str) else None
    if module is None:
        raise LlamavkError(f"model architecture {arch!r} is not supported; "
                           f"supported: {', '.join(sorted(ARCHITECTURES))}")
    return module


def config_from_metadata(metadata: dict, tensor_names=()) -> ModelConfig:
    """ModelConfig from metadata; `tied_output` is true when no output.weight is among tensor_names,
    and an architecture whose files come in several layouts picks its layout from them
    (`refine_config`)."""
    module = arch_module(metadata.get("general.architecture"))
    cfg = check_config(module.config(metadata))
    cfg = dataclasses.replace(cfg, tied_output="output.weight" not in set(tensor_names))
    refine = getattr(module, "refine_config", None)
    return refine(cfg, tensor_names) if refine is not None else cfg


def load_model_file(path: str | Path, kv_overrides=()) -> ModelFile:
    """Open and validate a GGUF model. Every problem is a one-line LlamavkError. kv_overrides:
    (key, value) pairs replacing metadata values first (llama.cpp's --override-kv, kv_override.py)."""
    g = GGUFFile(path)
    if kv_overrides:
        from ..kv_override import apply_kv_overrides
        g.metadata = apply_kv_overrides(g.metadata, kv_overrides)
    cfg = config_from_metadata(g.metadata, g.tensors.keys())
    if cfg.n_layer > len(g.tensors):   # every layer has tensors: a corrupt count, not a model
        raise LlamavkError(f"{g.path}: {cfg.arch}.block_count = {cfg.n_layer}, but the file has only "
                           f"{len(g.tensors)} tensors")
    tokens = g.metadata.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list) and len(tokens) != cfg.n_vocab:
        raise LlamavkError(f"{g.path}: tokenizer.ggml.tokens has {len(tokens)} tokens but the model's "
                           f"vocabulary is {cfg.n_vocab} ({cfg.arch}.vocab_size or the token count): some "
                           "ids would have no text or no embedding")
    module = arch_module(cfg.arch)
    weights: dict[str, WeightSpec] = {}
    for spec in module.weight_specs(cfg):
        if spec.name not in g.tensors:
            if spec.optional:
                continue
            raise LlamavkError(f"{g.path}: required tensor {spec.name} is missing "
                               f"({cfg.arch} model with {cfg.n_layer} layers)")
        qtype = g.tensor_type(spec.name)
        info = quant_info(qtype, spec.name)
        found = g.tensor_shape(spec.name)
        if found != spec.shape:
            raise LlamavkError(f"{g.path}: tensor {spec.name} has shape {found}, "
                               f"expected {spec.shape} (rows, cols) from the metadata")
        if spec.shape[-1] % info.block_size:
            raise LlamavkError(f"{g.path}: tensor {spec.name} row length {spec.shape[-1]} is not a "
                               f"multiple of the {info.name} block size {info.block_size}")
        weights[spec.name] = spec
    return ModelFile(g.path, g, cfg, weights)


def build_graph(cfg: ModelConfig, all_logits: bool = False):
    """The forward graph of the model's architecture (logits of the last token, or of every token)."""
    return arch_module(cfg.arch).build_graph(cfg, all_logits)
