"""Bad data gets one line naming the file, row and field (issue 16, item 11): references that
used to become "None", "nan" or a dict's repr, and chat roles that were never checked."""

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpr.data.loading import load_examples
from rlpr.data.records import DataError


def verl_row(ground_truth, role="user"):
    return {"data_source": "x", "prompt": [{"role": role, "content": "Capital of France?"}], "ability": "",
            "reward_model": {"ground_truth": ground_truth, "style": "rule"}, "extra_info": {"index": 0}}


@pytest.mark.parametrize("ground_truth,message", [
    ([None], r"field 'reward_model.ground_truth\[0\]' must be a string or a number, got NoneType"),
    ({"a": 1}, "field 'reward_model.ground_truth' must be a string or a number, got dict"),
    (True, "must be a string or a number, got bool"),
    ([], "field 'reward_model.ground_truth' is an empty list"),
    ("  ", "field 'reward_model.ground_truth' is empty"),
    (None, "must be a string or a number, got NoneType"),
])
def test_bad_references_in_jsonl(tmp_path, ground_truth, message):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(verl_row("Paris")) + "\n" + json.dumps(verl_row(ground_truth)) + "\n")
    with pytest.raises(DataError, match=f"{path}: row 2: .*{message}"):
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
    from rlpr.cli import main

    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"prompt": "q", "response": "r", "reference": "a"}\n{"prompt": "caf\xe9", "response": "r"}\n')
    with pytest.raises(DataError, match=rf"{path}: row 2: not valid UTF-8 \(byte 16 of the line\)"):
        load_examples(str(path))
    assert main(["score", "--input", str(path), "--output", str(tmp_path / "o.jsonl")]) == 2
