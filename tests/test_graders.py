"""Table-driven tests for the rule-based graders (rlpr.grading)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rlpr import grading as graders
from rlpr.grading import (
    GRADERS,
    Grade,
    extract_final_answer,
    grade,
    grade_math,
    grade_multiple_choice,
    grade_short_answer,
    grader_for,
    token_f1,
)

pytestmark = pytest.mark.unit

CAPITALS = ["London", "Paris", "Rome", "Berlin"]
GARBAGE = "lorem {ipsum} \\boxed{ (( $x$ ) 7 ]] " * 5_000  # ~180k chars, unbalanced braces


def short_id(value):
    """Readable test ids for the huge inputs."""
    return repr(value)[:40] if isinstance(value, str) else None


# --------------------------------------------------------------------------- extract_final_answer

@pytest.mark.parametrize("response, expected", [
    ("<answer>42</answer>", "42"),
    ("<think>hmm</think> <answer> Paris </answer>", "Paris"),
    ("<answer>1</answer> wait <answer>2</answer>", "2"),
    ("<answer>1</answer> then <answer>2", "2"),  # unclosed final tag
    ("<ANSWER>x</ANSWER>", "x"),
    ("<answer>5</answer> <answer>  </answer>", "5"),  # an empty last tag holds nothing
    ("<answer>so \\boxed{7}</answer>", "7"),  # a \boxed inside the tags is unwrapped
    ("<answer>\\boxed{1} or \\boxed{2}</answer>", "2"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("first \\boxed{1}, finally \\boxed{2}", "2"),
    ("\\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("\\boxed{3} and a cut-off \\boxed{\\frac{1}{", "3"),
    ("\\fbox{9}", "9"),
    ("$\\boxed{\\text{(B)}}$", "\\text{(B)}"),
    ("the answer is 4", None),
    ("", None),
    ("\\boxed{}", None),
    (GARBAGE, None),
], ids=short_id)
def test_extract_final_answer(response, expected):
    assert extract_final_answer(response) == expected


# --------------------------------------------------------------------------- multiple choice

@pytest.mark.parametrize("response, reference, choices, correct, extracted", [
    # letter in an explicit answer part
    ("\\boxed{B}", "B", None, True, "B"),
    ("\\boxed{\\text{(B)}}", "B", None, True, "B"),
    ("<answer> C </answer>", "C", None, True, "C"),
    ("<answer>(B) Paris</answer>", "B", CAPITALS, True, "B"),
    ("<answer>B. Paris</answer>", "B", CAPITALS, True, "B"),
    ("<answer>b</answer>", "B", None, True, "B"),
    ("<answer>D", "D", None, True, "D"),  # unclosed tag
    ("<answer>The answer is $\\boxed{D}$</answer>", "D", None, True, "D"),
    ("<answer>A</answer> ... <answer>C</answer>", "A", None, False, "C"),  # last wins
    # answer phrases
    ("so the answer is (D)", "D", None, True, "D"),
    ("The answer is B, not C", "B", None, True, "B"),
    ("The answer is B, not C", "C", None, False, "B"),
    ("Answer: C", "C", None, True, "C"),
    ("The correct answer is **C**.", "C", None, True, "C"),
    ("Option A is tempting. The answer is option D.", "D", None, True, "D"),
    ("A cat is sleeping, so the answer is C.", "C", None, True, "C"),
    # bare letters
    ("B.", "B", None, True, "B"),
    ("(B)", "B", None, True, "B"),
    ("**B**", "B", None, True, "B"),
    ("Thinking it over...\nA", "A", None, True, "A"),
    ("I choose B because A is wrong", "B", None, True, "B"),
    ("Both (A) and (C) look plausible, but (C) wins", "C", None, True, "C"),
    # the article "A" is not an option
    ("A cat is on the mat.", "A", None, False, None),
    ("A good approach is to compute the area first", "A", CAPITALS, False, None),
    # option text instead of a letter
    ("<answer>Paris</answer>", "B", CAPITALS, True, "B"),
    ("<answer>paris.</answer>", "B", CAPITALS, True, "B"),
    ("<answer>I think it is Paris, the capital</answer>", "B", CAPITALS, True, "B"),
    ("<answer>Paris or Rome</answer>", "B", CAPITALS, False, None),  # two options named
    ("<answer>Madrid</answer>", "B", CAPITALS, False, None),
    ("<answer>B</answer>", "Paris", CAPITALS, True, "B"),  # reference given as option text
    ("<answer>C</answer>", "(C)", None, True, "C"),
    # letters beyond the options are invalid
    ("<answer>E</answer>", "B", CAPITALS, False, None),
    ("<answer>E</answer>", "E", None, True, "E"),
    ("The answer is E. No wait, B.", "B", CAPITALS, True, "B"),
    # nothing usable
    ("", "A", None, False, None),
    ("I have no idea.", "B", CAPITALS, False, None),
    ("Ответ: В", "B", None, True, "B"),  # a Cyrillic Ve alone looks like, and reads as, a Latin B (issue 59)
    ("<answer>Pâris</answer>", "B", ["London", "Pâris"], True, "B"),
    ("<answer>" + "blah " * 20_000 + "</answer>", "A", CAPITALS, False, None),
    ("The answer is" + " " * 20_000 + "B", "B", None, True, "B"),  # no regex backtracking blow-up
], ids=short_id)
def test_grade_multiple_choice(response, reference, choices, correct, extracted):
    assert grade_multiple_choice(response, reference, choices) == Grade(correct, extracted)


# --------------------------------------------------------------------------- math

@pytest.mark.parametrize("response, reference, correct", [
    ("<answer>\\frac12</answer>", "0.5", True),
    ("<answer>0.5</answer>", "\\frac12", True),
    ("<answer>1/2</answer>", "0.5", True),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("\\boxed{\\dfrac{3}{4}}", "0.75", True),
    ("<answer>x=3</answer>", "3", True),
    ("\\boxed{\\text{(B)}}", "B", True),
    ("<answer>(1,2]</answer>", "(1, 2]", True),
    ("<answer>[1,2]</answer>", "(1, 2]", False),
    ("<answer>\\{2, 1\\}</answer>", "\\{1,2\\}", True),
    ("<answer>1,000</answer>", "1000", True),
    ("<answer>1,000,000</answer>", "10^6", True),
    ("<answer>5 cm</answer>", "5", True),
    ("<answer>\\sqrt{2}</answer>", "2^{1/2}", True),
    ("<answer>(x+1)^2</answer>", "x^2+2x+1", True),
    ("<answer>50\\%</answer>", "\\frac{1}{2}", True),
    ("<answer>\\$5</answer>", "5", True),
    ("<answer>−3</answer>", "-3", True),  # unicode minus
    ("<answer>π</answer>", "\\pi", True),  # unicode pi
    ("<answer>3.14</answer>", "\\pi", False),
    ("<answer>2</answer>", "3", False),
    ("\\boxed{1} hmm, actually \\boxed{2}", "2", True),  # last \boxed wins
    ("\\boxed{1} hmm, actually \\boxed{2}", "1", False),
    ("<answer>1</answer> on reflection <answer>7", "7", True),  # unclosed final tag
    ("<answer>The answer is 5</answer>", "5", True),
    ("Adding them up, the final answer is 42.", "42", True),  # no answer part: math-verify searches
    ("I am not sure.", "42", False),
    ("", "42", False),
    ("<answer>x=2 or x=3</answer>", "3", False),
    ("<answer>\\frac{1}{</answer>", "1", False),
    (GARBAGE, "8", False),
    ("<answer>" + "(" * 3_000 + "</answer>", "1", False),
], ids=short_id)
def test_grade_math(response, reference, correct):
    assert grade_math(response, reference).correct is correct


def test_grade_math_reports_extracted_answer():
    assert grade_math("so \\boxed{\\frac{1}{2}}", "0.5") == Grade(True, "\\frac{1}{2}")
    assert grade_math("I am not sure.", "42") == Grade(False, None)


def test_grade_math_acceptable_answers():
    assert grade_math("<answer>7</answer>", "6", acceptable=["7"]).correct


def test_grade_math_works_off_the_main_thread():
    """math-verify's signal timeout would raise in a worker thread; the grader disables it."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        result = pool.submit(grade_math, "<answer>\\frac12</answer>", "0.5").result()
    assert result.correct


