"""The example files users copy (docs/your-data.md) load as documented."""

from pathlib import Path

import pytest

from rlpr.data.loading import load_examples

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_own_questions_example_loads():
    train = load_examples(EXAMPLES / "my_questions.jsonl", template="plain")
    val = load_examples(EXAMPLES / "my_questions_val.jsonl", template="plain")
    assert (len(train), len(val)) == (24, 6)
    assert not {e.prompt[-1]["content"] for e in train} & {e.prompt[-1]["content"] for e in val}  # held out
    by_id = {e.uid: e for e in train}
    assert by_id["q02"].reference == "William Shakespeare" and "Shakespeare" in by_id["q02"].acceptable
    assert by_id["q04"].reference == "100"  # numbers become text references
    mc = by_id["mc2"]
    assert mc.reference == "C" and mc.choices[2] == "Canberra" and "C. Canberra" in mc.prompt[-1]["content"]
