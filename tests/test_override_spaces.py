"""A dotted-override string keeps its spaces unless quoted (issue 17, item 7)."""

import pytest

from rlpr.config import parse_override

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, value", [
    ("reward.answer_cue=<answer> ", "<answer> "),
    ("a.b= x  y ", " x  y "),
    ("a.b=The answer is", "The answer is"),
    ('a.b="\\n<answer> "', "\n<answer> "),  # quoted: YAML escapes, spaces inside the quotes kept
    ("a.b='x '", "x "),
    ("a.b=3", 3), ("a.b=0.5", 0.5), ("a.b=true", True), ("a.b=[1, 2]", [1, 2]), ("a.b=", ""),
    ("a.b=null", None),
])
def test_override_values(text, value):
    assert parse_override(text)[1] == value
