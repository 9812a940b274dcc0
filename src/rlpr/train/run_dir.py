"""The run directory's own files: its default name, config.yaml, data.yaml, resume_N.yaml, summary.yaml,
report.html.

(metrics.jsonl and samples/ are the Tracker's, rlpr/train/tracking.py; checkpoints/ is
rlpr/train/checkpoint.py's.)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import sys
import time
from pathlib import Path

import yaml

from rlpr.config import Config
from rlpr.model.checkpoint_files import leftovers, list_checkpoints
from rlpr.errors import (PARSE_ERRORS, ConfigError, command_line, error_reason, parse_error_reason, write_atomic,
                         yaml_load)
from rlpr.parallel import distributed as dist
from rlpr.train.tracking import check_metrics, trim_metrics

log = logging.getLogger("rlpr.train")


def default_run_dir(cfg: Config) -> Path:
    """trainer.output_dir/trainer.name (a name made of the preset and the time when empty). The name
    stays inside output_dir: an absolute path or a `..` part is refused (issue 35, N10)."""
    name = cfg.trainer.name or f"{cfg.preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    check_run_name(name)
    return Path(cfg.trainer.output_dir) / name


def check_run_name(name: str) -> None:
    """One line unless `name` is a relative path below trainer.output_dir (sub-folders allowed)."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\", "~")) or Path(name).is_absolute() or (len(name) > 1 and name[1] == ":") \
            or any(part in ("..", ".") for part in parts) or not name.strip() or "\0" in name:
        raise ConfigError(f"trainer.name: {name!r} must name a folder inside trainer.output_dir (no absolute "
                          f"path, no '..' or '.' part); set trainer.output_dir for another place")


# What a run writes and appends to besides config.yaml and data.yaml: a new run never mixes its
# records into another's (issue 35, N6)
RUN_FILES = ("metrics.jsonl", "samples", "summary.yaml", "tensorboard", "report.html")


def check_fresh(run_dir: Path) -> None:
    """A new run never writes into a run directory that has checkpoints, nor into one that holds a
    run's records without any (a run stopped before its first save): its metrics.jsonl would be
    appended to, and a tracker's run id (wandb, mlflow) reused."""
    check_not_nested(run_dir)
    left = set(leftovers(run_dir))
    if (run_dir / "checkpoints").exists() and any(p not in left for p in (run_dir / "checkpoints").iterdir()):
        raise ConfigError(f"{run_dir} already has checkpoints: resume it with "
                          f"{command_line('rlpr', 'train', '--resume', run_dir)} "
                          f"or choose another trainer.name")
    found = [name for name in RUN_FILES if (run_dir / name).exists()]
    found += sorted(p.name for p in run_dir.glob("*_run_id")) + sorted(p.name for p in run_dir.glob("resume_*.yaml"))
    if found:
        raise ConfigError(f"{run_dir} already holds a run that saved no checkpoint ({', '.join(found)}): a new run "
                          f"would append to its records; remove the folder or choose another trainer.name")


def is_run_dir(folder: Path) -> bool:
    """A folder holding a run: its config.yaml beside its checkpoints or records."""
    return (folder / "config.yaml").is_file() and any(
        (folder / name).exists() for name in ("checkpoints", "data.yaml", "base_model.yaml", *RUN_FILES))


def check_not_nested(run_dir: Path) -> None:
    """A run's folder is never inside another run's, nor holds one (issue 43): a run named into
    another's checkpoints/ was deleted by that run's pruning, and a run's records and resume would
    take the other's files for their own. Looks at every folder above and two levels below."""
    here = Path(run_dir).absolute()
    outer = next((p for p in here.parents if is_run_dir(p)), None)
    if outer is not None:
        raise ConfigError(f"trainer.name: {run_dir} would be inside the run {outer} (its checkpoint pruning and "
                          f"resume would take it for its own files): choose a folder outside it")
    inner = next((p.parent for pattern in ("*/config.yaml", "*/*/config.yaml") for p in sorted(here.glob(pattern))
                  if is_run_dir(p.parent)), None)
    if inner is not None:
        raise ConfigError(f"trainer.name: {run_dir} holds the run {inner}; a run's folder never holds another "
                          f"run: choose another trainer.name")


def remove_checkpoint_leftovers(run_dir: Path) -> None:
    """Under the run's lock (no other writer): what a killed save or removal left under checkpoints/
    is removed, each with a warning naming it."""
    import shutil

    for path in leftovers(run_dir):
        shutil.rmtree(path, ignore_errors=True)
        log.warning("removed %s, left by an interrupted checkpoint save or removal", path)


