"""Converters for TheoremQA, GPQA, ARC and SimpleQA on small hand-made fixtures in each
benchmark's official layout (written in tmp_path), `--source`, gzip input, and the data_source
reaching its grader."""

from __future__ import annotations

import csv
import gzip
import json
from pathlib import Path

import pytest

from rlpr.cli.main import main
from rlpr.data.convert import FORMATS, convert_file, convert_rows
from rlpr.data.loading import load_examples
from rlpr.data.records import DataError
from rlpr.grading import benchmark_rule, grade_example, grader_for

pytestmark = pytest.mark.integration

# TheoremQA (TIGER-AI-Lab/TheoremQA theoremqa_test.json): one JSON list; Answer is a bool,
# number, list or option string; Picture null or an image path.
THEOREMQA = [
    {"id": "t1", "Question": "Is 7 a prime number?", "Answer": True, "Answer_type": "bool",
     "Picture": None, "field": "Math", "subfield": "Number theory"},
    {"id": "t2", "Question": "How many edges does K_4 have?", "Answer": 6, "Answer_type": "integer",
     "Picture": None},
    {"id": "t3", "Question": "Compute pi to 5 digits.", "Answer": 3.14159, "Answer_type": "float",
     "Picture": None},
    {"id": "t4", "Question": "Eigenvalues of diag(1, 2)?", "Answer": [1, 2],
     "Answer_type": "list of integer", "Picture": None},
    {"id": "t5", "Question": "Which holds? (a) x (b) y", "Answer": "(b)", "Answer_type": "option",
     "Picture": None},
    {"id": "t6", "Question": "Read the figure. What is the area?", "Answer": 12.5,
     "Answer_type": "float", "Picture": "images/t6.png"},
    {"id": "t7", "Question": "Charge of an electron in C?", "Answer": -1.602e-19,
     "Answer_type": "float", "Picture": None},
]

# GPQA (idavidrein/gpqa gpqa_diamond.csv): the correct answer always in its own column.
GPQA_HEADER = ["Record ID", "Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
               "Incorrect Answer 3", "High-level domain", "Subdomain", "Explanation"]
GPQA = [
    ["rec1", "Which particle mediates the electromagnetic force?", "photon", "gluon", "W boson",
     "graviton", "Physics", "Particle physics", "QED."],
    ["rec2", "What is the pKa of acetic acid, approximately?\n", " 4.76", "1.2", "9.3", "14",
     "Chemistry", "Organic chemistry", "Known value,\nmultiline."],
    ["rec3", "Which organelle makes ATP?", "mitochondrion", "ribosome", "Golgi apparatus", "lysosome",
     "Biology", "Cell biology", ""],
]

# ARC (allenai ARC-V1-Feb2018 *.jsonl): nested question; labels A-E or 1-5.
ARC = [
    {"id": "Mercury_1", "question": {"stem": "Which is a mammal?", "choices": [
        {"text": "shark", "label": "A"}, {"text": "whale", "label": "B"},
        {"text": "trout", "label": "C"}, {"text": "eel", "label": "D"}]}, "answerKey": "B"},
    {"id": "NYSEDREGENTS_2", "question": {"stem": "Water boils at sea level at", "choices": [
        {"text": "0 C", "label": "1"}, {"text": "50 C", "label": "2"},
        {"text": "100 C", "label": "3"}]}, "answerKey": "3"},
    {"id": "MCAS_3", "question": {"stem": "Which is a gas at room temperature?", "choices": [
        {"text": "iron", "label": "A"}, {"text": "oxygen", "label": "B"}, {"text": "salt", "label": "C"},
        {"text": "sand", "label": "D"}, {"text": "wood", "label": "E"}]}, "answerKey": "B"},
]

