"""The user-facing error classes: each names the bad key, file, row or path in one line.

They live here, apart from the code that raises them, so that no module imports the config (or
the data or model loaders) only to raise or catch an error.
"""

from __future__ import annotations

import glob
import json
import logging
import math
import os
import re
import reprlib
import shlex
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path


class ConfigError(ValueError):
    """A bad configuration value or key; the message names it."""


class DataError(ValueError):
    """A user's data file is malformed; the message names the file, row and field."""


class ModelError(ValueError):
    """A model path that cannot be loaded, with a one-line reason."""


# The largest number of seconds a command-line wait may take (a timeout, a delay, a backoff): about
# 11.6 days; past it a socket timeout or a sleep overflows the platform's time_t (1e308: a traceback).
MAX_SECONDS = 1e6


def within(value, low: float, high: float, low_open: bool = False) -> bool:
    """A real number (not NaN, not a boolean) in [low, high], or (low, high] with `low_open`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return False
    return (low < value if low_open else low <= value) and value <= high


def command_line(*args: str) -> str:
    """A command for a user to paste, each argument quoted for the shell (a run named `a b;rm x`
    stays one argument and runs nothing else)."""
    return shlex.join(str(a) for a in args)


def error_reason(e: BaseException) -> str:
    """An exception as one short line for a user-facing error: its first line, or its type."""
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


# What a parser of a user's text (json.loads, yaml.safe_load) raises besides its own error type:
# ValueError (an integer of over 4300 digits, bytes that are not UTF-8) and RecursionError (lists
# or mappings nested about a thousand deep). Catch them with the parser's own and say
# `parse_error_reason(e)`: a traceback otherwise, or a line that names no file.
PARSE_ERRORS = (ValueError, RecursionError)


def parse_error_reason(e: BaseException) -> str:
    """A parser's failure (`PARSE_ERRORS`) in one short line: "nested too deep" for a RecursionError."""
    return "nested too deep" if isinstance(e, RecursionError) else error_reason(e)


# What a YAML text's aliases may add to it, in characters of the scalars they repeat: a 466-byte file
# of nested aliases expanded to gigabytes when an error message printed its value (issue 60, S7)
YAML_ALIAS_CHARS = 1 << 20


def yaml_load(text: str):
    """yaml.safe_load, refusing (a ValueError, one of PARSE_ERRORS) a text whose aliases expand its
    values by more than YAML_ALIAS_CHARS characters, or that refers to itself."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_chars(node, {}) > len(text) + YAML_ALIAS_CHARS:
            raise ValueError(f"its aliases expand to more than {YAML_ALIAS_CHARS >> 20} MiB beyond the text itself")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_chars(node, sizes: dict) -> float:
    """The characters of every scalar under `node` with each alias written out (memoized per node)."""
    key = id(node)
    if key in sizes:
        if sizes[key] is None:
            raise ValueError("an alias refers to the value that holds it")
        return sizes[key]
    sizes[key] = None
    if isinstance(node.value, str):
        size = len(node.value) + 1
    else:
        size = 1 + sum(_expanded_chars(child, sizes) for item in node.value
                       for child in (item if isinstance(item, tuple) else (item,)))
    sizes[key] = size
    return size


_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxtuple, _SHOWN.maxdict, _SHOWN.maxset = 2, 4, 4, 4, 4
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlong = 120, 120, 60
SHOWN_CHARS = 240
MAX_MESSAGE = 2000  # characters of an error line rlpr prints


def shown(value) -> str:
    """A value as an error message prints it: its repr, cut to a few items, two levels and at most
    SHOWN_CHARS characters (never built whole: a nested value of a million items costs nothing)."""
    text = _SHOWN.repr(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS - 3] + "..."


def message_line(e: BaseException) -> str:
    """An error's message as rlpr prints it: at most MAX_MESSAGE characters."""
    text = str(e)
    return text if len(text) <= MAX_MESSAGE else f"{text[:MAX_MESSAGE]}... ({len(text) - MAX_MESSAGE} characters more)"


