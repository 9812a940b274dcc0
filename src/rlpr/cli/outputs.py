"""Output paths checked before any work: a command that cannot write its output says so in one
line at start (issue 29), not in a traceback after the model has loaded and the work is done.

The check leaves nothing behind: it finds the deepest folder of the path that exists and creates
and removes a temporary folder there (the command itself creates the rest of the path).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rlpr.errors import ConfigError


def _probe(path: Path, folder: Path) -> None:
    """Raise ConfigError unless a file can be created in `folder` (the deepest existing part of `path`)."""
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rlpr-write-check-", dir=folder))
    except OSError as e:
        raise ConfigError(f"{path}: cannot write the output ({e.strerror or e})") from None


def _deepest_existing(path: Path) -> Path:
    folder = path.absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    return folder


def check_output_dir(path: str | os.PathLike) -> None:
    """A folder the command will create (if needed) and write files into."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path}: cannot write the output (a file is there, the output is a folder)")
    folder = _deepest_existing(path)
    if not folder.is_dir():
        raise ConfigError(f"{path}: cannot write the output ({folder} is a file, not a folder)")
    _probe(path, folder)


def check_output_file(path: str | os.PathLike) -> None:
    """A file the command will write (its folder created if needed)."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path}: cannot write the output (a folder is there; name a file)")
    if path.is_file() and not os.access(path, os.W_OK):
        raise ConfigError(f"{path}: cannot write the output (the file is read-only)")
    folder = _deepest_existing(path.parent)
    if not folder.is_dir():
        raise ConfigError(f"{path}: cannot write the output ({folder} is a file, not a folder)")
    _probe(path, folder)


def _holds(source: Path, out: Path) -> bool:
    """Whether writing `out` (an existing file) replaces `source`, an input: the same file by any
    path (./x, a link), or a file inside an input folder."""
    try:
        if source.is_dir():
            return out.resolve().is_relative_to(source.resolve())
        return source.exists() and os.path.samefile(out, source)
    except OSError:
        return False


def check_not_an_input(outputs, inputs: dict[str, object]) -> None:
    """Refuse, in one line naming both, an output file that would replace one of the command's
    inputs (`inputs`: {flag: a path or source, or a list of them}): `rlpr data convert --input
    x.parquet --output x.parquet`, `rlpr grade --responses out/samples.jsonl --output out` wrote
    over the user's file, which the command had read whole first."""
    from rlpr.data.sources import parse_source

    for out in map(Path, outputs):
        if not out.is_file():
            continue
        for flag, given in inputs.items():
            for spec in given if isinstance(given, (list, tuple)) else [given]:
                if spec and _holds(parse_source(spec).path, out):
                    raise ConfigError(f"{out}: the output would replace the input {spec} ({flag}); write the "
                                      f"output elsewhere")
