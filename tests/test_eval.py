"""`rlpr eval`: Avg@k arithmetic, benchmark summaries, and an end-to-end run with a tiny model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import ScriptedEngine, write_eval_data as _write_data
from rlpr.config import RolloutConfig
from rlpr.evaluation.metrics import avg_at_k, binomial_se
from rlpr.evaluation.benchmark import (
    Sample,
    apply_judge,
    benchmark_result,
    evaluate_files,
    results_table,
    samples_from_name,
    summary_means,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("name, k", [
    ("aime24_Avg16.parquet", 16), ("data/gpqa_diamond_Avg4.jsonl", 4), ("minerva_avg2.json", 2),
    ("math500.parquet", None), ("x_Avg0.jsonl", None), ("Avg4_math.jsonl", None),
])
def test_samples_from_name(name, k):
    assert samples_from_name(name) == k


def test_avg_at_k():
    assert avg_at_k([[True, False, False, True], [True, True, True, True]]) == pytest.approx(0.75)
    assert avg_at_k([[True], [False], [False]]) == pytest.approx(1 / 3)
    # unequal k: each question weighs the same
    assert avg_at_k([[True, True], [False, False, False, True]]) == pytest.approx((1 + 0.25) / 2)
    assert avg_at_k([]) == 0.0


def test_binomial_se_and_its_import_stays_light():
    assert binomial_se(0.25, 12) == pytest.approx(0.125) and binomial_se(0.0, 5) == 0.0
    assert binomial_se(0.5, 0) != binomial_se(0.5, 0)  # nan: no questions
    # the learning benchmark's tables import it: without the trainer, torch or transformers
    probe = "import sys, rlpr.evaluation.metrics; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"


def test_summary_means_match_names_by_substring():
    acc = {"MMLU_Pro_Avg4": 0.5, "gpqa_diamond_Avg4": 0.3, "TheoremQA": 0.4, "webinstruct_val": 0.6,
           "math500": 0.8, "minerva_math": 0.2, "aime24_Avg16": 0.1, "mmlu": 0.9, "gsm8k": 0.7}
    out = summary_means(acc)
    assert out["general"]["accuracy"] == pytest.approx((0.5 + 0.3 + 0.4 + 0.6) / 4)
    assert out["general"]["complete"] and "mmlu" not in out["general"]["benchmarks"]
    assert out["all"]["accuracy"] == pytest.approx((0.5 + 0.3 + 0.4 + 0.6 + 0.8 + 0.2 + 0.1) / 7)
    assert out["all"]["complete"]
    partial = summary_means({"math500": 0.8, "gsm8k": 0.7})
    assert "general" not in partial and partial["all"] == {
        "accuracy": 0.8, "benchmarks": ["math500"], "complete": False}
    assert summary_means({"gsm8k": 0.7}) == {}


def _sample(correct, judged=False, verdict=None, rule=None):
    return Sample(uid="q", sample=0, response="r", extracted=None,
                  rule_correct=correct if rule is None else rule, correct=correct, judged=judged,
                  judge_verdict=verdict, n_tokens=10, format_valid=correct)


def test_benchmark_result_and_table():
    groups = [[_sample(True), _sample(False, judged=True, verdict=False)],
              [_sample(True, judged=True, verdict=True, rule=False), _sample(False, judged=True)]]
    r = benchmark_result(groups)
    assert r["accuracy"] == 0.5 and r["rule_accuracy"] == 0.25
    assert (r["judge_calls"], r["judge_failed"], r["judge_flipped"]) == (3, 1, 1)
    assert r["samples_per_question"] == 2 and r["n_questions"] == 2
    table = results_table({"math500": r, **summary_means({"math500": 0.5})})
    assert "| math500 | Avg@2 | 50.0 |" in table and "**All** (partial)" in table


class FakeJudge:
    def __init__(self, verdicts):
        self.verdicts, self.asked = verdicts, []

    def judge_many(self, items):
        self.asked.extend(items)
        return self.verdicts[:len(items)]


def test_judge_only_asked_where_rule_says_wrong():
    from rlpr.data.records import Example

    ex = Example(prompt=[{"role": "user", "content": "Q?"}], reference="4", uid="0")
    groups = [[_sample(True), _sample(False), _sample(False)]]
    judge = FakeJudge([True, None])
    apply_judge(judge, [ex], groups)
    assert [q for q, _, _ in judge.asked] == ["Q?", "Q?"]
    assert [s.correct for s in groups[0]] == [True, True, False]  # a failure keeps the rule verdict
    assert [s.judged for s in groups[0]] == [False, True, True]


# --------------------------------------------------------------------------- end to end

def test_evaluate_files_with_scripted_responses(tmp_path, tokenizer):
    math_file, mc_file = _write_data(tmp_path)
    engine = ScriptedEngine(tokenizer, ["<think>easy</think> <answer>0</answer>", "I think it is 7"])
    results = evaluate_files(engine, tokenizer, [math_file, mc_file], tmp_path / "out",
                             RolloutConfig(max_new_tokens=8, batch_sequences=4), progress=False)
    # math500: 3 questions x 1 sample; only "0" for 0 + 0 is right -> 1/3
    assert results["math500"]["samples_per_question"] == 1
    assert results["math500"]["accuracy"] == pytest.approx(1 / 3)
    assert results["gpqa_tiny_Avg2"]["samples_per_question"] == 2
    assert results["gpqa_tiny_Avg2"]["accuracy"] == 0.0
    assert results["math500"]["format_valid_rate"] == pytest.approx(2 / 3)


def test_eval_command_end_to_end(tmp_path, tokenizer, tiny_model, capsys):
    from rlpr.cli.main import main

    model_dir = tmp_path / "tiny"
    tiny_model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    math_file, mc_file = _write_data(tmp_path)
    out = tmp_path / "eval"
    code = main(["eval", "--model", str(model_dir), "--data", str(math_file), str(mc_file),
                 "--max-new-tokens", "6", "--limit", "2", "--batch-sequences", "8", "--output", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"math500", "gpqa_tiny_Avg2", "general", "all"}
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    for name, k in (("math500", 1), ("gpqa_tiny_Avg2", 2)):
        r = results[name]
        assert (r["n_questions"], r["samples_per_question"]) == (2, k)
        mine = [s for s in samples if s["benchmark"] == name]
        assert len(mine) == 2 * k
        assert r["accuracy"] == pytest.approx(sum(s["correct"] for s in mine) / len(mine))
        assert 0 < r["mean_response_tokens"] <= 6
        assert r["judge_calls"] == 0 and not any(s["judged"] for s in mine)
        assert {"uid", "sample", "response", "extracted", "correct", "judged"} <= set(mine[0])
    assert sorted(s["sample"] for s in samples if s["benchmark"] == "gpqa_tiny_Avg2") == [0, 0, 1, 1]
    assert results["general"]["benchmarks"] == ["gpqa_tiny_Avg2"]
    assert "| math500 | Avg@1 |" in (out / "results.md").read_text()
    assert "math500: Avg@1" in capsys.readouterr().out


def test_eval_user_errors_are_one_line(tmp_path, capsys):
    from rlpr.cli.main import main

    assert main(["eval", "--data", str(tmp_path / "missing.jsonl"), "--samples", "0",
                 "--output", str(tmp_path)]) == 2
    assert "--samples must be at least 1" in capsys.readouterr().err
    assert main(["eval", "--data", "x.jsonl", "--temperature", "-1", "--output", str(tmp_path)]) == 2
    assert "--temperature must be >= 0" in capsys.readouterr().err
    assert main(["eval", "--data", "x.jsonl", "--judge-url", "http://127.0.0.1:1/v1",
                 "--output", str(tmp_path)]) == 2
    assert "--judge-model is required" in capsys.readouterr().err
    assert main(["eval", "--data", str(tmp_path / "missing.jsonl"), "--model", str(tmp_path / "nomodel"),
                 "--output", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "missing.jsonl: file not found" in err and len(err.strip().splitlines()) == 1


def test_eval_and_serve_of_a_run_start_from_the_run_s_config(tiny_dir, tokenizer, tmp_path, capsys, monkeypatch):
    """issue 35, N4 and E1: `rlpr eval --checkpoint RUN` (the command rlpr prints after a SIGTERM)
    and `rlpr serve --checkpoint RUN` loaded the embedded model instead of the run's model.path (a
    size-mismatch traceback) and evaluated with the default template and 1024-token answers. Now
    the run's config.yaml is the start (model, template, held-out lengths), with overrides on top
    and the choice printed; an adapter on a base of another shape is one line."""
    import rlpr.evaluation.benchmark as benchmark
    import rlpr.evaluation.serve as serve
    from helpers import tiny_cfg
    from rlpr.cli.main import main
    from rlpr.data.templates import build_messages
    from rlpr.model.loading import tiny_llama
    from rlpr.train.trainer import train

    train(tiny_cfg(tiny_dir, tmp_path, "run", "trainer.max_steps=1", "trainer.eval_samples=0", "data.val=",
                   "data.template=plain", "trainer.eval_max_new_tokens=5", "trainer.report=false"))
    run = tmp_path / "run"
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"question": f"What is {i} + {i}?", "answer": str(2 * i)}) + "\n"
                                 for i in range(3)))
    capsys.readouterr()
    seen = {}
    real = benchmark.evaluate

    def spy(engine, tokenizer, benchmarks, output, rollout, judge=None, **kw):
        seen.update(benchmarks=benchmarks, rollout=rollout, hidden=engine.model.config.hidden_size)
        return real(engine, tokenizer, benchmarks, output, rollout, judge, **kw)
    monkeypatch.setattr(benchmark, "evaluate", spy)
    assert main(["eval", "--checkpoint", str(run), "--data", str(questions), "--output", str(tmp_path / "e")]) == 0
    err = capsys.readouterr().err
    assert f"config: the run's {run / 'config.yaml'}" in err
    assert f"model.path {tiny_dir}, data.template plain, rollout.max_new_tokens 5" in err
    assert seen["hidden"] == 64 and seen["rollout"].max_new_tokens == 5  # the run's tiny model, its lengths
    assert seen["benchmarks"][0].examples[0].prompt == build_messages("What is 0 + 0?", "plain")
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert 0 < results["q"]["mean_response_tokens"] <= 5
    # a step directory names its run too; flags and overrides go on top
    step = run / "checkpoints" / "step_1"
    assert main(["eval", "--checkpoint", str(step), "--data", str(questions), "--output", str(tmp_path / "e2"),
                 "--max-new-tokens", "3", "data.template=r1"]) == 0
    assert seen["rollout"].max_new_tokens == 3
    assert seen["benchmarks"][0].examples[0].prompt == build_messages("What is 0 + 0?", "r1")
    capsys.readouterr()
    # serve: the same start
    got = {}
    monkeypatch.setattr(serve, "serve", lambda cfg, checkpoint, **kw: got.update(cfg=cfg))
    assert main(["serve", "--checkpoint", str(run), "--port", "0"]) == 0
    assert got["cfg"].model.path == tiny_dir and got["cfg"].data.template == "plain"
    assert got["cfg"].rollout.max_new_tokens == 8  # serve: the run's rollout length, not the held-out one
    capsys.readouterr()
    # an adapter on a base of another shape: one line, not a traceback
    other = tmp_path / "other"
    tiny_llama(tokenizer, layers=2, hidden=32, seed=0).save_pretrained(other)
    tokenizer.save_pretrained(other)
    assert main(["eval", "--checkpoint", str(run), "--model", str(other), "--data", str(questions),
                 "--output", str(tmp_path / "e3")]) == 2
    err = capsys.readouterr().err
    assert "is not the run's base" in err and "size mismatch" in err and "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("rlpr: error: ")
