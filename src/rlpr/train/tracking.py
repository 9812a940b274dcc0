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
import math
import os
import re
import time
from pathlib import Path


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


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
    step are dropped first, so the log reads as if the run had never stopped."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None, *,
                 trackers=("jsonl", "tensorboard"), config: dict | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.names = active_trackers(trackers, tensorboard)
        self._backends = []
        for name in self.names[1:]:
            if name == "tensorboard" and importlib.util.find_spec("tensorboard") is None:
                continue  # tensorboard is a dependency; tolerate a minimal install
            self._backends.append(TRACKERS[name](self.run_dir, resume_step, config))

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for backend in self._backends:
            backend.log(step, metrics)

    def write_samples(self, step: int, rows: list[dict]) -> None:
        folder = self.run_dir / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"step_{step:06d}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def close(self) -> None:
        for backend in self._backends:
            backend.close()
        self._backends = []


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class NullTracker:
    """What the ranks other than the main one log to: nothing."""

    def log(self, *a, **k):
        pass

    def write_samples(self, *a, **k):
        pass

    def close(self):
        pass
