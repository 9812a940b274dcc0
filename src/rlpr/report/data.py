"""What a report reads from a run directory: metrics.jsonl, config.yaml, summary.yaml and the last
samples file. Pure data: no plotting here (rlpr/report/render.py draws).

Whatever the files hold, reading them never fails (issue 29): bytes that are not UTF-8 become
U+FFFD, a line that is not JSON (cut by a crash, too deep, an integer too long to parse) is
skipped, a record whose step is not an integer is dropped, and a file that is not a mapping reads
as empty. What is read is not trusted either: render.py escapes every value it shows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlpr.errors import ConfigError, yaml_load
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
    """A finite int or float (not a bool), small enough for a float: what can be plotted."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an integer beyond float range
        return False


def _read_text(path: Path) -> str:
    """A file's text; bytes that are not UTF-8 become U+FFFD instead of failing the report."""
    return path.read_bytes().decode("utf-8", errors="replace")


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = yaml_load(_read_text(path))
    except (yaml.YAMLError, ValueError, RecursionError, OSError):  # ValueError: an int over 4300 digits
        return {}
    return data if isinstance(data, dict) else {}


def _read_jsonl(path: Path) -> list[dict]:
    rows = []
    for line in _read_text(path).splitlines():
        if line.strip():
            try:
                row = json.loads(line)
            except (ValueError, RecursionError):  # a line cut by a crash, an over-long integer, deep nesting
                continue  # the rest of the log still reads
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _step(record: dict) -> int | None:
    """A metrics record's step: an integer (or an integral float), else None (the record is dropped)."""
    step = record.get("step", 0)
    if isinstance(step, bool) or not _number(step) or step != int(step):
        return None
    return int(step)


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
    records = [{**r, "step": _step(r)} for r in _read_jsonl(metrics) if _step(r) is not None]
    return RunData(path=path, name=path.resolve().name, records=records,
                   config=_read_yaml(path / "config.yaml"), summary=_read_yaml(path / "summary.yaml"),
                   samples=samples, samples_step=samples_step)


def config_differences(runs: list[RunData]) -> tuple[str, dict[str, list]]:
    """With several runs: the keys whose values differ between them. With one: the keys that differ
    from rlpr's defaults. Returns (what was compared, key -> [value per run (+ default)])."""
    flats = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flats))
    if len(runs) > 1:
        return "between runs", {k: [f.get(k) for f in flats] for k in keys
                                if len({_canonical(f.get(k)) for f in flats}) > 1}
    from rlpr.config import Config

    defaults = flatten(Config().to_dict())
    return "from the defaults", {k: [flats[0].get(k), defaults.get(k)] for k in keys
                                 if k != "preset" and flats[0].get(k) != defaults.get(k)}


def _canonical(value) -> str:
    """A value as text for comparison (YAML gives dates and mappings with non-string keys too)."""
    try:
        return json.dumps(value, sort_keys=True, default=str)
    except (TypeError, ValueError):
        return repr(value)


def held_out(run: RunData) -> tuple[dict, dict]:
    """(before, after) held-out evaluations: summary.yaml's, else the first and last eval/ lines."""
    before, after = run.summary.get("before"), run.summary.get("after")
    before = before if isinstance(before, dict) else {}
    after = after if isinstance(after, dict) else {}
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
