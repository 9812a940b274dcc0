"""`rlpr grade`: responses produced elsewhere graded without a model, into the same files as
`rlpr eval`."""

from __future__ import annotations

import json

import pytest

from rlpr.cli.main import main
from rlpr.data.convert import convert_file

pytestmark = pytest.mark.integration


@pytest.fixture
def converted(tmp_path):
    src = tmp_path / "theoremqa.jsonl"
    rows = [{"Question": "pi?", "Answer": 3.14159, "Answer_type": "float"},
            {"Question": "Is 2 prime?", "Answer": True, "Answer_type": "bool"},
            {"Question": "Unanswered", "Answer": 5, "Answer_type": "integer"}]
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "theoremqa.parquet"
    convert_file("theoremqa", src, out)
    return out


def test_grade_writes_results_and_samples(tmp_path, converted, capsys):
    responses = tmp_path / "responses.jsonl"
    rows = [{"index": 0, "response": "<answer>3.14</answer>"},
            {"index": 0, "response": "The answer is 2.9."},
            {"index": 1, "response": "The answer is yes."},
            {"index": 1, "response": "\\boxed{False}"}]
    responses.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "graded"
    assert main(["grade", "--data", str(converted), "--responses", str(responses), "--output", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    r = results["theoremqa"]
    assert (r["n_questions"], r["samples_per_question"], r["questions_without_responses"]) == (2, 2, 1)
    assert r["accuracy"] == pytest.approx(0.5)
    assert results["general"]["benchmarks"] == ["theoremqa"]
    samples = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [(s["uid"], s["sample"], s["correct"]) for s in samples] == [
        ("0", 0, True), ("0", 1, False), ("1", 0, True), ("1", 1, False)]
    assert samples[0]["reference"] == "3.14159" and samples[0]["extracted"] == "3.14"
    assert samples[0]["rule"] == "answer_tag:numeric_rel_tol_0.04" and samples[0]["grader"] == "math"
    assert samples[2]["rule"] == "answer_phrase:boolean"
    assert "| theoremqa | Avg@2 | 50.0 |" in (out / "results.md").read_text()
    assert "theoremqa: Avg@2 50.0% (2 questions, 1 without responses)" in capsys.readouterr().out


@pytest.mark.parametrize("row, message", [
    ({"index": 3, "response": "x"}, "field 'index' must be an integer in 0..2"),
    ({"index": "0", "response": "x"}, "field 'index'"),
    ({"index": 0}, "field 'response' must be a string"),
])
def test_grade_bad_responses_are_one_line_errors(tmp_path, converted, capsys, row, message):
    responses = tmp_path / "r.jsonl"
    responses.write_text(json.dumps(row) + "\n")
    assert main(["grade", "--data", str(converted), "--responses", str(responses),
                 "--output", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and f"{responses}: row 1" in err and err.count("\n") == 1


def test_a_disk_that_fills_up_keeps_the_results_and_leaves_no_partial_file(tmp_path, converted, capsys,
                                                                              monkeypatch):
    """A full disk while writing the bulky samples.jsonl: one line naming it, results.json and
    results.md already written whole, no partial samples file or temporary left behind."""
    import rlpr.errors

    from test_trackers import FullDisk

    responses = tmp_path / "responses.jsonl"
    responses.write_text(json.dumps({"index": 0, "response": "<answer>3.14</answer>"}) + "\n")
    out = tmp_path / "graded"
    monkeypatch.setattr(rlpr.errors, "open", FullDisk(lambda path: ".samples.jsonl" in path), raising=False)
    assert main(["grade", "--data", str(converted), "--responses", str(responses), "--output", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"rlpr: error: cannot write {out / 'samples.jsonl'}: No space left on device"
    assert json.loads((out / "results.json").read_text())["theoremqa"]["n_questions"] == 1
    assert sorted(p.name for p in out.iterdir()) == ["results.json", "results.md"]


def test_an_output_that_would_replace_an_input_is_refused(tmp_path, converted, capsys):
    """`rlpr grade --responses out/samples.jsonl --output out` replaced the user's responses with
    its graded samples, and `rlpr data convert --input x.parquet --output x.parquet` the user's table
    with the converted rows (other columns and rows past --limit gone). Now one line naming both,
    before any work, and the input is untouched; by any path (./x, a link) and for every command
    that writes files it read."""
    out = tmp_path / "graded"
    out.mkdir()
    responses = out / "samples.jsonl"
    responses.write_text(json.dumps({"index": 0, "response": "<answer>3.14</answer>", "mine": "keep"}) + "\n")
    before = responses.read_bytes()
    flat = tmp_path / "flat.jsonl"
    flat.write_text(json.dumps({"question": "pi?", "answer": "3.14", "note": "mine"}) + "\n")
    link = tmp_path / "link.jsonl"
    link.symlink_to(flat)
    for argv, output, given, flag in [
        (["grade", "--data", str(converted), "--responses", str(responses), "--output", str(out)],
         responses, responses, "--responses"),
        (["data", "convert", "--format", "jsonl", "--input", str(flat), "--output", str(tmp_path / "." / "flat.jsonl")],
         flat, flat, "--input"),
        (["data", "convert", "--format", "jsonl", "--input", str(flat), "--output", str(link)], link, flat, "--input"),
        (["eval", "--data", str(responses), "--output", str(out)], responses, responses, "--data"),
        (["reward-quality", "--build-from", str(flat), "--samples", "1", "--output", str(flat)], flat, flat,
         "--build-from"),
        (["reward-quality", "--input", str(out / "scores.jsonl"), "--output", str(out)], out / "scores.jsonl",
         out / "scores.jsonl", "--input"),
    ]:
        (out / "scores.jsonl").write_text("{}\n")
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == (f"rlpr: error: {output}: the output would replace the input {given} "
                                           f"({flag}); write the output elsewhere\n"), argv
    assert responses.read_bytes() == before and json.loads(flat.read_text())["note"] == "mine"
    # another output, or an output folder beside the input: written as before
    assert main(["grade", "--data", str(converted), "--responses", str(responses), "--output", str(tmp_path / "o")]) == 0
    assert main(["data", "convert", "--format", "jsonl", "--input", str(flat), "--output", str(tmp_path / "f.parquet")]) == 0
