"""Rule-based graders: decide whether a model response answers a question correctly.

Each grader returns the answer it read out of the response along with the verdict, so an
evaluation report can show *why* a response was marked wrong. Graders never raise on model
output: a reward function must score every rollout, however malformed.
"""

from __future__ import annotations

import logging
import re
import string
import threading
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from math_verify import parse, verify
from math_verify.errors import TimeoutException

# The graders' version: results graded by different versions never mix (benchmarks record it).
# Bump it whenever a grader accepts or rejects differently.
GRADER_VERSION = 1

LETTERS = string.ascii_uppercase

# math-verify's timeouts use signal.alarm, which only works in the main thread (seconds).
_MATH_TIMEOUT_S = 5
# Longer "answers" are prose, not a formula: let math-verify pick the math out of them rather
# than parse the whole text as one LaTeX expression (which can take seconds).
_MAX_FORMULA_CHARS = 1_000

# math-verify logs a warning per timeout that quotes the whole input (possibly a 100k-character
# rollout) and one when timeouts are disabled, which is expected in worker threads.
logging.getLogger("math_verify").setLevel(logging.ERROR)


@dataclass(frozen=True)
class Grade:
    """A verdict, the answer the grader read out of the response (None if none found) and the
    rule that decided, as "WHERE:HOW" (e.g. "answer_tag:numeric_rel_tol_0.04", "choice_phrase",
    "none"); `rule` is a report, not part of the verdict (Grades compare without it)."""

    correct: bool
    extracted: str | None
    rule: str = field(default="", compare=False)


# --------------------------------------------------------------------------- answer extraction

_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def extract_final_answer(response: str) -> str | None:
    """The answer part of a response: content of the LAST <answer>...</answer> (or after a final
    unclosed <answer>), else the last \\boxed{...} (balanced braces), else None.

    A \\boxed{} inside the answer tags is unwrapped too, so every grader sees the bare answer.
    """
    tagged = _last_tagged(response)
    if tagged is not None:
        return _last_boxed(tagged) or tagged
    return _last_boxed(response)


def answer_part(response: str) -> tuple[str | None, str]:
    """`extract_final_answer` and where it came from: "answer_tag", "boxed" or "none"."""
    tagged = _last_tagged(response)
    if tagged is not None:
        return _last_boxed(tagged) or tagged, "answer_tag"
    boxed = _last_boxed(response)
    return (boxed, "boxed") if boxed is not None else (None, "none")


# Weak cues (see `weak_cue_text`) are read from a whole response of at most this many characters,
# else only from its last paragraph when that paragraph is at most _MAX_CLOSING_CHARS long.
_MAX_CUELESS_CHARS = 1_000
_MAX_CLOSING_CHARS = 300


def weak_cue_text(response: str) -> str | None:
    """The text in which a grader may look for an answer WITHOUT an answer cue, or None.

    The rule ("nothing from long garbage"): an answer cue (an answer part in `<answer>` tags or
    `\\boxed{}`, an "answer is"/"answer:" phrase, or for multiple choice an explicit choice phrase
    such as "I choose D" / "option A") is read anywhere in a response. Without one, the weak cues
    (a bare letter on the last line, an option's text, "(C)", a capital letter ending a clause,
    math-verify's search for the last formula) are read only
    - in the whole response when it is at most 1,000 characters, else
    - in its last paragraph (after the last blank line) when that paragraph is at most 300
      characters: a short closing statement such as "So the result is (C).".
    A long response without a cue and without such a closing paragraph (degenerate repetition,
    random tokens, a reasoning cut off mid-way) yields no answer at all.
    """
    if len(response) <= _MAX_CUELESS_CHARS:
        return response
    window = response.rstrip()[-(_MAX_CLOSING_CHARS + 20):]
    breaks = list(re.finditer(r"\n[ \t\r]*\n", window))
    if not breaks:
        return None
    last = window[breaks[-1].end():].strip()
    return last if 0 < len(last) <= _MAX_CLOSING_CHARS else None


def _last_tagged(text: str) -> str | None:
    """Content of the last <answer> tag that holds something (truncated generations included)."""
    for opening in reversed(list(_ANSWER_OPEN.finditer(text))):
        close = _ANSWER_CLOSE.search(text, opening.end())
        content = text[opening.end():close.start() if close else len(text)].strip()
        if content:
            return content
    return None


