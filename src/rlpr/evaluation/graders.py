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
from dataclasses import dataclass

from math_verify import parse, verify
from math_verify.errors import TimeoutException

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
    """A verdict and the answer the grader read out of the response (None if none found)."""

    correct: bool
    extracted: str | None


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
_ONLY_LETTER = re.compile(r"^[\s*(\[]*([A-Za-z])[\s*)\].:]*$")
_LEADING_LETTER = re.compile(r"^[\s*]*(?:\(([A-Z])\)|([A-Z])[.):])")
# One character class per gap (never two adjacent ones that overlap), so a long run of spaces
# after a cue cannot make the regex backtrack quadratically.
_ANSWER_PHRASE = re.compile(
    r"(?i:\banswer\b(?:\s+(?:is|would\s+be|should\s+be|must\s+be))?)[\s*:=\-(\[]*"
    r"(?:(?i:option|choice)\b" + _DECOR + r")?([A-Z])" + _NOT_WORD
)
_OPTION_MENTION = re.compile(
    r"(?i:\b(?:option|choice|choose|pick|select)\b)" + _DECOR + r"([A-Z])" + _NOT_WORD
)
_MARKED_LETTER = re.compile(r"\(([A-Z])\)|\*\*([A-Z])\*\*")
# A bare capital that ends its clause ("so it is B.") - the article "A" in "A cat" never does.
_STANDALONE = re.compile(r"(?<![\w'’])([A-Z])(?=[\s*)\]]*(?:[.,;:!?]|$))", re.MULTILINE)


def grade_multiple_choice(response: str, reference: str,
                          choices: list[str] | None = None) -> Grade:
    """Correct when the option letter read out of the response is the reference letter.

    The reference may be a letter ("B", "(B)") or, when `choices` are given, an option's text.
    """
    valid = LETTERS[:len(choices)] if choices else LETTERS
    gold = _letter_in(reference, valid, choices)
    letter = _response_letter(response, valid, choices)
    return Grade(letter is not None and letter == gold, letter)


def _response_letter(response: str, valid: str, choices: list[str] | None) -> str | None:
    """Most explicit cue first (answer part, "answer is"), stray letters last."""
    answer = extract_final_answer(response)
    if answer is not None:
        letter = _letter_in(answer, valid, choices)
        if letter:
            return letter
    text = _LETTER_MARKUP.sub("", response)
    return (_last_letter(_ANSWER_PHRASE, text, valid)
            or _letter_in(_last_line(response), valid, choices)
            or _last_letter(_OPTION_MENTION, text, valid)
            or _last_letter(_MARKED_LETTER, text, valid)
            or _last_letter(_STANDALONE, text, valid))


def _letter_in(answer: str, valid: str, choices: list[str] | None) -> str | None:
    """The option an answer string names, by letter or (with `choices`) by option text."""
    text = _LETTER_MARKUP.sub("", answer)
    only = _ONLY_LETTER.match(text)
    if only and only.group(1).upper() in valid:
        return only.group(1).upper()
    leading = _LEADING_LETTER.match(text)
    if leading and (leading.group(1) or leading.group(2)) in valid:
        return leading.group(1) or leading.group(2)
    return (_last_letter(_ANSWER_PHRASE, text, valid)
            or (_option_by_text(answer, choices) if choices else None)
            or _last_letter(_STANDALONE, text, valid))


def _last_letter(pattern: re.Pattern, text: str, valid: str) -> str | None:
    letter = None
    for m in pattern.finditer(text):
        found = next(g for g in m.groups() if g)
        if found in valid:
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


def grade_math(response: str, reference: str, acceptable: list[str] | None = None) -> Grade:
    """Correct when the final answer is symbolically equal (math-verify) to the reference or
    any `acceptable` answer. Without an answer part, math-verify searches the whole response.

    math-verify only enforces its timeouts in the main thread (signal.alarm); in other threads
    a pathological answer such as 10^{10^{10}} can block, so run heavy grading in processes.
    """
    answer = extract_final_answer(response)
    try:
        gold = [g for ref in (reference, *(acceptable or [])) for g in _parse_math(ref)]
        if answer is None:
            pred = parse(response, parsing_timeout=_math_timeout())
            answer = next((p for p in pred if isinstance(p, str)), None)
        else:
            pred = _parse_math(answer)
        correct = bool(gold and pred) and verify(gold, pred, timeout_seconds=_math_timeout())
    except (Exception, TimeoutException):  # a malformed answer is wrong, never a crash
        return Grade(False, answer)
    return Grade(bool(correct), answer)


def _parse_math(answer: str) -> list:
    """Parse a bare answer as LaTeX: math-verify only reads math inside delimiters, so "0.5" or
    "\\frac12" on its own is wrapped in $...$."""
    if len(answer) <= _MAX_FORMULA_CHARS and not _DELIMITED.search(answer):
        answer = f"${answer}$"
    return parse(answer, parsing_timeout=_math_timeout())


def _math_timeout() -> int | None:
    """math-verify's signal-based timeout raises outside the main thread; disable it there."""
    return _MATH_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


# --------------------------------------------------------------------------- short answer