def test_grade_math_times_out_instead_of_hanging(monkeypatch):
    from rlpr.grading import math_answers

    monkeypatch.setattr(math_answers, "_MATH_TIMEOUT_S", 1)
    assert not grade_math("<answer>10^{10^{10}}</answer>", "1").correct  # returns: no hang


# --------------------------------------------------------------------------- short answer

@pytest.mark.parametrize("response, reference, acceptable, correct", [
    ("<answer>Paris</answer>", "Paris", None, True),
    ("<answer>paris.</answer>", "Paris", None, True),
    ("<answer>  PARIS  </answer>", "paris", None, True),
    ("<answer>The Beatles</answer>", "Beatles", None, True),
    ("<answer>an apple</answer>", "Apple", None, True),
    ("<answer>\\text{Paris}</answer>", "Paris", None, True),
    ("\\boxed{Paris}", "Paris", None, True),
    ("<answer>New   York\nCity</answer>", "new york city", None, True),
    ("<answer>U.S.A.</answer>", "USA", None, True),
    ("<answer>four</answer>", "4", None, True),
    ("<answer>4.0</answer>", "four", None, True),
    ("<answer>1,000</answer>", "1000", None, True),
    ("<answer>0.50</answer>", "0.5", None, True),
    ("<answer>3.5</answer>", "35", None, False),  # the decimal point matters
    ("<answer>forty</answer>", "40", None, True),
    ("<answer>The answer is Paris</answer>", "Paris", None, True),
    ("<answer>NYC</answer>", "New York City", ["NYC", "New York"], True),
    ("<answer>Big Apple</answer>", "New York City", ["NYC"], False),
    ("Let me think.\nParis", "Paris", None, False),  # no answer part: the first statement decides
    ("Paris\nLet me explain why.", "Paris", None, True),
    ("The capital is Paris. Berlin is nice.", "Paris", None, True),
    ("Berlin or Paris", "Paris", None, False),  # a list of candidates is never correct
    ("The answer is Paris.\nHope this helps!", "Paris", None, True),
    ("**Answer:** Paris", "Paris", None, True),
    ("<answer>London</answer>", "Paris", None, False),
    ("<answer>Paris, France</answer>", "Paris", None, False),
    ("<answer>Paris</answer> ... <answer>Rome</answer>", "Paris", None, False),  # last wins
    ("<answer>Rome", "Rome", None, True),  # unclosed tag
    ("<answer>東京</answer>", "東京", None, True),
    ("<answer>Ünïcödé</answer>", "ünïcödé", None, True),
    ("<answer>ｐａｒｉｓ</answer>", "Paris", None, True),  # full-width letters
    ("<answer>the</answer>", "a", None, False),  # nothing left after normalization
    ("", "Paris", None, False),
    ("   \n  ", "Paris", None, False),
    ("<answer>" + "garbage " * 20_000 + "</answer>", "Paris", None, False),
    ("1" * 50_000 + ".5", "Paris", None, False),
], ids=short_id)
def test_grade_short_answer(response, reference, acceptable, correct):
    assert grade_short_answer(response, reference, acceptable).correct is correct