# The run directories this process holds locked (issue 35, N7): path -> the open directory.
_LOCKS: dict[str, int] = {}


def lock_run_dir(run_dir: Path) -> None:
    """One writer per run directory: an exclusive, non-blocking lock on the folder itself (flock;
    nothing is written into it), held until the training ends (`release_run_dir`, at
    `dist.shutdown`), the process ends, or it locks another run directory. A second `rlpr train` or
    `--resume` of the same run, while the first runs, is refused with one line."""
    import fcntl

    key = str(Path(run_dir).resolve())
    if key in _LOCKS:
        return
    for other in list(_LOCKS):  # this process's earlier run has finished
        os.close(_LOCKS.pop(other))
    fd = os.open(key, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ConfigError(f"{run_dir}: another rlpr process is training this run (its directory is locked); "
                          f"wait for it to finish or stop it, then {command_line('rlpr', 'train', '--resume', run_dir)}"
                          ) from None
    except OSError:  # a file system without locks (some network mounts): no lock rather than no training
        os.close(fd)
        log.debug("%s: could not lock the run directory", run_dir)
        return
    _LOCKS[key] = fd
    dist.at_shutdown(lambda: release_run_dir(key))


def release_run_dir(run_dir) -> None:
    """Let another process train `run_dir` (its lock, if this process holds it)."""
    fd = _LOCKS.pop(str(Path(run_dir).resolve()), None)
    if fd is not None:
        os.close(fd)


def prepare_run_dir(run_dir: Path, cfg: Config, examples: dict, resume: bool,
                    accept_base_change: bool = False) -> None:
    """Before the model loads. The main process locks the run directory (`lock_run_dir`: one writer).
    A new run: refused where checkpoints or another run's records exist, then config.yaml, data.yaml
    and base_model.yaml (the base weights' fingerprint, rlpr/model/fingerprint.py) are written (main
    process). A resume writes nothing: refused when the data changed (`check_data`), the base
    model's weights changed (`check_base`, unless `accept_base_change`) or metrics.jsonl has a bad
    line before its last one (`check_metrics`)."""
    from rlpr.model.fingerprint import check_base

    if resume:
        if dist.is_main():
            lock_run_dir(run_dir)
            remove_checkpoint_leftovers(run_dir)
        check_data(run_dir, data_fingerprint(cfg, examples))
        check_base(run_dir, cfg.model.path, f"--resume {run_dir}", accept_base_change)
        check_metrics(run_dir / "metrics.jsonl")
        return
    check_fresh(run_dir)
    if dist.is_main():
        try:
            run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{run_dir}: cannot write the run directory ({e.strerror or e}); "
                              f"set trainer.output_dir") from None
        lock_run_dir(run_dir)
        check_fresh(run_dir)  # again under the lock: a run started beside this one
        remove_checkpoint_leftovers(run_dir)
        write_config(run_dir, cfg, data_fingerprint(cfg, examples))
    dist.barrier()


def write_config(run_dir: Path, cfg: Config, data: dict | None = None) -> None:
    """Create the run directory with config.yaml, the run's configuration, data.yaml, the
    fingerprint of its data (`data_fingerprint`), and with it base_model.yaml, its base weights'
    (`rlpr.model.fingerprint`)."""
    from rlpr.model.fingerprint import write_fingerprint

    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "config.yaml", yaml.safe_dump(cfg.to_dict(), sort_keys=False))  # whole or none
        if data is not None:
            write_atomic(run_dir / "data.yaml", yaml.safe_dump(data, sort_keys=False))
            write_fingerprint(run_dir, cfg.model.path)
    except OSError as e:
        raise ConfigError(f"{run_dir}: cannot write the run directory ({e.strerror or e}); "
                          f"set trainer.output_dir") from None


def print_location(run_dir: Path) -> Path | None:
    """Print where a finished run is (its directory, its last checkpoint), shell-quoted to paste as
    the resume line is (issue 60, S16); returns that checkpoint."""
    found = list_checkpoints(run_dir)
    print(f"run directory: {command_line(run_dir)}" + (f"\nlast checkpoint: {command_line(found[-1])}" if found
                                                        else ""), file=sys.stderr)
    return found[-1] if found else None


