"""`rlpr reward-quality`: AUC with ties, mixed-group filtering, the group bootstrap, end to end."""

from __future__ import annotations

import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpr.evaluation.reward_quality import (
    auc_report,
    bootstrap_ci,
    mean_group_auc,
    mixed_groups,
    percentile,
    pooled_auc,
    roc_auc,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("scores, labels, expected", [
    ([0.1, 0.4, 0.35, 0.8], [False, False, True, True], 0.75),  # 3 of 4 pairs ordered
    ([1, 1, 2, 2, 3], [False, True, False, True, True], 4 / 6),  # two ties count 1/2 each
    ([5, 5, 5, 5], [True, False, True, False], 0.5),  # all tied
    ([0.2, 0.9], [False, True], 1.0),
    ([0.9, 0.2, 0.5], [False, True, True], 0.0),
    ([0.3, 0.3, 0.1], [True, False, False], 0.75),  # (1/2 + 1) / 2
])
def test_roc_auc_hand_computed(scores, labels, expected):
    assert roc_auc(scores, labels) == pytest.approx(expected)


def test_roc_auc_needs_both_classes():
    assert roc_auc([0.1, 0.2], [True, True]) is None
    assert roc_auc([0.1, 0.2], [False, False]) is None
    assert roc_auc([], []) is None


def _brute_force_auc(scores, labels):
    pos = [s for s, y in zip(scores, labels) if y]
    neg = [s for s, y in zip(scores, labels) if not y]
    return sum((p > n) + 0.5 * (p == n) for p in pos for n in neg) / (len(pos) * len(neg))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=2, max_size=30))
def test_roc_auc_matches_pair_counting(rows):
    scores, labels = [float(s) for s, _ in rows], [y for _, y in rows]
    if all(labels) or not any(labels):
        assert roc_auc(scores, labels) is None
    else:
        assert roc_auc(scores, labels) == pytest.approx(_brute_force_auc(scores, labels))


def test_mixed_groups_keep_only_groups_with_both_labels():
    groups = ["a", "a", "b", "b", "c", "a", "d", "d"]
    labels = [True, False, True, True, False, True, False, True]
    assert mixed_groups(groups, labels) == {"a": [0, 1, 5], "d": [6, 7]}


def test_pooled_and_within_group_auc_differ():
    """Within each prompt the score ranks perfectly, but across prompts the easy prompt's wrong
    answer outscores the hard prompt's right one: pooled AUC 3/4, within-group 1."""
    scores = [0.9, 0.8, 0.3, 0.2, 0.5]
    labels = [True, False, True, False, True]
    groups = ["easy", "easy", "hard", "hard", "all-right"]
    rows = list(mixed_groups(groups, labels).values())
    assert rows == [[0, 1], [2, 3]]
    assert pooled_auc(scores, labels, rows) == pytest.approx(0.75)
    assert mean_group_auc(scores, labels, rows) == pytest.approx(1.0)


def test_percentile():
    assert percentile([3, 1, 2], 0.5) == 2
    assert percentile([0, 10], 0.25) == pytest.approx(2.5)
    assert percentile([4], 0.975) == 4


def _noisy_groups(n_groups=30, size=6, seed=1):
    rng = random.Random(seed)
    scores, labels, groups = [], [], []
    for g in range(n_groups):
        offset = rng.random()  # prompt difficulty shifts every score of the group
        for _ in range(size):
            y = rng.random() < 0.5
            scores.append(offset + (0.6 if y else 0.0) + rng.gauss(0, 0.3))
            labels.append(y)
            groups.append(g)
    return scores, labels, groups


def test_bootstrap_ci_contains_the_point_estimate_and_is_deterministic():
    scores, labels, groups = _noisy_groups()
    report = auc_report({"s": scores}, labels, groups, n_boot=300, seed=0)
    s = report["scores"]["s"]
    assert 0.5 < s["auc"] < 1.0
    lo, hi = s["auc_ci"]
    assert lo < s["auc"] < hi and hi - lo < 0.3
    lo, hi = s["mean_group_auc_ci"]
    assert lo < s["mean_group_auc"] < hi
    again = auc_report({"s": scores}, labels, groups, n_boot=300, seed=0)["scores"]["s"]
    assert again == s
    assert report["n_mixed_groups"] == len(mixed_groups(groups, labels))


def test_bootstrap_ci_edge_cases():
    assert bootstrap_ci(lambda picked: 1.0, 5, n_boot=0) is None
    assert bootstrap_ci(lambda picked: 1.0, 0, n_boot=10) is None
    assert bootstrap_ci(lambda picked: None, 3, n_boot=10) is None
    assert bootstrap_ci(lambda picked: 0.5, 3, n_boot=10) == (0.5, 0.5)


