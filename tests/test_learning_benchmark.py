"""The learning benchmark end to end, in a smoke setting on a tiny in-process model (the real
`--quick` run on the embedded model takes minutes; this checks the pipeline and its output)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning.py"


def test_learning_benchmark_smoke(tiny_dir, tmp_path):
    out = tmp_path / "learning"
    cmd = [sys.executable, str(BENCH), "--quick", "--variants", "rlpr,rlvr", "--steps", "2", "--heldout", "6",
           "--curve-every", "1", "--curve-questions", "3", "--threads", "1", "--output", str(out),
           "--workdir", str(tmp_path / "work"), "--set", f"model.path={tiny_dir}", "rollout.max_new_tokens=6",
           "trainer.eval_max_new_tokens=6", "rollout.responses_per_prompt=2", "trainer.prompts_per_step=2",
           "trainer.mini_batch_prompts=2"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    runs = {r["variant"]: r for r in data["runs"]}
    assert set(runs) == {"base", "rlpr", "rlvr"}
    required = ["variant", "seed", "steps", "n_heldout", "acc_before", "acc_after", "greedy_before", "greedy_after",
                "reward_before", "reward_after", "pass8_before", "pass8_after"]
    for r in runs.values():
        assert all(k in r for k in required), set(required) - set(r)
        assert r["n_heldout"] == 6 and 0 <= r["acc_after"] <= r["pass8_after"] <= 1
    assert runs["rlpr"]["steps"] == 2 and [p["step"] for p in runs["rlpr"]["curve"]] == [0, 1]
    assert runs["rlvr"]["acc_before"] == runs["base"]["acc_before"]  # every run starts from the same base
    assert out.with_suffix(".png").stat().st_size > 10_000 and "| rlvr |" in out.with_suffix(".md").read_text()
    # a re-run finds every job done and only rewrites the summary
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "('rlpr', 0)" not in again.stdout
