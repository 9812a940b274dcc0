"""The math grader: the final answer read out of a response, compared with math-verify."""

from __future__ import annotations

import logging
import re
import threading

from math_verify import parse, verify
from math_verify.errors import TimeoutException

from rlpr.grading.extraction import (NEGATED_ANSWER, answer_part, boxed_alternatives, last_line,
                                                phrase_answer, weak_cue_text)
from rlpr.grading.canonical import percent_value, same_value
from rlpr.grading.decisive import corrected, decisive_part, uncommitted
from rlpr.grading.hedges import hedged_after, text_mentions
from rlpr.grading.normalization import LATEX_TEXT, normalize_answer
from rlpr.grading.rendering import visible
from rlpr.grading.verdict import Grade

# Longer "answers" are prose, not a formula: let math-verify pick the math out of them rather
# than parse the whole text as one LaTeX expression (which can take seconds).
_MAX_FORMULA_CHARS = 1_000

# math-verify logs a warning per timeout that quotes the whole input (possibly a 100k-character
# rollout) and one when timeouts are disabled, which is expected in worker threads.
logging.getLogger("math_verify").setLevel(logging.ERROR)

_BARE_NUMBER = re.compile(r"[-+\u2212]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed")


def grade_math(response: str, reference: str, acceptable: list[str] | None = None, *,
               rel_tol: float = 0.0, round_integers: bool = False, sort_lists: bool = False,
               strip_units: bool = False) -> Grade:
    """Correct when the final answer equals the reference or any `acceptable` answer.

    The answer is read by the first rule that finds one (reported in `Grade.rule`): the answer
    part (`<answer>` tags, `\\boxed{}`), else the last "answer is X" / "answer: X" phrase (up to
    the end of its sentence), else math-verify's search for the last formula, only inside
    `weak_cue_text` (never in long text without a cue); for a boolean or option reference also the
    last line ("Therefore, the statement is true.", a bare "(a)"). One committed answer: boxed
    answers side by side, "3 or 5" and a negated answer ("not 0") are wrong. It is compared by the
    first rule that applies to the reference (`math_equal`): booleans (case-insensitive, yes/no as
    true/false, in a sentence one un-negated polarity), option labels "(a)"-"(f)", bracketed lists
    (same length, element by element, in order or with `sort_lists` sorted; a non-list is wrong),
    numbers within `rel_tol` (relative; `round_integers`: an integer reference equals the
    rounded answer, TheoremQA's rule; `strip_units`: "3.2 m/s" is 3.2), else symbolic equality
    (math-verify), else the normalized text.

    math-verify only enforces its timeouts in the main thread (signal.alarm); in other threads
    a pathological answer such as 10^{10^{10}} can block, so run heavy grading in processes.

    The response is read as rendered (`rendering.visible`), a correction as its corrected value, and
    a credited answer stands only when the decisive part offers no other value (decisive.py).
    """
    response = visible(response)
    response = corrected(response, _read) or response
    equal = dict(rel_tol=rel_tol, round_integers=round_integers, sort_lists=sort_lists, strip_units=strip_units)
    g = _grade_math(response, reference, acceptable, **equal)
    if g.correct:
        golds = [reference, *(acceptable or [])]
        why = uncommitted(decisive_part(response), _read, _other_value(golds, equal), _not_equal(golds, equal))
        if why:
            return Grade(False, g.extracted, f"{g.rule.split(':')[0]}:{why}")
    return g


def _not_equal(golds: list[str], equal: dict):
    """Whether an answer cue's answer is another value than the reference's."""
    def differs(said: str) -> bool:
        try:
            return not math_equal(said, golds, **equal)[0]
        except (Exception, TimeoutException):
            return True
    return differs


def _read(text: str) -> str | None:
    """The answer a math grader reads in a piece of text."""
    return _math_answer(text)[0]


