"""--regrade: every graded number of the saved runs recomputed from their saved responses with the
current grader, without retraining."""

from __future__ import annotations

import json
from pathlib import Path

from .records import graded_numbers, read_records, regrade_records, settings_hash, write_records
from .rows import claim_alive, grader_version, load_rows, rewriting, same_settings
from .variants import TRANSFER


def regraded_row(row: dict, records: list[dict], base: dict | None) -> dict:
    """A row's graded numbers recomputed from its (re-graded) records: the held-out and transfer
    sets ("after"; the base row also "before"), and its curve points; a run's "before" numbers and
    step-0 curve point come from the (re-graded) `base` row."""
    row = json.loads(json.dumps(row))
    whens = ("before", "after") if row["variant"] == "base" else ("after",)
    for set_name in ("heldout", *TRANSFER):
        chosen = [r for r in records if r["set"] == set_name]
        if not chosen:
            continue
        numbers = graded_numbers(chosen)
        for key, value in numbers.items():
            for when in whens:
                row[f"{key}_{when}" if set_name == "heldout" else f"{set_name}_{key}_{when}"] = value
    for point in row.get("curve", []):
        chosen = [r for r in records if r["set"] == "curve" and r.get("step") == point["step"]]
        if chosen:
            point.update({f"{k}_curve": v for k, v in graded_numbers(chosen).items()})
    if base is not None and row["variant"] != "base":
        row.update({k: v for k, v in base.items() if k.endswith("_before")})
        if row.get("curve") and base.get("curve") and row["curve"][0]["step"] == 0:
            row["curve"][0] = dict(base["curve"][0])
    return row


def unfinished_jobs(log_path: Path, settings: dict, workdir: Path) -> list[str]:
    """Jobs claimed under these settings with an OLDER grader version and no row yet: workers that
    may still be running. A re-grade moves the base row to the current version, and such a worker
    would then wait for its base row forever."""
    claims = workdir / "claims"
    if not claims.is_dir():
        return []
    rows = load_rows(log_path)
    out = []
    for version in range(1, settings["grader_version"]):
        old = {**settings, "grader_version": version}
        done = {f"{r['variant']}-{r['seed']}" for r in rows if r.get("settings") == old}
        tag = f"-{settings_hash(old)}"
        out += [c.name for c in sorted(claims.iterdir())  # a claim whose worker has ended waits for nothing
                if c.name.endswith(tag) and c.name[:-len(tag)] not in done and claim_alive(c)]
    return out


def regrade(log_path: Path, settings: dict) -> None:
    """Re-grade, with the current grader, every row of `log_path` with these settings (any grader
    version) whose responses were saved; rows graded by another version with no saved responses
    are left as they are (and stay out of the summary). Rewrites the .jsonl and the response files."""
    version = grader_version()
    with rewriting(log_path) as lines:  # under the lock: a worker's row appended meanwhile waits for it
        done, missing = _regrade_rows(lines, log_path, version, settings)
    print(f"--regrade: {done} rows re-graded with grader version {version}, {missing} without saved responses",
          flush=True)


def _regrade_rows(lines: list[dict], log_path: Path, version: int, settings: dict) -> tuple[int, int]:
    """`regrade` on the rows in place: (rows re-graded, rows graded by another version left as they are)."""
    from rlpr.grading import grade_example

    mine = [i for i, r in enumerate(lines) if same_settings(r.get("settings"), settings)]
    order = sorted(mine, key=lambda i: lines[i]["variant"] != "base")  # the base first: runs copy its numbers
    current = {(lines[i]["variant"], lines[i]["seed"]) for i in mine if lines[i].get("grader_version") == version}
    base, done, missing = None, 0, 0
    for i in order:
        row = lines[i]
        if row.get("grader_version") != version and (row["variant"], row["seed"]) in current:
            print(f"--regrade: {row['variant']} seed {row['seed']}: a row graded with version {version} exists; "
                  f"the one graded with {row.get('grader_version', 'unknown')} is left as it is", flush=True)
            continue
        path = log_path.parent / row["responses"] if row.get("responses") else None
        if path is None or not path.exists():
            if row.get("grader_version") != version:
                missing += 1
                print(f"--regrade: {row['variant']} seed {row['seed']}: no saved responses "
                      f"({row.get('responses') or 'none recorded'}); left at grader version "
                      f"{row.get('grader_version', 'unknown')}", flush=True)
            elif row["variant"] == "base":
                base = row
            continue
        records = regrade_records(read_records(path), lambda e, text: grade_example(e, text).correct)
        write_records(path, records)
        new = regraded_row(row, records, base)
        old = row.get("grader_version")
        if old != version:
            new["regraded_from"] = old
        new["grader_version"] = version
        new["settings"] = {**row["settings"], "grader_version": version}
        lines[i] = new
        if new["variant"] == "base":
            base = new
        done += 1
    return done, missing
