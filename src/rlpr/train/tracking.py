"""Metrics to `metrics.jsonl` (one line per step) and the trackers named in `trainer.trackers`
(TensorBoard, Weights & Biases, MLflow); sampled generations to files.

TRACKERS is the registry: name -> a backend class with `log(step, metrics)` and `close()`. jsonl
is always on (the report and resume read it); the others log the finite numbers of the same
records at the same steps. wandb and mlflow are optional extras (`pip install 'rlpr[wandb]'`,
`'rlpr[mlflow]'`), configured by their own environment variables (WANDB_PROJECT, WANDB_MODE,
WANDB_API_KEY; MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME); rlpr never reads or prints a key.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import re
import time
from pathlib import Path

from rlpr.errors import ConfigError, error_reason, json_line, write_atomic

log = logging.getLogger("rlpr.train")


def numbers(metrics: dict) -> dict[str, float]:
    """The finite numeric values of a record (what the trackers other than jsonl receive)."""
    return {k: v for k, v in metrics.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def flatten(tree: dict, prefix: str = "") -> dict:
    """A nested config dict as dotted keys ({"a": {"b": 1}} -> {"a.b": 1}): what trackers log as
    parameters, what resume compares and what the report diffs."""
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _saved_id(run_dir: Path, name: str) -> str | None:
    """A tracker's run id, kept in the run directory so that a resume continues the same run."""
    path = run_dir / f"{name}_run_id"
    return path.read_text().strip() or None if path.is_file() else None


class TensorBoardBackend:
    package = None

    def __init__(self, run_dir: Path, resume_step: int | None, config: dict | None):
        from torch.utils.tensorboard import SummaryWriter

        self._tb = SummaryWriter(str(run_dir / "tensorboard"), purge_step=resume_step)

    def log(self, step: int, metrics: dict) -> None:
        for key, value in numbers(metrics).items():
            self._tb.add_scalar(key, value, step)
        self._tb.flush()

    def close(self) -> None:
        self._tb.close()


