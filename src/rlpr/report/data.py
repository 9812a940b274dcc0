"""What a report reads from a run directory: metrics.jsonl, config.yaml, summary.yaml and the last
samples file. Pure data: no plotting here (rlpr/report/render.py draws)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlpr.errors import ConfigError
from rlpr.train.tracking import flatten


@dataclass
class RunData:
    path: Path
    name: str
    records: list[dict]
    config: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    samples: list[dict] = field(default_factory=list)
    samples_step: int | None = None

    def keys(self) -> set[str]:
        return {k for r in self.records for k, v in r.items() if k != "step" and _number(v)}

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of `key`, finite numbers only, in log order (a key logged twice at one
        step, e.g. after a resume, keeps its last value)."""
        by_step: dict[int, float] = {}
        for r in self.records:
            if _number(r.get(key)):
                by_step[int(r.get("step", 0))] = float(r[key])
        steps = sorted(by_step)
        return steps, [by_step[s] for s in steps]

    def first_last(self, key: str) -> tuple[float | None, float | None]:
        steps, values = self.series(key)
        return (values[0], values[-1]) if values else (None, None)

    @property
    def steps(self) -> int:
        return max((int(r.get("step", 0)) for r in self.records), default=0)


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a crash: the rest of the log still reads
            if isinstance(row, dict):
                rows.append(row)
    return rows


def load_run(path: str | Path) -> RunData:
    """A run directory's metrics, config, summary and its last samples file. A directory without
    metrics.jsonl is not a run (one-line ConfigError)."""
    path = Path(path)
    metrics = path / "metrics.jsonl"
    if not metrics.is_file():
        raise ConfigError(f"{path}: not a run directory (no metrics.jsonl)")
    samples, samples_step = [], None
    files = sorted((path / "samples").glob("step_*.jsonl")) if (path / "samples").is_dir() else []
    if files:
        samples = _read_jsonl(files[-1])
        try:
            samples_step = int(files[-1].stem.split("_")[-1])
        except ValueError:
            samples_step = None
    return RunData(path=path, name=path.resolve().name, records=_read_jsonl(metrics),
                   config=_read_yaml(path / "config.yaml"), summary=_read_yaml(path / "summary.yaml"),
                   samples=samples, samples_step=samples_step)


def config_differences(runs: list[RunData]) -> tuple[str, dict[str, list]]:
    """With several runs: the keys whose values differ between them. With one: the keys that differ
    from rlpr's defaults. Returns (what was compared, key -> [value per run (+ default)])."""
    flats = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flats))
    if len(runs) > 1:
        return "between runs", {k: [f.get(k) for f in flats] for k in keys
                                if len({json.dumps(f.get(k), sort_keys=True) for f in flats}) > 1}
    from rlpr.config import Config

    defaults = flatten(Config().to_dict())
    return "from the defaults", {k: [flats[0].get(k), defaults.get(k)] for k in keys
                                 if k != "preset" and flats[0].get(k) != defaults.get(k)}


def held_out(run: RunData) -> tuple[dict, dict]:
    """(before, after) held-out evaluations: summary.yaml's, else the first and last eval/ lines."""
    before, after = run.summary.get("before") or {}, run.summary.get("after") or {}
    if not before or not after:
        evals = [{k: v for k, v in r.items() if k.startswith("eval/")} for r in run.records]
        evals = [e for e in evals if e]
        if evals:
            before, after = before or evals[0], after or evals[-1]
    return before, after


def pick_samples(rows: list[dict], prompts: int = 4) -> list[dict]:
    """For the first `prompts` prompts of a samples file: the best and the worst response by reward."""
    groups: dict[str, list[dict]] = {}
    for row in rows:
        groups.setdefault(str(row.get("prompt", "")), []).append(row)
    picked = []
    for group in list(groups.values())[:prompts]:
        ranked = sorted(group, key=lambda r: r.get("reward") if _number(r.get("reward")) else -math.inf)
        picked.append(ranked[-1])
        if len(ranked) > 1:
            picked.append(ranked[0])
    return picked