def _last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} whose braces balance (an unclosed one was cut off)."""
    starts = [m.end() - 1 for m in _BOXED.finditer(text)]
    if not starts:
        return None
    closing = _matching_braces(text, starts[0])
    for start in reversed(starts):
        if start in closing:
            content = text[start + 1:closing[start]].strip()
            if content:
                return content
    return None


def _matching_braces(text: str, begin: int) -> dict[int, int]:
    """Map each unescaped '{' at or after `begin` to its '}'; one linear pass, so long garbage
    with thousands of unclosed braces stays fast."""
    stack: list[int] = []
    pairs: dict[int, int] = {}
    escaped = False
    for i in range(begin, len(text)):
        ch = text[i]
        if escaped:
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == "{":
            stack.append(i)
        elif ch == "}" and stack:
            pairs[stack.pop()] = i
    return pairs


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# --------------------------------------------------------------------------- multiple choice

# LaTeX/markdown wrappers around a letter: \text{(B)}, $B$, {B}, `B`.
_LETTER_MARKUP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|boxed)\b|[{}$`]")
_DECOR = r"[\s*(\[]*"  # what may sit between a cue and its letter: spaces, **, (, [
_NOT_WORD = r"(?![\w'’])"
# The letter after a cue: a capital that is not the start of a word, a letter of either case in
# parentheses, or a lowercase letter that ends its clause ("the answer is c.", but never the
# article in "the answer is a prime").
_CUE_LETTER = (r"(?:\(([A-Za-z])\)|([A-Z])" + _NOT_WORD
               + r"|([a-z])(?=[ \t*)\]]*(?:[.,;:!?\n]|$)))")
_ONLY_LETTER = re.compile(r"^[\s*(\[]*([A-Za-z])[\s*)\].:]*$")
_LEADING_LETTER = re.compile(r"^[\s*]*(?:\(([A-Z])\)|([A-Z])[.):])")
# One character class per gap (never two adjacent ones that overlap), so a long run of spaces
# after a cue cannot make the regex backtrack quadratically.
_ANSWER_PHRASE = re.compile(
    r"(?i:\banswer\b(?:\s+(?:is|would\s+be|should\s+be|must\s+be))?)[\s*:=\-(\[]*"
    r"(?:(?i:option|choice)\b" + _DECOR + r")?" + _CUE_LETTER
)
_OPTION_MENTION = re.compile(
    r"(?i:\b(?:option|choice|choose|chose|pick|picked|select|selected|go\s+with)\b)" + _DECOR
    + _CUE_LETTER
)
_MARKED_LETTER = re.compile(r"\(([A-Z])\)|\*\*([A-Z])\*\*")
# A bare capital that ends its clause ("so it is B.") - the article "A" in "A cat" never does.
_STANDALONE = re.compile(r"(?<![\w'’])([A-Z])(?=[\s*)\]]*(?:[.,;:!?]|$))", re.MULTILINE)
# A negation earlier in the same clause ("Exclude option D", "we can rule out option B") or a
# verdict right after the letter ("option D is wrong") means the letter is not chosen.
_CLAUSE_START = re.compile(r"[.,;:!?\n]|\b(?:so|but|therefore|thus|hence|then)\b", re.IGNORECASE)
_NEGATION_BEFORE = re.compile(
    r"\b(?:not|never|exclude[sd]?|excluding|eliminat(?:e|es|ed|ing)|rul(?:e|es|ed|ing)\s+out"
    r"|reject(?:s|ed|ing)?|discard(?:s|ed|ing)?|rather\s+than|instead\s+of|except|other\s+than"
    r"|remove[sd]?|cross(?:es|ed)?\s+out|wrong|incorrect)\b|n't\b", re.IGNORECASE)
_NEGATION_AFTER = re.compile(
    r"^[\s*)\]]*(?:(?:is|are|was|seems|looks|appears)\s+(?:not\b|wrong|incorrect|false|eliminated"
    r"|excluded|ruled\s+out|unlikely|impossible)|(?:is|are|was)n['’]t\b"
    r"|(?:can|should|must)\s+be\s+(?:eliminated|excluded|ruled\s+out))", re.IGNORECASE)


def grade_multiple_choice(response: str, reference: str,
                          choices: list[str] | None = None) -> Grade:
    """Correct when the option letter read out of the response is the reference letter.

    The reference may be a letter ("B", "(B)", "b") or, when `choices` are given, an option's
    text. The response is read by the first rule that finds a valid letter (the rule is
    reported in `Grade.rule`):
    1. the answer part (`<answer>` tags, `\\boxed{}`): a bare letter in any case ("b", "(B)",
       "B. Paris"), an "answer is" or choice phrase inside it, then an option's text;
    2. the last "answer is X" / "answer: X" phrase ("The answer is c." reads C);
    3. the last explicit choice phrase ("I choose D", "option A", "I pick A", "select (b)");
       negated mentions ("Exclude option D", "not option B", "option C is wrong") are skipped;
    4. weak cues, only inside `weak_cue_text` (short responses or a short closing paragraph,
       never long text without a cue): the last line (letter or option text), a letter in
       parentheses or bold, a capital letter ending a clause.
    Explicit phrases thus outrank option text anywhere outside the answer part.
    """
    valid = LETTERS[:len(choices)] if choices else LETTERS
    gold = _letter_in(reference, valid, choices)
    letter, rule = _response_letter_rule(response, valid, choices)
    return Grade(letter is not None and letter == gold, letter, rule)


def _response_letter(response: str, valid: str, choices: list[str] | None) -> str | None:
    return _response_letter_rule(response, valid, choices)[0]


def _response_letter_rule(response: str, valid: str,
                          choices: list[str] | None) -> tuple[str | None, str]:
    """Most explicit cue first (answer part, "answer is", choice phrases), stray letters last."""
    answer, where = answer_part(response)
    if answer is not None:
        letter = _letter_in(answer, valid, choices)
        if letter:
            return letter, where
    text = _LETTER_MARKUP.sub("", response)
    for rule, pattern in (("answer_phrase", _ANSWER_PHRASE), ("choice_phrase", _OPTION_MENTION)):
        letter = _last_letter(pattern, text, valid)
        if letter:
            return letter, rule
    weak = weak_cue_text(response)
    if weak is None:
        return None, "none:no_cue_in_long_text"
    weak = _without_negated(weak)
    letter = _letter_in(_last_line(weak), valid, choices)
    if letter:
        return letter, "last_line"
    text = _LETTER_MARKUP.sub("", weak)
    for rule, pattern in (("marked_letter", _MARKED_LETTER), ("standalone_letter", _STANDALONE)):
        letter = _last_letter(pattern, text, valid)
        if letter:
            return letter, rule
    return None, "none"


def _letter_in(answer: str, valid: str, choices: list[str] | None) -> str | None:
    """The option an answer string names, by letter or (with `choices`) by option text."""
    text = _without_negated(_LETTER_MARKUP.sub("", answer))
    only = _ONLY_LETTER.match(text)
    if only and only.group(1).upper() in valid:
        return only.group(1).upper()
    leading = _LEADING_LETTER.match(text)
    if leading and (leading.group(1) or leading.group(2)) in valid:
        return leading.group(1) or leading.group(2)
    return (_last_letter(_ANSWER_PHRASE, text, valid)
            or _last_letter(_OPTION_MENTION, text, valid)
            or (_option_by_text(answer, choices) if choices else None)
            or _last_letter(_STANDALONE, text, valid))


def _negated(text: str, m: re.Match) -> bool:
    """Whether a cue's letter is mentioned to be excluded rather than chosen."""
    before = text[max(0, m.start() - 80):m.start()]
    clauses = list(_CLAUSE_START.finditer(before))
    clause = before[clauses[-1].end():] if clauses else before
    return bool(_NEGATION_BEFORE.search(clause) or _NEGATION_AFTER.match(text[m.end():m.end() + 40]))


