"""llamavk: GGUF language models on any Vulkan GPU, and split across several GPUs of any vendor."""

from . import phases  # noqa: F401  (first: its clock starts the phase breakdown of `run -v`)
from .errors import LlamavkError, UsageError


def load(path=None, **kwargs):
    """Load a GGUF model onto Vulkan devices; see llamavk.api.Model for the options."""
    from .api import load as _load
    return _load(path, **kwargs)


__version__ = "0.1.0"

__all__ = ["LlamavkError", "UsageError", "__version__", "load"]