# What a failed write says in the libraries' own error types (safetensors' SafetensorError, torch.save's
# RuntimeError): "I/O error: No space left on device (os error 28)", "file write failed"
_WRITE_FAILURE = re.compile(r"no space|storagefull|i/o error|ioerror|disk|quota|read-only|readonly|write failed|"
                            r"os error \d+|errno \d+", re.IGNORECASE)
_OS_MESSAGE = re.compile(r"(?:I/O error|IoError)\W+(.+?)\s*\(os error \d+\)", re.IGNORECASE)


def write_failure(e: BaseException) -> bool:
    """Whether `e` reports a failed write (a full disk, a quota, a read-only folder) whatever its
    type: an OSError, or a library's own error saying so (safetensors raises SafetensorError, a
    plain Exception, on a full disk; torch.save a RuntimeError)."""
    if isinstance(e, OSError):
        return True
    return isinstance(e, Exception) and bool(_WRITE_FAILURE.search(str(e)))


def write_failure_reason(e: BaseException) -> str:
    """A failed write's reason in one short line: the system's words ("No space left on device")."""
    if isinstance(e, OSError) and e.strerror:
        return e.strerror
    found = _OS_MESSAGE.search(str(e))
    return found.group(1) if found else error_reason(e)


class ArgumentTypeError(ConfigError, TypeError):
    """A Python API argument of the wrong type (a string where a list of strings belongs); the
    message names the argument, what it takes and what it got. Both a ConfigError and a TypeError."""


class OutputError(OSError):
    """An output that cannot be written (a full disk, a read-only folder); the message names the file."""


class TrainingError(RuntimeError):
    """A run that cannot continue as configured (e.g. the filter keeps too few groups)."""


# Every signal a user's session sends to stop a command: Ctrl-C (SIGINT), a scheduler's or `kill`'s
# stop (SIGTERM), a closed terminal or dropped ssh session (SIGHUP). Each stops a command cleanly and
# makes a training run finish its step and checkpoint (issue 60, S3: SIGHUP lost every step since the
# last checkpoint). SIGQUIT (Ctrl-\) stays Python's hard stop: the way out when a clean one hangs.
STOP_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def stop_signals() -> list:
    """STOP_SIGNALS as this platform's signal numbers (Windows has no SIGHUP), less those this process
    was started ignoring: `nohup rlpr train` asks to outlive a closed terminal, and a script's
    background job (`cmd &`) ignores the terminal's Ctrl-C; a handler over SIG_IGN would undo both."""
    import signal

    numbers = [getattr(signal, name) for name in STOP_SIGNALS if hasattr(signal, name)]
    return [s for s in numbers if signal.getsignal(s) is not signal.SIG_IGN]


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the command is, as Ctrl-C (SIGINT) is: its `finally` blocks
    remove what it was writing (rlpr's main installs the handlers; `str()` is the signal's name)."""


_log = logging.getLogger("rlpr")


def owned_temporary_prefix(name: str, kind: str = "tmp") -> str:
    """A hidden temporary's name prefix that says which process on which host writes it
    (`.NAME.tmp-HOST-PID-`), so that a later start can tell a leftover of a killed process from a
    temporary another process is still writing (`remove_leftovers`)."""
    host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"
    return f".{name}.{kind}-{host}-{os.getpid()}-"


_OWNER = re.compile(r"\.(?:tmp|old)-(?P<host>[A-Za-z0-9_]+)-(?P<pid>\d+)-")


def abandoned(path: Path) -> bool | None:
    """Whether the process that named the temporary `path` (`owned_temporary_prefix`) is gone: True
    (a process of this host that no longer runs), False (it runs), None (another host's, or a name
    without an owner: rlpr cannot tell)."""
    owner = _OWNER.search(Path(path).name)
    host = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname()) or "host"
    if owner is None or owner["host"] != host:
        return None
    pid = int(owner["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: alive
        return False
    return False


def remove_leftovers(folder: Path, pattern: str, what: str, log, owned_only: bool = False) -> None:
    """Remove the temporaries in `folder` matching the glob `pattern` that a process on this host
    left when it was killed (SIGKILL, a power cut: no `finally` ran), each with a warning naming it;
    those of a live process, of another host or without an owner in their name are reported only
    (`owned_only`: names without rlpr's owner, another program's files, are left alone in silence)."""
    try:
        found = sorted(Path(folder).glob(pattern))
    except OSError:
        return
    for path in found:
        if owned_only and _OWNER.search(path.name) is None:
            continue
        gone = abandoned(path)
        if gone is None:
            log.warning("%s: left by an interrupted %s, or another machine's that is still running; remove it "
                        "once none runs", path, what)
            continue
        if not gone:
            continue  # being written right now
        try:
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        except OSError as e:
            log.warning("%s: left by an interrupted %s; could not remove it (%s)", path, what, error_reason(e))
            continue
        log.warning("removed %s, left by an interrupted %s", path, what)


def temporary_name(path) -> Path:
    """Where an output is written before it is renamed into place: hidden beside it, never taken
    for the output itself (not step_*.jsonl, not *.jsonl), named for this host and process
    (`owned_temporary_prefix`) so that the next write of the output removes a killed writer's."""
    path = Path(path)
    return path.with_name(owned_temporary_prefix(path.name) + "w")


