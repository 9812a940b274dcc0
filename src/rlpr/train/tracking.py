"""Metrics to `metrics.jsonl` (one line per step) and TensorBoard; sampled generations to files."""

from __future__ import annotations

import json
import math
from pathlib import Path


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Tracker:
    """Append-only metric log. On resume, lines after the checkpoint's step are dropped first, so
    the log reads as if the run had never stopped."""

    def __init__(self, run_dir: Path, tensorboard: bool = True, resume_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines()
                    if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(line + "\n" for line in kept))
        self._tb = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tensorboard"), purge_step=resume_step)
            except ImportError:  # tensorboard is a dependency; tolerate a minimal install
                self._tb = None

    def log(self, step: int, metrics: dict) -> None:
        record = {"step": step, **{k: _clean(v) for k, v in metrics.items()}}
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)
            self._tb.flush()

    def write_samples(self, step: int, rows: list[dict]) -> None:
        folder = self.run_dir / "samples"
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"step_{step:06d}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


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
