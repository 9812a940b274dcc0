"""Converters on the first real rows of each public data set, and their parquet round trip.

The data is read from ../shared/data at test time and never copied into the repository; the tests
that need it skip with one line when it is absent (`helpers.shared_data`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rlpr.data.convert import FORMATS, convert_file, convert_rows, last_boxed
from rlpr.data.loading import ColumnMapping, load_examples, read_rows
from rlpr.errors import DataError
from rlpr.data.templates import MC_INSTRUCTION

from helpers import shared_data

pytestmark = pytest.mark.unit

N = 4


def first(rel: str, n: int = N) -> list[dict]:
    return read_rows(shared_data(rel))[:n]


def convert(fmt: str, rel: str, **kwargs):
    return convert_rows(fmt, first(rel), source=fmt, **kwargs)


def test_gsm8k_reference_is_the_number_after_hashes():
    rows = first("gsm8k/test.jsonl")
    examples = convert_rows("gsm8k", rows, source="gsm8k")
    assert examples[0].reference == "18"
    assert [e.reference for e in examples] == [r["answer"].split("####")[1].strip() for r in rows]
    assert examples[0].prompt[-1]["content"] == rows[0]["question"]
    assert (examples[0].ability, examples[0].uid) == ("math", "0")


def test_gsm8k_strips_thousands_separators():
    row = {"question": "How much?", "answer": "So 1,450,000.\n#### 1,450,000"}
    assert convert_rows("gsm8k", [row], source="gsm8k")[0].reference == "1450000"


def test_math500_reference_is_the_answer_field():
    rows = first("math500/test.jsonl")
    examples = convert_rows("math", rows, source="math500")
    assert [e.reference for e in examples] == [r["answer"] for r in rows]
    assert examples[0].reference == r"\left( 3, \frac{\pi}{2} \right)"
    assert examples[0].uid == rows[0]["unique_id"]
    assert examples[0].extra_info == {"subject": rows[0]["subject"], "level": str(rows[0]["level"])}


def test_math_without_answer_field_uses_last_boxed_of_solution():
    rows = first("math500/test.jsonl")
    solution_only = [{k: v for k, v in r.items() if k != "answer"} for r in rows]
    examples = convert_rows("math", solution_only, source="math")
    assert [e.reference for e in examples] == [r["answer"] for r in rows]


def test_math_test5000_uses_idx_as_uid():
    rows = first("math_test5000/math_test5000.jsonl")
    examples = convert_rows("math", rows, source="math")
    assert [e.reference for e in examples] == [r["answer"] for r in rows]
    assert [e.uid for e in examples] == [str(r["idx"]) for r in rows]


def test_minerva_reference_is_last_boxed():
    examples = convert("minerva", "minerva_math/test.jsonl")
    assert [e.reference for e in examples] == ["1.6", "4.5e33", "41.8", "20.39"]  # read by hand
    assert examples[0].extra_info["type"] == "Introduction to Astronomy (8.282J Spring 2006)"


def test_aime_and_amc_answers_are_strings():
    rows = first("aime24/test.jsonl")
    aime = convert_rows("aime", rows, source="aime24")
    assert [e.reference for e in aime] == [r["answer"] for r in rows]
    assert [e.uid for e in aime] == [str(r["id"]) for r in rows]
    amc = convert("aime", "amc23/test.jsonl")  # AMC stores 27.0; graders should see 27
    assert [e.reference for e in amc] == ["27", "36", "45", "3159"]


def test_mmlu_letters_the_options():
    rows = first("mmlu/mmlu_test.jsonl")
    examples = convert_rows("mmlu", rows, source="mmlu")
    for row, ex in zip(rows, examples):
        user = ex.prompt[-1]["content"]
        assert ex.reference == row["answer"] and ex.reference in "ABCD"
        assert ex.choices == row["choices"]
        assert f"A. {row['choices'][0]}" in user and f"D. {row['choices'][3]}" in user
        assert user.endswith(MC_INSTRUCTION)
        assert ex.extra_info["subject"] == row["subject"]


def test_mmlu_accepts_an_answer_index():
    row = {"question": "2+2?", "choices": ["3", "4"], "answer": 1}
    assert convert_rows("mmlu", [row], source="mmlu")[0].reference == "B"


def test_mmlu_pro_letters_up_to_ten_options():
    rows = first("mmlu_pro/mmlu_pro_test_1000_seed0.jsonl")
    examples = convert_rows("mmlu_pro", rows, source="mmlu_pro")
    for row, ex in zip(rows, examples):
        assert ex.reference == row["answer"] == "ABCDEFGHIJ"[row["answer_index"]]
        assert ex.choices == row["options"]
        assert f"J. {row['options'][9]}" in ex.prompt[-1]["content"]
        assert ex.uid == str(row["question_id"])
        assert ex.extra_info["category"] == row["category"]


def test_bbh_multiple_choice_target_becomes_bare_letter():
    rows = first("bbh/date_understanding.json")
    examples = convert_rows("bbh", rows, source="bbh/date_understanding")
    assert [e.reference for e in examples] == [r["target"].strip("()") for r in rows]
    assert examples[0].choices == ["12/11/1937", "12/25/1937", "01/04/1938", "12/04/1937",
                                   "12/25/2006", "07/25/1937"]
    assert examples[0].prompt[-1]["content"] == rows[0]["input"] + "\n" + MC_INSTRUCTION
    assert examples[0].extra_info == {"task": "date_understanding"}


def test_bbh_free_form_targets_stay_text():
    rows = first("bbh/boolean_expressions.json")
    examples = convert_rows("bbh", rows, source="bbh/boolean_expressions")
    assert [e.reference for e in examples] == [r["target"] for r in rows]
    assert all(not e.choices and MC_INSTRUCTION not in e.prompt[-1]["content"] for e in examples)


def test_bbh_option_split_on_commas_keeps_text_target():
    # movie_recommendation row 163 lists "(A) Monsters" "(B) Inc" but its target is "Monsters, Inc".
    row = read_rows(shared_data("bbh/movie_recommendation.json"))[163]
    [ex] = convert_rows("bbh", [row], source="bbh/movie_recommendation")
    assert (ex.reference, ex.choices) == ("Monsters, Inc", [])


def test_nq_open_keeps_every_acceptable_answer():
    rows = first("nq_open/NQ-open.dev.jsonl")
    examples = convert_rows("nq_open", rows, source="nq_open")
    for row, ex in zip(rows, examples):
        assert ex.acceptable == row["answer"]
        assert ex.reference == row["answer"][0]
        assert ex.ability == "general"


def test_jsonl_uses_the_column_mapping():
    rows = first("math_test5000/math_test5000.jsonl")
    examples = convert_rows("jsonl", rows, source="mine", mapping=ColumnMapping(question="problem"))
    assert [e.reference for e in examples] == [r["answer"] for r in rows]
    assert examples[0].prompt[-1]["content"] == rows[0]["problem"]
    mmlu = convert("jsonl", "mmlu/mmlu_dev.jsonl")
    assert mmlu[0].choices == first("mmlu/mmlu_dev.jsonl")[0]["choices"]
    assert "A. " in mmlu[0].prompt[-1]["content"]


ROUND_TRIPS = [
    ("gsm8k", "gsm8k/test.jsonl"),
    ("math", "math500/test.jsonl"),
    ("math", "math_test5000/math_test5000.jsonl"),
    ("minerva", "minerva_math/test.jsonl"),
    ("aime", "aime24/test.jsonl"),
    ("aime", "amc23/test.jsonl"),
    ("mmlu", "mmlu/mmlu_test.jsonl"),
    ("mmlu_pro", "mmlu_pro/mmlu_pro_test_1000_seed0.jsonl"),
    ("bbh", "bbh/date_understanding.json"),
    ("bbh", "bbh/object_counting.json"),
    ("nq_open", "nq_open/NQ-open.efficientqa.dev.1.1.jsonl"),
    ("jsonl", "mmlu/mmlu_dev.jsonl"),
]


# Formats whose data is not in ../shared/data: round-tripped on hand-made fixtures in the
# official layout (tests/test_convert_benchmarks.py).
FIXTURE_FORMATS = {"theoremqa", "gpqa", "arc", "simpleqa"}


def test_round_trips_cover_every_format():
    assert {fmt for fmt, _ in ROUND_TRIPS} | FIXTURE_FORMATS == set(FORMATS)


@pytest.mark.parametrize("fmt,rel", ROUND_TRIPS)
def test_parquet_round_trip(fmt, rel, tmp_path):
    out = tmp_path / "nested" / f"{fmt}.parquet"
    assert convert_file(fmt, shared_data(rel), out, limit=N) == N
    source = f"bbh/{Path(rel).stem}" if fmt == "bbh" else fmt
    expected = convert_rows(fmt, first(rel), source=source)
    loaded = load_examples(out)
    assert len(loaded) == N
    for want, got in zip(expected, loaded):
        assert got.prompt == want.prompt
        assert got.reference == want.reference
        assert got.acceptable == want.acceptable
        assert got.choices == want.choices
        assert (got.uid, got.data_source, got.ability) == (want.uid, source, want.ability)
    assert not list(out.parent.glob(".*tmp*"))


def test_round_trip_keeps_a_column_missing_from_the_first_row(tmp_path):
    src = tmp_path / "flat.jsonl"
    src.write_text(json.dumps({"question": "q0", "answer": "a"}) + "\n"
                   + json.dumps({"question": "q1", "answer": "b", "score_a": 0.5}) + "\n")
    convert_file("jsonl", src, tmp_path / "out.parquet")
    assert [e.score_a for e in load_examples(tmp_path / "out.parquet")] == [None, 0.5]


def test_last_boxed():
    assert last_boxed(r"so \boxed{\frac{1}{2}} and then \boxed{\sqrt{a^{2}+b}}.") == r"\sqrt{a^{2}+b}"
    assert last_boxed(r"\fbox{12} is it") == "12"
    assert last_boxed(r"\boxed{\{1, 2\}}") == r"\{1, 2\}"
    assert last_boxed("no box here") is None
    assert last_boxed(r"\boxed{\frac{1}{2}") is None  # unbalanced


@pytest.mark.parametrize("fmt,row,field", [
    ("gsm8k", {"question": "q", "answer": "no final line"}, "answer"),
    ("math", {"problem": "p", "solution": "no box"}, "solution"),
    ("mmlu", {"question": "q", "choices": ["x", "y"], "answer": "C"}, "answer"),
    ("mmlu_pro", {"question": "q", "options": "x", "answer": "A"}, "options"),
    ("bbh", {"input": "Options:\n(A) x", "target": "(B)"}, "target"),
    ("nq_open", {"question": "q", "answer": []}, "answer"),
    ("aime", {"id": 1, "answer": "5"}, "problem"),
    ("jsonl", {"question": "q"}, "answer"),
])
def test_malformed_row_names_row_and_field(fmt, row, field):
    with pytest.raises(DataError) as err:
        convert_rows(fmt, [row], source="src")
    message = str(err.value)
    assert message.startswith(f"src: row 1: field '{field}'") and "\n" not in message


def test_malformed_file_names_the_path(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps({"question": "q", "answer": ["x"]}) + "\n"
                   + json.dumps({"question": "q", "answer": "not a list"}) + "\n")
    with pytest.raises(DataError, match=re.escape(f"{src}: row 2: field 'answer'")):
        convert_file("nq_open", src, tmp_path / "out.parquet")
    assert not (tmp_path / "out.parquet").exists()


def test_unknown_format():
    with pytest.raises(ValueError, match="unknown format"):
        convert_rows("squad", [], source="x")
    with pytest.raises(ValueError, match="unknown format"):
        convert_file("squad", "missing.jsonl", "out.parquet")