def _without_negated(text: str) -> str:
    """`text` with negated option mentions ("Exclude option D") blanked out, so that no later
    rule reads their letter as a stray one."""
    spans = [m.span() for m in _OPTION_MENTION.finditer(text) if _negated(text, m)]
    for start, end in reversed(spans):
        text = text[:start] + " " * (end - start) + text[end:]
    return text


def _last_letter(pattern: re.Pattern, text: str, valid: str) -> str | None:
    letter = None
    check_negation = pattern is not _STANDALONE
    for m in pattern.finditer(text):
        found = next(g for g in m.groups() if g).upper()
        if found in valid and not (check_negation and _negated(text, m)):
            letter = found
    return letter


def _option_by_text(answer: str, choices: list[str]) -> str | None:
    """The option whose text the answer is, or the only option whose text the answer contains."""
    said = normalize_answer(answer)
    options = [normalize_answer(c) for c in choices]
    if not said:
        return None
    if said in options:
        return LETTERS[options.index(said)]
    contained = [i for i, o in enumerate(options) if o and f" {o} " in f" {said} "]
    return LETTERS[contained[0]] if len(contained) == 1 else None


# --------------------------------------------------------------------------- math

_DELIMITED = re.compile(r"(?<!\\)\$|\\\(|\\\[|\\boxed")


