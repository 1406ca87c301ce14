"""llamavk: GGUF language models on any Vulkan GPU, and split across several GPUs of any vendor."""

from .errors import LlamavkError, UsageError

__version__ = "0.1.0"

__all__ = ["LlamavkError", "UsageError", "__version__"]
