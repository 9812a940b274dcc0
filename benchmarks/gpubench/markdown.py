"""What every section of gpu_check.md shares: the lines of a part that did not finish, number formatting."""

from __future__ import annotations


def unfinished(part: dict) -> list[str] | None:
    """A part's report lines when it did not run to its end (its skip reason or its error), else None."""
    return [f"{part.get('skipped') or part.get('error')}", ""] if "error" in part or "skipped" in part else None


def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)
