"""benchmarks/results/README.md read as data: its index table, one row per question, names the command
that answers it, the canonical file that holds the current answer, and the numbers that docs and the
README quote from it (`quoted`: "docs/x.md: 1.23, 4.5; README.md: 6.7"). tests/test_results_index.py
checks that each quoted number appears in the quoting file and in the canonical pair."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
COLUMNS = ("question", "command", "canonical", "quoted")


def rows(path: Path = RESULTS / "README.md") -> list[dict]:
    """The index table's rows as dicts of COLUMNS; `quoted` parsed to {file: [number, ...]}."""
    out = []
    for line in path.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != len(COLUMNS) or cells[0] in ("question", "") or set(cells[0]) <= set("-: "):
            continue
        row = dict(zip(COLUMNS, (c.strip("`").strip() for c in cells)))
        quoted = {}
        for part in filter(None, (p.strip() for p in row["quoted"].split(";"))):
            if part == "-":
                continue
            where, _, numbers = part.partition(":")
            quoted[where.strip()] = [n.strip() for n in re.split(r",\s+", numbers) if n.strip()]
        row["quoted"] = quoted
        out.append(row)
    return out


def plain(text: str) -> str:
    """`text` with thousands separators dropped (89,023 -> 89023), as quotes are compared."""
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)