@contextmanager
def atomic_output(path, mode: str = "w"):
    """An open file whose content becomes `path` whole or not at all: written to
    `temporary_name(path)` and renamed over it when the block ends. A write that fails (a full disk
    midway) leaves the old file, no partial one, and is an OutputError naming the file."""
    tmp = temporary_name(path)
    remove_leftovers(Path(path).parent, f".{glob.escape(Path(path).name)}.tmp-*", f"write of {Path(path).name}", _log,
                     owned_only=True)  # a killed writer's (issue 60, S16)
    try:
        with open(tmp, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        os.replace(tmp, path)
    except OSError as e:
        _discard(tmp)
        raise OutputError(f"cannot write {path}: {e.strerror or error_reason(e)}") from None
    except BaseException:  # Ctrl-C, a signal, an error of the block: no temporary left behind
        _discard(tmp)
        raise


def _discard(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def current_umask() -> int:
    """The process's umask, read without changing it (Linux's /proc), else by setting it back at once."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normal_modes(path) -> None:
    """Give `path` (a file, or a folder and everything under it) the modes a plain `open()` or
    `mkdir` gets under the user's umask (0644 and 0755 under umask 022). Some writers create
    private ones (tempfile's folders and files, safetensors' weights: 0700 and 0600), which other
    users and groups of a shared cluster could then not read."""
    mask = current_umask()
    path = Path(path)
    items = [path, *path.rglob("*")] if path.is_dir() else [path]
    for item in items:
        if item.is_symlink():
            continue
        os.chmod(item, (0o777 if item.is_dir() else 0o666) & ~mask)


def write_atomic(path, data: str | bytes) -> None:
    """Write a whole output file or nothing (`atomic_output`)."""
    with atomic_output(path, "wb") as f:
        f.write(data if isinstance(data, bytes) else data.encode("utf-8"))


def json_safe(value):
    """`value` with every non-finite float (NaN, +-inf) as None, so that the output is strict JSON
    (json.dumps writes NaN, which other JSON readers refuse)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def json_line(value, **kwargs) -> str:
    """One strict-JSON line (`json_safe`, then `allow_nan=False`: a non-finite value can never be
    written as a bare NaN or Infinity), newline included."""
    return json.dumps(json_safe(value), allow_nan=False, **kwargs) + "\n"
