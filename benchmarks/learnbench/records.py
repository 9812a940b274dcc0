"""Saved responses: one compact record per question and run (what a grader needs to re-grade it),
gzipped beside the .jsonl, and the graded numbers recomputed from them."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path


def response_records(set_name: str, kept: list[dict], step: int | None = None) -> list[dict]:
    """One compact record per question (what a grader needs to re-grade it): the set, the
    example's chat prompt, data source, ability, reference, aliases and choices, the greedy and the
    sampled responses with their verdicts (1/0), and the step for curve points."""
    out = []
    for q in kept:
        e = q["prompt"].example
        rec = {"set": set_name, "uid": e.uid, "prompt": e.prompt, "data_source": e.data_source,
               "ability": e.ability, "reference": e.reference, "acceptable": list(e.acceptable),
               "greedy": q["greedy"], "greedy_correct": int(q["greedy_correct"]),
               "samples": q["samples"], "samples_correct": [int(c) for c in q["samples_correct"]]}
        if e.choices:
            rec["choices"] = list(e.choices)
        if step is not None:
            rec["step"] = step
        out.append(rec)
    return out


def graded_numbers(records: list[dict]) -> dict:
    """Avg@k (greedy when no samples), greedy accuracy and pass@k of records (one set, one step),
    as rlpr.train.held_out.evaluate computes them."""
    n = max(len(records), 1)
    greedy = sum(r["greedy_correct"] for r in records) / n
    if not any(r["samples"] for r in records):
        return {"acc": greedy, "greedy": greedy, "pass8": None}
    return {"acc": sum(sum(r["samples_correct"]) / len(r["samples_correct"]) for r in records) / n,
            "greedy": greedy, "pass8": sum(any(r["samples_correct"]) for r in records) / n}


def regrade_records(records: list[dict], grade) -> list[dict]:
    """The records with every verdict recomputed by `grade(example, response) -> bool`."""
    from rlpr.data.records import Example

    out = []
    for r in records:
        example = Example(prompt=r["prompt"], reference=r["reference"], uid=r.get("uid", ""),
                          data_source=r.get("data_source", ""), ability=r.get("ability", ""),
                          acceptable=list(r.get("acceptable") or []), choices=list(r.get("choices") or []))
        out.append({**r, "greedy_correct": int(grade(example, r["greedy"])),
                    "samples_correct": [int(grade(example, s)) for s in r["samples"]]})
    return out


def replace_with(path: Path, data: str | bytes) -> None:
    """Write `data` to a new file beside `path` under a random name (never through a link planted at a
    predictable one: issue 60, S10), then rename it over `path` (a rename replaces a link, not its target)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_records(path: Path, records: list[dict]) -> None:
    """Gzipped jsonl, written whole and renamed into place (`replace_with`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    replace_with(path, gzip.compress("".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n"
                                             for r in records).encode("utf-8")))


def read_records(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def settings_hash(settings: dict) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]


def responses_path(log_path: Path, variant: str, seed, settings: dict) -> Path:
    return log_path.with_name(log_path.stem + "_responses") / \
        f"{variant}-{'base' if seed is None else seed}-{settings_hash(settings)}.jsonl.gz"
