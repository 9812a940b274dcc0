"""Accuracy over questions and its standard error: pure arithmetic, no model, no torch (the learning
benchmark's tables import it without loading the trainer)."""

from __future__ import annotations

import math


def avg_at_k(correct: list[list[bool]]) -> float:
    """Avg@k: the mean over questions of each question's fraction of correct samples (equal to
    the mean over all samples when every question has k of them)."""
    per_question = [sum(c) / len(c) for c in correct if c]
    return sum(per_question) / len(per_question) if per_question else 0.0


def binomial_se(p: float, n: float) -> float:
    """Standard error of a proportion over n questions."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n else float("nan")
