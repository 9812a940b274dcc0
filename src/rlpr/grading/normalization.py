"""Text normalization shared by every grader: SQuAD-style answer keys, numbers in one form,
token-overlap F1."""

from __future__ import annotations

import re
import unicodedata
from collections import Counter

LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\b")
_THOUSANDS_OR_DECIMAL = re.compile(r"(?<!\d)(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+)")
# Keeps the point of a decimal number and the sign of a negative one ("-1", "x = -1"), not a
# hyphen ("well-known", "1-2").
_PUNCT = re.compile(r"(?!(?<=\d)\.\d)(?!(?<![\w.])-(?=\.?\d))[^\w\s]|_")
_MINUS = re.compile(r"[\u2212\u2013\u2012\ufe63\uff0d](?=\.?\d)")  # unicode minus signs before a digit
# A lone option label ("(a)", "A.", "b") stays a letter: "(a)" must not vanish as an article.
_LONE_LABEL = re.compile(r"[(\[]?([a-z])[)\]]?[.:]?")
_ARTICLES = frozenset({"a", "an", "the"})
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({w: str(10 * i) for i, w in enumerate(
    "thirty forty fifty sixty seventy eighty ninety".split(), start=3)})


def normalize_answer(text: str) -> str:
    """SQuAD normalization (lowercase, no punctuation/articles/extra spaces), plus numbers in
    one form so "4", "four" and "4.0" compare equal. A minus sign before a number is kept
    ("-1" is not "1"), and a lone option label ("(a)", "A.") is its letter, not an article."""
    text = _MINUS.sub("-", unicodedata.normalize("NFKC", text).lower())
    label = _LONE_LABEL.fullmatch(LATEX_TEXT.sub("", text).replace("{", "").replace("}", "").strip())
    if label:
        return label.group(1)
    text = _THOUSANDS_OR_DECIMAL.sub(_canonical_number, LATEX_TEXT.sub("", text))
    tokens = _PUNCT.sub("", text).split()
    return " ".join(_NUMBER_WORDS.get(t, t) for t in tokens if t not in _ARTICLES)


def _canonical_number(m: re.Match) -> str:
    number = m.group().replace(",", "")
    return number.rstrip("0").rstrip(".") if "." in number else number


def answer_key(text: str) -> str:
    """What an explicit answer is compared by: `normalize_answer`, or for an answer made only of
    punctuation (BBH's Dyck-language targets "] ]", ">") its characters with single spaces."""
    plain = text.replace("\\{", "{").replace("\\}", "}")  # \boxed{\}} holds a brace
    return normalize_answer(text) or " ".join(plain.split()).rstrip(".").strip()


_PLAIN_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")


def close_numbers(said: str, golds: set[str], rel_tol: float) -> bool:
    """Whether `said` and one of `golds` (all normalized) are numbers within `rel_tol`."""
    if not _PLAIN_NUMBER.fullmatch(said):
        return False
    value = float(said)
    return any(_PLAIN_NUMBER.fullmatch(g) and abs(value - float(g)) <= rel_tol * abs(float(g))
               for g in golds)


def token_f1(prediction: str, reference: str) -> float:
    """SQuAD token-overlap F1 after normalization (1.0 when both are empty)."""
    pred, gold = normalize_answer(prediction).split(), normalize_answer(reference).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if not common:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)