# --------------------------------------------------------------------------- end to end

THINK = "<think>The capital is well known.</think> "


def _labeled_rows():
    rows = []
    for q, right, wrong in (("Capital of France?", "Paris", "Lyon"), ("Capital of Italy?", "Rome", "Milan"),
                            ("Capital of Spain?", "Madrid", "Seville")):
        prompt = q if q != "Capital of Italy?" else [{"role": "user", "content": q}]
        rows += [
            {"prompt": prompt, "response": f"{THINK}<answer>{right}</answer>", "reference": right, "correct": True},
            {"prompt": prompt, "response": f"{THINK}<answer>{wrong}</answer>", "reference": right, "correct": False},
            {"prompt": prompt, "response": f"no tags, it is {wrong}", "reference": right, "correct": False},
        ]
    rows.append({"prompt": "2+2?", "response": f"{THINK}<answer>4</answer>", "reference": "4", "correct": True,
                 "group": "all-right", "ability": "math"})
    return rows


@pytest.fixture
def model_dir(tmp_path, tiny_model, tokenizer):
    d = tmp_path / "tiny"
    tiny_model.save_pretrained(d)
    tokenizer.save_pretrained(d)
    return str(d)


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_reward_quality_end_to_end(tmp_path, model_dir, capsys):
    from rlpr.cli.main import main
    from rlpr.evaluation.reward_quality import VARIANTS

    labeled = _write_jsonl(tmp_path / "labeled.jsonl", _labeled_rows())
    for fallback in ("none", "free"):
        out = tmp_path / f"rq_{fallback}"
        assert main(["reward-quality", "--input", labeled, "--model", model_dir, "--output", str(out),
                     "--bootstrap", "50", "--fallback", fallback]) == 0
        report = json.loads((out / "reward_quality.json").read_text())
        assert (report["n_rows"], report["n_groups"], report["n_mixed_groups"], report["n_mixed_rows"]) == (10, 4, 3, 9)
        assert list(report["scores"]) == list(VARIANTS) and report["baseline"] == "reward"
        assert {"B:mean_prob", "B:mean_logprob", "B:sum_logprob", "B:seq_likelihood", "B:r3", "B-A:mean_prob",
                "verifree", "nover:rank", "nover:rank+efficiency", "nover:-perplexity", "verifier"} <= set(VARIANTS)
        assert report["scores"]["verifier"]["auc"] == 1.0  # the rule grader agrees with these labels
        assert report["scores"]["verifier"]["mean_group_auc"] == 1.0 and report["labels_are_rule_verdicts"]
        for name, s in report["scores"].items():
            assert 0.0 <= s["auc"] <= 1.0 and len(s["auc_ci"]) == 2
            if name != "reward":
                assert s["auc_diff"] == pytest.approx(s["auc"] - report["scores"]["reward"]["auc"])
                lo, hi = s["mean_group_auc_diff_ci"]
                assert lo <= hi
        scores = [json.loads(line) for line in (out / "scores.jsonl").read_text().splitlines()]
        assert len(scores) == 10
        for row in scores:
            if row["B:mean_prob"] is not None:
                assert row["B-A:mean_prob"] == pytest.approx(row["B:mean_prob"] - row["score_a"])
                assert 0.0 <= row["B:seq_likelihood"] <= row["B:mean_prob"] + 1e-9 <= 1.0 + 1e-9
        tagless = [r for r in scores if r["response"].startswith("no tags")]
        assert all(r["nover:rank"] == 0.0 and r["nover:-perplexity"] is None for r in tagless)  # the gate
        if fallback == "none":  # unscored: null in the file, below every scored row in the AUC
            assert all(r["B:mean_prob"] is None and r["B-A:sum_logprob"] is None for r in tagless)
        else:
            assert all(r["B:mean_prob"] > 0.0 for r in tagless)
        text = (out / "reward_quality.md").read_text()
        assert "| rule verifier | 1.000 |" in text and "by construction" in text
    assert "verifier: AUC 1.000, within-group 1.000" in capsys.readouterr().out


def _scored(tmp_path, tiny_model, tokenizer, cfg):
    from rlpr.evaluation.reward_quality import read_labeled, score_rows

    rows = read_labeled(_write_jsonl(tmp_path / "labeled.jsonl", _labeled_rows()))
    prompts = [tokenizer.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True) for r in rows]
    return rows, prompts, score_rows(tiny_model, tokenizer, rows, cfg, batch_rows=4)


