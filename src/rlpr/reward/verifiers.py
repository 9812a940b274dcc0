"""Rule verifiers for the verifier reward kinds: who decides that a response is correct (`reward.verifier`).

RLVR rewards a response with 1 when a verifier accepts it. What that verifier can read decides
what RLVR can teach, and RLPR exists because rule verifiers fail outside math and multiple
choice: a free-form answer can be right in a thousand phrasings that no rule anticipates (the
paper measures a rule verifier's ROC-AUC at 0.61 on general-domain responses). A fair RLVR
baseline therefore needs the verifier a real RLVR user would have, not rlpr's own eval grader,
which was written against hand-labeled responses of the very model being trained. Both are here,
in a registry (`VERIFIERS`), for `reward.kind=verifier` and the verifier part of `hybrid`:

- `oracle` (the default, rlpr's behaviour before the key existed): the eval grader's verdict
  (`rlpr.grading.grade_example`, the verdict of `rlpr eval` and `reward/accuracy`).
  For free-form answers it also reads an answer stated in a sentence ("Paris is the capital of
  France.", "The capital is Paris, which ..."): an upper bound for a rule verifier, and on the
  demo tasks the metric's own grader, so RLVR (oracle) is rewarded by exactly what is measured.
- `exact`: normalized exact match of the extracted answer, what rule-based verifiers do on
  free-form answers: the text inside the last `<answer>...</answer>` (or the last `\\boxed{}`),
  else the text after the last "answer is"/"answer:" up to the end of its sentence, else the
  response's first non-blank line up to the end of its first sentence; compared after
  `normalize_answer` (lowercase, no punctuation, no articles, numbers in one form) with the
  reference and each of its aliases. "Paris", "Paris." and "The answer is Paris." are accepted;
  "The capital of France is Paris, which ..." is not. The comparison is the same for every data
  kind (a multiple-choice letter matches its reference letter; math answers match as strings, not
  symbolically).

The functions below are pure: (response, answers, the grader's verdict) -> accepted; the caller
grades (`ProbabilityReward.verify`, the trainer) and reads no file. The graders' helpers are
imported when first used: the registry itself is read by the config's validation, which must stay
quick (the graders load math-verify, about 0.4 s).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

# "answer is X" / "answer: X" / "Answer is: X" (the last one counts), up to the end of its line
_ANSWER_PHRASE = re.compile(r"\banswer[\s*]*(?:is\b[\s*]*:?|:)[\s*]*(.*)$", re.IGNORECASE | re.MULTILINE)
# a sentence ends at . ! ? followed by white space (not the point of 3.5)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def first_sentence(text: str) -> str | None:
    """The first non-blank line of `text`, up to the end of its first sentence (None: no text)."""
    line = next((line.strip() for line in text.splitlines() if line.strip()), None)
    return None if line is None else _SENTENCE_END.split(line, maxsplit=1)[0].strip()


def exact_answer(response: str) -> str | None:
    """The answer a rule verifier reads: an answer part (`<answer>` tags, `\\boxed{}`), else what
    follows the last "answer is"/"answer:" up to its sentence's end, else the first sentence."""
    from rlpr.grading import extract_final_answer

    tagged = extract_final_answer(response)
    if tagged is not None:
        return tagged
    phrases = list(_ANSWER_PHRASE.finditer(response))
    if phrases:
        return first_sentence(phrases[-1].group(1)) or None
    return first_sentence(response)


def exact_key(response: str) -> str | None:
    """The extracted answer (`exact_answer`) after `normalize_answer`, what exact match compares and
    majority vote counts; None when there is none or it normalizes to nothing."""
    from rlpr.grading import normalize_answer

    answer = exact_answer(response)
    return (normalize_answer(answer) if answer is not None else "") or None


def exact_match(response: str, answers: Sequence[str]) -> bool:
    """True iff the extracted answer (`exact_key`) equals one of `answers` (the reference and its
    aliases) after `normalize_answer`; an answer that normalizes to nothing never matches."""
    from rlpr.grading import normalize_answer

    said = exact_key(response)
    return said is not None and said in {normalize_answer(a) for a in answers} and not _several_bare_lines(response)


# A line that is only a short answer: at most three words without a verb, one sentence ("(B)", "Paris.").
_BARE_LINE = re.compile(r"[^.!?\n]{1,40}[.!?]?")


def _several_bare_lines(response: str) -> bool:
    """One committed answer (issue 34): a response that boxes several answers side by side, or
    lists several different short answers, one per line ("(A)\n(B)\n(C)\n(D)", "Paris\nLyon"), commits to none of them; "Paris.\nIt is
    the capital." commits to Paris."""
    from rlpr.grading import extract_final_answer, normalize_answer
    from rlpr.grading.extraction import boxed_alternatives
    from rlpr.grading.wording import main_verb, tokens

    if boxed_alternatives(response):  # "\\boxed{A} or \\boxed{B}"
        return True
    if extract_final_answer(response) is not None or _ANSWER_PHRASE.search(response):
        return False
    bare = {normalize_answer(line) for line in (x.strip() for x in response.splitlines())
            if line and _BARE_LINE.fullmatch(line) and len(normalize_answer(line).split()) <= 3
            and main_verb(tokens(line)) is None}
    return len(bare - {""}) > 1


def oracle(response: str, answers: Sequence[str], graded: bool | None) -> bool | None:
    """The eval grader's verdict, as graded by the caller (None: not graded)."""
    return None if graded is None else bool(graded)


def exact(response: str, answers: Sequence[str], graded: bool | None) -> bool | None:
    """Normalized exact match (`exact_match`); the grader's verdict is not read."""
    return exact_match(response, answers)


@dataclass(frozen=True)
class Verifier:
    # (response, the reference and its aliases, the eval grader's verdict or None) -> accepted
    # (None: no verdict, which rewards as 0)
    verdict: Callable[[str, Sequence[str], bool | None], bool | None]
    needs_grade: bool  # reads the eval grader's verdict (the caller must grade every response)


VERIFIERS: dict[str, Verifier] = {
    "oracle": Verifier(oracle, needs_grade=True),
    "exact": Verifier(exact, needs_grade=False),
}