# SimpleQA (openai/simple-evals simple_qa_test_set.csv): metadata, problem, answer.
SIMPLEQA_HEADER = ["metadata", "problem", "answer"]
SIMPLEQA = [
    ["{'topic': 'Geography', 'answer_type': 'Place', 'urls': ['https://example.org']}",
     "In which city is the Eiffel Tower?", "Paris"],
    ["{'topic': 'Science and technology', 'answer_type': 'Number', 'urls': []}",
     "How many moons does Mars have?", "2"],
    ["{'topic': 'History', 'answer_type': 'Date', 'urls': []}",
     "In which year did the Berlin Wall fall?", "1989"],
]


def write_csv(path: Path, header: list[str], rows: list[list[str]], gz: bool = False) -> Path:
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def write_jsonl(path: Path, rows: list[dict], gz: bool = False) -> Path:
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return path


def fixture(fmt: str, tmp_path: Path, gz: bool = False) -> Path:
    """The hand-made fixture of `fmt` written in its official layout."""
    suffix = ".gz" if gz else ""
    if fmt == "theoremqa":
        path = tmp_path / f"theoremqa_test.json{suffix}"
        (gzip.open if gz else open)(path, "wt", encoding="utf-8").write(json.dumps(THEOREMQA))
        return path
    if fmt == "gpqa":
        return write_csv(tmp_path / f"gpqa_diamond.csv{suffix}", GPQA_HEADER, GPQA, gz)
    if fmt == "arc":
        return write_jsonl(tmp_path / f"ARC-Challenge-Test.jsonl{suffix}", ARC, gz)
    return write_csv(tmp_path / f"simple_qa_test_set.csv{suffix}", SIMPLEQA_HEADER, SIMPLEQA, gz)


def test_new_formats_are_registered():
    assert {"theoremqa", "gpqa", "arc", "simpleqa"} <= set(FORMATS)


def test_theoremqa_answers_and_skipped_pictures(tmp_path):
    skipped: dict[str, int] = {}
    out = tmp_path / "tqa.parquet"
    assert convert_file("theoremqa", fixture("theoremqa", tmp_path), out, skipped=skipped) == 6
    assert skipped == {"picture question": 1}
    examples = load_examples(out)
    assert [e.reference for e in examples] == ["True", "6", "3.14159", "[1, 2]", "(b)", "-1.602e-19"]
    assert [e.uid for e in examples] == ["t1", "t2", "t3", "t4", "t5", "t7"]
    assert examples[0].extra_info["answer_type"] == "bool"
    assert examples[0].prompt[-1]["content"] == "Is 7 a prime number?"
    assert {e.data_source for e in examples} == {"theoremqa"}


def test_theoremqa_jsonl_layout_without_pictures_column(tmp_path):
    rows = [{"Question": r["Question"], "Answer": r["Answer"], "Answer_type": r["Answer_type"]}
            for r in THEOREMQA[:3]]
    examples = load_examples_via(tmp_path, "theoremqa", write_jsonl(tmp_path / "tqa.jsonl", rows))
    assert [e.reference for e in examples] == ["True", "6", "3.14159"]


def load_examples_via(tmp_path, fmt, path, **kw):
    out = tmp_path / f"{fmt}_out.parquet"
    convert_file(fmt, path, out, **kw)
    return load_examples(out)


def test_theoremqa_reaches_the_math_grader_with_its_tolerance(tmp_path):
    examples = load_examples_via(tmp_path, "theoremqa", fixture("theoremqa", tmp_path))
    e = {ex.uid: ex for ex in examples}
    assert grader_for(e["t3"].data_source, e["t3"].ability) == "math"
    assert benchmark_rule(e["t3"].data_source).rel_tol == 0.04
    assert grade_example(e["t3"], "<answer>3.14</answer>").correct
    assert grade_example(e["t1"], "The answer is true.").correct
    assert grade_example(e["t4"], "\\boxed{[1, 2]}").correct
    assert grade_example(e["t4"], "\\boxed{[2, 1]}").correct  # TheoremQA sorts lists (issue 34)
    assert not grade_example(e["t4"], "\\boxed{[1, 1]}").correct and not grade_example(e["t4"], "\\boxed{1}").correct
    assert grade_example(e["t5"], "(b)").correct and grade_example(e["t1"], "Therefore, the statement is true.").correct
    assert grade_example(e["t5"], "<answer>(b)</answer>").correct
    assert not grade_example(e["t7"], "<answer>1.602e-19</answer>").correct  # the sign
    assert grade_example(e["t7"], "<answer>-1.6 \\times 10^{-19}</answer>").correct


