"""Where a final answer is read: `<answer>` tags, `\\boxed{}`, "the answer is ..." phrases, and
the rule for reading weak cues only from short text."""

from __future__ import annotations

import re

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


# What may stand between two boxed answers offered as alternatives: "\\boxed{3} or \\boxed{5}",
# "\\boxed{A}, \\boxed{B}", "either \\boxed{3} or maybe \\boxed{5}".
_BETWEEN_ALTERNATIVES = re.compile(r"[\s$,;/&.]*(?:(?:or|and|nor|either|maybe|perhaps|possibly|probably)\b[\s$,]*)*")


def boxed_alternatives(response: str) -> list[str]:
    """The answers of the final run of `\\boxed{}` answers offered side by side (only joiners
    between them: ",", "or", "and", "/", "maybe"), when there are several different ones; else
    [] ("\\boxed{2} and so the area is \\boxed{4}" is one answer: words stand between)."""
    text = _last_tagged(response) or response
    starts = [m for m in _BOXED.finditer(text)]
    if len(starts) < 2:
        return []
    closing = _matching_braces(text, starts[0].end() - 1)
    boxes = [(m.start(), closing[m.end() - 1], text[m.end():closing[m.end() - 1]].strip())
             for m in starts if m.end() - 1 in closing]
    run = boxes[-1:]
    for box in reversed(boxes[:-1]):
        between = text[box[1] + 1:run[0][0]]
        if not _BETWEEN_ALTERNATIVES.fullmatch(between):
            break
        run.insert(0, box)
    answers = []
    for _, _, content in run:
        key = re.sub(r"\s+", "", content)
        if key and key not in [re.sub(r"\s+", "", a) for a in answers]:
            answers.append(content)
    return answers if len(answers) > 1 else []


# A negated answer: "not 5", "never Paris", "isn't 4".
NEGATED_ANSWER = re.compile(r"(?i)^[\s*(]*(?:not|never|neither|no\s+longer|isn['’]?t|is\s+not|wasn['’]?t)\b")


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


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# --------------------------------------------------------------------------- "the answer is X"

_ANSWER_IS = re.compile(r"(?i)\banswer[\s*]*(?:is\b|:)[\s*:]*(.+)$", re.MULTILINE)
# The end of an answer after "answer is": a sentence end, but not after an initial, a title or a
# month's abbreviation ("R. H. Thomson", "T.J. Miller", "Dr. Jesse Bennett", "Sept. 3, 2001").
_ANSWER_END = re.compile(r"(?<![\s.][A-Z]\.)(?<!^[A-Z]\.)(?<!\b(?:Dr|Mr|Ms|St|Jr|Sr|vs)\.)(?<!Mrs\.)"
                         r"(?<!\b(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\.)(?<!\bSept\.)"
                         r"(?<=[.!?])\s+|\n+|(?<=[.!?])$")


def explicit_answer(response: str) -> str | None:
    """The answer part, or what follows the last "answer is"/"answer:" up to its sentence's end."""
    answer = extract_final_answer(response)
    phrases = list(_ANSWER_IS.finditer(response if answer is None else answer))
    if phrases:
        answer = _ANSWER_END.split(phrases[-1].group(1), maxsplit=1)[0]
    return None if answer is None else (answer.strip() or None)


# The end of a sentence after an answer phrase: ". " or a final "." (not the point of 3.5 or of
# 1e-5.), or a newline.
_PHRASE_END = re.compile(r"\.(?:\s|$)|\n")


def phrase_answer(text: str) -> str | None:
    """What follows the last "answer is"/"answer:" up to the end of its sentence, or None."""
    phrases = list(_ANSWER_IS.finditer(text))
    if not phrases:
        return None
    said = _PHRASE_END.split(phrases[-1].group(1).strip(), maxsplit=1)[0].strip().rstrip(".")
    return said.strip("*").strip() or None
