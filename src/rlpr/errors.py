"""The user-facing error classes: each names the bad key, file, row or path in one line.

They live here, apart from the code that raises them, so that no module imports the config (or
the data or model loaders) only to raise or catch an error.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad configuration value or key; the message names it."""


class DataError(ValueError):
    """A user's data file is malformed; the message names the file, row and field."""


class ModelError(ValueError):
    """A model path that cannot be loaded, with a one-line reason."""


def error_reason(e: BaseException) -> str:
    """An exception as one short line for a user-facing error: its first line, or its type."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


class TrainingError(RuntimeError):
    """A run that cannot continue as configured (e.g. the filter keeps too few groups)."""