def test_theoremqa_all_pictures_is_an_error(tmp_path):
    path = tmp_path / "pics.json"
    path.write_text(json.dumps([THEOREMQA[5]]))
    with pytest.raises(DataError, match="every row was skipped"):
        convert_file("theoremqa", path, tmp_path / "out.parquet")


@pytest.mark.parametrize("gz", [False, True])
def test_gpqa_options_shuffled_with_a_stored_seed(tmp_path, gz):
    examples = load_examples_via(tmp_path, "gpqa", fixture("gpqa", tmp_path, gz))
    assert len(examples) == 3
    for row, ex in zip(GPQA, examples):
        correct = row[2].strip()
        assert sorted(ex.choices) == sorted(c.strip() for c in row[2:6])
        assert ex.choices["ABCD".index(ex.reference)] == correct
        order = [int(i) for i in ex.extra_info["option_order"].split(",")]
        assert [[c.strip() for c in row[2:6]][i] for i in order] == ex.choices
        assert ex.extra_info["shuffle_seed"] == "0"
        assert ex.uid == row[0] and ex.data_source == "gpqa"
        assert "A. " in ex.prompt[-1]["content"] and "D. " in ex.prompt[-1]["content"]
    assert examples[1].prompt[-1]["content"].startswith("What is the pKa of acetic acid, approximately?\n")
    assert [e.reference for e in examples] != ["A", "A", "A"]  # not always listed first


def test_gpqa_shuffle_is_deterministic(tmp_path):
    a = convert_rows("gpqa", [dict(zip(GPQA_HEADER, r)) for r in GPQA], source="gpqa")
    b = convert_rows("gpqa", [dict(zip(GPQA_HEADER, r)) for r in reversed(GPQA)], source="gpqa")
    assert [e.choices for e in a] == [e.choices for e in reversed(b)]  # per record, not per position


def test_gpqa_correct_letter_is_spread_over_many_rows():
    rows = [dict(zip(GPQA_HEADER, [f"r{i}", f"q{i}", "right", "w1", "w2", "w3", "", "", ""]))
            for i in range(200)]
    letters = [e.reference for e in convert_rows("gpqa", rows, source="gpqa")]
    assert all(25 <= letters.count(x) <= 75 for x in "ABCD")


@pytest.mark.parametrize("gz", [False, True])
def test_arc_nested_records(tmp_path, gz):
    examples = load_examples_via(tmp_path, "arc", fixture("arc", tmp_path, gz))
    assert [e.reference for e in examples] == ["B", "C", "B"]
    assert [len(e.choices) for e in examples] == [4, 3, 5]
    assert examples[1].choices == ["0 C", "50 C", "100 C"]
    assert "C. 100 C" in examples[1].prompt[-1]["content"]
    assert examples[0].uid == "Mercury_1" and examples[0].data_source == "arc"
    assert grader_for(examples[0].data_source, examples[0].ability, True) == "multiple_choice"
    assert grade_example(examples[1], "The answer is c.").correct
    assert grade_example(examples[2], "<answer>oxygen</answer>").correct


@pytest.mark.parametrize("row, field", [
    ({"question": "x", "answerKey": "A"}, "question"),
    ({"question": {"stem": "s", "choices": [{"text": "a", "label": "A"}]}, "answerKey": "A"},
     "question.choices"),
    ({"question": {"stem": "s", "choices": [{"text": t, "label": t} for t in "ABC"]}, "answerKey": "D"},
     "answerKey"),
])
def test_arc_malformed_rows(row, field):
    with pytest.raises(DataError, match=f"row 1: field '{field}'"):
        convert_rows("arc", [row], source="arc")


