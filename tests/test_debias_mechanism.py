"""The debiasing experiment (issue 28): the learning benchmark's `reinforce` variants are valid configs
that differ only in reward.debias, and benchmarks/debias_mechanism.py's separation statistics
against hand-computed values (derivations in the comments)."""

import importlib
import importlib.util
import json
from pathlib import Path

import pytest

from rlpr.config import load_config

pytestmark = pytest.mark.unit

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def module(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reinforce_variants_are_tail_variants_that_differ_only_in_debias():
    module("learning")  # puts benchmarks/ on the path, as running it does
    variants = importlib.import_module("learnbench.variants")
    with_a, without = variants.VARIANTS["reinforce"], variants.VARIANTS["reinforce_no_debias"]
    assert set(without) - set(with_a) == {"reward.debias=false"} and set(with_a) <= set(without)
    assert not {"reinforce", "reinforce_no_debias"} & set(variants.MAIN_VARIANTS)
    for overrides, debias in ((with_a, True), (without, False)):
        cfg = load_config("small", overrides)  # validated as the benchmark loads it
        assert cfg.algorithm.advantage == "reinforce" and cfg.reward.debias is debias
        # everything else is the preset's (the rlpr variant): the std filter stays on
        assert cfg.algorithm.std_filter == load_config("small", []).algorithm.std_filter


def row(batch, group, b, a, correct):
    return {"batch": batch, "group": group, "b": b, "a": a, "reward": max(0.0, b - a), "correct": correct}


def test_separation_hand_values():
    # batch 1: X (A 0.5, B 0.75 right / 0.5 wrong), Y (A 0, B 0.25 right / 0.125 wrong);
    # batch 2: Z (A 0.5, B 0.375 right / 0.25 wrong: both below A, clipped to 0)
    rows = [row(1, "X", 0.75, 0.5, True), row(1, "X", 0.5, 0.5, False),
            row(1, "Y", 0.25, 0.0, True), row(1, "Y", 0.125, 0.0, False),
            row(2, "Z", 0.375, 0.5, True), row(2, "Z", 0.25, 0.5, False)]
    s = module("debias_mechanism").separation(rows, n_boot=20)["scores"]
    # within each group the right response is above the wrong one by B and by B - A: 1, 1, 1;
    # the clipped reward ties Z's pair at 0 (AUC 0.5): (1 + 1 + 0.5) / 3
    assert s["B"]["mean_group_auc"] == s["B - A"]["mean_group_auc"] == 1.0
    assert s["reward (trained)"]["mean_group_auc"] == pytest.approx(2.5 / 3)
    # pooled, B: right {0.75, 0.25, 0.375} against wrong {0.5, 0.125, 0.25}: 0.75 beats 3; 0.25 beats
    # 0.125 and ties 0.25 (1.5); 0.375 beats 0.125 and 0.25 (2): 6.5 / 9.
    # B - A: right {0.25, 0.25, -0.125} against wrong {0, 0.125, -0.25}: 3 + 3 + 1 = 7 / 9
    assert s["B"]["auc"] == pytest.approx(6.5 / 9) and s["B - A"]["auc"] == pytest.approx(7 / 9)
    assert s["B - A"]["auc_diff"] == pytest.approx(0.5 / 9)
    # per batch: batch 1, B: right {0.75, 0.25} against wrong {0.5, 0.125}: 3 of 4; B - A: 4 of 4;
    # batch 2: 1 for both; means 0.875 and 1.0
    assert s["B"]["batch_auc"] == pytest.approx(0.875) and s["B - A"]["batch_auc"] == pytest.approx(1.0)
    assert s["B - A"]["batch_auc_diff"] == pytest.approx(0.125)


def test_separation_clip_statistics():
    rows = [row(1, "X", 0.75, 0.5, True), row(1, "X", 0.5, 0.5, False),
            row(1, "Y", 0.25, 0.0, True), row(1, "Y", 0.125, 0.0, False),
            row(2, "Z", 0.375, 0.5, True), row(2, "Z", 0.25, 0.5, False)]
    c = module("debias_mechanism").separation(rows, n_boot=0)["clip"]
    # B <= A: X's wrong response (0.5 <= 0.5) and both of Z's: 3 of 6; right 1 of 3, wrong 2 of 3
    assert c["responses_b_at_most_a"] == 0.5
    assert c["correct_b_at_most_a"] == pytest.approx(1 / 3) and c["wrong_b_at_most_a"] == pytest.approx(2 / 3)
    # Z is all clipped; no group has equal B's
    assert c["groups_all_clipped"] == pytest.approx(1 / 3) and c["groups_zero_std_b"] == 0.0
    assert c["mean_a"] == pytest.approx(1 / 3)  # per prompt: (0.5 + 0 + 0.5) / 3


def test_samples_are_read_once_and_runs_without_a_skipped(tmp_path):
    def write(folder, step, lines):
        path = tmp_path / folder / "samples"
        path.mkdir(parents=True, exist_ok=True)
        (path / f"step_{step:06d}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    def sample(prompt, response, b, a, correct):
        return {"prompt": prompt, "response": response, "score_b": b, "score_a": a, "reward": max(0.0, b - a),
                "correct": correct}

    group = [sample("P", "yes", 0.5, 0.25, 1.0), sample("P", "no", 0.125, 0.25, 0.0)]
    write("run-a", 1, group)
    write("run-b", 1, group)  # the same group again (same seed and settings): read once
    write("run-b", 2, [sample("Q", "x", 0.5, 0.25, 0.0), sample("Q", "y", 0.25, 0.25, None)])  # ungraded: left out
    write("run-c", 1, [sample("P", "yes", 0.5, 0.0, 1.0), sample("P", "no", 0.125, 0.0, 0.0)])  # no score A
    rows, info = module("debias_mechanism").read_samples([str(tmp_path / "*" / "samples")])
    assert [(r["group"][1:], r["b"], r["correct"]) for r in rows] == [
        (("step_000001", "P"), 0.5, True), (("step_000001", "P"), 0.125, False), (("step_000002", "Q"), 0.5, False)]
    assert info["files"] == 3 and info["files_without_a"] == 1 and info["duplicate_groups"] == 1
