"""LaTeX in an answer is the answer's markup, never an offered alternative (issue 59, item 1).

Grader version 5 read the backslash of a LaTeX command after a space ("5.2 \\text{ m/s}") as a
separator of two candidates and refused TheoremQA's own answer format on every row. Every LaTeX form
rlpr writes or reads (\\text{}, \\mathrm{}, \\, , \\times 10^{k}, ^\\circ, \\%) is graded here inside
\\boxed{}, $...$ and answer tags, credited when the value is the reference, and still refused when an
alternative follows it.
"""

from __future__ import annotations

import pytest

from rlpr.grading import benchmark_rule, grade

pytestmark = pytest.mark.unit

THEOREMQA = benchmark_rule("TheoremQA")

# (answer as LaTeX, the reference it is)
VALUES = [
    ("5.2 \\text{ m/s}", "5.2"),
    ("5.2 \\text{m/s}", "5.2"),
    ("5.2\\text{ m/s}", "5.2"),
    ("5.2 \\mathrm{m/s}", "5.2"),
    ("5.2 \\mathrm{~m/s}", "5.2"),
    ("5.2\\,\\mathrm{m/s}", "5.2"),
    ("5.2 \\, \\text{kg}", "5.2"),
    ("5.2\\ \\text{kg}", "5.2"),
    ("9.8 \\, \\text{m/s}^2", "9.8"),
    ("1.42 \\times 10^{0}", "1.42"),
    ("1.42 \\times 10^{3}", "1420"),
    ("1.42 \\times 10^{-3}", "0.00142"),
    ("6.02 \\times 10^{23}", "6.02e23"),
    ("30^\\circ", "30"),
    ("30 ^{\\circ}", "30"),
    ("30^{\\circ} \\text{C}", "30"),
    ("25\\%", "0.25"),
    ("25 \\%", "0.25"),
]
WRAPPERS = [
    "\\boxed{{{}}}",
    "The answer is $\\boxed{{{}}}$.",
    "${}$",
    "The answer is ${}$.",
    "<answer> {} </answer>",
    "<answer>${}$</answer>",
    "<answer>\\boxed{{{}}}</answer>",
]


@pytest.mark.parametrize("wrapper", WRAPPERS)
@pytest.mark.parametrize("latex, reference", VALUES)
def test_latex_units_and_notation_are_credited(latex, reference, wrapper):
    response = wrapper.format(latex)
    assert grade("math", response, reference, rule=THEOREMQA).correct, response


@pytest.mark.parametrize("wrapper", ["\\boxed{{{}}} (or possibly 77)", "<answer> {} </answer> (or possibly 77)",
                                     "The answer is ${}$ (or possibly 77).", "\\boxed{{{}}} / 77"])
@pytest.mark.parametrize("latex, reference", [v for v in VALUES if "%" not in v[0]])
def test_latex_answers_hedged_after_stay_refused(latex, reference, wrapper):
    response = wrapper.format(latex)
    assert not grade("math", response, reference, rule=THEOREMQA).correct, response


@pytest.mark.parametrize("latex", ["5.2 \\text{ m/s}", "5.2\\,\\mathrm{m/s}", "1.42 \\times 10^{0}"])
def test_latex_answers_of_another_value_are_wrong(latex):
    assert not grade("math", f"\\boxed{{{latex}}}", "7.5", rule=THEOREMQA).correct


def test_a_backslash_standing_alone_still_separates_names():
    assert not grade("short_answer", "Bobby Scott \\ Bob Russell", "Bobby Scott").correct
    assert grade("short_answer", "\\boxed{Bobby Scott}", "Bobby Scott").correct


@pytest.mark.parametrize("response", ["\\boxed{100 \\text{ km}}", "<answer> 100 \\text{ km} </answer>",
                                      "The answer is $100 \\, \\mathrm{km}$."])
def test_units_after_a_space_in_a_short_answer(response):
    assert grade("short_answer", response, "100 km").correct
