"""Which grader a row gets (by its data source's benchmark name, its ability, its choices), the
per-benchmark rules, and `grade` / `grade_example`, the one entry point through the registry."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

from rlpr.grading.free_form import grade_short_answer
from rlpr.grading.math_answers import grade_math
from rlpr.grading.multiple_choice import grade_multiple_choice
from rlpr.grading.verdict import Grade

# Benchmark names (lowercase, letters and digits) and the grader each gets. A data source matches
# a name exactly once `benchmark_name` has taken off the conventions around it; never a substring
# (issue 29: "trivia_reclaimed" went to math by its "aime", "gpqa_like_but_free" to multiple choice).
BENCHMARK_GRADERS: dict[str, str] = {
    **dict.fromkeys(("mmlu", "mmlupro", "gpqa", "gpqadiamond", "gpqamain", "gpqaextended",
                     "multiplechoice", "bbhmultiplechoice"), "multiple_choice"),
    **dict.fromkeys(("math", "math500", "hendrycksmath", "competitionmath", "minerva", "minervamath",
                     "aime", "amc", "gsm8k", "theoremqa"), "math"),
}
# Names with a year (aime24, aime2024, amc23) and the grader they get.
NAME_PATTERN_GRADERS: tuple[tuple[re.Pattern, str], ...] = (
    (re.compile(r"(?:aime|amc)(?:\d{2}|\d{4})"), "math"),
)
# A row's `ability` (lowercase) and the grader it gets when its benchmark name names none.
ABILITY_GRADERS: dict[str, str] = {"math": "math"}
DEFAULT_GRADER = "short_answer"
# trailing words that name a split, a sample size, a seed or Avg@k, not the benchmark
_CONVENTION_WORD = re.compile(r"avg\d+|seed\d+|\d+|(?:test|val|valid|validation|dev|train|eval)\d*")


def benchmark_name(data_source: str) -> str:
    """The benchmark a data source names, lowercase letters and digits: the part before a "/" (a
    subset: "mmlu/abstract_algebra"), without its trailing split, size, seed and _AvgK words
    ("MMLU_Pro_test_1000_seed0_Avg2" -> "mmlupro", "Math-500_Avg2" -> "math", "aime24" stays)."""
    words = re.findall(r"[a-z0-9]+", data_source.lower().split("/")[0])
    while len(words) > 1 and _CONVENTION_WORD.fullmatch(words[-1]):
        words.pop()
    return "".join(words)


def grader_for(data_source: str, ability: str = "", has_choices: bool = False) -> str:
    """Pick a grader name: rows with choices get multiple_choice; else the grader of the
    benchmark's name in BENCHMARK_GRADERS (mmlu, mmlu_pro, gpqa (_diamond, _main, _extended),
    multiple_choice -> multiple_choice; math, math500, minerva(_math), aime, amc, gsm8k, theoremqa
    -> math) or of a NAME_PATTERN_GRADERS pattern (aime24, amc2023 -> math); else the grader of
    the row's ability (ABILITY_GRADERS: 'math' -> math); otherwise short_answer. Names match
    exactly (`benchmark_name`), never as a substring."""
    if has_choices:
        return "multiple_choice"
    name = benchmark_name(data_source)
    if name in BENCHMARK_GRADERS:
        return BENCHMARK_GRADERS[name]
    by_pattern = next((g for pattern, g in NAME_PATTERN_GRADERS if pattern.fullmatch(name)), None)
    return by_pattern or ABILITY_GRADERS.get(ability.strip().lower(), DEFAULT_GRADER)


@dataclass(frozen=True)
class BenchmarkRule:
    """How one benchmark is graded, after its official evaluation code (docs/scoring-and-evaluation.md
    shows this table)."""

    benchmark: str
    keys: tuple[str, ...]  # benchmark names (`benchmark_name`), matched exactly, a trailing year or size aside
    grader: str
    rel_tol: float = 0.0  # relative numeric tolerance; 0: exact (math-verify's own rounding)
    round_integers: bool = False  # an integer reference equals the answer rounded to an integer
    sort_lists: bool = False  # list answers compared sorted (TheoremQA's compare_two_list)
    strip_units: bool = False  # "3.2 m/s" is the number 3.2 (TheoremQA's clean_units)
    normalisation: str = ""
    source: str = ""


# The one table of per-benchmark rules; the entry naming the data source's benchmark wins.
BENCHMARK_RULES: tuple[BenchmarkRule, ...] = (
    BenchmarkRule("TheoremQA", ("theoremqa",), "math", rel_tol=0.04, round_integers=True,
                  sort_lists=True, strip_units=True,
                  normalisation="by the reference's JSON type (kept by the converter): floats within 4%; "
                  "integers: the answer rounded; lists sorted, item by item, same length; booleans "
                  "True/False/yes/no/correct/incorrect, also in a sentence ('the statement is true'), one polarity, "
                  "not negated; options (a)-(d), also bare on the last line; plain units stripped ('3.2 m/s'); "
                  "scientific notation ('1e-24'); a percent X% is X/100 (clean_units) or, asked in percent, X",
                  source="https://github.com/TIGER-AI-Lab/TheoremQA (utils.py: compare_answer_with_groundtruth, "
                  "compare_two_numbers: within_eps |pred - gt| <= 0.04 |gt|, round(pred) == gt for int; "
                  "compare_two_list: sorted; clean_units: '%' -> '/100'; extract_theoremqa_answer: 'yes'/'true' "
                  "anywhere reads True, which rlpr narrows to one un-negated polarity)"),
    BenchmarkRule("GPQA-Diamond", ("gpqa", "gpqadiamond", "gpqamain", "gpqaextended"), "multiple_choice",
                  normalisation="option letter A-D in any case",
                  source="https://github.com/idavidrein/gpqa: four options, one letter; options shuffled at conversion"),
    BenchmarkRule("MMLU-Pro", ("mmlupro",), "multiple_choice",
                  normalisation="option letter A-J in any case",
                  source="https://github.com/TIGER-AI-Lab/MMLU-Pro evaluate_from_local.py: 'answer is (X)', then "
                  "'Answer: X', then the last letter"),
    BenchmarkRule("MMLU", ("mmlu",), "multiple_choice", normalisation="option letter A-D",
                  source="https://github.com/hendrycks/test: the letter of the correct option"),
    BenchmarkRule("ARC", ("arc", "arcchallenge", "arceasy", "ai2arc"), "multiple_choice",
                  normalisation="option letter (3-5 options)",
                  source="https://allenai.org/data/arc (allenai ARC): answerKey names one option"),
    BenchmarkRule("GSM8K", ("gsm8k",), "math", normalisation="exact number (symbolic, math-verify)",
                  source="https://github.com/openai/grade-school-math: the number after '####', exact"),
    BenchmarkRule("AIME / AMC", ("aime", "amc"), "math", normalisation="exact integer",
                  source="integer answers, exact"),
    BenchmarkRule("Minerva (OCW)", ("minerva", "minervamath"), "math",
                  normalisation="symbolic equality (math-verify; floats to 6 significant places)",
                  source="Lewkowycz et al. 2022 (symbolic / numeric equivalence); rlpr: exact"),
    BenchmarkRule("MATH / MATH-500", ("math", "hendrycksmath", "competitionmath"), "math",
                  normalisation="symbolic equality (math-verify)",
                  source="https://github.com/hendrycks/math is_equiv (normalized string); math-verify is stricter on "
                  "form and accepts equivalent forms"),
    BenchmarkRule("SimpleQA", ("simpleqa",), "short_answer",
                  normalisation="SQuAD normalization, exact match of the answer slot: after 'The answer "
                  "is', before ', which' / ', and <clause>' / a second sentence; a reference with commas "
                  "('March 5, 2010') whole; one candidate, not negated",
                  source="https://github.com/openai/simple-evals (simpleqa_eval.py) grades with an LLM (CORRECT / INCORRECT / NOT "
                  "ATTEMPTED; a hedged single answer is CORRECT, a hedge between candidates INCORRECT); the "
                  "rule grader is stricter: add --judge-url for the official rule"),
    BenchmarkRule("NQ-Open", ("nqopen", "nqopenefficientqa"), "short_answer",
                  normalisation="SQuAD normalization, exact match against any acceptable answer",
                  source="https://github.com/google-research-datasets/natural-questions nq_open: exact match"),
    BenchmarkRule("BIG-Bench Hard", ("bbh",), "short_answer",
                  normalisation="option letter when the target is '(X)', else exact match",
                  source="https://github.com/suzgunmirac/BIG-Bench-Hard: exact match of the target"),
)
DEFAULT_RULE = BenchmarkRule("other", (), "", normalisation="by grader_for: no tolerance")


def benchmark_rule(data_source: str) -> BenchmarkRule:
    """The entry of BENCHMARK_RULES for a data source (DEFAULT_RULE when none matches): its
    benchmark name (`benchmark_name`) equals a key, or does once a trailing year or size is off
    ("aime24", "math500"). Never a prefix: "theoremqa_like_free_text" gets no 4% tolerance."""
    name = benchmark_name(data_source)
    bare = re.sub(r"\d+$", "", name)
    return next((r for r in BENCHMARK_RULES if name in r.keys or bare in r.keys), DEFAULT_RULE)


# Every grader through one signature: (response, reference, choices, acceptable, question, rule),
# each passing on only the extras it uses (and the numeric tolerance of `rule`).
def _multiple_choice(response, reference, choices, acceptable, question, rule) -> Grade:
    return grade_multiple_choice(response, reference, choices)


def _math(response, reference, choices, acceptable, question, rule) -> Grade:
    return grade_math(response, reference, acceptable, rel_tol=rule.rel_tol, round_integers=rule.round_integers,
                      sort_lists=rule.sort_lists, strip_units=rule.strip_units)


def _short_answer(response, reference, choices, acceptable, question, rule) -> Grade:
    return grade_short_answer(response, reference, acceptable, question, rel_tol=rule.rel_tol)


# The registry of graders: the names grader_for, BENCHMARK_RULES and `grade` use.
GRADERS: dict[str, Callable[..., Grade]] = {
    "multiple_choice": _multiple_choice,
    "math": _math,
    "short_answer": _short_answer,
}


def grade(name: str, response: str, reference: str, *, choices: list[str] | None = None,
          acceptable: list[str] | None = None, question: str | None = None,
          rule: BenchmarkRule | None = None) -> Grade:
    """Grade with the named grader, passing each only the extras it uses (and the numeric
    tolerance of `rule`, a benchmark's entry in BENCHMARK_RULES)."""
    if name not in GRADERS:
        raise ValueError(f"unknown grader {name!r}; choose one of {', '.join(GRADERS)}")
    return GRADERS[name](response, reference, choices, acceptable, question, rule or DEFAULT_RULE)


def question_text(example) -> str:
    """The question of an `rlpr.data.records.Example` as a grader or a judge sees it: the last user
    turn."""
    users = [m["content"] for m in example.prompt if m.get("role") == "user"]
    return users[-1] if users else example.prompt[-1]["content"]


def grade_example(example, response: str) -> Grade:
    """The rule grader's verdict for one response to one `rlpr.data.records.Example` (the grader
    chosen by its data source; free-form answers are read against its question). The same
    verdict serves evaluation, `reward/accuracy` and `reward.kind=verifier`."""
    name = grader_for(example.data_source, example.ability, bool(example.choices))
    return grade(name, response, example.reference, choices=example.choices or None,
                 acceptable=example.acceptable or None, question=question_text(example),
                 rule=benchmark_rule(example.data_source))