def data_fingerprint(cfg: Config, examples: dict) -> dict:
    """Per split (data.train, data.val): the source, its size and modification time (a file, or a
    folder's files summed), the number of rows read and a SHA-256 of those rows as rlpr read them."""
    out = {}
    for split, source in (("train", cfg.data.train), ("val", cfg.data.val)):
        if not source:
            continue
        digest = hashlib.sha256()
        for example in examples.get(split) or []:
            digest.update(json.dumps(vars(example), sort_keys=True, default=str, ensure_ascii=False).encode())
            digest.update(b"\n")
        out[split] = {"source": str(source), **_file_facts(str(source)), "rows": len(examples.get(split) or []),
                      "sha256": digest.hexdigest()}
    return out


def _file_facts(source: str) -> dict:
    from rlpr.data.sources import parse_source

    path = parse_source(source).path
    try:
        files = [path] if path.is_file() else [f for f in path.rglob("*") if f.is_file()]
        stats = [f.stat() for f in files]
    except OSError:
        return {}
    if not stats:
        return {}
    return {"bytes": sum(s.st_size for s in stats),
            "modified": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(max(s.st_mtime for s in stats)))}


def check_data(run_dir: Path, now: dict) -> None:
    """A resume reads the same rows as the run did: data.train or data.val whose rows changed at the
    same path is refused with one line naming the file (the checkpoint's prompt order, re-roll
    cache and score-A cache refer to the rows by position). The same rows with a new modification
    time (copied, written again) are the same data. A run from before data.yaml is not checked."""
    path = run_dir / "data.yaml"
    if not path.is_file():
        return
    try:
        saved = yaml_load(path.read_text())
    except (OSError, yaml.YAMLError, *PARSE_ERRORS) as e:  # PARSE_ERRORS: not UTF-8, nested a thousand deep
        log.warning("%s: unreadable (%s); the data is not checked against the run's", path, parse_error_reason(e))
        return
    for split, was in (saved if isinstance(saved, dict) else {}).items():
        new = now.get(split)
        if not isinstance(was, dict) or not new or (was.get("rows"), was.get("sha256")) == (new["rows"], new["sha256"]):
            continue
        raise ConfigError(f"--resume {run_dir}: data.{split} changed since the run started: {new['source']} "
                          f"({_describe(was)} -> {_describe(new)}); its checkpoint refers to the old rows: restore "
                          f"the file or start a new run")


def _describe(facts: dict) -> str:
    parts = [f"{facts.get('rows')} rows, sha256 {str(facts.get('sha256'))[:12]}"]
    if "bytes" in facts:
        parts.append(f"{facts['bytes']} bytes, modified {facts.get('modified')}")
    return ", ".join(parts)


def record_resume(run_dir: Path, step: int, changes: dict) -> None:
    """config.yaml stays the run's original configuration; each resume writes resume_N.yaml with
    the step it resumed at and the keys it changed (old and new values). metrics.jsonl is trimmed
    to the checkpoint's step first (`trim_metrics`): a failure there adds no resume_N.yaml."""
    trim_metrics(run_dir / "metrics.jsonl", step)
    n = 1 + sum(1 for _ in run_dir.glob("resume_*.yaml"))
    try:
        write_atomic(run_dir / f"resume_{n}.yaml", yaml.safe_dump(
            {"resumed_at_step": step, "changed": {k: {"was": a, "now": b} for k, (a, b) in changes.items()}},
            sort_keys=False))
    except OSError as e:
        raise ConfigError(f"{run_dir}: could not write resume_{n}.yaml ({error_reason(e)})") from None


def write_summary(run_dir: Path, summary: dict) -> None:
    """summary.yaml: the before/after evaluations and the last step's metrics (NaN written as null);
    written atomically, and a failure (a full disk) is a warning: the checkpoint is already saved."""
    try:
        write_atomic(run_dir / "summary.yaml", yaml.safe_dump(_plain(summary), sort_keys=False))
    except OSError as e:
        log.warning("could not write %s (%s); the checkpoint is saved", run_dir / "summary.yaml", error_reason(e))


def _plain(obj):
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def write_run_report(run_dir: Path) -> Path | None:
    """report.html in the run directory; a failure is a warning, never a failed run."""
    try:
        from rlpr.report import write_report

        return write_report([run_dir], run_dir / "report.html")
    except Exception as e:  # noqa: BLE001 - the run has finished; its report is a convenience
        log.warning("could not write the run report: %s", error_reason(e))
        return None
