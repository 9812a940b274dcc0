"""Bad data gets one line naming the file, row and field (issue 16, item 11): references that
used to become "None", "nan" or a dict's repr, and chat roles that were never checked."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpr.data.loading import load_examples
from rlpr.errors import DataError

pytestmark = pytest.mark.integration


def verl_row(ground_truth, role="user"):
    return {"data_source": "x", "prompt": [{"role": role, "content": "Capital of France?"}], "ability": "",
            "reward_model": {"ground_truth": ground_truth, "style": "rule"}, "extra_info": {"index": 0}}


@pytest.mark.parametrize("ground_truth,message", [
    ([None], r"field 'reward_model.ground_truth\[0\]' is missing \(null\)"),
    ({"a": 1}, "field 'reward_model.ground_truth' must be a string or a number, got dict"),
    (True, "must be a string or a number, got bool"),
    ([], "field 'reward_model.ground_truth' is an empty list"),
    ("  ", "field 'reward_model.ground_truth' is empty"),
    (None, r"field 'reward_model.ground_truth' is missing \(null\)"),
])
def test_bad_references_in_jsonl(tmp_path, ground_truth, message):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(verl_row("Paris")) + "\n" + json.dumps(verl_row(ground_truth)) + "\n")
    with pytest.raises(DataError, match=f"{path}: row 2: .*{message}"):
        load_examples(str(path))


def test_verl_parquet_row_without_ground_truth_says_missing(tmp_path):
    """A struct column takes its keys from all rows: a row without ground_truth reads as null."""
    path = tmp_path / "d.parquet"
    bad = verl_row("Paris")
    del bad["reward_model"]["ground_truth"]
    pq.write_table(pa.Table.from_pylist([verl_row("Paris"), bad]), path)
    with pytest.raises(DataError, match=r"row 2: field 'reward_model.ground_truth' is missing \(null\)"):
        load_examples(str(path))


def test_nan_reference_in_parquet(tmp_path):
    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "q1", "answer": 1.5}, {"question": "q2", "answer": math.nan}]),
                   path)
    with pytest.raises(DataError, match="row 2: field 'answer' is not a finite number"):
        load_examples(str(path))


def test_unknown_role_is_refused(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(verl_row("Paris", role="hacker")) + "\n")
    with pytest.raises(DataError, match=r"row 1: field 'prompt\[0\].role' is 'hacker'"):
        load_examples(str(path))


def test_numbers_and_lists_are_fine(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(verl_row(42)) + "\n" + json.dumps(verl_row(["Paris", "Paname"])) + "\n")
    first, second = load_examples(str(path))
    assert first.reference == "42" and second.reference == "Paris" and second.acceptable == ["Paris", "Paname"]


def test_non_utf8_names_file_and_row(tmp_path):
    """Issue 16, item 10: `rlpr score` used to fail on non-UTF-8 input naming neither."""
    from rlpr.cli.main import main

    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "q", "response": "r", "reference": "a"}\n{"prompt": "caf\xe9", "response": "r"}\n')
    with pytest.raises(DataError, match=rf"{path}: row 2: not valid UTF-8 \(byte 16 of the line\)"):
        load_examples(str(path))
    assert main(["score", "--input", str(path), "--output", str(tmp_path / "o.jsonl")]) == 2


DEEP = "[" * 5000 + "]" * 5000  # json.loads raises RecursionError on it
LONG_INT = "1" * 5000  # over Python's 4300 digits: json.loads raises a plain ValueError


@pytest.mark.parametrize("name,text,message", [
    ("deep.jsonl", f'{{"question": "q", "answer": {DEEP}}}\n', r"row 1: not valid JSON \(nested too deep\)"),
    ("long.jsonl", f'{{"question": "q", "answer": {LONG_INT}}}\n',
     r"row 1: not valid JSON \(Exceeds the limit \(4300 digits\)"),
    ("deep.json", f'[{{"question": "q", "answer": {DEEP}}}]', r"cannot read \(nested too deep\)"),
    ("deep.csv", f'question,answer,choices\nq,A,"{DEEP}"\n',
     r"row 1: field 'choices' is not a JSON list \(nested too deep\)"),
    ("long.csv", f"question,answer,choices\nq,A,{LONG_INT}\n",
     r"row 1: field 'choices' is not a JSON list \(Exceeds the limit \(4300 digits\)"),
])
def test_json_nested_too_deep_or_an_over_long_integer_names_file_and_row(tmp_path, capsys, name, text, message):
    """Nesting a thousand deep was a RecursionError traceback, an integer of over 4300 digits a
    line naming no file (json.loads raises neither as a JSONDecodeError)."""
    from rlpr.cli.main import main

    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(DataError, match=rf"^{path}: {message}"):
        load_examples(str(path))
    # the same through a command, and for a --responses file: one line, no traceback
    assert main(["grade", "--data", str(path), "--responses", str(path), "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlpr: error: {path}: ") and "\n" not in err and "Traceback" not in err, err
    ok = tmp_path / "ok.csv"
    ok.write_text("question,answer\nq,A\n")
    responses = tmp_path / "responses.jsonl"
    responses.write_text(f'{{"index": 0, "response": {DEEP}}}\n')
    assert main(["grade", "--data", str(ok), "--responses", str(responses), "--output", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.strip() == f"rlpr: error: {responses}: row 1: not valid JSON (nested too deep)"


# --------------------------------------------------------------------------- model directories (item 9)

@pytest.mark.parametrize("case,message", [
    ("bad_json", "cannot load the config.json"),
    ("deep_config", r"cannot load the config.json \(RecursionError: nested too deep\)"),
    ("deep_tokenizer_config", r"cannot load the tokenizer \(RecursionError: nested too deep\)"),
    ("no_weights", "cannot load the model weights"),
    ("not_causal", "not a causal language model"),
])
def test_broken_model_directories_give_one_line(tiny_dir, tmp_path, case, message):
    import shutil

    from rlpr.errors import ModelError
    from rlpr.model.loading import load_model

    model_dir = tmp_path / case
    shutil.copytree(tiny_dir, model_dir)
    if case == "bad_json":
        (model_dir / "config.json").write_text("{not json")
    elif case.startswith("deep_"):  # nested a thousand deep: a RecursionError traceback before
        (model_dir / f"{case[5:]}.json").write_text(f'{{"x": {DEEP}}}')
    elif case == "no_weights":
        for f in model_dir.glob("*.safetensors"):
            f.unlink()
    else:
        cfg = json.loads((model_dir / "config.json").read_text())
        cfg.update(model_type="vit", architectures=["ViTModel"])
        (model_dir / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelError, match=rf"^{model_dir}: {message}") as err:
        load_model(str(model_dir))
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


# --------------------------------------------------------------------------- train/score set-up (items 9, 13)

def _tiny_train_cfg(tiny_dir, out, *extra):
    from rlpr.config import load_config

    return load_config("demo", [f"model.path={tiny_dir}", f"trainer.output_dir={out}", "trainer.name=r",
                                "trainer.max_steps=1", "rollout.max_new_tokens=4", "data.val=",
                                "trainer.progress=false", "trainer.tensorboard=false", *extra])


def test_data_error_comes_before_the_model_and_the_run_directory(tiny_dir, tmp_path, monkeypatch):
    from rlpr.model import loading as models
    from rlpr.train.trainer import train

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "q", "answer": null}\n')
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(DataError, match="row 1: field 'answer'"):
        train(_tiny_train_cfg(tiny_dir, tmp_path / "runs", f"data.train={bad}"))
    assert not (tmp_path / "runs").exists()


def test_more_prompts_per_step_than_data_is_refused(tiny_dir, tmp_path):
    from rlpr.errors import ConfigError
    from rlpr.train.trainer import train

    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"question": f"q{i}", "answer": "a"}) + "\n" for i in range(3)))
    with pytest.raises(ConfigError, match=r"trainer.prompts_per_step \(4\) exceeds the 3 usable training prompts"):
        train(_tiny_train_cfg(tiny_dir, tmp_path / "runs", f"data.train={small}"))


def test_unwritable_output_is_one_line(tiny_dir, tmp_path):
    import os

    from rlpr.cli.main import main

    if os.geteuid() == 0:  # root writes anywhere: use a path under a file instead
        blocker = tmp_path / "file"
        blocker.write_text("x")
        out_dir = blocker / "sub"
    else:
        out_dir = tmp_path / "ro"
        out_dir.mkdir(mode=0o500)
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"prompt": "q", "response": "r", "reference": "a"}) + "\n")
    assert main(["score", "--input", str(rows), "--output", str(out_dir / "o.jsonl"), "--model", str(tiny_dir)]) == 2
    assert main(["train", f"model.path={tiny_dir}", f"trainer.output_dir={out_dir}", "trainer.max_steps=1"]) == 2


def test_a_byte_order_mark_is_not_data(tmp_path):
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"question": "q", "answer": "a"}\n{"question": "q2", "answer": "b",}\n')
    with pytest.raises(DataError, match=r"row 2: not valid JSON \(Expecting property name enclosed in double "
                                        r"quotes at column 34\)"):
        load_examples(str(path))
    path.write_bytes(b'\xef\xbb\xbf{"question": "q", "answer": "a"}\n')
    assert load_examples(str(path))[0].reference == "a"