def grade_math(response: str, reference: str, acceptable: list[str] | None = None, *,
               rel_tol: float = 0.0, round_integers: bool = False) -> Grade:
    """Correct when the final answer equals the reference or any `acceptable` answer.

    The answer is read by the first rule that finds one (reported in `Grade.rule`): the answer
    part (`<answer>` tags, `\\boxed{}`), else the last "answer is X" / "answer: X" phrase (up to
    the end of its sentence), else math-verify's search for the last formula, only inside
    `weak_cue_text` (never in long text without a cue). It is compared by the first rule that
    applies to the reference (`math_equal`): booleans (case-insensitive, yes/no as true/false),
    option labels "(a)"-"(f)", bracketed lists (ordered, same length, element by element),
    numbers within `rel_tol` (relative; `round_integers`: an integer reference equals the
    rounded answer, TheoremQA's rule), else symbolic equality (math-verify), else the normalized
    text.

    math-verify only enforces its timeouts in the main thread (signal.alarm); in other threads
    a pathological answer such as 10^{10^{10}} can block, so run heavy grading in processes.
    """
    answer, where = _math_answer(response)
    if answer is None:
        return Grade(False, None, where)
    try:
        correct, how = math_equal(answer, [reference, *(acceptable or [])], rel_tol=rel_tol,
                                  round_integers=round_integers)
    except (Exception, TimeoutException):  # a malformed answer is wrong, never a crash
        return Grade(False, answer, f"{where}:error")
    return Grade(bool(correct), answer, f"{where}:{how}")


def _math_answer(response: str) -> tuple[str | None, str]:
    """The answer a math grader reads and the rule that found it (see `grade_math`)."""
    answer, where = answer_part(response)
    phrased = _answer_phrase(response if answer is None else answer)
    if phrased is not None:
        return phrased, "answer_phrase" if answer is None else where
    if answer is not None:
        return answer, where
    weak = weak_cue_text(response)
    if weak is None:
        return None, "none:no_cue_in_long_text"
    try:
        pred = parse(weak, parsing_timeout=_math_timeout())
    except (Exception, TimeoutException):
        return None, "none"
    found = next((p for p in pred if isinstance(p, str) and p.strip()), None)
    return (found, "math_search") if found is not None else (None, "none")


# The end of a sentence after an answer phrase: ". " or a final "." (not the point of 3.5 or of
# 1e-5.), or a newline.
_PHRASE_END = re.compile(r"\.(?:\s|$)|\n")


def _answer_phrase(text: str) -> str | None:
    """What follows the last "answer is"/"answer:" up to the end of its sentence, or None."""
    phrases = list(_ANSWER_IS.finditer(text))
    if not phrases:
        return None
    said = _PHRASE_END.split(phrases[-1].group(1).strip(), maxsplit=1)[0].strip().rstrip(".")
    return said.strip("*").strip() or None