def _grade_math(response: str, reference: str, acceptable: list[str] | None = None, *,
                rel_tol: float = 0.0, round_integers: bool = False, sort_lists: bool = False,
                strip_units: bool = False) -> Grade:
    """`grade_math` on a rendered, corrected response, before the decisive part is read whole."""
    boxes = boxed_alternatives(response)
    if boxes:
        return Grade(False, " or ".join(boxes), "boxed:several_answers")
    answer, where = _math_answer(response)
    kind = _reference_kind(reference)
    if kind and (answer is None or where == "math_search" or not _reads_as(kind, answer)):
        # a boolean or an option read as TheoremQA's extraction reads it: in the answer, else in
        # the last line ("Therefore, the statement is true.", a bare "(a)")
        weak = weak_cue_text(response)
        line = answer if answer is not None and where != "math_search" else (last_line(weak) if weak else None)
        if line is not None and _reads_as(kind, line):
            answer, where = line, ("last_line" if where in ("math_search", "none") else where)
    if answer is None:
        return Grade(False, None, where)
    if NEGATED_ANSWER.match(answer):
        return Grade(False, answer, f"{where}:negated")
    golds = [reference, *(acceptable or [])]
    options = alternatives(answer if where != "math_search" else last_line(weak_cue_text(response) or ""))
    if options and not any(_OR.search(g) or "," in g for g in golds):
        return Grade(False, " or ".join(options), f"{where}:several_answers")
    try:
        correct, how = math_equal(answer, golds, rel_tol=rel_tol, round_integers=round_integers,
                                  sort_lists=sort_lists, strip_units=strip_units)
    except (Exception, TimeoutException):  # a malformed answer is wrong, never a crash
        return Grade(False, answer, f"{where}:error")
    if correct:  # one committed answer: no alternative offered after it ("\\boxed{12} (or 13)")
        zone = decisive_part(response)
        equal = dict(rel_tol=rel_tol, round_integers=round_integers, sort_lists=sort_lists, strip_units=strip_units)
        if hedged_after(zone, text_mentions(zone, [*golds, answer]), _other_value(golds, equal)):
            return Grade(False, answer, f"{where}:alternative_after")
    return Grade(bool(correct), answer, f"{where}:{how}")


_OFFER_WORDS = re.compile(r"(?i)\b(?:or|maybe|perhaps|possibly|probably|alternatively|otherwise|else|might|could|either|"
                          r"though|although|also|if\s+not|likely|is|be|too|right|work|possible|plausible)\b|[$:,]")


def _other_value(golds: list[str], equal: dict):
    """`is_other` for a math answer: what an alternative offers, its words of offering taken off,
    is another value (not equal to the reference by the benchmark's rule `equal`: "(or 2)" after
    \\boxed{\\frac{2}{2}})."""
    def names_one(text: str) -> bool:
        offered = _OFFER_WORDS.sub(" ", text).strip()
        if not offered:
            return False
        try:
            return not math_equal(offered, golds, **equal)[0]
        except (Exception, TimeoutException):  # unreadable: another answer all the same
            return True
    return names_one


def _math_answer(response: str) -> tuple[str | None, str]:
    """The answer a math grader reads and the rule that found it (see `grade_math`)."""
    answer, where = answer_part(response)
    phrased = phrase_answer(response if answer is None else answer)
    if phrased is not None:
        return phrased, "answer_phrase" if answer is None else where
    if answer is not None:
        return answer, where
    weak = weak_cue_text(response)
    if weak is None:
        return None, "none:no_cue_in_long_text"
    bare = weak.strip().rstrip(".").strip()
    if _BARE_NUMBER.fullmatch(bare) or (len(bare) <= 30 and percent_value(bare) is not None):
        # "1e-24" alone: the number, not the search's "10"; "25%" alone: the percent, not 25
        return bare, "math_search"
    try:
        pred = parse(_SCIENTIFIC.sub(r"\1\\times 10^{\2}", weak), parsing_timeout=_math_timeout())
    except (Exception, TimeoutException):
        return None, "none"
    found = next((p for p in pred if isinstance(p, str) and p.strip()), None)
    return (found, "math_search") if found is not None else (None, "none")


_OR = re.compile(r"(?i)\\text\{\s*or\s*\}|\bor\b")
_EITHER = re.compile(r"(?i)^\W*(?:either|maybe|perhaps|possibly|probably)\b")
_HEDGE = re.compile(r"(?i)^(?:either|maybe|perhaps|possibly|probably|else)\b\s*|[\s.,;:!?$]+$")
_MATHY = re.compile(r"\d|\\[a-zA-Z]|^(?![\s\S]*[A-Za-z]{2})[A-Za-z0-9\s+\-*/^=().,{}]{1,30}$")


def alternatives(text: str) -> list[str]:
    """Several different answers offered side by side, "3 or 5", "either 225 or \\frac{17}{50}",
    "8 or p - q" (each part holding a number or a formula, or a short expression without words;
    not equivalent to one another), else []."""
    parts = [_HEDGE.sub("", p.strip()).strip() for p in _OR.split(_EITHER.sub("", text))]
    parts = [p for p in parts if p]
    if len(parts) < 2 or not all(_MATHY.search(p) for p in parts):
        return []
    distinct: list[str] = []
    for p in parts:
        try:
            same = any(_compact(p) == _compact(d) or math_equal(p, [d])[0] for d in distinct)
        except (Exception, TimeoutException):
            same = False
        if not same:
            distinct.append(p)
    return distinct if len(distinct) > 1 else []


