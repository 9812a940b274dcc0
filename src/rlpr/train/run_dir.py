"""The run directory's own files: its default name, config.yaml, resume_N.yaml, summary.yaml, report.html.

(metrics.jsonl and samples/ are the Tracker's, rlpr/train/tracking.py; checkpoints/ is
rlpr/train/checkpoint.py's.)
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import yaml

from rlpr.config import Config
from rlpr.errors import ConfigError, error_reason

log = logging.getLogger("rlpr.train")


def default_run_dir(cfg: Config) -> Path:
    name = cfg.trainer.name or f"{cfg.preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.trainer.output_dir) / name


def check_fresh(run_dir: Path) -> None:
    """A new run never writes into a run directory that has checkpoints."""
    if (run_dir / "checkpoints").exists() and any((run_dir / "checkpoints").iterdir()):
        raise ConfigError(f"{run_dir} already has checkpoints: resume it with --resume {run_dir} "
                          f"or choose another trainer.name")


def write_config(run_dir: Path, cfg: Config) -> None:
    """Create the run directory with config.yaml, the run's configuration."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    except OSError as e:
        raise ConfigError(f"{run_dir}: cannot write the run directory ({e.strerror or e}); "
                          f"set trainer.output_dir") from None


def record_resume(run_dir: Path, step: int, changes: dict) -> None:
    """config.yaml stays the run's original configuration; each resume writes resume_N.yaml with
    the step it resumed at and the keys it changed (old and new values)."""
    n = 1 + sum(1 for _ in run_dir.glob("resume_*.yaml"))
    (run_dir / f"resume_{n}.yaml").write_text(yaml.safe_dump(
        {"resumed_at_step": step, "changed": {k: {"was": a, "now": b} for k, (a, b) in changes.items()}},
        sort_keys=False))


def write_summary(run_dir: Path, summary: dict) -> None:
    """summary.yaml: the before/after evaluations and the last step's metrics (NaN written as null)."""
    (run_dir / "summary.yaml").write_text(yaml.safe_dump(_plain(summary), sort_keys=False))


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
