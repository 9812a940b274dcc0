"""Stored benchmark results re-render: each benchmark's report function reads the JSON it wrote,
also one written before a later version added columns (benchmarks/results/)."""

import importlib
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
# module, report function, the stored results it reads
REPORTS = [("speedbench.report", "markdown", "speed*.json"), ("speedbench.report", "markdown", "archive/speed*.json")]


@pytest.mark.parametrize("module,function,pattern", REPORTS)
def test_stored_results_re_render(module, function, pattern, monkeypatch):
    files = sorted((BENCH / "results").glob(pattern))
    if not files:
        pytest.skip(f"no stored {pattern} in benchmarks/results")
    monkeypatch.syspath_prepend(str(BENCH))
    render = getattr(importlib.import_module(module), function)
    for path in files:
        text = render(json.loads(path.read_text()))
        assert text.startswith("# ") and len(text.splitlines()) > 5, path.name
