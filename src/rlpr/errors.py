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


class OutputError(OSError):
    """An output that cannot be written (a full disk, a read-only folder); the message names the file."""


class TrainingError(RuntimeError):
    """A run that cannot continue as configured (e.g. the filter keeps too few groups)."""


def write_atomic(path, data: str | bytes) -> None:
    """Write a whole output file or nothing: a temporary file beside it, renamed over it. A write
    that fails (a full disk midway) leaves the old file, no partial one, and is an OutputError
    naming the file."""
    import os
    from pathlib import Path

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        os.replace(tmp, path)
    except OSError as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise OutputError(f"cannot write {path}: {e.strerror or error_reason(e)}") from None