class WandbBackend:
    """A wandb run in `run_dir/wandb` named after the run directory; its id is kept in
    `run_dir/wandb_run_id` (a resume continues it). Project: WANDB_PROJECT, else "rlpr"."""

    package = "wandb"

    def __init__(self, run_dir: Path, resume_step: int | None, config: dict | None):
        import wandb

        run_id = _saved_id(run_dir, "wandb") if resume_step is not None else None
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT") or "rlpr", name=run_dir.name,
                               dir=str(run_dir), config=config or {}, id=run_id,
                               resume="allow" if run_id else None, reinit="create_new")
        (run_dir / "wandb_run_id").write_text(self._run.id)

    def log(self, step: int, metrics: dict) -> None:
        self._run.log(numbers(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def mlflow_name(key: str) -> str:
    """A metric name MLflow accepts (letters, digits, _ - . / space): `eval/pass@4` -> `eval/pass_at_4`."""
    return re.sub(r"[^\w./ -]", "_", key.replace("@", "_at_"))


class MlflowBackend:
    """An MLflow run named after the run directory, its config as parameters (flattened keys);
    its id is kept in `run_dir/mlflow_run_id` (a resume continues it); metric names as
    `mlflow_name` spells them. Where: MLFLOW_TRACKING_URI
    (e.g. file:./mlruns or a server), experiment MLFLOW_EXPERIMENT_NAME, else "rlpr"."""

    package = "mlflow"

    def __init__(self, run_dir: Path, resume_step: int | None, config: dict | None):
        from mlflow.tracking import MlflowClient

        self._client = client = MlflowClient()
        run_id = _saved_id(run_dir, "mlflow") if resume_step is not None else None
        if run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "rlpr"
            experiment = client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
            run_id = client.create_run(experiment_id, run_name=run_dir.name).info.run_id
            for key, value in flatten(config or {}).items():
                client.log_param(run_id, key, json.dumps(value) if isinstance(value, (list, dict)) else value)
        (run_dir / "mlflow_run_id").write_text(run_id)
        self._run_id = run_id

    def log(self, step: int, metrics: dict) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(mlflow_name(k), float(v), now, step) for k, v in numbers(metrics).items()]
        if batch:
            self._client.log_batch(self._run_id, metrics=batch)

    def close(self) -> None:
        self._client.set_terminated(self._run_id)


TRACKERS: dict[str, type | None] = {
    "jsonl": None,  # metrics.jsonl, always written by Tracker itself
    "tensorboard": TensorBoardBackend,
    "wandb": WandbBackend,
    "mlflow": MlflowBackend,
}
EXTRAS = {"wandb": "pip install 'rlpr[wandb]'", "mlflow": "pip install 'rlpr[mlflow]'"}


def missing_package(name: str) -> str | None:
    """A one-line reason why tracker `name` cannot run here, or None."""
    backend = TRACKERS.get(name)
    package = getattr(backend, "package", None)
    if package and importlib.util.find_spec(package) is None:
        return f"the {name} tracker needs the {package} package ({EXTRAS[name]})"
    return None


def active_trackers(trackers, tensorboard: bool = True) -> list[str]:
    """`trainer.trackers` with jsonl first, each once; `trainer.tensorboard: false` (the older
    switch) removes tensorboard."""
    out = ["jsonl"]
    for name in trackers:
        if name not in out and (name != "tensorboard" or tensorboard):
            out.append(name)
    return out


class Tracker:
    """Append-only metric log, plus the other trackers. On resume, lines after the checkpoint's
    step are dropped first (`trim_metrics`), so the log reads as if the run had never stopped.

    A full disk (or any failed write) outside the checkpoint is a warning, never a failed run: a
    record that cannot be appended whole is cut back off (metrics.jsonl never holds half a line),
    and a samples file is written to a temporary name and renamed (never left empty or partial)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None, *,
                 trackers=("jsonl", "tensorboard"), config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None:
            trim_metrics(self.path, resume_step)
        self._failed: dict[str, int] = {}  # what could not be written -> how many times in a row
        self.names = active_trackers(trackers, tensorboard)
        self._backends = []
        for name in self.names[1:]:
            if name == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
                continue  # tensorboard is a dependency; tolerate a minimal install
            self._backends.append(TRACKERS[name](self.run_dir, resume_step, config))

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **metrics}
        try:
            _append(self.path, json_line(record).encode("utf-8"))
            self._written(self.path.name, step)
        except OSError as e:
            self._failure(self.path.name, step, e, "its record is missing from the log")
        for backend in self._backends:
            name = type(backend).__name__.removesuffix("Backend").lower()
            try:
                backend.log(step, metrics)
                self._written(name, step)
            except OSError as e:
                self._failure(name, step, e, "the other trackers go on")

    def write_samples(self, step: int, rows: list[dict]) -> None:
        folder = self.run_dir / "samples"
        path = folder / f"step_{step:06d}.jsonl"
        try:  # the temporary name is not step_*.jsonl: no reader takes it for a samples file
            folder.mkdir(parents=True, exist_ok=True)
            # strict JSON: a non-finite reward or score is null, never a bare NaN (issue 43)
            write_atomic(path, "".join(json_line(row, ensure_ascii=False) for row in rows))
        except OSError as e:
            self._failure(f"samples/{path.name}", step, e, "training goes on without it", key="samples")

    def _failure(self, what: str, step: int, e: OSError, consequence: str, key: str | None = None) -> None:
        """One warning when writing `what` starts failing (then debug lines until it works again)."""
        key = key or what
        self._failed[key] = self._failed.get(key, 0) + 1
        (log.warning if self._failed[key] == 1 else log.debug)(
            "could not write %s at step %d (%s); %s", what, step, error_reason(e), consequence)

    def _written(self, key: str, step: int) -> None:
        missed = self._failed.pop(key, 0)
        if missed:
            log.warning("%s is written again from step %d (%d write%s failed before)", key, step, missed,
                        "s" if missed > 1 else "")

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
        self._backends = []


def _append(path: Path, data: bytes) -> None:
    """Append `data` whole or not at all: a write that fails midway (ENOSPC) is cut back off."""
    with open(path, "ab", buffering=0) as f:
        end = f.seek(0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                view = view[f.write(view) or 0:]
        except OSError:
            try:
                f.truncate(end)
            except OSError:  # rare; a resume then drops the cut line (`trim_metrics`)
                pass
            raise


def _metric_lines(path: Path) -> tuple[list[tuple[bytes, dict]], int | None]:
    """metrics.jsonl as (line, record) pairs, and the number of a last line cut short (a write that
    did not finish, e.g. on a full disk), else None. Any other line that is not a JSON record with
    an integer step is a ConfigError naming the file and the line."""
    lines = path.read_bytes().split(b"\n")
    out, cut = [], None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        last = n == len(lines)  # the file does not end with a newline here
        try:
            record = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, ValueError) as e:
            if last:
                cut = n
                continue
            why = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else error_reason(e)
            raise ConfigError(f"{path}: line {n} is not a JSON record ({why}); fix or remove that line, then "
                              f"resume") from None
        if not isinstance(record, dict):
            raise ConfigError(f"{path}: line {n} is not a JSON record (a {type(record).__name__}); fix or "
                              f"remove that line, then resume")
        if not isinstance(record.get("step"), int) or isinstance(record.get("step"), bool):
            raise ConfigError(f"{path}: line {n} has no integer step; fix or remove that line, then resume")
        out.append((line, record))
    return out, cut


def check_metrics(path: Path) -> None:
    """Read-only: a resume refuses, before any model work, a metrics.jsonl it could not trim."""
    if path.is_file():
        _metric_lines(path)


def trim_metrics(path: Path, step: int) -> None:
    """On resume: drop the records after the checkpoint's `step`, and a last line cut short (with a
    warning); rewritten atomically, and only when something changes."""
    if not path.is_file():
        return
    lines, cut = _metric_lines(path)
    if cut is not None:
        log.warning("%s: line %d is cut short (a write that did not finish, e.g. on a full disk); dropped it",
                    path, cut)
    kept = [line for line, record in lines if record["step"] <= step]
    data = b"".join(line + b"\n" for line in kept)
    if cut is None and len(kept) == len(lines) and path.read_bytes() == data:
        return
    try:
        write_atomic(path, data)
    except OSError as e:
        raise ConfigError(f"{path}: could not rewrite it for the resume ({error_reason(e)}); it is unchanged") \
            from None


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of a run's metrics.jsonl (a last line cut short left out)."""
    return [record for _, record in _metric_lines(Path(run_dir) / "metrics.jsonl")[0]]


class NullTracker:
    """What the ranks other than the main one log to: nothing."""

    def log(self, *a, **k):
        pass

    def write_samples(self, *a, **k):
        pass

    def close(self):
        pass
