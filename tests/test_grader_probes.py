"""benchmarks/grader_probes.py, the gaming and wordings probes of the graders in one entry point: each
probe builds its forms from a row's reference (G) and another option or row's (O), the counting loop
grades them with the real graders, and the report table sums them per class."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from rlpr.data.records import Example

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("grader_probes", ROOT / "benchmarks" / "grader_probes.py")
gp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gp)


def mc(reference: str) -> Example:
    return Example(prompt=[{"role": "user", "content": "Pick one."}], reference=reference, data_source="mmlu",
                   ability="multiple_choice", choices=["w", "x", "y", "z"])


def free(reference: str) -> Example:
    return Example(prompt=[{"role": "user", "content": "Which city?"}], reference=reference, data_source="nq_open")


def test_each_probe_builds_its_forms_from_the_reference_and_another_answer():
    rows = [mc("B"), mc("C")]
    gaming = gp.responses(rows, "mc", "gaming")
    assert len(gaming) == 2 * len(gp.GAMING["mc"])
    by_form = {form: text for e, form, _, text, _ in gaming if e is rows[0]}
    assert by_form["bare"] == "B" and by_form["all_options"] == "The answer is A, B, C or D."
    other = by_form["gold_and_other"].split(" and ")[1]
    assert other in "ACD" and by_form["not_gold"] == "The answer is not B."
    wordings = gp.responses(rows, "mc", "wordings")
    look_alike = [text for e, cls, _, text, good in wordings if e is rows[0] and cls == "look_alike_letter"]
    assert look_alike[0] == "The answer is \u0412." and look_alike[2] == "<answer>\uff22</answer>"  # Cyrillic, full-width
    places = [free("Paris"), free("Rome"), free("Oslo")]
    for e, cls, wording, text, good in gp.responses(places, "free", "wordings"):
        assert "{" not in text and (cls != "value_in_another_form")  # city names have no other form
        if cls == "correction_to_reference" and e is places[0]:
            assert text.endswith("Paris.") or "Paris" in text.split("--")[-1]


def test_the_probes_grade_with_the_real_graders_and_sum_per_class(tmp_path, monkeypatch):
    data = tmp_path / "data"
    (data / "nq_open").mkdir(parents=True)
    rows = [{"question": f"capital number {i}", "answer": [city]} for i, city in
            enumerate(["Paris", "Rome", "Oslo", "Lima", "Bern"])]
    (data / "nq_open" / "NQ-open.dev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(gp, "DATA", data)
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # as running the script puts it (harness/)
    results = gp.probe("gaming", 5)
    assert list(results) == ["nq_open"]  # the data sets absent here are passed over
    forms = {w["class"]: w for w in results["nq_open"]["wordings"]}
    assert forms["bare"]["credited"] == 1.0 and forms["bare"]["n"] == 5
    assert forms["gold_or_other"]["credited"] == 0.0 and forms["not_gold"]["credited"] == 0.0
    classes = gp.by_class(results)
    assert classes["bare"] == {"must_be_credited": True, "credited": 5, "n": 5, "rate": 1.0, "passes": True}
    res = {"machine": "here", "commit": "c", "date": "d", "by_class": classes, "results": results,
           "meta": {"probe": "gaming", "grader_version": 6, "limit": 5}}
    text = gp.markdown(res)
    assert text.startswith("# Gaming probe (GRADER_VERSION 6)") and "| bare | credit | 100.0% | 5 | yes |" in text
