"""samples.jsonl of `rlpr eval` carries the reference, the grader, the extracted answer and the
rule that decided (issue 17, item 7)."""

from __future__ import annotations

import json

from helpers import ScriptedEngine, write_eval_data as _write_data

from rlpr.config import RolloutConfig
from rlpr.evaluation.benchmark import evaluate_files
import pytest

pytestmark = pytest.mark.unit


def test_samples_carry_reference_extracted_answer_and_rule(tmp_path, tokenizer):
    math_file, mc_file = _write_data(tmp_path)
    engine = ScriptedEngine(tokenizer, ["<think>easy</think> <answer>0</answer>", "The answer is b."])
    evaluate_files(engine, tokenizer, [math_file, mc_file], tmp_path / "out",
                   RolloutConfig(max_new_tokens=8, batch_sequences=4), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    math = [r for r in rows if r["benchmark"] == "math500"]
    assert [r["reference"] for r in math] == ["0", "2", "4"]
    want = {"reference": "0", "extracted": "0", "grader": "math", "rule": "answer_tag:identical",
            "correct": True}
    assert {k: math[0][k] for k in want} == want
    assert math[1]["rule"] == "answer_phrase:symbolic" and math[1]["extracted"] == "b"
    assert not math[1]["correct"]
    mc = [r for r in rows if r["benchmark"] == "gpqa_tiny_Avg2"]
    assert {r["reference"] for r in mc} == {"B"} and {r["grader"] for r in mc} == {"multiple_choice"}
    said_b = [r for r in mc if r["response"] == "The answer is b."]
    assert said_b and all(r["correct"] and r["extracted"] == "B" and r["rule"] == "answer_phrase"
                          for r in said_b)
    assert list(rows[0])[:8] == ["benchmark", "uid", "sample", "reference", "response", "extracted",
                                 "grader", "rule"]
