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


def test_wrong_argument_types_are_one_line_before_any_work(tmp_path):
    """issue 35, N11: a string where a list belongs was read character by character (each letter a
    question, a file or an override), and other wrong types were raw AttributeErrors from deep
    inside. Now one line naming the argument, a TypeError and a ConfigError at once."""
    from rlpr.errors import ArgumentTypeError, ConfigError, DataError

    cases = [
        (lambda: rlpr.score("demo", "What?", ["It is."], ["Paris"]),
         "questions: expected a list of strings, got str 'What?' (for one, pass ['What?'])"),
        (lambda: rlpr.score("demo", ["q"], ["a", 3], ["b"]), "responses[1]: expected a string, got int 3"),
        (lambda: rlpr.score("demo", ["q"], ["a"], ["b"], model=object()), "give both"),
        (lambda: rlpr.evaluate("demo", 5), "data: expected a list of data files, got int 5"),
        (lambda: rlpr.evaluate("demo", ["x.jsonl"], samples="3"),
         "samples: expected a whole number, got str '3'"),
        (lambda: rlpr.evaluate("demo", ["x.jsonl"], limit=True), "limit: expected a whole number, got bool True"),
        (lambda: rlpr.evaluate("demo", ["x.jsonl"], samples=0), "samples: must be at least 1"),
        (lambda: rlpr.train(5), "cfg: expected a Config"),
        (lambda: rlpr.train("demo", "trainer.max_steps=5"), "overrides: expected a list of 'key=value' strings or a "
                                                            "dict, got the string 'trainer.max_steps=5'"),
        (lambda: rlpr.train("demo", {1: 2}), "overrides: the keys must be strings"),
        (lambda: rlpr.train("demo", resume=3), "resume: expected a path"),
    ]
    for call, message in cases:
        with pytest.raises(ArgumentTypeError) as e:
            call()
        assert message in str(e.value) and len(str(e.value).splitlines()) == 1
        assert isinstance(e.value, TypeError) and isinstance(e.value, ConfigError)
    # one data file as a plain path is one file, not its characters
    with pytest.raises(DataError, match="missing.jsonl: file not found"):
        rlpr.evaluate("demo", str(tmp_path / "missing.jsonl"))
    assert list(tmp_path.iterdir()) == []


def test_rlpr_config_checks_its_argument_types():
    """issue 35, N11 for rlpr.config: once rlpr.config (the module) is imported, the name is the
    callable module, whose call went straight to from_preset, so rlpr.config("demo", "a=b") read the
    string character by character ("override 'a': expected key=value") and other wrong types were
    raw TypeErrors. Now the same one-line ArgumentTypeError as rlpr.train's, naming the argument."""
    import rlpr.config
    from rlpr.config import from_preset, override_list
    from rlpr.errors import ArgumentTypeError, ConfigError

    assert type(rlpr.config).__name__ == "_CallableModule"  # the module's call, not rlpr/__init__'s api.config
    cases = [
        (lambda: rlpr.config("demo", "trainer.max_steps=5"), "overrides: expected a list of 'key=value' strings or "
                                                             "a dict, got the string 'trainer.max_steps=5'"),
        (lambda: rlpr.config("demo", overrides="a=b"), "got the string 'a=b' (for one, pass ['a=b'])"),
        (lambda: rlpr.config("demo", 5), "overrides: expected a list of strings, got int 5"),
        (lambda: rlpr.config("demo", ["trainer.max_steps=5", 3]), "overrides[1]: expected a string, got int 3"),
        (lambda: rlpr.config("demo", {1: 2}), "overrides: the keys must be strings"),
        (lambda: rlpr.config(5), "preset: expected a path (str or os.PathLike), got int 5"),
        (lambda: from_preset("demo", "a=b"), "got the string 'a=b'"),  # the module-level helpers too
        (lambda: override_list("a=b"), "got the string 'a=b'"),
    ]
    for call, message in cases:
        with pytest.raises(ArgumentTypeError) as e:
            call()
        assert message in str(e.value) and len(str(e.value).splitlines()) == 1
        assert isinstance(e.value, TypeError) and isinstance(e.value, ConfigError)
    # the right types still work, positional or by name
    assert rlpr.config("demo", ["trainer.max_steps=3"]).trainer.max_steps == 3
    assert rlpr.config(preset="demo", overrides={"trainer.max_steps": 4}).trainer.max_steps == 4


def test_dict_overrides_keep_their_python_values():
    """A dict's values are the values meant, not text re-read as YAML: the string "true" stays a
    string (it became the boolean True), None and lists pass as they are, and a wrong type is the
    config's one-line error."""
    import rlpr
    from rlpr.config import ConfigError

    cfg = rlpr.config("demo", {"reward.answer_cue": "true", "trainer.max_steps": 5, "rollout.stop": ["\n", "Q:"]})
    assert cfg.reward.answer_cue == "true" and cfg.trainer.max_steps == 5 and cfg.rollout.stop == ["\n", "Q:"]
    assert rlpr.config("demo", {"reward.answer_cue": "1: "}).reward.answer_cue == "1: "  # YAML would make a mapping
    with pytest.raises(ConfigError, match="trainer.max_steps: expected an integer"):
        rlpr.config("demo", {"trainer.max_steps": "five"})
