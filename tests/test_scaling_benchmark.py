"""benchmarks/scaling.py end to end on the tiny model: the set-up child (model_gb), one training-step
child with every response exactly L tokens, the outputs, and the resume that skips finished points."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "scaling.py"


def run(tiny_dir, stem):
    return subprocess.run([sys.executable, str(SCRIPT), "--quick", "--points", "8:2", "--model", tiny_dir,
                           "--train-prompts", "2", "--output", str(stem)],
                          capture_output=True, text=True, timeout=300)


def test_quick_run_on_the_tiny_model(tiny_dir, tmp_path):
    stem = tmp_path / "scaling"
    proc = run(tiny_dir, stem)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = json.loads(stem.with_suffix(".json").read_text())
    assert res["model_gb"] > 0 and res["setup"]["trainable_params"] > 0
    (row,) = res["rows"]
    assert (row["response_tokens"], row["group_size"]) == (8, 2)
    assert row["response_len_mean"] == 8 and row["truncated_frac"] == 1.0  # min_new_tokens = max_new_tokens
    assert row["peak_reset"] and row["peak_rss_gb"] > 0 and row["step_s"] > 0
    assert all(row[k] is not None for k in ("rollout_s", "reward_s", "update_s"))
    assert set(row["phase_peak_gb"]) == {"sync", "rollout", "reward", "update", "optimizer_step"}
    assert row["peak_rss_gb"] >= max(row["phase_peak_gb"].values()) > 0
    assert "| 8 | 2 |" in stem.with_suffix(".md").read_text()
    assert stem.with_suffix(".png").stat().st_size > 0
    lines = stem.with_suffix(".jsonl").read_text().splitlines()
    again = run(tiny_dir, stem)  # resumable: nothing left to measure
    assert again.returncode == 0, again.stderr[-2000:]
    assert "already in" in again.stdout and "== set-up" not in again.stdout
    assert stem.with_suffix(".jsonl").read_text().splitlines() == lines
