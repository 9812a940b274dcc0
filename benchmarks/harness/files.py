"""A result as one canonical file pair, OUTPUT.json (everything) and OUTPUT.md (the tables), whose
header states the machine, the commit and the date; the earlier runs that docs still cite are rows of
a history table inside the same pair (`history`), never a sibling file the reader must choose between."""

from __future__ import annotations

import json
from pathlib import Path


def header(res: dict) -> str:
    """The line under a result's title: machine (CPU, instruction set, caps) or GPU, commit, date."""
    m = res.get("machine") or {}
    if isinstance(m, str):
        where = m
    else:
        where = m.get("gpu") or m.get("cpu", "unknown machine")
        if m.get("cpu_count"):
            where += f", {m['cpu_count']} CPUs"
        if m.get("cpu_flags"):
            where += f" ({' '.join(m['cpu_flags'])})"
        if m.get("isa_caps"):
            where += ", capped: " + " ".join(f"{k}={v}" for k, v in m["isa_caps"].items())
        if m.get("load_average"):
            where += f"; load {m['load_average'][0]:.1f} at the start"
    commit = res.get("commit") or (res.get("versions") or {}).get("rlpr_commit", "unknown")
    return f"Machine: {where}. Commit: {commit}. Date: {res.get('date', 'unknown')}."


def table(head: list[str], rows, align: list[str] | None = None) -> list[str]:
    """Markdown lines of a table: the column names, then each row's cells (`str` of each); `align`: a
    separator cell per column ("---", "---:")."""
    return (["| " + " | ".join(head) + " |", "|" + "".join(f"{a}|" for a in align or ["---"] * len(head))]
            + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def history_table(rows: list[dict], columns: list[tuple[str, str]]) -> list[str]:
    """Markdown lines of the earlier runs: `columns` = (key, heading) pairs, newest row first."""
    if not rows:
        return []
    return ["## Earlier runs (history)", "", *table([h for _, h in columns], ([r.get(k, "") for k, _ in columns]
                                                                             for r in rows)), ""]


def save(res: dict, output, render, figure=None) -> str:
    """`res` as OUTPUT.json and `render(res)` as OUTPUT.md (any suffix of `output` replaced), and
    `figure` (a matplotlib figure) as OUTPUT.png; returns the markdown."""
    out = Path(output).with_suffix("")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(res, indent=1, default=str) + "\n")
    text = render(res)
    out.with_suffix(".md").write_text(text)
    if figure is not None:
        figure.savefig(out.with_suffix(".png"), dpi=110)
    return text


def load(output) -> dict | None:
    """The result `save` wrote at OUTPUT (its .json), or None where there is none yet."""
    path = Path(output).with_suffix("").with_suffix(".json")
    return json.loads(path.read_text()) if path.exists() else None


def carry_history(res: dict, output, row) -> dict:
    """`res` with the history of the canonical result at OUTPUT (if there is one) kept, and that result's
    own run added as its newest history row (`row(old_result)` -> dict): rerunning a suite moves the
    run it replaces into the history instead of losing it."""
    if (old := load(output)) is not None:
        res["history"] = [row(old)] + old.get("history", [])
    return res