_TRUE, _FALSE = frozenset({"true", "yes"}), frozenset({"false", "no"})
_BOOL_MARKUP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\b|[{}$`*().\s]")
_OPTION_LABEL = re.compile(r"\(([a-fA-F])\)")
_SCIENTIFIC = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?![\w.])")
_LIST_WRAP = re.compile(r"\\(?:left|right|big|Big)\s*")


def _boolean(text: str) -> bool | None:
    word = _BOOL_MARKUP.sub("", text).lower()
    return True if word in _TRUE else False if word in _FALSE else None


def _option_label(text: str) -> str | None:
    """The option label an answer names: "(b)", "b", "\\text{(B)}", or the only "(x)" in it."""
    bare = _BOOL_MARKUP.sub("", _LATEX_TEXT.sub("", text)).lower().rstrip(":")
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


def _number(text: str) -> float | None:
    """The real number an answer is (via math-verify's parse), or None."""
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


def math_equal(answer: str, golds: list[str], *, rel_tol: float = 0.0,
               round_integers: bool = False) -> tuple[bool, str]:
    """Whether `answer` equals any of `golds`, and how that was decided (see `grade_math`)."""
    how = "symbolic"
    for gold in golds:
        ok, how = _math_equal_one(answer, gold, rel_tol, round_integers)
        if ok:
            return True, how
    return False, how


def _math_equal_one(answer: str, gold: str, rel_tol: float, round_integers: bool) -> tuple[bool, str]:
    if _compact(answer) == _compact(gold):  # the reference itself, however math-verify reads it
        return True, "identical"
    gold_bool = _boolean(gold)
    if gold_bool is not None:
        return _boolean(answer) is gold_bool, "boolean"
    if _OPTION_LABEL.fullmatch(gold.strip()):
        return _option_label(answer) == gold.strip()[1].lower(), "option_label"
    gold_items = _bracket_items(gold)
    if gold_items is not None and len(gold_items) >= 2:
        items = _bracket_items(answer)
        if items is not None:
            same = len(items) == len(gold_items) and all(
                _math_equal_one(a, g, rel_tol, round_integers)[0] for a, g in zip(items, gold_items))
            return same, "ordered_list"
    if rel_tol > 0 or round_integers:
        gold_number, number = _number(gold), _number(answer)
        if gold_number is not None and number is not None:
            if round_integers and _INTEGER.fullmatch(gold.strip()):
                return round(number) == round(gold_number), "rounded_integer"
            return abs(number - gold_number) <= rel_tol * abs(gold_number), f"numeric_rel_tol_{rel_tol:g}"
    gold_parsed, parsed = _parse_math(gold), _parse_math(answer)
    if gold_parsed and parsed and verify(gold_parsed, parsed, timeout_seconds=_math_timeout()):
        return True, "symbolic"
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


def _math_timeout() -> int | None:
    """math-verify's signal-based timeout raises outside the main thread; disable it there."""
    return _MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


# --------------------------------------------------------------------------- short answer

_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\b")
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
_ANSWER_IS = re.compile(r"(?i)\banswer[\s*]*(?:is\b|:)[\s*:]*(.+)$", re.MULTILINE)


def normalize_answer(text: str) -> str:
    """SQuAD normalization (lowercase, no punctuation/articles/extra spaces), plus numbers in
    one form so "4", "four" and "4.0" compare equal. A minus sign before a number is kept
    ("-1" is not "1"), and a lone option label ("(a)", "A.") is its letter, not an article."""
    text = _MINUS.sub("-", unicodedata.normalize("NFKC", text).lower())
    label = _LONE_LABEL.fullmatch(_LATEX_TEXT.sub("", text).replace("{", "").replace("}", "").strip())
    if label:
        return label.group(1)
    text = _THOUSANDS_OR_DECIMAL.sub(_canonical_number, _LATEX_TEXT.sub("", text))
    tokens = _PUNCT.sub("", text).split()
    return " ".join(_NUMBER_WORDS.get(t, t) for t in tokens if t not in _ARTICLES)


def _canonical_number(m: re.Match) -> str:
    number = m.group().replace(",", "")
    return number.rstrip("0").rstrip(".") if "." in number else number


def grade_short_answer(response: str, reference: str, acceptable: list[str] | None = None,
                       question: str | None = None, *, rel_tol: float = 0.0) -> Grade:
    """Correct when the response's final answer is the reference or an `acceptable` form.

    The final answer is read as a person would, in this order:
    1. an answer part (`<answer>` tags or `\\boxed{}`), else the text after the last
       "answer is"/"answer:" (up to the end of its sentence): normalized exact match (numbers
       keep their sign; with `rel_tol` > 0, two numbers match within that relative error);
    2. else the response's first statement (its first sentence of two or more words, or a
       one-word first line), checked by `statement_answers`: it must END with the reference
       (after cutting a trailing ", which ..." / ", located ..." clause and dropping trailing
       words the question already contains, e.g. "Paris is the capital of France"), and the reference must not be the last item of an enumeration ("Berlin or
       Paris", "Rome, Paris"), so listing several candidates is never correct; a statement that
       is a question (ends with "?", or repeats the question) never answers it.
    """
    golds = [g for g in (reference, *(acceptable or [])) if normalize_answer(g)]
    answer = _explicit_answer(response)
    if answer is not None:
        said = _answer_key(answer)
        normalized = {_answer_key(g) for g in (reference, *(acceptable or []))} - {""}
        where = answer_part(response)[1]
        where = "answer_phrase" if where == "none" else where
        if bool(said) and said in normalized:
            return Grade(True, answer, f"{where}:normalized_match")
        if rel_tol > 0 and _close_numbers(said, normalized, rel_tol):
            return Grade(True, answer, f"{where}:numeric_rel_tol_{rel_tol:g}")
        return Grade(False, answer, f"{where}:normalized_match")
    statement = first_statement(response)
    if statement is None:
        return Grade(False, None, "none")
    return Grade(statement_answers(statement, golds, question or ""), statement, "first_statement")


def _answer_key(text: str) -> str:
    """What an explicit answer is compared by: `normalize_answer`, or for an answer made only of
    punctuation (BBH's Dyck-language targets "] ]", ">") its characters with single spaces."""
    plain = text.replace("\\{", "{").replace("\\}", "}")  # \boxed{\}} holds a brace
    return normalize_answer(text) or " ".join(plain.split()).rstrip(".").strip()


_PLAIN_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")


def _close_numbers(said: str, golds: set[str], rel_tol: float) -> bool:
    """Whether `said` and one of `golds` (all normalized) are numbers within `rel_tol`."""
    if not _PLAIN_NUMBER.fullmatch(said):
        return False
    value = float(said)
    return any(_PLAIN_NUMBER.fullmatch(g) and abs(value - float(g)) <= rel_tol * abs(float(g))
               for g in golds)


def _explicit_answer(response: str) -> str | None:
    """The answer part, or what follows the last "answer is"/"answer:" up to its sentence's end."""
    answer = extract_final_answer(response)
    phrases = list(_ANSWER_IS.finditer(response if answer is None else answer))
    if phrases:
        answer = _ANSWER_END.split(phrases[-1].group(1), maxsplit=1)[0]
    return None if answer is None else (answer.strip() or None)


# A sentence ends at . ! ? followed by a space or the end (not the point of 3.5), or at a newline.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+|(?<=[.!?])$")
# The end of an answer after "answer is": a sentence end, but not after an initial or a title
# ("R. H. Thomson", "T.J. Miller", "Dr. Jesse Bennett").
_ANSWER_END = re.compile(r"(?<![\s.][A-Z]\.)(?<!^[A-Z]\.)(?<!\b(?:Dr|Mr|Ms|St|Jr|Sr|vs)\.)(?<!Mrs\.)"
                         r"(?<=[.!?])\s+|\n+|(?<=[.!?])$")
_WORD_OR_SEPARATOR = re.compile(r"[,;/&]|[^\s,;/&]+")
_ENUMERATION = frozenset({",", ";", "/", "&", "or", "and", "nor", "vs", "versus"})
# Words that may follow the answer in a statement without changing it ("8 apples left").
_TRAILING_FILLER = frozenset({"now", "left", "total", "in", "all", "altogether", "only", "exactly",
                              "each", "then", "too", "so", "it", "is", "are", "was", "were", "be"})


def first_statement(response: str) -> str | None:
    """The first sentence of two or more words, or a first line that is one word ("Paris.");
    an opening interjection ("Sure!") is skipped."""
    lines = [line for line in response[:5_000].splitlines() if line.strip()]
    for i, line in enumerate(lines):
        pieces = [p.strip() for p in _SENTENCE_END.split(line) if p and p.strip()]
        if i == 0 and len(pieces) == 1 and len(normalize_answer(pieces[0]).split()) == 1:
            return pieces[0]
        for piece in pieces:
            if len(normalize_answer(piece).split()) >= 2:
                return piece
    return None


def _statement_tokens(text: str) -> list[str]:
    """Normalized words, with the separators of an enumeration kept as tokens."""
    tokens = []
    for raw in _WORD_OR_SEPARATOR.findall(unicodedata.normalize("NFKC", text)):
        if raw in ",;/&":
            tokens.append(raw)
        else:
            tokens.extend(normalize_answer(raw).split())
    return tokens


# A comma followed by one of these opens a clause about the answer, not another candidate
# ("Mount Everest, which is 8,848 m tall"): the statement is read up to that comma.
_CLAUSE_AFTER_ANSWER = re.compile(r",\s*(?:which|who|whose|where|located|situated|known|famous|being)\b",
                                  re.IGNORECASE)


def statement_answers(statement: str, golds: list[str], question: str = "") -> bool:
    """True iff `statement` ends with one of `golds` (see grade_short_answer), not as the last
    item of an enumeration. A trailing relative or participle clause after a comma (", which
    ...", ", located ...") is cut first; then words of the question (that are not words of the
    gold answer) and a few fillers ("now", "left") are dropped from the end."""
    if statement.rstrip().endswith("?"):  # a question is not an answer ("Mexico City is the capital
        return False                       # of which country?" must not count for "Mexico")
    clause = _CLAUSE_AFTER_ANSWER.search(statement)
    if clause:
        statement = statement[:clause.start()]
    tokens = _statement_tokens(statement)
    asked = set(normalize_answer(question).split())
    if [t for t in tokens if t not in ",;/&"] == normalize_answer(question).split():
        return False  # the question repeated
    for gold in golds:
        target = normalize_answer(gold).split()
        droppable = (asked - set(target)) | _TRAILING_FILLER
        end = len(tokens)
        while end and (tokens[end - 1] in droppable or tokens[end - 1] in ",;"):
            end -= 1
        start = end - len(target)
        if start < 0 or tokens[start:end] != target:
            continue
        if start and tokens[start - 1] in _ENUMERATION:
            continue
        return True
    return False


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


# --------------------------------------------------------------------------- dispatch


# Benchmark names (lowercase, letters and digits) and the grader each gets. A data source matches
# a name exactly once `benchmark_name` has taken off the conventions around it; never a substring
# (issue 29: "trivia_reclaimed" went to math by its "aime", "gpqa_like_but_free" to multiple choice).
_MC_NAMES = frozenset({"mmlu", "mmlupro", "gpqa", "gpqadiamond", "gpqamain", "gpqaextended",
                       "multiplechoice", "bbhmultiplechoice"})
_MATH_NAMES = frozenset({"math", "math500", "hendrycksmath", "competitionmath", "minerva", "minervamath",
                         "aime", "amc", "gsm8k", "theoremqa"})
_MATH_YEARS = re.compile(r"(?:aime|amc)(?:\d{2}|\d{4})")  # aime24, aime2024, amc23
# trailing words that name a split, a sample size, a seed or Avg@k, not the benchmark
_CONVENTION_WORD = re.compile(r"avg\d+|seed\d+|\d+|test|val|valid|validation|dev|train|eval")


def benchmark_name(data_source: str) -> str:
    """The benchmark a data source names, lowercase letters and digits: the part before a "/" (a
    subset: "mmlu/abstract_algebra"), without its trailing split, size, seed and _AvgK words
    ("MMLU_Pro_test_1000_seed0_Avg2" -> "mmlupro", "Math-500_Avg2" -> "math", "aime24" stays)."""
    words = re.findall(r"[a-z0-9]+", data_source.lower().split("/")[0])
    while len(words) > 1 and _CONVENTION_WORD.fullmatch(words[-1]):
        words.pop()
    return "".join(words)


def grader_for(data_source: str, ability: str = "", has_choices: bool = False) -> str:
    """Pick a grader name: rows with choices, or a benchmark named mmlu, mmlu_pro, gpqa (_diamond,
    _main, _extended) or multiple_choice -> multiple_choice; ability 'math', or a benchmark named
    math, math500, minerva(_math), aime, amc (with a year: aime24, amc2023), gsm8k or theoremqa ->
    math; otherwise short_answer. Names match exactly (`benchmark_name`)."""
    name = benchmark_name(data_source)
    if has_choices or name in _MC_NAMES:
        return "multiple_choice"
    if ability.strip().lower() == "math" or name in _MATH_NAMES or _MATH_YEARS.fullmatch(name):
        return "math"
    return "short_answer"


@dataclass(frozen=True)
class BenchmarkRule:
    """How one benchmark is graded, after its official evaluation code (docs/scoring-and-evaluation.md
    shows this table)."""

    benchmark: str
    keys: tuple[str, ...]  # data_source prefixes, lowercase alphanumeric ("bbh/x" -> "bbhx")
    grader: str
    rel_tol: float = 0.0  # relative numeric tolerance; 0: exact (math-verify's own rounding)
    round_integers: bool = False  # an integer reference equals the answer rounded to an integer
    normalisation: str = ""
    source: str = ""


# The one table of per-benchmark rules; the first entry whose key starts the data source wins.
BENCHMARK_RULES: tuple[BenchmarkRule, ...] = (
    BenchmarkRule("TheoremQA", ("theoremqa",), "math", rel_tol=0.04, round_integers=True,
                  normalisation="numbers within 4% of the reference; integer references: the "
                  "answer rounded to an integer; True/False case-insensitive (yes/no accepted); "
                  "option labels (a)-(f); lists element by element, in order",
                  source="TIGER-AI-Lab/TheoremQA utils.py compare_answer_with_groundtruth / "
                  "compare_two_numbers (within_eps: |pred - gt| <= 0.04 |gt|; round(pred) == gt "
                  "for integers; the official script sorts list items, rlpr keeps their order)"),
    BenchmarkRule("GPQA-Diamond", ("gpqa",), "multiple_choice",
                  normalisation="option letter A-D in any case",
                  source="idavidrein/gpqa: four options, one letter; options shuffled at conversion"),
    BenchmarkRule("MMLU-Pro", ("mmlupro",), "multiple_choice",
                  normalisation="option letter A-J in any case",
                  source="TIGER-AI-Lab/MMLU-Pro evaluate_from_local.py: 'answer is (X)', then "
                  "'Answer: X', then the last letter"),
    BenchmarkRule("MMLU", ("mmlu",), "multiple_choice", normalisation="option letter A-D",
                  source="hendrycks/test: the letter of the correct option"),
    BenchmarkRule("ARC", ("arc",), "multiple_choice", normalisation="option letter (3-5 options)",
                  source="allenai ARC: answerKey names one option"),
    BenchmarkRule("GSM8K", ("gsm8k",), "math", normalisation="exact number (symbolic, math-verify)",
                  source="openai/grade-school-math: the number after '####', exact"),
    BenchmarkRule("AIME / AMC", ("aime", "amc"), "math", normalisation="exact integer",
                  source="integer answers, exact"),
    BenchmarkRule("Minerva (OCW)", ("minerva",), "math",
                  normalisation="symbolic equality (math-verify; floats to 6 significant places)",
                  source="Lewkowycz et al. 2022 (symbolic / numeric equivalence); rlpr: exact"),
    BenchmarkRule("MATH / MATH-500", ("math",), "math",
                  normalisation="symbolic equality (math-verify)",
                  source="hendrycks/math is_equiv (normalized string); math-verify is stricter on "
                  "form and accepts equivalent forms"),
    BenchmarkRule("SimpleQA", ("simpleqa",), "short_answer",
                  normalisation="SQuAD normalization, exact match",
                  source="openai/simple-evals grades with an LLM (CORRECT / INCORRECT / NOT "
                  "ATTEMPTED); the rule grader is stricter: add --judge-url for the official rule"),
    BenchmarkRule("NQ-Open", ("nqopen",), "short_answer",
                  normalisation="SQuAD normalization, exact match against any acceptable answer",
                  source="google-research-datasets/natural-questions nq_open: exact match"),
    BenchmarkRule("BIG-Bench Hard", ("bbh",), "short_answer",
                  normalisation="option letter when the target is '(X)', else exact match",
                  source="suzgunmirac/BIG-Bench-Hard: exact match of the target"),
)
DEFAULT_RULE = BenchmarkRule("other", (), "", normalisation="by grader_for: no tolerance")


def benchmark_rule(data_source: str) -> BenchmarkRule:
    """The entry of BENCHMARK_RULES for a data source (DEFAULT_RULE when none matches)."""
    source = re.sub(r"[^a-z0-9]", "", data_source.lower())
    return next((r for r in BENCHMARK_RULES if any(source.startswith(k) for k in r.keys)),
                DEFAULT_RULE)


# Every grader through one signature: (response, reference, choices, acceptable, question, rule),
# each passing on only the extras it uses (and the numeric tolerance of `rule`).
def _multiple_choice(response, reference, choices, acceptable, question, rule) -> Grade:
    return grade_multiple_choice(response, reference, choices)


def _math(response, reference, choices, acceptable, question, rule) -> Grade:
    return grade_math(response, reference, acceptable, rel_tol=rule.rel_tol, round_integers=rule.round_integers)


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