_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|textrm|mathrm|mathbf|mbox)\b")
_THOUSANDS_OR_DECIMAL = re.compile(r"(?<!\d)(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+\.\d+)")
_PUNCT = re.compile(r"(?!(?<=\d)\.\d)[^\w\s]|_")  # keeps the point of a decimal number
_ARTICLES = frozenset({"a", "an", "the"})
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_WORDS.update({w: str(10 * i) for i, w in enumerate(
    "thirty forty fifty sixty seventy eighty ninety".split(), start=3)})
_ANSWER_IS = re.compile(r"(?i)\banswer[\s*]*(?:is\b|:)[\s*:]*(.+)$", re.MULTILINE)


def normalize_answer(text: str) -> str:
    """SQuAD normalization (lowercase, no punctuation/articles/extra spaces), plus numbers in
    one form so "4", "four" and "4.0" compare equal."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = _THOUSANDS_OR_DECIMAL.sub(_canonical_number, _LATEX_TEXT.sub("", text))
    tokens = _PUNCT.sub("", text).split()
    return " ".join(_NUMBER_WORDS.get(t, t) for t in tokens if t not in _ARTICLES)


def _canonical_number(m: re.Match) -> str:
    number = m.group().replace(",", "")
    return number.rstrip("0").rstrip(".") if "." in number else number


def grade_short_answer(response: str, reference: str, acceptable: list[str] | None = None,
                       question: str | None = None) -> Grade:
    """Correct when the response's final answer is the reference or an `acceptable` form.

    The final answer is read as a person would, in this order:
    1. an answer part (`<answer>` tags or `\\boxed{}`), else the text after the last
       "answer is"/"answer:" (up to the end of its sentence): normalized exact match;
    2. else the response's first statement (its first sentence of two or more words, or a
       one-word first line), checked by `statement_answers`: it must END with the reference
       (after dropping trailing words the question already contains, e.g. "Paris is the capital
       of France"), and the reference must not be the last item of an enumeration ("Berlin or
       Paris", "Rome, Paris"), so listing several candidates is never correct; a statement that
       is a question (ends with "?", or repeats the question) never answers it.
    """
    golds = [g for g in (reference, *(acceptable or [])) if normalize_answer(g)]
    answer = _explicit_answer(response)
    if answer is not None:
        said = normalize_answer(answer)
        return Grade(bool(said) and said in {normalize_answer(g) for g in golds}, answer)
    statement = first_statement(response)
    if statement is None:
        return Grade(False, None)
    return Grade(statement_answers(statement, golds, question or ""), statement)


def _explicit_answer(response: str) -> str | None:
    """The answer part, or what follows the last "answer is"/"answer:" up to its sentence's end."""
    answer = extract_final_answer(response)
    phrases = list(_ANSWER_IS.finditer(response if answer is None else answer))
    if phrases:
        answer = _SENTENCE_END.split(phrases[-1].group(1), maxsplit=1)[0]
    return None if answer is None else (answer.strip() or None)


# A sentence ends at . ! ? followed by a space or the end (not the point of 3.5), or at a newline.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+|(?<=[.!?])$")
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


def statement_answers(statement: str, golds: list[str], question: str = "") -> bool:
    """True iff `statement` ends with one of `golds` (see grade_short_answer), not as the last
    item of an enumeration. Words of the question (that are not words of the gold answer) and
    a few fillers ("now", "left") are dropped from the end first."""
    if statement.rstrip().endswith("?"):  # a question is not an answer ("Mexico City is the capital
        return False                       # of which country?" must not count for "Mexico")
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

GRADERS = {
    "multiple_choice": grade_multiple_choice,
    "math": grade_math,
    "short_answer": grade_short_answer,
}

_MC_SOURCES = ("mmlu", "gpqa", "multiplechoice")
_MATH_SOURCES = ("math", "minerva", "aime", "amc", "gsm8k", "theoremqa")


def grader_for(data_source: str, ability: str = "", has_choices: bool = False) -> str:
    """Pick a grader name: has_choices or sources like mmlu/mmlu_pro/gpqa/bbh-multiple-choice ->
    multiple_choice; math500/math/minerva/aime/amc/gsm8k/theoremqa/ ability 'math' -> math;
    otherwise short_answer."""
    source = re.sub(r"[^a-z0-9]", "", data_source.lower())
    if has_choices or any(s in source for s in _MC_SOURCES):
        return "multiple_choice"
    if ability.strip().lower() == "math" or any(s in source for s in _MATH_SOURCES):
        return "math"
    return "short_answer"


def grade(name: str, response: str, reference: str, *, choices: list[str] | None = None,
          acceptable: list[str] | None = None, question: str | None = None) -> Grade:
    """Grade with the named grader, passing each only the extras it uses."""
    if name not in GRADERS:
        raise ValueError(f"unknown grader {name!r}; choose one of {', '.join(GRADERS)}")
    if name == "multiple_choice":
        return grade_multiple_choice(response, reference, choices)
    if name == "short_answer":
        return grade_short_answer(response, reference, acceptable, question)
    return GRADERS[name](response, reference, acceptable)


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
                 acceptable=example.acceptable or None, question=question_text(example))
