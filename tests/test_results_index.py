"""benchmarks/results/README.md, the index of current results (issue 62): every canonical file it names
exists as a .json + .md pair, every maintained suite's command is listed, and every number a doc or
the README quotes from a benchmark appears both in the quoting file and in the canonical pair, so that
a rerun which moves a number fails here until the quoting line is updated."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
if not RESULTS.is_dir():
    pytest.skip("no benchmarks/results beside tests/ (an installed rlpr)", allow_module_level=True)
sys.path.insert(0, str(ROOT / "benchmarks"))
from harness.index import plain, rows  # noqa: E402

ROWS = rows()


def appears(number: str, text: str) -> bool:
    """`number` in `text` as a whole number, not inside another (0.5% is not in 10.5%)."""
    return re.search(rf"(?<![\d.]){re.escape(plain(number))}(?![\d])", plain(text)) is not None


def test_the_index_reads_and_names_each_maintained_suite():
    commands = " ".join(r["command"] for r in ROWS)
    for suite in ("learning.py", "speed.py", "scaling.py", "memory_plan.py", "grader_consistency.py",
                  "grader_probes.py", "gpu_check.py", "serve_soak.py", "demo_time.py"):
        assert f"benchmarks/{suite}" in commands, suite
    assert sum(len(q) for r in ROWS for q in r["quoted"].values()) >= 30


@pytest.mark.parametrize("row", ROWS, ids=[r["canonical"] for r in ROWS])
def test_every_quoted_number_is_in_the_doc_and_the_canonical_file(row):
    stem = RESULTS / Path(row["canonical"]).with_suffix("")
    assert stem.with_suffix(".md").exists(), f"{row['canonical']}: no such file in benchmarks/results"
    canonical = stem.with_suffix(".md").read_text()
    if stem.with_suffix(".json").exists():
        canonical += stem.with_suffix(".json").read_text()
    missing = []
    for doc, numbers in row["quoted"].items():
        text = (ROOT / doc).read_text()
        missing += [f"{doc} does not quote {n}" for n in numbers if not appears(n, text)]
        missing += [f"{row['canonical']} does not hold {n} (quoted by {doc})" for n in numbers if not appears(n, canonical)]
    assert missing == []


def test_the_number_check_fails_on_a_number_that_moved(tmp_path):
    index = tmp_path / "README.md"
    index.write_text("| question | command | canonical | quoted |\n|---|---|---|---|\n"
                     "| q | `python benchmarks/x.py` | `x.md` | docs/a.md: 0.5%, 89,023; README.md: 1.2 |\n")
    [row] = rows(index)
    assert row["canonical"] == "x.md" and row["quoted"] == {"docs/a.md": ["0.5%", "89,023"], "README.md": ["1.2"]}
    assert appears("89023", "89,023 requests") and not appears("0.5%", "10.5%") and not appears("1.2", "1.25")
