"""The Python API (rlpr.config / train / score / evaluate, rlpr/api.py): the same runs and numbers
as the command line, from a notebook."""

import json
from pathlib import Path

import pytest

import rlpr
from rlpr.cli.main import main

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_train_resume_score_and_evaluate_from_python(tiny_dir, tmp_path):
    cfg = rlpr.config("demo", {"model.path": tiny_dir, "trainer.output_dir": str(tmp_path), "trainer.max_steps": 1,
                               "rollout.max_new_tokens": 8, "data.demo_train_size": 40, "data.demo_val_size": 4,
                               "trainer.prompts_per_step": 2, "trainer.mini_batch_prompts": 2,
                               "rollout.responses_per_prompt": 2, "trainer.eval_samples": 0,
                               "trainer.progress": False})
    summary = rlpr.train(cfg)
    run = Path(summary["run_dir"])
    assert run.parent == tmp_path and (run / "checkpoints" / "step_1").is_dir()
    assert summary["step"] == 1 and "before" in summary and "after" in summary
    resumed = rlpr.train(resume=run, overrides={"trainer.max_steps": 2})
    assert resumed["step"] == 2 and resumed["run_dir"] == str(run)
    assert resumed["before"] == summary["before"]  # a resumed run's summary keeps its evaluation before training

    # score: the same numbers as `rlpr score` on the same rows
    questions = ["What is the capital of France?", "What color is the sky?"]
    responses = ["The capital of France is Paris.", "It is green."]
    references = ["Paris", "blue"]
    got = rlpr.score(cfg, questions, responses, references)
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": q, "response": r, "reference": ref}) + "\n"
                            for q, r, ref in zip(questions, responses, references)))
    assert main(["score", "--preset", "demo", "--model", tiny_dir, "--input", str(rows), "--output", str(tmp_path / "s.jsonl")]) == 0
    want = [json.loads(line) for line in (tmp_path / "s.jsonl").read_text().splitlines()]
    for g, w in zip(got, want):
        assert g["score_b"] == pytest.approx(w["score_b"], abs=1e-6) and g["reward"] == pytest.approx(w["reward"], abs=1e-6)

    results = rlpr.evaluate(cfg, [ROOT / "examples" / "my_questions_val.jsonl"], checkpoint=run, samples=2, limit=3,
                            output_dir=tmp_path / "eval")
    assert results["my_questions_val"]["n_questions"] == 3 and 0 <= results["my_questions_val"]["accuracy"] <= 1
    assert (tmp_path / "eval" / "results.json").exists()
    with pytest.raises(ValueError, match="differ in length"):
        rlpr.score(cfg, questions, responses[:1], references)