@pytest.mark.parametrize("overrides", [
    {}, {"invalid_fallback": "free"}, {"invalid_fallback": "free", "score_a_form": "prompt"},
    {"aggregation": "sum_logprob", "invalid_fallback": "free", "shaping": "identity"},
    {"kind": "nover", "debias": False}, {"kind": "nover", "debias": False, "efficiency_weight": 1.0},
    {"kind": "verifier"}, {"kind": "hybrid", "invalid_fallback": "free"}, {"debias": False, "alpha": 0.3},
    {"aggregation": "r3", "debias": False, "invalid_fallback": "free", "shaping": "identity"},
    {"score_span": "block", "aggregation": "seq_likelihood", "debias": False, "shaping": "identity",
     "invalid_fallback": "free"}])
def test_configured_reward_is_the_trainers_reward(tmp_path, tiny_model, tokenizer, overrides):
    """The `reward` row, computed from the one pass's log-probs, equals ProbabilityReward.__call__
    with the rule verdicts and the file's groups (what `rlpr train` computes)."""
    from rlpr.config import RewardConfig
    from rlpr.evaluation.reward_quality import configured_reward
    from rlpr.reward.probability_reward import ProbabilityReward

    cfg = RewardConfig(**overrides)
    rows, prompts, scored = _scored(tmp_path, tiny_model, tokenizer, cfg)
    want = ProbabilityReward(cfg, tokenizer, max_length=2048)(
        tiny_model, prompts, [r["response"] for r in rows], [r["reference"] for r in rows],
        correct=scored.verdicts, groups=scored.groups)
    assert configured_reward(scored) == pytest.approx([o.reward for o in want], rel=1e-5, abs=1e-7)
    assert len({round(o.reward, 6) for o in want}) > 1  # not a constant column


def test_every_variant_against_a_hand_computation(tmp_path, tiny_model, tokenizer):
    import math

    from rlpr.config import RewardConfig
    from rlpr.evaluation.reward_quality import auc_report, variant_columns
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.reward.scoring import reference_logprobs

    cfg = RewardConfig(invalid_fallback="free")
    rows, prompts, scored = _scored(tmp_path, tiny_model, tokenizer, cfg)
    columns = variant_columns(scored)
    reward = ProbabilityReward(cfg, tokenizer)
    formulas = {"mean_prob": lambda lp: sum(math.exp(x) for x in lp) / len(lp),
                "mean_logprob": lambda lp: sum(lp) / len(lp), "sum_logprob": sum,
                "seq_likelihood": lambda lp: math.exp(sum(lp)), "geo_mean_prob": lambda lp: math.exp(sum(lp) / len(lp))}
    for i, (row, prompt) in enumerate(zip(rows, prompts)):
        item = reward.score_b_text(prompt, row["response"], row["reference"])
        [b] = reference_logprobs(tiny_model, tokenizer, [item])
        [a] = reference_logprobs(tiny_model, tokenizer, [reward.score_a_text(prompt, row["reference"], item.fallback)])
        for how, f in formulas.items():
            fb, fa = f(b.tolist()), f(a.tolist())
            assert columns[f"B:{how}"][i] == pytest.approx(fb, rel=1e-5), (how, i)
            assert columns[f"B-A:{how}"][i] == pytest.approx(fb - fa, abs=1e-5 * (abs(fb) + abs(fa))), (how, i)
        assert columns["verifier"][i] == float(row["correct"])  # these labels are the rule's verdicts
        block = ProbabilityReward(RewardConfig(invalid_fallback="free", score_span="block"), tokenizer)
        [blk] = reference_logprobs(tiny_model, tokenizer, [block.score_b_text(prompt, row["response"], row["reference"])])
        assert blk.numel() > b.numel()  # the tags too
        assert columns["verifree"][i] == pytest.approx(math.exp(blk.sum().item()), rel=1e-5)
    r3 = ProbabilityReward(RewardConfig(aggregation="r3", debias=False, invalid_fallback="free"), tokenizer)(
        tiny_model, prompts, [r["response"] for r in rows], [r["reference"] for r in rows], groups=scored.groups)
    assert columns["B:r3"] == pytest.approx([o.score_b for o in r3], rel=1e-5)  # tests/test_r3.py checks R3
    nover = ProbabilityReward(RewardConfig(kind="nover", debias=False, invalid_fallback="free"), tokenizer)(
        tiny_model, prompts, [r["response"] for r in rows], [r["reference"] for r in rows], groups=scored.groups)
    assert columns["nover:rank"] == pytest.approx([o.delta for o in nover])
    assert [p is None for p in columns["nover:-perplexity"]] == [o.perplexity is None for o in nover]
    assert [-p for p in columns["nover:-perplexity"] if p is not None] == \
        pytest.approx([o.perplexity for o in nover if o.perplexity is not None])
    # the within-group AUC of one column, by pair counting over the mixed groups
    labels = [r["correct"] for r in rows]
    report = auc_report({"s": columns["B:sum_logprob"]}, labels, scored.groups, n_boot=0)
    groups = mixed_groups(scored.groups, labels)
    by_hand = [_brute_force_auc([columns["B:sum_logprob"][i] for i in idx], [labels[i] for i in idx])
               for idx in groups.values()]
    assert report["scores"]["s"]["mean_group_auc"] == pytest.approx(sum(by_hand) / len(by_hand))