def test_theoremqa_keeps_each_answers_json_type(tmp_path):
    """Issue 34: a float that is a whole number stays a float ("1.0", "-6e+25"), so the grader
    applies TheoremQA's 4% to it, not the integer rule (round)."""
    rows = [{"Question": "q1", "Answer": 1.0, "Answer_type": "float"},
            {"Question": "q2", "Answer": -6e+25, "Answer_type": "float"},
            {"Question": "q3", "Answer": 100, "Answer_type": "integer"},
            {"Question": "q4", "Answer": [0.5, 2.0], "Answer_type": "list of float"}]
    e = load_examples_via(tmp_path, "theoremqa", write_jsonl(tmp_path / "tqa.jsonl", rows))
    assert [x.reference for x in e] == ["1.0", "-6e+25", "100", "[0.5, 2.0]"]
    assert [x.extra_info["answer_type"] for x in e] == ["float", "float", "integer", "list of float"]
    assert grade_example(e[0], "\\boxed{1.03}").correct and not grade_example(e[0], "\\boxed{1.4}").correct
    assert grade_example(e[1], "\\boxed{-6.2 \\times 10^{25}}").correct
    assert not grade_example(e[1], "\\boxed{-6.5e25}").correct
    assert grade_example(e[2], "\\boxed{100.4}").correct and not grade_example(e[2], "\\boxed{103}").correct
    assert grade_example(e[3], "\\boxed{[2, 0.51]}").correct
    assert grade_example(e[2], "The answer is 100 J.").correct


def test_simpleqa(tmp_path):
    examples = load_examples_via(tmp_path, "simpleqa", fixture("simpleqa", tmp_path))
    assert [e.reference for e in examples] == ["Paris", "2", "1989"]
    assert examples[0].extra_info["topic"] == "Geography"
    assert examples[1].extra_info["answer_type"] == "Number"
    assert grader_for(examples[0].data_source, examples[0].ability) == "short_answer"
    assert grade_example(examples[0], "<answer>Paris</answer>").correct
    assert grade_example(examples[1], "The answer is two.").correct
    # the answer slot (issue 34): before ", which", not several candidates, not negated
    assert grade_example(examples[0], "The answer is Paris, which is on the Seine.").correct
    assert not grade_example(examples[0], "The answer is Paris or Lyon.").correct
    assert not grade_example(examples[0], "It wasn't Paris.").correct


def test_gz_input_for_existing_formats(tmp_path):
    rows = [{"question": "2+2?", "answer": "So 4.\n#### 4"}]
    assert load_examples_via(tmp_path, "gsm8k", write_jsonl(tmp_path / "t.jsonl.gz", rows, True))[0].reference == "4"
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(DataError, match="bad.jsonl.gz: cannot decompress"):
        convert_file("gsm8k", bad, tmp_path / "o.parquet")
    broken = write_jsonl(tmp_path / "broken.jsonl.gz", [{"question": "q", "answer": "no hashes"}], True)
    with pytest.raises(DataError, match="broken.jsonl.gz: row 1: field 'answer'"):
        convert_file("gsm8k", broken, tmp_path / "o.parquet")


def test_source_sets_data_source_of_a_generic_conversion(tmp_path, capsys):
    src = write_jsonl(tmp_path / "mine.jsonl", [{"question": "pi?", "answer": "3.14159"}])
    out = tmp_path / "mine.parquet"
    assert main(["data", "convert", "--format", "jsonl", "--input", str(src), "--output", str(out),
                 "--source", "theoremqa"]) == 0
    [ex] = load_examples(out)
    assert ex.data_source == "theoremqa"
    assert grade_example(ex, "<answer>3.14</answer>").correct  # TheoremQA's 4% rule reached
    convert_file("jsonl", src, out)
    assert load_examples(out)[0].data_source == "jsonl"


def test_cli_reports_skipped_rows(tmp_path, capsys):
    out = tmp_path / "t.parquet"
    assert main(["data", "convert", "--format", "theoremqa", "--input",
                 str(fixture("theoremqa", tmp_path, gz=True)), "--output", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "wrote 6 rows" in printed and "skipped 1 rows (picture question)" in printed
