"""One exception type for every user-facing failure.

The CLI prints `error: <message>` (one line, no traceback unless -v) and exits 1. Library code raises
LlamavkError with a message a user can act on; anything else escaping is a bug and keeps its traceback.
"""


class LlamavkError(Exception):
    """A failure caused by input or environment (bad file, missing device...), not by a bug."""


class UsageError(LlamavkError):
    """Bad command-line or API arguments (exit code 2)."""