def test_paired_bootstrap_differences():
    scores, labels, groups = _noisy_groups()
    noisier = [s + random.Random(i).gauss(0, 1.0) for i, s in enumerate(scores)]
    report = auc_report({"base": scores, "same": list(scores), "noisy": noisier}, labels, groups,
                        n_boot=200, seed=3, baseline="base")
    same, noisy, base = (report["scores"][k] for k in ("same", "noisy", "base"))
    assert "auc_diff" not in base
    assert same["auc_diff"] == 0.0 and same["auc_diff_ci"] == (0.0, 0.0)  # paired: identical resamples
    assert same["mean_group_auc_diff_ci"] == (0.0, 0.0)
    assert noisy["auc_diff"] == pytest.approx(noisy["auc"] - base["auc"]) and noisy["auc_diff"] < 0
    lo, hi = noisy["auc_diff_ci"]
    assert lo <= noisy["auc_diff"] <= hi and hi < 0  # more noise: reliably worse
    assert report == auc_report({"base": scores, "same": list(scores), "noisy": noisier}, labels, groups,
                                n_boot=200, seed=3, baseline="base")  # seeded


def test_reward_quality_row_errors_are_one_line(tmp_path, capsys):
    from rlpr.cli.main import main

    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "q", "response": "r", "reference": "x", "correct": True},
                                                 {"prompt": "q", "response": "r", "reference": "x", "correct": "yes"}])
    assert main(["reward-quality", "--input", bad, "--model", str(tmp_path / "none"), "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()  # rows are checked before the (missing) model is loaded
    assert err == f"rlpr: error: {bad}: row 2: field 'correct' must be true or false"
    from rlpr.errors import DataError
    from rlpr.evaluation.reward_quality import read_labeled

    with pytest.raises(DataError, match=r"row 1: field 'prompt\[0\]' must be an object with string 'role' and 'content'"):
        read_labeled(_write_jsonl(tmp_path / "b2.jsonl", [{"prompt": [{"role": "user"}], "response": "",
                                                           "reference": "x", "correct": False}]))
    with pytest.raises(DataError, match=r"row 1: field 'reference' is empty"):
        read_labeled(_write_jsonl(tmp_path / "b3.jsonl", [{"prompt": "q", "response": "", "reference": " ",
                                                           "correct": False}]))


def test_build_from_then_score(tmp_path, model_dir):
    from rlpr.cli.main import main

    data = _write_jsonl(tmp_path / "caps.jsonl", [{"question": f"Capital number {i}?", "answer": "Paris"}
                                                   for i in range(3)])
    labeled = tmp_path / "labeled.jsonl"
    assert main(["reward-quality", "--build-from", data, "--samples", "2", "--limit", "2", "--model", model_dir,
                 "--max-new-tokens", "5", "--output", str(labeled)]) == 0
    rows = [json.loads(line) for line in labeled.read_text().splitlines()]
    assert len(rows) == 4 and [r["group"] for r in rows] == ["0", "0", "1", "1"]
    assert all(isinstance(r["correct"], bool) and r["reference"] == "Paris" for r in rows)
    assert isinstance(rows[0]["prompt"], list)
    out = tmp_path / "rq"
    assert main(["reward-quality", "--input", str(labeled), "--model", model_dir, "--output", str(out),
                 "--bootstrap", "10"]) == 0
    report = json.loads((out / "reward_quality.json").read_text())
    assert report["n_rows"] == 4
    if report["n_mixed_groups"] == 0:  # a random tiny model is never right
        assert report["scores"]["reward"]["auc"] is None
        assert "n/a" in (out / "reward_quality.md").read_text()


def test_group_chunks_keep_a_group_together():
    from rlpr.evaluation.reward_quality import _group_chunks

    assert _group_chunks(["a", "b", "a", "c", "c", "d"], 2) == [[0, 2], [1, 3, 4], [5]]
    assert _group_chunks(["a"] * 3, 64) == [[0, 1, 2]]
