"""The learning benchmark end to end, in a smoke setting on a tiny in-process model (the real
`--quick` run on the embedded model takes minutes; this checks the pipeline and its output): the
three main variants, the transfer sets, the saved responses, the grader version and --regrade."""

import gzip
import importlib
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlpr.grading import GRADER_VERSION

pytestmark = pytest.mark.integration

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning.py"
SETS = ("heldout", "new_items", "general")


def learnbench(name: str):
    """A module of the benchmark's package, imported as learning.py imports it (benchmarks/ on the path)."""
    spec = importlib.util.spec_from_file_location("bench_learning", BENCH)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return importlib.import_module(f"learnbench.{name}")


def records_of(out: Path, row: dict) -> list[dict]:
    with gzip.open(out.parent / row["responses"], "rt") as f:
        return [json.loads(line) for line in f]


def test_learning_benchmark_smoke(tiny_dir, tmp_path):
    out = tmp_path / "learning"
    cmd = [sys.executable, str(BENCH), "--quick", "--variants", "rlpr,rlvr", "--steps", "2",
           "--heldout", "6", "--transfer-questions", "3", "--curve-every", "1", "--curve-questions", "3",
           "--threads", "1", "--output", str(out), "--workdir", str(tmp_path / "work"), "--set",
           f"model.path={tiny_dir}", "rollout.max_new_tokens=6", "trainer.eval_max_new_tokens=6",
           "rollout.responses_per_prompt=2", "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["settings"]["grader_version"] == GRADER_VERSION
    runs = {r["variant"]: r for r in data["runs"]}
    assert set(runs) == {"base", "rlpr", "rlvr"}
    required = ["variant", "seed", "steps", "n_heldout", "acc_before", "acc_after", "greedy_before", "greedy_after",
                "reward_before", "reward_after", "pass8_before", "pass8_after", "grader_version", "responses"]
    required += [f"{s}_{k}_{w}" for s in SETS[1:] for k in ("acc", "greedy", "pass8") for w in ("before", "after")]
    for r in runs.values():
        assert all(k in r for k in required), set(required) - set(r)
        assert r["n_heldout"] == 6 and r["n_new_items"] == 3 and r["n_general"] == 3
        assert 0 <= r["acc_after"] <= r["pass8_after"] <= 1 and r["grader_version"] == GRADER_VERSION
        assert r["machine"]["cpu"] and r["machine"]["cpu_count"] and r["commit"] and r["date"]  # where it ran
        # the saved responses: every question of every set, graded as the row reports
        records = records_of(out, r)
        for s in SETS:
            chosen = [x for x in records if x["set"] == s]
            assert len(chosen) == {"heldout": 6}.get(s, 3)
            assert all(len(x["samples"]) == len(x["samples_correct"]) == 2 for x in chosen)
            prefix = "" if s == "heldout" else f"{s}_"
            assert r[f"{prefix}greedy_after"] == pytest.approx(sum(x["greedy_correct"] for x in chosen) / len(chosen))
            assert r[f"{prefix}acc_after"] == pytest.approx(
                sum(sum(x["samples_correct"]) / 2 for x in chosen) / len(chosen))
        assert {x["reference"] for x in records if x["set"] == "general"} and \
            all(x["reference"] in x["acceptable"] for x in records if x["set"] != "heldout")
    assert runs["rlpr"]["steps"] == 2 and [p["step"] for p in runs["rlpr"]["curve"]] == [0, 1]
    # issue 61: a row counts every response its training generated, and its curve points say how many so far
    for v in ("rlpr", "rlvr"):
        train = runs[v]["train"]
        assert runs[v]["rollouts"] == sum(t["rollout/responses"] for t in train) == train[-1]["rollout/responses_total"]
        assert runs[v]["rollouts"] >= 2 * 2 * 2 and 0 < runs[v]["wall_s"] < runs[v]["seconds"]
        assert [p["rollouts"] for p in runs[v]["curve"]] == [0, train[0]["rollout/responses_total"]]
        assert all(t["policy/groups"] <= t["filter/generated_groups"] for t in train)
    compared = subprocess.run([sys.executable, str(BENCH.with_name("early_learning.py")), "compare", "--rows",
                               str(out.with_suffix(".jsonl")), "--output", str(tmp_path / "early")],
                              capture_output=True, text=True, timeout=300)
    assert compared.returncode == 0, compared.stderr[-3000:]
    comparison = json.loads((tmp_path / "early.json").read_text())["comparison"]
    assert set(comparison["variants"]) == {"rlpr", "rlvr"}
    assert comparison["budget_rollouts"] == min(runs[v]["rollouts"] for v in ("rlpr", "rlvr"))
    assert comparison["variants"]["rlpr"]["steps"] == pytest.approx(runs["rlpr"]["acc_after"])
    assert "| rlvr | 1 |" in (tmp_path / "early.md").read_text()
    # evaluation schedule 2: only the final held-out set is scored; transfer sets and curve points graded only
    assert runs["rlpr"]["eval_schedule"] == 2 and runs["rlpr"]["eval_s"] > 0
    assert all("reward_curve" not in p and 0 <= p["acc_curve"] <= 1 for p in runs["rlpr"]["curve"])
    assert runs["rlpr"]["reward_after"] is not None and "general_reward_after" not in runs["rlpr"]
    for v in ("rlpr", "rlvr"):  # every run starts from the same base, on every set
        assert all(runs[v][f"{p}acc_before"] == runs["base"][f"{p}acc_before"] for p in ("", "new_items_", "general_"))
    md = out.with_suffix(".md").read_text()
    assert f"Rows' machines: {runs['rlpr']['machine']['cpu']} (3 rows)" in md
    assert "| rlvr |" in md and "general questions (3 q) Avg@k" in md and "grader version" in md
    assert out.with_suffix(".png").stat().st_size > 10_000
    # a re-run finds every job done and only rewrites the summary
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "('rlpr', 0)" not in again.stdout
    # a worker killed mid-run (its claim names a process that has ended, no row): the next run takes
    # the job over and runs it from its start; the finished rows stay as they were
    log = out.with_suffix(".jsonl")
    kept = [line for line in log.read_text().splitlines() if json.loads(line)["variant"] != "rlvr"]
    log.write_text("".join(line + "\n" for line in kept))
    claim = next((tmp_path / "work" / "claims").glob("rlvr-0-*"))
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    claim.write_text(json.dumps({**json.loads(claim.read_text()), "pid": ended.pid}))
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"taking over {claim.name}" in resumed.stdout and "('rlvr', 0)" in resumed.stdout
    assert "('rlpr', 0)" not in resumed.stdout
    lines = log.read_text().splitlines()
    assert lines[:len(kept)] == kept and json.loads(lines[-1])["variant"] == "rlvr" and len(lines) == 3

    # rows graded by another grader version are never mixed with new ones ...
    original = [json.loads(line) for line in log.read_text().splitlines()]
    old = []
    for r in original:
        r = json.loads(json.dumps(r))
        r["grader_version"] = r["settings"]["grader_version"] = GRADER_VERSION - 1
        r["acc_after"] = r["general_greedy_after"] = -1.0  # numbers an older grader gave
        old.append(r)
    log.write_text("".join(json.dumps(r) + "\n" for r in old))
    report = subprocess.run(cmd + ["--report"], capture_output=True, text=True, timeout=300)
    assert report.returncode == 0
    assert f"skipping 3 rows graded with grader version {GRADER_VERSION - 1}" in report.stdout
    assert json.loads(out.with_suffix(".json").read_text())["runs"] == []
    # a worker of the older version still running (a claim, no row) would wait forever for a base
    # row the re-grade moves to the new version: --regrade refuses, naming the claim
    running = tmp_path / "work" / "claims" / f"rlpr-7-{learnbench('records').settings_hash(old[0]['settings'])}"
    running.touch()  # a claim from before claims named their worker: taken to be alive
    refused = subprocess.run(cmd + ["--regrade"], capture_output=True, text=True, timeout=300)
    assert refused.returncode != 0 and f"({running.name} in" in refused.stderr
    assert [json.loads(line) for line in log.read_text().splitlines()] == old  # nothing re-graded
    running.unlink()
    # ... and --regrade re-grades their saved responses with the current grader, without training
    regraded = subprocess.run(cmd + ["--regrade"], capture_output=True, text=True, timeout=300)
    assert regraded.returncode == 0, regraded.stderr[-3000:]
    assert "3 rows re-graded" in regraded.stdout and "('rlpr', 0)" not in regraded.stdout
    rows = {r["variant"]: r for r in json.loads(out.with_suffix(".json").read_text())["runs"]}
    for r in original:
        new = rows[r["variant"]]
        assert new["grader_version"] == GRADER_VERSION and new["regraded_from"] == GRADER_VERSION - 1
        for key in ("acc_after", "acc_before", "general_greedy_after", "new_items_pass8_after", "greedy_after"):
            assert new[key] == pytest.approx(r[key]), (r["variant"], key)  # the same grader: the same numbers
        assert [p["acc_curve"] for p in new["curve"]] == pytest.approx([p["acc_curve"] for p in r["curve"]])

    # a longer run (other settings: --steps 3; one variant is enough) reuses the base row instead of
    # evaluating the base again
    main_summary = out.with_suffix(".json").read_text()
    longer_cmd = [*cmd[:cmd.index("--steps")], "--steps", "3", *cmd[cmd.index("--steps") + 2:], "--summary",
                  str(tmp_path / "long")]
    longer_cmd[longer_cmd.index("--variants") + 1] = "rlpr"
    longer = subprocess.run(longer_cmd, capture_output=True, text=True, timeout=600)
    assert longer.returncode == 0, longer.stderr[-3000:]
    # ... into a summary of its own: the 2-step summary is untouched
    assert out.with_suffix(".json").read_text() == main_summary
    assert json.loads((tmp_path / "long.json").read_text())["settings"]["steps"] == 3
    assert "('base', None)" not in longer.stdout and "('rlpr', 0)" in longer.stdout
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    base3 = [r for r in rows if r["variant"] == "base" and r["settings"]["steps"] == 3]
    assert len(base3) == 1 and base3[0]["reused_from_steps"] == 2
    assert base3[0]["acc_before"] == rows_base(rows, 2)["acc_before"]
    rlpr3 = next(r for r in rows if r["variant"] == "rlpr" and r["settings"]["steps"] == 3)
    assert rlpr3["acc_before"] == base3[0]["acc_before"] and rlpr3["steps"] == 3


def rows_base(rows: list[dict], steps: int) -> dict:
    return next(r for r in rows if r["variant"] == "base" and r["settings"]["steps"] == steps
                and r["grader_version"] == GRADER_VERSION)


def test_controls_verdict_by_hand():
    """RLPR minus the best control, in standard errors of the difference (binomial over the questions
    plus each mean's seed spread)."""
    import math

    learning = learnbench("tables")
    base = {"n_heldout": 100, "acc_before": 0.2, "greedy_before": 0.4, "pass8_before": 0.5}
    entry = lambda v, acc, sd, seeds: {"variant": v, "seeds": list(range(seeds)), "acc_after": acc,  # noqa: E731
                                       "acc_after_sd": sd, "greedy_after": acc, "greedy_after_sd": sd,
                                       "pass8_after": acc, "pass8_after_sd": sd, "len_after": 10.0}
    table = [entry("rlpr", 0.5, 0.02, 3), entry("random", 0.3, 0.0, 1), entry("entropy", 0.4, 0.04, 2)]
    rows, text = learning.controls_verdict(table, base)
    first = rows[0]
    assert first["best_control"] == "entropy" and math.isclose(first["net"], 0.1)
    se = math.sqrt(0.5 * 0.5 / 100 + 0.02 ** 2 / 3 + 0.4 * 0.6 / 100 + 0.04 ** 2 / 2)
    assert math.isclose(first["net_se"], 0.1 / se)
    assert [r["metric"] for r in rows] == ["Avg@8", "greedy", "pass@8"]
    assert "RLPR - best control" in text and "+10.0 (entropy;" in text
    assert learning.controls_verdict([entry("rlpr", 0.5, 0.0, 1)], base) == ([], "")


def test_budget_reads_curves_at_equal_rollouts():
    """Issue 61's comparison by hand: a curve is read linearly in rollouts at the fewest rollouts any run
    generated; each variant's mean carries the seeds' spread and the binomial error over its questions."""
    import math

    budget = learnbench("budget")
    points = [(0, 0.2), (100, 0.4), (300, 0.5)]
    assert budget.read_at(points, 50) == pytest.approx(0.3) and budget.read_at(points, 200) == pytest.approx(0.45)
    assert math.isnan(budget.read_at(points, 301))
    # the final evaluation joins the curve on the curve's questions only
    records = [{"set": "curve", "uid": "a", "step": 1}, {"set": "heldout", "uid": "a", "greedy_correct": 1,
                                                           "samples": ["x", "y"], "samples_correct": [1, 0]},
               {"set": "heldout", "uid": "b", "greedy_correct": 0, "samples": ["x", "y"], "samples_correct": [0, 0]}]
    row = {"rollouts": 300, "curve": [{"step": 0, "rollouts": 0, "acc_curve": 0.25},
                                      {"step": 1, "rollouts": 150, "acc_curve": 0.25}]}
    assert budget.curve(row, records) == [(0, 0.25), (150, 0.25), (300, 0.5)]
    assert budget.curve({"rollouts": None, "curve": row["curve"]}, records) == []  # a row from before issue 61
    runs = [{"variant": "rlpr", "seed": s, "steps": 20, "acc_after": a, "n_heldout": 100, "rollouts": 300,
             "wall_s": 10.0, "curve_points": points, "n_curve": 50} for s, a in ((0, 0.4), (1, 0.6))]
    runs.append({"variant": "fill", "seed": 0, "steps": 20, "acc_after": 0.7, "n_heldout": 100, "rollouts": 600,
                 "wall_s": 20.0, "curve_points": [(0, 0.2), (600, 0.8)], "n_curve": 50})
    result = budget.compare(runs)
    assert result["budget_rollouts"] == 300
    rlpr, fill = result["variants"]["rlpr"], result["variants"]["fill"]
    assert rlpr["steps"] == pytest.approx(0.5) and rlpr["budget"] == pytest.approx(0.5)
    assert rlpr["steps_se"] == pytest.approx(math.sqrt(0.1 ** 2 + 0.25 / 100))  # sd 0.1414 / sqrt(2) = 0.1
    assert fill["budget"] == pytest.approx(0.5) and fill["budget_diff"] == pytest.approx(0.0)
    assert fill["steps_diff"] == pytest.approx(0.2)
    assert fill["steps_diff_in_se"] == pytest.approx(0.2 / math.hypot(fill["steps_se"], rlpr["steps_se"]))
    assert "| fill | 1 | 600 | 20 | 70.0 +- 4.6 | +20.0 (+1.7) | 50.0 +- 7.1 | +0.0 (+0.0) |" in budget.markdown(result)


def test_the_longer_comparison_takes_rows_without_rollouts_and_only_their_setting():
    """Issue 61's 60-step check sets the best RLPR setting beside RLPR and self-certainty rows that came
    before rollouts were recorded: equal steps only, their rollouts and wall time n/a; the learning
    benchmark's .jsonl also holds other presets, models, lengths and grader versions, which stay out."""
    import importlib.util

    from rlpr.grading import GRADER_VERSION

    budget = learnbench("budget")
    spec = importlib.util.spec_from_file_location("early_learning", BENCH.with_name("early_learning.py"))
    early = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(early)
    keep = early.longer_rows(60, ["rlpr", "rlpr_lr2x"])
    small = {"preset": "small", "set": [], "grader_version": GRADER_VERSION}
    assert keep({"variant": "rlpr", "steps": 60, "settings": small})
    assert not keep({"variant": "rlpr", "steps": 20, "settings": small})
    assert not keep({"variant": "self_certainty", "steps": 60, "settings": small})
    assert not keep({"variant": "rlpr", "steps": 60, "settings": small | {"model": "gemma"}})
    assert not keep({"variant": "rlpr", "steps": 60, "settings": small | {"preset": "reasoning"}})
    assert not keep({"variant": "rlpr", "steps": 60, "settings": small | {"grader_version": GRADER_VERSION - 1}})
    runs = [{"variant": "rlpr", "seed": s, "steps": 60, "acc_after": a, "n_heldout": 100, "rollouts": None,
             "wall_s": None, "curve_points": [], "n_curve": 0} for s, a in ((0, 0.5), (1, 0.5))]
    runs.append({"variant": "rlpr_lr2x", "seed": 0, "steps": 60, "acc_after": 0.6, "n_heldout": 100, "rollouts": 3000,
                 "wall_s": 900.0, "curve_points": [], "n_curve": 0})
    result = budget.compare(runs)
    assert result["budget_rollouts"] is None and result["variants"]["rlpr"]["rollouts"] is None
    lr2x = result["variants"]["rlpr_lr2x"]
    assert lr2x["steps_diff"] == pytest.approx(0.1) and "budget" not in lr2x
    lines = budget.markdown(result)
    assert "| rlpr | 2 | n/a | n/a | 50.0 +- 5.0 |  | n/a | n/a |" in lines and "at equal rollouts" in lines[0]
    assert "| rlpr_lr2x | 1 | 3000 | 900 | 60.0 +- 4.9 | +10.0 (+1.4) | n/a | n/a |" in lines
