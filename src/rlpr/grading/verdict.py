"""The verdict every grader returns."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Grade:
    """A verdict, the answer the grader read out of the response (None if none found) and the
    rule that decided, as "WHERE:HOW" (e.g. "answer_tag:numeric_rel_tol_0.04", "choice_phrase",
    "none"); `rule` is a report, not part of the verdict (Grades compare without it)."""

    correct: bool
    extracted: str | None
    rule: str = field(default="", compare=False)
