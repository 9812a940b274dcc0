"""Every grader reads the whole decisive part of a response (issue 59, item 2; grading/decisive.py).

Two different answers after the reasoning (two final lines, two tags, two boxes however separated,
a second choice, a condition, a postscript, "equally valid") are not committed and earn nothing; a
correction ("no wait", "actually", "I mean") withdraws what it corrects and the corrected value is
the answer; a restatement of the same answer stays credited. The property tests build each class
from parts for every grader (multiple choice, math, short answer); each class was graded otherwise
by version 5 (the examples marked in `V5_WRONG` are checked to have been).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpr.data.records import Example
from rlpr.grading import LETTERS, grade_example

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=40, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def example(source: str, reference: str, question: str = "Which one is right?", choices=None) -> Example:
    return Example(prompt=[{"role": "user", "content": question}], reference=reference,
                   data_source=source, choices=choices or [])


# A grader's case: (data source, question, choices, gold, other); the answers are written as they are.
NAMES = ["Paris", "Lyon", "Marie Curie", "Lake Victoria", "Johannes Kepler", "Ulaanbaatar", "Nile", "1969", "42"]
NUMBERS = ["12", "7", "0.5", "\\frac{3}{4}", "144", "2.5", "-3"]


@st.composite
def cases(draw):
    kind = draw(st.sampled_from(["mc", "math", "short"]))
    if kind == "mc":
        n = draw(st.integers(3, 10))
        gold, other = draw(st.lists(st.sampled_from(LETTERS[:n]), min_size=2, max_size=2, unique=True))
        source = draw(st.sampled_from(["mmlu", "gpqa_diamond", "arc_challenge", "mmlu_pro"]))
        return example(source, gold, choices=[f"option number {i}" for i in range(n)]), gold, other
    pool = NUMBERS if kind == "math" else NAMES
    gold, other = draw(st.lists(st.sampled_from(pool), min_size=2, max_size=2, unique=True))
    source = "math500" if kind == "math" else draw(st.sampled_from(["simpleqa", "nq_open"]))
    return example(source, gold, "What is the value asked for?" if kind == "math" else "Who or what is it?"), gold, other


REASONING = ["", "Let me think about this step by step. ", "We compare the candidates carefully.\n\n"]
# Two answers after the reasoning: never credited, whichever is the reference.
TWO_ANSWERS = [
    "Final answer: {A}\nFinal answer: {B}",
    "<answer>{A}</answer>\n<answer>{B}</answer>",
    "\\boxed{{{A}}}\n\nSo we get \\boxed{{{B}}}.",
    "\\boxed{{{A}}}. Checking once more, the result is \\boxed{{{B}}}.",
    "Answer: {A}\nSecond choice: {B}",
    "The answer is {A}. Then again, {B}.",
    "The answer is {A}. Alternatively, {B}.",
    "The answer is {A}.\n\nP.S. It could also be {B}.",
    "Answer: {A}. Or {B}.",
    "The answer is {A} ({B} is equally valid).",
    "The answer is {A}. {B} is also correct.",
    "Answer: {A}, unless the question means {B}.",
    "The answer is {A}. I choose {B}.",
    "Answer: {A}. On the other hand, {B}.",
]
# A correction: the corrected value ({B}) is the answer.
CORRECTIONS = [
    "Answer: {A} -- no wait, {B}",
    "The answer is {A}. Wait, no: the answer is {B}.",
    "Answer: {A}. Actually, {B}.",
    "Answer: {A}, I mean {B}.",
    "\\boxed{{{A}}} -- sorry, \\boxed{{{B}}}",
    "The answer is {A}. On second thought, the answer is {B}.",
    "Answer: {A}. Scratch that: {B}.",
]
# The same answer said again: credited.
RESTATEMENTS = [
    "The answer is {G}. So the answer is {G}.",
    "Final answer: {G}\nFinal answer: {G}",
    "<answer>{G}</answer> <answer>{G}</answer>",
    "\\boxed{{{G}}}\n\nTherefore, the final answer is \\boxed{{{G}}}.",
    "Answer: {G}. I choose {G}.",
    "The answer is {G}. Actually, I am confident it is {G}.",
]


@PROPERTY
@given(cases(), st.sampled_from(TWO_ANSWERS), st.sampled_from(REASONING), st.booleans())
def test_two_answers_after_the_reasoning_are_not_committed(case, template, reasoning, gold_first):
    e, gold, other = case
    a, b = (gold, other) if gold_first else (other, gold)
    response = reasoning + template.format(A=a, B=b)
    assert not grade_example(e, response).correct, response


@PROPERTY
@given(cases(), st.sampled_from(CORRECTIONS), st.sampled_from(REASONING))
def test_a_correction_withdraws_what_it_corrects(case, template, reasoning):
    e, gold, other = case
    to_gold = reasoning + template.format(A=other, B=gold)
    away = reasoning + template.format(A=gold, B=other)
    assert grade_example(e, to_gold).correct, to_gold
    assert not grade_example(e, away).correct, away


@PROPERTY
@given(cases(), st.sampled_from(RESTATEMENTS), st.sampled_from(REASONING))
def test_a_restatement_of_the_same_answer_stays_credited(case, template, reasoning):
    e, gold, _ = case
    response = reasoning + template.format(G=gold)
    assert grade_example(e, response).correct, response


# Examples of each class that version 5 graded the other way (checked against v5 when written).
V5_WRONG = [
    ("mmlu", "B", "Answer: B. Then again, C.", False),
    ("mmlu", "B", "Final answer: C\nFinal answer: B", False),
    ("mmlu", "C", "<answer>B</answer> <answer>C</answer>", False),
    ("mmlu", "B", "Answer: B\n\nP.S. It could also be C.", False),
    ("mmlu", "B", "The answer is B (option C is equally valid).", False),
    ("mmlu", "B", "Answer: B, unless the question means C.", False),
    ("mmlu", "D", "Answer: C -- no wait, D", True),
    ("mmlu", "C", "Answer: C -- no wait, D", False),
    ("math500", "13", "\\boxed{12}\n\nsome more text\n\n\\boxed{13}", False),
    ("math500", "12", "The answer is 12. Then again, 13.", False),
    ("simpleqa", "Paris", "The answer is Paris. Then again, Lyon.", False),
    ("simpleqa", "Paris", "Lyon -- no wait, Paris.", True),
]


@pytest.mark.parametrize("source, reference, response, correct", V5_WRONG)
def test_each_class_on_examples_version_5_graded_otherwise(source, reference, response, correct):
    choices = ["w", "x", "y", "z"] if source == "mmlu" else None
    e = example(source, reference, "What is the capital of France?", choices)
    assert grade_example(e, response).correct is correct


def test_reasoning_before_the_first_cue_is_not_part_of_the_decisive_part():
    e = example("mmlu", "B", choices=["w", "x", "y", "z"])
    response = ("Option A is wrong: it ignores friction. Option C fails too, and D is too large.\n\n"
                "The answer is B.")
    assert grade_example(e, response).correct


def test_a_correction_marker_with_no_answer_after_it_corrects_nothing():
    e = example("simpleqa", "Paris", "What is the capital of France?")
    assert grade_example(e, "The answer is Paris. Actually, it is the most visited city in Europe.").correct
    m = example("mmlu", "B", choices=["w", "x", "y", "z"])
    assert grade_example(m, "The answer is B. Actually, this follows from Newton's second law.").correct


def test_degenerate_text_after_an_early_cue_is_read_fast():
    e = example("mmlu", "B", choices=["w", "x", "y", "z"])
    assert not grade_example(e, "The answer is B. " + "Then again, maybe. " * 5_000 + "Answer: C").correct


@pytest.mark.parametrize("source, reference, response, correct", [
    ("nq_open", "one", "Answer: Guy Boucher. Hmm, no wait -- one.", True),  # a strong marker, a lowercase value
    ("nq_open", "R. H. Thomson", "Answer: 53. No wait -- R. H. Thomson.", True),  # read to the sentence's end
    ("nq_open", "September 14, 2008", "Answer: John Young. I mean September 14, 2008.", True),
    ("math500", "-50", "Answer: 720. Hmm, no wait -- -50.", True),  # the minus is the value's
    ("math500", "p - q", "Answer: 27. No wait -- p - q.", True),
    ("math500", "\\left( 3, \\frac{\\pi}{2} \\right)", "Answer: 6 - 5i. No wait -- \\left( 3, \\frac{\\pi}{2} \\right).", True),
    ("nq_open", "Rihanna", "The answer is Rihanna. Then again, an armature of piped masonry.", False),
    ("nq_open", "Lisa Stelly", "Answer: Lisa Stelly. the Elkia Federation is also plausible.", False),
    ("nq_open", "Cathy Dennis", "Answer: Cathy Dennis\n\nP.S. Or one.", False),  # a number word is another value
    ("nq_open", "Paris", "The answer is Paris. Perhaps the most famous city in Europe.", True),  # offers no candidate
])
def test_values_after_a_correction_or_an_offer(source, reference, response, correct):
    assert grade_example(example(source, reference, "Who or what is it?"), response).correct is correct


@pytest.mark.parametrize("word", ["orange", "Oregon", "Orlando", "orbit", "Eithers", "Maybelline", "Perhapsville"])
def test_an_answer_that_begins_like_an_offer_word_is_not_an_offer(word):
    """The offer words ("or", "either", "maybe", "perhaps") are whole words: "orange" is no "or" offering
    "ange" (the v6 probe's first tree refused a bare "orange", the colour of a carrot)."""
    assert grade_example(example("demo/color", word), word).correct
    assert grade_example(example("demo/color", word), f"The answer is {word}.").correct
    assert not grade_example(example("demo/color", word), f"{word}, or maybe Blue").correct
