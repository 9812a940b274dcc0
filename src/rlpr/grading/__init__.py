"""Rule-based graders: decide whether a model response answers a question correctly.

Each grader returns the answer it read out of the response along with the verdict, so an
evaluation report can show *why* a response was marked wrong. Graders never raise on model
output: a reward function must score every rollout, however malformed.

One module per rule family:
- `extraction`: where a final answer is read (`<answer>` tags, `\\boxed{}`, "the answer is",
  weak cues only from short text);
- `rendering`: the text a reader of the rendered response sees (no hidden text; NFKC, look-alikes);
- `decisive`: the decisive part of a response, read whole (corrections, a second answer, offers);
- `normalization`: answer keys (SQuAD normalization, numbers in one form), token F1;
- `canonical`: values read alike in any form (dates, percents, number words, scientific notation);
- `free_form`: short answers (an explicit answer, else the answer a response's statements give),
  read with `wording` (tokens, sentences, the question's focus), `answer_guards` (what keeps a
  mention of the reference from being the answer) and `answer_slot` (where an answer stands);
- `math_answers`: math answers compared with math-verify;
- `multiple_choice`: the option letter a response chooses;
- `dispatch`: which grader a data source gets, the per-benchmark rules, `grade`.
"""

from __future__ import annotations

# The graders' version: results graded by different versions never mix (benchmarks record it).
# Bump it whenever a grader accepts or rejects differently.
# 2: the free-form grader reads a statement's answer slot instead of its last words (issue 28).
# 3: coordinated clauses read one by one, an opening phrase mirroring the question's ("In
#    baseball, ..."), a year after its month, quoted "X" or "Y-z" lists, function words end a phrase;
#    asides (", of course,"), "due to", "However, in ..." taking nothing back.
# 4: one committed answer (issue 34): several distinct candidates ("B or D", "Answer: B, D",
#    "\\boxed{3} or \\boxed{5}"), a negated reference ("not (B)", "It wasn't X.") and a hedge
#    between two ("X, or maybe Y") are wrong whatever their order; answers read before ", which"
#    / ", and <clause>"; references with commas matched whole; TheoremQA's own rules.
# 5: no alternative after the committed answer (issue 43, grading/hedges.py): "B (or possibly C)",
#    "Paris (maybe Lyon)", "Paris/Lyon", "1969 -- or 1970", "Milky Way; Andromeda", "It was 1969, 1970."
# 6: (issue 59) LaTeX after a space is the answer's markup, not an alternative ("\\boxed{5.2 \\text{ m/s}}",
#    "1.42 \\times 10^{0}": v5 refused them); the decisive part read whole (grading/decisive.py): two different
#    answers after the reasoning are not committed, a correction ("no wait", "actually") gives the answer;
#    the rendered text only (grading/rendering.py: no HTML comments or hidden elements; NFKC, look-alike letters);
#    values in one form (grading/canonical.py): dates, percents (TheoremQA: % is /100), "approximately X",
#    scientific notation, number words and ordinals, "correct"/"incorrect" for True/False.
GRADER_VERSION = 6

from rlpr.grading.dispatch import (  # noqa: E402
    BENCHMARK_RULES,
    DEFAULT_RULE,
    GRADERS,
    BenchmarkRule,
    benchmark_name,
    benchmark_rule,
    grade,
    grade_example,
    grader_for,
    question_text,
)
from rlpr.grading.extraction import (  # noqa: E402
    answer_part,
    extract_final_answer,
    weak_cue_text,
)
from rlpr.grading.free_form import (  # noqa: E402
    first_statement,
    grade_short_answer,
    statement_answers,
)
from rlpr.grading.math_answers import grade_math, math_equal  # noqa: E402
from rlpr.grading.multiple_choice import LETTERS, grade_multiple_choice  # noqa: E402
from rlpr.grading.normalization import normalize_answer, token_f1  # noqa: E402
from rlpr.grading.verdict import Grade  # noqa: E402

__all__ = [
    "BENCHMARK_RULES", "DEFAULT_RULE", "GRADERS", "GRADER_VERSION", "LETTERS", "BenchmarkRule", "Grade",
    "answer_part", "benchmark_name", "benchmark_rule", "extract_final_answer", "first_statement",
    "grade", "grade_example", "grade_math", "grade_multiple_choice", "grade_short_answer", "grader_for",
    "math_equal", "normalize_answer", "question_text", "statement_answers", "token_f1", "weak_cue_text",
]