_TRUE, _FALSE = frozenset({"true", "yes", "correct"}), frozenset({"false", "no", "incorrect"})
_BOOL_MARKUP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\b|[{}$`*().\s]")
_OPTION_LABEL = re.compile(r"\(([a-fA-F])\)")
_SCIENTIFIC = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
_LIST_WRAP = re.compile(r"\\(?:left|right|big|Big)\s*")


def _boolean(text: str) -> bool | None:
    word = _BOOL_MARKUP.sub("", text).lower()
    return True if word in _TRUE else False if word in _FALSE else None


_BOOL_WORD = re.compile(r"(?i)\b(true|yes|correct|false|no|incorrect)\b")
_NEGATION = re.compile(r"(?i)\b(?:not|never|isn['’]?t|aren['’]?t|wasn['’]?t|neither|nor)\b")


def sentence_boolean(text: str) -> bool | None:
    """The boolean a short answer or sentence commits to: the bare word, else the one polarity
    its words name ("Therefore, the statement is true.", "Yes, it converges."); None when both
    polarities or a negation appear ("not true", "true or false") or none does."""
    bare = _boolean(text)
    if bare is not None:
        return bare
    if len(text) > 300 or _NEGATION.search(text):
        return None
    found = {m.group(1).lower() in _TRUE for m in _BOOL_WORD.finditer(LATEX_TEXT.sub("", text))}
    return found.pop() if len(found) == 1 else None


def _reference_kind(reference: str) -> str | None:
    if _boolean(reference) is not None:
        return "boolean"
    return "option" if _OPTION_LABEL.fullmatch(reference.strip()) else None


def _reads_as(kind: str, text: str) -> bool:
    return (sentence_boolean(text) if kind == "boolean" else _option_label(text)) is not None


def _option_label(text: str) -> str | None:
    """The option label an answer names: "(b)", "b", "\\text{(B)}", or the only "(x)" in it."""
    bare = _BOOL_MARKUP.sub("", LATEX_TEXT.sub("", text)).lower().rstrip(":")
    if len(bare) == 1 and bare.isalpha():
        return bare
    labels = {m.group(1).lower() for m in _OPTION_LABEL.finditer(text)}
    return labels.pop() if len(labels) == 1 else None


def _bracket_items(text: str) -> list[str] | None:
    """The items of "[a, b]" or "(a, b)" (one kind of bracket, top-level commas), else None."""
    t = _LIST_WRAP.sub("", text.strip().strip("$").strip())
    if len(t) < 2 or (t[0], t[-1]) not in (("[", "]"), ("(", ")")):
        return None
    items, depth, current = [], 0, ""
    for ch in t[1:-1]:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            items.append(current.strip())
            current = ""
        else:
            current += ch
    items.append(current.strip())
    return items if all(items) else None


# A number followed by plain units: "3.2 m/s", "5 J", "9.8\\,\\text{m/s}^2", "20 %" (TheoremQA's clean_units).
_NUMBER_WITH_UNITS = re.compile(
    r"^\$?\s*([-+\u2212]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?(?:\s*\\times\s*10\^\{?[-+]?\d+\}?)?)"
    r"\s*(?:\\[,;! ]\s*)*(?![eE][-+]?\d)(?:\\(?:text|mathrm|rm)\s*\{[^{}]{1,20}\}(?:\^\{?-?\d\}?)?"
    r"|[A-Za-z\u03a9\u03bc\u00b5\u00b0%][A-Za-z\u03a9\u03bc\u00b5\u00b0%/^\-\d\s\u00b7*]{0,19})\s*\$?\.?$")


def _number(text: str, strip_units: bool = False) -> float | None:
    """The real number an answer is (via math-verify's parse), or None; with `strip_units`, a
    number followed by plain units is that number."""
    if strip_units:
        m = _NUMBER_WITH_UNITS.match(text.strip())
        if m:
            text = m.group(1)
    for value in _parse_math(text):
        if isinstance(value, str):
            continue
        if getattr(value, "is_Equality", False) or type(value).__name__ == "Equality":
            value = value.rhs
        try:
            if getattr(value, "is_number", False) and value.is_real is not False:
                number = complex(value.evalf())
                return number.real if number.imag == 0 else None
        except (TypeError, ValueError, AttributeError, OverflowError):
            return None
        return None
    return None


_INTEGER = re.compile(r"[-+\u2212]?\d+")


def math_equal(answer: str, golds: list[str], *, rel_tol: float = 0.0, round_integers: bool = False,
               sort_lists: bool = False, strip_units: bool = False) -> tuple[bool, str]:
    """Whether `answer` equals any of `golds`, and how that was decided (see `grade_math`)."""
    how = "symbolic"
    for gold in golds:
        ok, how = _math_equal_one(answer, gold, rel_tol, round_integers, sort_lists, strip_units)
        if ok:
            return True, how
    return False, how


def _sorted_items(items: list[str]) -> list[str]:
    """List items in numeric order where all are numbers (TheoremQA sorts both lists), else as given."""
    numbers = [_number(i) for i in items]
    if any(n is None for n in numbers):
        return items
    return [i for _, i in sorted(zip(numbers, items), key=lambda pair: pair[0])]


def _math_equal_one(answer: str, gold: str, rel_tol: float, round_integers: bool,
                    sort_lists: bool = False, strip_units: bool = False) -> tuple[bool, str]:
    if _compact(answer) == _compact(gold):  # the reference itself, however math-verify reads it
        return True, "identical"
    gold_bool = _boolean(gold)
    if gold_bool is not None:
        return sentence_boolean(answer) is gold_bool, "boolean"
    if _OPTION_LABEL.fullmatch(gold.strip()):
        return _option_label(answer) == gold.strip()[1].lower(), "option_label"
    gold_items = _bracket_items(gold)
    if gold_items is not None and len(gold_items) >= 2:
        items = _bracket_items(answer)
        if items is None:  # "1" is not [1, 1]
            return False, "list"
        if sort_lists:
            gold_items, items = _sorted_items(gold_items), _sorted_items(items)
        same = len(items) == len(gold_items) and all(
            _math_equal_one(a, g, rel_tol, round_integers)[0] for a, g in zip(items, gold_items))
        return same, "sorted_list" if sort_lists else "ordered_list"
    percent = percent_value(answer)
    if percent is not None and percent_value(gold) is None and _number(gold) is not None:
        # "25%" is 0.25 (TheoremQA's clean_units reads % as /100) or, asked in percent, 25
        gold_number, tol = _number(gold), max(rel_tol, 1e-9)
        return any(abs(p - gold_number) <= tol * abs(gold_number) or p == gold_number
                   for p in (percent / 100, percent)), "percent"
    if rel_tol > 0 or round_integers:
        gold_number, number = _number(gold), _number(answer, strip_units)
        if gold_number is not None and number is not None:
            if round_integers and _INTEGER.fullmatch(gold.strip()):
                return round(number) == round(gold_number), "rounded_integer"
            return abs(number - gold_number) <= rel_tol * abs(gold_number), f"numeric_rel_tol_{rel_tol:g}"
    gold_parsed, parsed = _parse_math(gold), _parse_math(answer)
    if gold_parsed and parsed and verify(gold_parsed, parsed, timeout_seconds=_math_timeout()):
        return True, "symbolic"
    if same_value(answer, gold, rel_tol):  # "twenty-one", "approximately 3.2", "6.02 x 10^23"
        return True, "canonical"
    if any(ch.isdigit() for ch in gold):  # "1,2" and "12" normalize alike; numbers are math's
        return False, "symbolic"
    said = normalize_answer(answer)
    return bool(said) and said == normalize_answer(gold), "text"


def _compact(text: str) -> str:
    return re.sub(r"\s+|\$|\\[,;!: ]", "", text).rstrip(".")


def _parse_math(answer: str) -> list:
    """Parse a bare answer as LaTeX: math-verify only reads math inside delimiters, so "0.5" or
    "\\frac12" on its own is wrapped in $...$; "1e-24" is read as 1\\times 10^{-24}."""
    answer = _SCIENTIFIC.sub(r"\1\\times 10^{\2}", answer)
    if len(answer) <= _MAX_FORMULA_CHARS and not _DELIMITED.search(answer):
        answer = f"${answer}$"
    return parse(answer, parsing_timeout=_math_timeout())


# math-verify's timeouts use signal.alarm, which only works in the main thread (seconds).
_MATH_TIMEOUT_S = 5


def _math_timeout() -> int | None:
    """math-verify's signal-based timeout raises outside the main thread; disable it there."""
    return _MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
