"""`rlpr score` as a user runs it: a real HF model directory, JSONL in and out, clear errors."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlpr.cli.main import main

pytestmark = pytest.mark.integration

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "score_example.jsonl"


def test_score_example_file(tiny_dir, tmp_path):
    out = tmp_path / "out.jsonl"
    assert main(["score", "--input", str(EXAMPLE), "--output", str(out), "--model", str(tiny_dir)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    inputs = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    assert len(rows) == len(inputs)
    for row, given in zip(rows, inputs):
        for key in ("valid", "format", "score_b", "score_a", "reward", "ref_tokens"):
            assert key in row
        assert all(row[k] == v for k, v in given.items())  # the input is kept
    assert rows[0]["ref_tokens"] == " Paris" and rows[1]["ref_tokens"] == " Berlin"
    assert rows[4]["valid"] is False and rows[4]["score_b"] == 0.0  # spec default: no fallback
    assert 0.0 < rows[0]["score_b"] < 1.0


def test_score_with_fallback_override(tiny_dir, tmp_path):
    out = tmp_path / "out.jsonl"
    assert main(["score", "--input", str(EXAMPLE), "--output", str(out), "--model", str(tiny_dir),
                 "reward.invalid_fallback=free", "reward.aggregation=geo_mean_prob"]) == 0
    last = json.loads(out.read_text().splitlines()[4])
    assert last["fallback"] is True and last["score_b"] > 0.0 and last["ref_tokens"] == "144"


@pytest.mark.parametrize("line,message", [
    ('{"prompt": "q", "response": "r"}', "row 2: field 'reference' is missing"),
    ('{"prompt": "q", "response": "r", "reference": "  "}', "row 2: field 'reference' is empty"),
    ('{"prompt": "q", "response": 5, "reference": "a"}', "row 2: field 'response' must be a string"),
    ('{"prompt": [{"role": "user"}], "response": "r", "reference": "a"}', "row 2: field 'prompt[0]'"),
    ('{"prompt": "q", "response": "r", "reference": "a"', "row 2: not valid JSON"),
    ('[1, 2]', "row 2: expected a JSON object"),
])
def test_malformed_rows_give_one_line_errors(tmp_path, capsys, line, message):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q", "response": "r", "reference": "a"}\n' + line + "\n")
    assert main(["score", "--input", str(bad), "--output", str(tmp_path / "o.jsonl"), "--model", "/nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(bad) in err
    assert not (tmp_path / "o.jsonl").exists()


def test_overlong_field_and_bad_model(tmp_path, capsys, tiny_dir):
    long_file = tmp_path / "long.jsonl"
    long_file.write_text(json.dumps({"prompt": "q", "response": "x" * 1_000_001, "reference": "a"}) + "\n")
    assert main(["score", "--input", str(long_file), "--output", str(tmp_path / "o.jsonl")]) == 2
    assert "row 1: field 'response' is too long" in capsys.readouterr().err
    assert main(["score", "--input", str(EXAMPLE), "--output", str(tmp_path / "o.jsonl"),
                 "--model", str(tmp_path)]) == 2
    assert "not a Hugging Face model directory" in capsys.readouterr().err
    assert main(["score", "--input", str(EXAMPLE), "--output", str(tmp_path / "o.jsonl"),
                 "--model", str(tiny_dir), "reward.aggregaton=mean_prob"]) == 2
    assert "did you mean 'reward.aggregation'" in capsys.readouterr().err


def test_console_script_help():
    result = subprocess.run([sys.executable, "-m", "rlpr", "score", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--input" in result.stdout
    # the parser of every command loads no torch: `rlpr --help` in 0.3 s, not 1.4 (export's choices are in
    # a module that imported torch at its top); validating a config loads no transformers: `rlpr config` in
    # 2.3 s, not 6.7 (the decode-loop registry's module imported transformers' cache classes at its top)
    probe = ("import sys; from rlpr.cli.main import build_parser; build_parser(); print('torch' in sys.modules); "
             "from rlpr.config import load_config, validate; validate(load_config('demo', [])); "
             "print('transformers' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.stdout.split() == ["False", "False"], result.stderr[-2000:]


def test_over_long_row_is_flagged_not_scored(tiny_dir, tmp_path, capsys):
    """Issue 16, item 6: a row longer than the model's context used to get score_b 0 and
    reward 0.1 with nothing to tell it apart from a real score."""
    rows = tmp_path / "in.jsonl"
    long_prompt = "word " * 3000  # > the tiny model's 2048 positions
    rows.write_text(json.dumps({"prompt": long_prompt, "response": "<think> a </think> <answer> x </answer>",
                                "reference": "Paris"}) + "\n" +
                    json.dumps({"prompt": "Capital of France?", "response": "<think> a </think> <answer> x </answer>",
                                "reference": "Paris"}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["score", "--input", str(rows), "--output", str(out), "--model", str(tiny_dir)]) == 0
    long, short = [json.loads(line) for line in out.read_text().splitlines()]
    assert long["too_long"] is True and long["reward"] is None and long["score_b"] is None
    assert short["too_long"] is False and short["reward"] is not None
    assert "1 row(s) longer than the model's context" in capsys.readouterr().err


def test_score_with_the_verifier_reward(tiny_dir, tmp_path):
    """reward.kind=verifier with the oracle verifier reads the eval grader's verdict per row (it
    failed: no verdicts were passed), and with the exact verifier the extracted answer."""
    out = tmp_path / "out.jsonl"
    assert main(["score", "--input", str(EXAMPLE), "--output", str(out), "--model", str(tiny_dir),
                 "reward.kind=verifier"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    inputs = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    from rlpr.grading import grade_short_answer

    for row, given in zip(rows, inputs):
        correct = grade_short_answer(given["response"], given["reference"]).correct
        assert row["reward"] == pytest.approx(0.9 * correct + 0.1 * row["format"]), row
    assert main(["score", "--input", str(EXAMPLE), "--output", str(out), "--model", str(tiny_dir),
                 "reward.kind=verifier", "reward.verifier=exact"]) == 0