def test_first_statement_rule_with_the_question():
    from rlpr.grading import grade_short_answer as g

    q = "Mexico City is the capital of which country?"
    assert not g("Mexico City is the capital of which country?", "Mexico", None, q).correct  # echoed question
    assert not g("Mexico City is the capital of which country", "Mexico", None, q).correct
    assert g("Mexico City is the capital of Mexico.", "Mexico", None, q).correct
    assert g("It is the capital of Mexico.", "Mexico", None, q).correct
    q = "What is the capital of France?"
    for response, right in [("The capital of France is Paris.", True), ("Paris is the capital of France.", True),
                            ("Sure! The capital of France is Paris. It is lovely.", True),
                            ("Paris or Berlin", False), ("Rome, Berlin, Paris", False),
                            ("The capital of France is Berlin. Paris is nice.", False),
                            ("Is it Paris?", False)]:
        assert g(response, "Paris", None, q).correct is right, response
    q = "Which is the largest of these numbers: 12, 45, 7?"
    assert g("The largest of these numbers is 45.", "45", None, q).correct
    assert not g("12, 45, 7", "45", None, q).correct
    q = "Tom has 5 apples and gets 3 more. How many apples does he have now?"
    assert g("Tom has 5 apples and gets 3 more, so he has 8 apples now.", "8", None, q).correct
    assert not g("Tom has 5 apples.", "8", None, q).correct
    q = "What is the highest mountain in the world?"
    for response, right in [
            ("The highest mountain in the world is Mount Everest, which is approximately 8,848 meters tall.", True),
            ("It is Mount Everest, located in the Himalayas.", True),
            ("It is K2 or Mount Everest, which are both tall.", False),  # still an enumeration
            ("It is K2, which is taller than Mount Everest.", False),
            ("It is K2, Mount Everest.", False)]:
        assert g(response, "Mount Everest", None, q).correct is right, response


