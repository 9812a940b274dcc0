"""What every section of gpu_check.md shares: its title over its lines or those of a part that did not finish,
number formatting."""

from __future__ import annotations


def unfinished(part: dict) -> list[str] | None:
    """A part's report lines when it did not run to its end (its skip reason or its error), else None."""
    return [f"{part.get('skipped') or part.get('error')}", ""] if "error" in part or "skipped" in part else None


def section(title: str, part: dict, body) -> list[str]:
    """A section: its title, then `body(part)`'s lines, or the part's skip reason or error instead."""
    return [title, "", *(unfinished(part) or body(part))]


def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)
