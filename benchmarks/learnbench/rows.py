"""The benchmark's .jsonl of finished runs and the job claims that let several workers share it: a row is
appended in one write under an exclusive lock (a --regrade rewrite takes the same lock), so a killed
worker loses only its run in progress; a torn line is skipped with a message; a claim names its process,
and a claim whose process has ended on this host is taken over (docs/learning.md, "Workers, resuming")."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat
import time
from contextlib import contextmanager
from pathlib import Path

from .records import replace_with, settings_hash
from .variants import TRANSFER

try:
    import fcntl
except ImportError:  # no POSIX locks (Windows): run one worker at a time
    fcntl = None


def grader_version() -> int:
    from rlpr.grading import GRADER_VERSION

    return GRADER_VERSION


def transfer_fingerprint() -> dict:
    """The transfer files' SHA-256 (first 12 hex digits): rows evaluated on other questions never mix."""
    return {name: hashlib.sha256(path.read_bytes()).hexdigest()[:12] for name, path in TRANSFER.items()}


@contextmanager
def _lock(path: Path):
    """An exclusive lock on `path` itself (created when missing), held for the block; a waiter that got the
    lock on an inode a rewrite has replaced opens the new file again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    try:
        yield fd
    finally:
        os.close(fd)  # closing releases the lock


def load_rows(log_path: Path) -> list[dict]:
    """Every row of the .jsonl ([] when it does not exist); a line that is not a JSON object (torn by
    a writer killed mid-write) is skipped, with one line naming it."""
    if not log_path.exists():
        return []
    rows = []
    for number, line in enumerate(log_path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not isinstance(row, dict) or "variant" not in row:
            print(f"{log_path}:{number}: skipping a line that is not a finished run's row ({line[:60]!r}...)",
                  flush=True)
            continue
        rows.append(row)
    return rows


def free_responses_path(log_path: Path, path: Path) -> Path:
    """`path`, or `path` numbered (-2, -3, ...) where a row of the .jsonl already names it: a run never
    writes over another row's saved responses (a renamed variant's rows keep their file names)."""
    taken = {r.get("responses") for r in load_rows(log_path)}
    candidate, number = path, 1
    while str(candidate.relative_to(log_path.parent)) in taken:
        number += 1
        candidate = path.with_name(path.name.replace(".jsonl.gz", f"-{number}.jsonl.gz"))
    return candidate


def append_row(log_path: Path, row: dict) -> None:
    """Append one row, in one write under the lock: concurrent workers never interleave."""
    data = (json.dumps(row) + "\n").encode()
    with _lock(log_path) as fd:
        if (size := os.fstat(fd).st_size) and os.pread(fd, 1, size - 1) != b"\n":
            data = b"\n" + data  # a torn last line stays a line of its own
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]


@contextmanager
def rewriting(log_path: Path):
    """Rewrite the .jsonl whole: yields its rows (a list to change in place) under the lock, then
    writes them to a temporary file and renames it into place."""
    with _lock(log_path):
        rows = load_rows(log_path)
        yield rows
        replace_with(log_path, "".join(json.dumps(r) + "\n" for r in rows))


def private_dir(path: Path) -> Path:
    """`path` created as a folder only this user can enter (0700); one line (SystemExit) when it is a link,
    another user's, or writable by others (the default lies in the shared temporary folder)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise SystemExit(f"{path}: not a private folder of this user (a link, another user's, or writable by "
                         f"others); remove it or pass --workdir")
    return path


def _without(settings: dict, key: str) -> dict:
    return {k: v for k, v in settings.items() if k != key}


def same_settings(a: dict | None, b: dict) -> bool:
    """Equal settings apart from the grader version."""
    return isinstance(a, dict) and _without(a, "grader_version") == _without(b, "grader_version")


def read_rows(log_path: Path, settings: dict, report: bool = False) -> list[dict]:
    """The rows of `log_path` with these settings and graded by the current grader version; with
    `report`, one line about rows with these settings graded by another version (skipped)."""
    rows = load_rows(log_path)
    version = settings["grader_version"]
    kept = [r for r in rows if r.get("settings") == settings and r.get("grader_version") == version]
    if report:
        other = [r for r in rows if same_settings(r.get("settings"), settings) and r not in kept]
        if other:
            versions = sorted({str(r.get("grader_version", "unknown")) for r in other})
            print(f"{log_path}: skipping {len(other)} rows graded with grader version {', '.join(versions)} "
                  f"(now {version}); they are never mixed with new ones: re-run them, or `--regrade` those "
                  f"whose responses were saved", flush=True)
        unversioned = [r for r in rows if isinstance(r.get("settings"), dict) and "grader_version" not in r["settings"]]
        if unversioned:
            print(f"{log_path}: skipping {len(unversioned)} rows recorded before the benchmark recorded grader "
                  f"versions and transfer sets (they stay in the file, out of this summary)", flush=True)
    return kept


def reuse_base(log_path: Path, settings: dict) -> dict | None:
    """A base row of the same settings but another `steps`, copied under these settings and appended: the
    untrained model's row does not depend on the steps, and a longer run need not evaluate it again."""
    rows = load_rows(log_path)
    bases = [r for r in rows if r["variant"] == "base" and isinstance(r.get("settings"), dict)
             and r.get("grader_version") == settings["grader_version"]]  # as read_rows keeps them
    if any(r["settings"] == settings for r in bases):
        return None
    donor = next((r for r in bases if _without(r["settings"], "steps") == _without(settings, "steps")), None)
    if donor is None:
        return None
    row = {**donor, "settings": settings, "reused_from_steps": donor["settings"]["steps"]}
    append_row(log_path, row)
    return row


def claim_alive(path: Path) -> bool:
    """Whether the worker that holds the claim file `path` may still run: True unless the claim names a
    process on this host that has ended."""
    try:
        owner = json.loads(path.read_text() or "{}")
    except (json.JSONDecodeError, OSError):
        owner = {}
    pid = owner.get("pid") if isinstance(owner, dict) else None
    if not isinstance(pid, int) or owner.get("host") != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        pass
    return True


def claim(workdir: Path, job: tuple, settings: dict) -> bool:
    """Claim `job` with a file that names this process; False while another live process holds it (a
    claim that names no process blocks the job until `workdir/claims` is deleted)."""
    claims = workdir / "claims"
    claims.mkdir(parents=True, exist_ok=True)
    path = claims / f"{job[0]}-{job[1]}-{settings_hash(settings)}"
    me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
    with _lock(claims / ".lock"):
        if path.exists():
            if claim_alive(path):  # this process's own claims included
                return False
            print(f"taking over {path.name}: its worker has ended", flush=True)
        replace_with(path, me)
    return True
