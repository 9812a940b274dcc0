"""Regression tests for the grader defects of issue 17 (signs, tolerance, "(a)", booleans, lists,
option letters, choice phrases, negations, long text without a cue) and the per-benchmark rules.

Every rule has hand-written positive and negative cases; test_graders.py keeps the original ones.
"""

from __future__ import annotations

import pytest

from rlpr.data.records import Example
from rlpr.grading import (
    BENCHMARK_RULES,
    DEFAULT_RULE,
    Grade,
    benchmark_rule,
    grade,
    grade_example,
    grade_math,
    grade_multiple_choice,
    grade_short_answer,
    normalize_answer,
    weak_cue_text,
)

pytestmark = pytest.mark.unit

CAPITALS = ["London", "Paris", "Rome", "Berlin"]
THEOREMQA = benchmark_rule("TheoremQA")


def short_id(value):
    return repr(value)[:40] if isinstance(value, str) else None


# --------------------------------------------------------------------------- 1. signs are kept

@pytest.mark.parametrize("text, normalized", [
    ("-1", "-1"), ("−1", "-1"), ("-1.50", "-1.5"), ("x = -3", "x -3"), ("$-3$", "-3"),
    ("-0.5", "-0.5"), ("1", "1"),
    ("well-known", "wellknown"), ("x-1", "x1"),  # hyphens are not signs
])
def test_normalize_keeps_minus_signs(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize("response, reference, correct", [
    ("<answer>-1</answer>", "-1", True),
    ("<answer>−1</answer>", "-1", True),
    ("The answer is -12.", "-12", True),
    ("<answer>1</answer>", "-1", False),
    ("<answer>-1</answer>", "1", False),
    ("The answer is 12.", "-12", False),
    ("<answer>-2.5</answer>", "2.5", False),
], ids=short_id)
def test_short_answer_sign_matters(response, reference, correct):
    assert grade_short_answer(response, reference).correct is correct


@pytest.mark.parametrize("response, reference, correct", [
    ("\\boxed{-1}", "-1", True), ("\\boxed{1}", "-1", False), ("\\boxed{-1}", "1", False),
], ids=short_id)
def test_math_sign_matters(response, reference, correct):
    assert grade_math(response, reference).correct is correct
    assert grade("math", response, reference, rule=THEOREMQA).correct is correct


# --------------------------------------------------------------------------- 2. numeric tolerance

def test_rules_table_states_theoremqa_tolerance():
    assert THEOREMQA.benchmark == "TheoremQA" and THEOREMQA.rel_tol == 0.04
    assert THEOREMQA.round_integers and THEOREMQA.grader == "math"
    assert benchmark_rule("theoremqa_test").rel_tol == 0.04
    for name in ("math500", "gsm8k", "aime24", "amc23", "minerva", "mmlu_pro", "gpqa", "nq_open"):
        assert benchmark_rule(name).rel_tol == 0.0, name
    assert benchmark_rule("mmlu_pro").benchmark == "MMLU-Pro"
    assert benchmark_rule("bbh/date_understanding").benchmark == "BIG-Bench Hard"
    assert benchmark_rule("my_own_data") is DEFAULT_RULE
    assert all(r.source and r.normalisation for r in BENCHMARK_RULES)


@pytest.mark.parametrize("source, expected", [
    ("TheoremQA", "TheoremQA"), ("theoremqa_test_800", "TheoremQA"), ("GPQA_Diamond", "GPQA-Diamond"),
    ("ARC-Challenge", "ARC"), ("aime2024", "AIME / AMC"), ("amc23_Avg8", "AIME / AMC"),
    ("minerva_math", "Minerva (OCW)"), ("Math-500_Avg2", "MATH / MATH-500"), ("math_test5000", "MATH / MATH-500"),
    ("nq_open_efficientqa", "NQ-Open"), ("bbh/date_understanding", "BIG-Bench Hard"),
    # names that only start like a benchmark get no benchmark's rule (no 4% tolerance)
    ("theoremqa_like_free_text", "other"), ("arcane_facts", "other"), ("mathematical_trivia", "other"),
    ("amcas_prep", "other"), ("gsm8k_hard_rewrite", "other"), ("simpleqa_verified_but_mine", "other"),
])
def test_benchmark_rule_matches_names_exactly(source, expected):
    assert benchmark_rule(source).benchmark == expected


@pytest.mark.parametrize("response, reference, correct", [
    ("<answer>3.1416</answer>", "3.14159", True),
    ("<answer>3.14</answer>", "3.14159", True),  # 3 significant digits
    ("<answer>3.2</answer>", "3.14159", True),  # 1.9% off
    ("<answer>3.3</answer>", "3.14159", False),  # 5% off
    ("<answer>-3.14</answer>", "3.14159", False),
    ("<answer>1.6e-19</answer>", "1.602e-19", True),
    ("<answer>1.6 \\times 10^{-19}</answer>", "1.602e-19", True),
    ("<answer>1.6e-18</answer>", "1.602e-19", False),
    ("<answer>0</answer>", "0.0", True),
    ("<answer>0.001</answer>", "0.0", False),  # no relative slack around zero
    ("<answer>\\frac{1}{3}</answer>", "0.333", True),
    ("<answer>30\\%</answer>", "0.3", True),
    # integer references: the rounded answer must equal them (TheoremQA's compare_two_numbers)
    ("<answer>7</answer>", "7", True),
    ("<answer>7.4</answer>", "7", True),
    ("<answer>7.6</answer>", "7", False),
    ("<answer>8</answer>", "7", False),  # 4% of 7 would accept nothing else, of 100 would: still exact
    ("<answer>103</answer>", "100", False),
], ids=short_id)
def test_theoremqa_relative_tolerance(response, reference, correct):
    assert grade("math", response, reference, rule=THEOREMQA).correct is correct


@pytest.mark.parametrize("response, reference", [
    ("<answer>3.1416</answer>", "3.14159"),
    ("<answer>3.14</answer>", "\\pi"),
    ("<answer>7.4</answer>", "7"),
    ("<answer>103</answer>", "100"),
], ids=short_id)
def test_exact_benchmarks_have_no_tolerance(response, reference):
    assert not grade_math(response, reference).correct
    for source in ("math500", "gsm8k", "aime24"):
        assert not grade("math", response, reference, rule=benchmark_rule(source)).correct


@pytest.mark.parametrize("response, reference, correct", [
    ("The answer is R. H. Thomson.", "R. H. Thomson", True),  # initials do not end the answer
    ("The answer is T.J. Miller.", "T.J. Miller", True),
    ("The answer is Dr. Jesse Bennett.", "Dr. Jesse Bennett", True),
    ("The answer is R. H. Thomson.", "R", False),
    ("The answer is Paris. Berlin is nice.", "Paris", True),
    ("The answer is ] ].", "] ]", True),  # BBH Dyck targets are all punctuation
    ("<answer> ) > </answer>", ") >", True),
    ("<answer> ) </answer>", ") >", False),
    ("<answer> ] </answer>", ") >", False),
], ids=short_id)
def test_short_answer_phrase_ends_and_punctuation_targets(response, reference, correct):
    assert grade_short_answer(response, reference).correct is correct


def test_short_answer_tolerance_only_when_asked():
    assert not grade_short_answer("<answer>3.1416</answer>", "3.14159").correct
    assert grade_short_answer("<answer>3.1416</answer>", "3.14159", rel_tol=0.04).correct
    assert not grade_short_answer("<answer>-3.1416</answer>", "3.14159", rel_tol=0.04).correct
    assert not grade_short_answer("<answer>pi</answer>", "3.14159", rel_tol=0.04).correct


# --------------------------------------------------------------------------- 3. "(a)" is a letter

@pytest.mark.parametrize("text, normalized", [
    ("(a)", "a"), ("(A)", "a"), ("a.", "a"), ("(b)", "b"), ("\\text{(a)}", "a"),
    ("the", ""), ("an apple", "apple"),  # articles still go
])
def test_normalize_keeps_a_lone_option_label(text, normalized):
    assert normalize_answer(text) == normalized


@pytest.mark.parametrize("grader, response, reference, correct", [
    ("short_answer", "<answer>(a)</answer>", "(a)", True),
    ("short_answer", "<answer>(A)</answer>", "(a)", True),
    ("short_answer", "<answer>(b)</answer>", "(a)", False),
    ("short_answer", "<answer>the</answer>", "(a)", False),
    ("math", "<answer>(a)</answer>", "(a)", True),
    ("math", "The answer is (a).", "(a)", True),
    ("math", "\\boxed{\\text{(A)}}", "(a)", True),
    ("math", "<answer>a</answer>", "(a)", True),
    ("math", "<answer>(b)</answer>", "(a)", False),
    ("math", "<answer>(a) or (b)</answer>", "(a)", False),  # two labels name nothing
], ids=short_id)
def test_option_label_a_can_be_correct(grader, response, reference, correct):
    assert grade(grader, response, reference, rule=THEOREMQA).correct is correct


# --------------------------------------------------------------------------- 4. math grader forms

@pytest.mark.parametrize("response, reference, correct", [
    ("<answer>true</answer>", "True", True),
    ("<answer>TRUE</answer>", "True", True),
    ("<answer>True</answer>", "true", True),
    ("<answer>yes</answer>", "True", True),
    ("<answer>\\text{False}</answer>", "False", True),
    ("<answer>No.</answer>", "False", True),
    ("The answer is true.", "True", True),
    ("<answer>False</answer>", "True", False),
    ("<answer>no</answer>", "True", False),
    ("<answer>1</answer>", "True", False),
    ("<answer>truth</answer>", "True", False),
], ids=short_id)
def test_math_booleans_case_insensitive(response, reference, correct):
    assert grade_math(response, reference).correct is correct


@pytest.mark.parametrize("response, reference, correct", [
    ("<answer>[1, 1]</answer>", "[1, 1]", True),
    ("<answer>[1,2,3]</answer>", "[1, 2, 3]", True),
    ("<answer>[0.5, -2]</answer>", "[\\frac12, -2]", True),
    ("The answer is [1, 2, 3].", "[1, 2, 3]", True),
    ("<answer>(3, \\frac{\\pi}{2})</answer>", "\\left( 3, \\frac{\\pi}{2} \\right)", True),
    ("<answer>[1]</answer>", "[1, 1]", False),  # a list is not a set
    ("<answer>[1, 1, 1]</answer>", "[1, 1]", False),
    ("<answer>[2, 1]</answer>", "[1, 2]", False),  # order matters
    ("<answer>[1, 2]</answer>", "[1, 2, 3]", False),
    ("<answer>[1, -2]</answer>", "[1, 2]", False),
], ids=short_id)
def test_math_lists_are_ordered(response, reference, correct):
    assert grade_math(response, reference).correct is correct


def test_math_lists_use_the_benchmark_tolerance():
    assert grade("math", "<answer>[3.14, 2.72]</answer>", "[3.14159, 2.71828]", rule=THEOREMQA).correct
    assert not grade("math", "<answer>[3.14, 2.72]</answer>", "[3.14159, 2.71828]").correct


@pytest.mark.parametrize("response, reference, correct", [
    ("The answer is 1e-24.", "1e-24", True),
    ("The answer is 1e-24.", "1", False),
    ("The answer is 1.", "1e-24", False),
    ("<answer>1e-24</answer>", "10^{-24}", True),
    ("<answer>4.5e33</answer>", "4.5 \\times 10^{33}", True),
    ("The answer is 3.5.", "3.5", True),
    ("The answer is 3.", "3.5", False),
    ("The final answer is: 12", "12", True),
    ("The answer is (b).", "(b)", True),
    ("The answer is False.", "False", True),
    ("The answer is False.", "True", False),
], ids=short_id)
def test_math_reads_the_answer_phrase_without_tags(response, reference, correct):
    assert grade_math(response, reference).correct is correct


def test_math_reports_the_rule_that_decided():
    g = grade("math", "<answer>3.1416</answer>", "3.14159", rule=THEOREMQA)
    assert g == Grade(True, "3.1416") and g.rule == "answer_tag:numeric_rel_tol_0.04"
    assert grade_math("\\boxed{[1, 2.0]}", "[1, 2]").rule == "boxed:ordered_list"
    assert grade_math("\\boxed{[1, 2]}", "[1,2]").rule == "boxed:identical"
    assert grade_math("The answer is true.", "True").rule == "answer_phrase:boolean"
    assert grade_math("\\boxed{x^{2}}", "x^2").rule == "boxed:symbolic"
    assert grade_math("Adding up we get $42.0$", "42").rule == "math_search:symbolic"
    assert grade_math("I am not sure.", "42").rule == "none"


# --------------------------------------------------------------------------- 5. multiple choice

@pytest.mark.parametrize("response, reference, choices, correct, extracted", [
    # lowercase letters after a cue
    ("The answer is c.", "C", None, True, "C"),
    ("The answer is (c)", "C", None, True, "C"),
    ("answer: b", "B", None, True, "B"),
    ("\\boxed{d}", "D", None, True, "D"),
    ("I pick a.", "A", None, True, "A"),
    ("The answer is a prime number, 7.", "A", None, False, None),  # the article is not option A
    ("The answer is c.", "B", None, False, "C"),
    # explicit choice phrases outrank option text (and stray letters)
    ("Paris is lovely, but I choose D.", "D", CAPITALS, True, "D"),
    ("Choose D", "D", CAPITALS, True, "D"),
    ("I pick A. Rome and Paris are other capitals.", "A", CAPITALS, True, "A"),
    ("Rome is old. option A", "A", CAPITALS, True, "A"),
    ("<answer>I pick A, London</answer>", "A", CAPITALS, True, "A"),
    ("<answer>Option C: Rome, not Paris</answer>", "C", CAPITALS, True, "C"),
    ("Paris.\nI go with option C.", "B", CAPITALS, False, "C"),
    # negated mentions are ignored
    ("Exclude option D", "D", CAPITALS, False, None),
    ("Exclude option D. I choose B.", "B", CAPITALS, True, "B"),
    ("We can rule out option A, so I choose C.", "C", CAPITALS, True, "C"),
    ("It is not option B; choose C", "C", CAPITALS, True, "C"),
    ("Option D is wrong. Option B is right.", "B", CAPITALS, True, "B"),
    ("Option D is incorrect.", "D", CAPITALS, False, None),
    ("Eliminate choice A and choice C. Select B.", "B", CAPITALS, True, "B"),
    ("Eliminate choice A.", "A", CAPITALS, False, None),
    ("It isn't A, so I choose B.", "B", CAPITALS, True, "B"),  # negation stays in its clause
    # letters in any case in the answer part
    ("<answer>c</answer>", "C", None, True, "C"),
    ("<answer>(c)</answer>", "C", None, True, "C"),
    ("<answer>c</answer>", "c", None, True, "C"),  # a lowercase reference
], ids=short_id)
def test_multiple_choice_cues(response, reference, choices, correct, extracted):
    assert grade_multiple_choice(response, reference, choices) == Grade(correct, extracted)


# --------------------------------------------------------------------------- long text, no cue

LONG_GARBAGE = "lorem ipsum (B) dolor B. sit amet 7 " * 200  # ~7k chars, no cue, no closing paragraph


def test_weak_cue_text_rule():
    assert weak_cue_text("short (B).") == "short (B)."
    assert weak_cue_text(LONG_GARBAGE) is None
    closing = LONG_GARBAGE + "\n\nSo the result is (C)."
    assert weak_cue_text(closing) == "So the result is (C)."
    assert weak_cue_text(LONG_GARBAGE + "\n\n" + "x " * 400) is None  # closing paragraph too long


@pytest.mark.parametrize("grader, response, reference, correct", [
    ("multiple_choice", LONG_GARBAGE, "B", False),
    ("multiple_choice", LONG_GARBAGE + "\n\nSo the result is (C).", "C", True),
    ("multiple_choice", LONG_GARBAGE + " The answer is C.", "C", True),  # a cue is read anywhere
    ("multiple_choice", LONG_GARBAGE + " I choose D", "D", True),
    ("math", LONG_GARBAGE, "7", False),
    ("math", LONG_GARBAGE + "\n\nSo we get $7$.", "7", True),
    ("math", LONG_GARBAGE + " The answer is 7.", "7", True),
    ("math", "Short: $7$", "7", True),
], ids=short_id)
def test_nothing_read_from_long_text_without_a_cue(grader, response, reference, correct):
    g = grade(grader, response, reference)
    assert g.correct is correct
    if response == LONG_GARBAGE:
        assert g.extracted is None and g.rule == "none:no_cue_in_long_text"


# --------------------------------------------------------------------------- dispatch

def test_grade_example_uses_the_benchmark_rule():
    def ex(source, reference, choices=()):
        return Example(prompt=[{"role": "user", "content": "q"}], reference=reference,
                       data_source=source, choices=list(choices))

    assert grade_example(ex("theoremqa", "3.14159"), "<answer>3.1416</answer>").correct
    assert not grade_example(ex("math500", "3.14159"), "<answer>3.1416</answer>").correct
    assert grade_example(ex("theoremqa", "True"), "The answer is true.").correct
    assert grade_example(ex("gpqa", "C", ["w", "x", "y", "z"]), "The answer is c.").correct
    assert grade_example(ex("arc", "B", ["w", "x", "y"]), "I choose B").correct
    assert not grade_example(ex("simpleqa", "-5"), "<answer>5</answer>").correct
