"""Graders read what a reader of the rendered response sees (issue 59, items 3 and 4; grading/rendering.py).

Hidden text (an HTML comment, a script or style block, an element marked hidden, a markdown comment,
zero-width characters) is no answer; full-width and look-alike letters (Cyrillic, Greek) read as the
Latin letters they look like, in the answer and in an alternative offered after it.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpr.data.records import Example
from rlpr.grading import LETTERS, grade_example
from rlpr.grading.rendering import visible

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def example(source: str, reference: str, choices=None, question: str = "What is the capital of France?") -> Example:
    return Example(prompt=[{"role": "user", "content": question}], reference=reference,
                   data_source=source, choices=choices or [])


HIDERS = ["<!-- {X} -->", "<!--answer: {X}-->", "<!-- The answer is {X}. -->", "<span hidden>The answer is {X}.</span>",
          "<div style=\"display:none\">Answer: {X}</div>", "<script>answer = '{X}'</script>",
          "<style>/* {X} */</style>", "\n[//]: # (The answer is {X})\n", "<!-- unclosed: the answer is {X}"]
KINDS = {  # data source, gold, other, choices
    "mc": ("mmlu", "B", "C", ["w", "x", "y", "z"]),
    "math": ("math500", "12", "13", None),
    "short": ("simpleqa", "Paris", "Lyon", None),
}


@PROPERTY
@given(st.sampled_from(sorted(KINDS)), st.sampled_from(HIDERS), st.booleans())
def test_hidden_text_is_no_answer(kind, hider, hidden_first):
    source, gold, other, choices = KINDS[kind]
    e = example(source, gold, choices)
    hidden = hider.format(X=gold)
    only_hidden = f"I am not sure. {hidden}" if hidden_first else f"{hidden} I am not sure."
    assert not grade_example(e, only_hidden).correct, only_hidden
    visible_answer, hidden_other = f"The answer is {gold}.", hider.format(X=other)
    both = (f"{visible_answer} {hidden_other}" if hidden_first or "unclosed" in hider  # it hides all after it
            else f"{hidden_other}\n{visible_answer}")
    assert grade_example(e, both).correct, both


LOOK_ALIKES = {"A": ["А", "Α", "Ａ"], "B": ["В", "Β", "Ｂ"], "C": ["С", "Ｃ"], "D": ["Ｄ"], "E": ["Е", "Ε", "Ｅ"]}


@PROPERTY
@given(st.sampled_from(sorted(LOOK_ALIKES)), st.data())
def test_look_alike_letters_read_as_the_latin_letter(gold, data):
    choices = [f"option {i}" for i in range(5)]
    e = example("gpqa_diamond", gold, choices)
    glyph = data.draw(st.sampled_from(LOOK_ALIKES[gold]))
    template = data.draw(st.sampled_from(["The answer is {X}.", "Answer: ({X})", "<answer>{X}</answer>", "\\boxed{{{X}}}"]))
    assert grade_example(e, template.format(X=glyph)).correct
    other = data.draw(st.sampled_from([x for x in LETTERS[:5] if x != gold]))
    alike = LOOK_ALIKES.get(other, [other])[0]
    for hedge in ("The answer is {X} or {Y}.", "The answer is {X} (or possibly {Y}).", "Answer: {X}/{Y}"):
        response = hedge.format(X=glyph, Y=alike)
        assert not grade_example(e, response).correct, response


def test_rendering_keeps_what_a_reader_sees():
    assert visible("Ｔｈｅ answer is Ｂ") == "The answer is B"
    assert visible("CO\u2082 and x\u00b2 and 10\u207b\u00b3") == "CO2 and x^{2} and 10^{-3}"
    assert visible("P\u0430ris") == "Paris"  # a Cyrillic a inside a Latin word
    assert visible("Москва") == "Москва"  # a word of another script stays
    assert visible("Par\u200bis") == "Paris"
    assert visible("<answer>B</answer>") == "<answer>B</answer>"  # rlpr's own tags are the answer