def test_grade_short_answer_reports_extracted_answer():
    assert grade_short_answer("Thinking...\nThe answer is Paris.", "Paris") == Grade(True, "Paris.")
    assert grade_short_answer("", "Paris") == Grade(False, None)


# --------------------------------------------------------------------------- token F1

@pytest.mark.parametrize("prediction, reference, expected", [
    ("Paris", "paris", 1.0),
    ("the cat sat", "a cat sat down", 0.8),
    ("cat cat", "cat", 2 / 3),
    ("London", "Paris", 0.0),
    ("", "", 1.0),
    ("", "Paris", 0.0),
    ("Paris", "", 0.0),
    ("four dogs", "4 dogs", 1.0),
], ids=short_id)
def test_token_f1(prediction, reference, expected):
    assert token_f1(prediction, reference) == pytest.approx(expected)


# --------------------------------------------------------------------------- dispatch

@pytest.mark.parametrize("data_source, ability, has_choices, expected", [
    ("mmlu", "", False, "multiple_choice"),
    ("mmlu_pro", "", False, "multiple_choice"),
    ("MMLU-Pro", "", False, "multiple_choice"),
    ("gpqa_diamond", "", False, "multiple_choice"),
    ("bbh-multiple-choice", "", False, "multiple_choice"),
    ("my_quiz", "", True, "multiple_choice"),
    ("math500", "", False, "math"),
    ("MATH", "", False, "math"),
    ("minerva", "", False, "math"),
    ("aime2024", "", False, "math"),
    ("amc23", "", False, "math"),
    ("gsm8k", "", False, "math"),
    ("TheoremQA", "", False, "math"),
    ("webinstruct", "math", False, "math"),
    ("webinstruct", "general", False, "short_answer"),
    ("triviaqa", "", False, "short_answer"),
    ("", "", False, "short_answer"),
], ids=short_id)
def test_grader_for(data_source, ability, has_choices, expected):
    assert grader_for(data_source, ability, has_choices) == expected


def test_grade_dispatches_with_the_right_extras():
    assert set(GRADERS) == {"multiple_choice", "math", "short_answer"}
    assert grade("multiple_choice", "<answer>Paris</answer>", "B", choices=CAPITALS).correct
    assert grade("math", "<answer>0.5</answer>", "\\frac12").correct
    assert grade("short_answer", "<answer>NYC</answer>", "New York", acceptable=["NYC"]).correct
    with pytest.raises(ValueError, match="unknown grader"):
        grade("essay", "x", "y")


# --------------------------------------------------------------------------- robustness

@settings(max_examples=40, deadline=None)
@given(response=st.text(max_size=300), reference=st.text(max_size=30),
       choices=st.none() | st.lists(st.text(max_size=20), max_size=6))
def test_no_grader_raises_on_arbitrary_text(response, reference, choices):
    for name in GRADERS:
        result = grade(name, response, reference, choices=choices, acceptable=choices)
        assert isinstance(result, Grade)
    assert 0.0 <= token_f1(response, reference) <= 1.0
    extract_final_answer(response)
