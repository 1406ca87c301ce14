"""Tokenizers for GGUF models, producing the same token ids as llama.cpp (llama-vocab.cpp).

Supported: SentencePiece-style BPE (`tokenizer.ggml.model = llama`) and byte-level BPE (`gpt2`) with
the pre-tokenizer named by `tokenizer.ggml.pre`. See docs/TOKENIZER.md.
"""

from .core import Tokenizer
from .stream import StreamDecoder

__all__ = ["Tokenizer", "StreamDecoder"]
