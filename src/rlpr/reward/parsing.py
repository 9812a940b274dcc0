"""Response parsing, the format reward and the repetition penalty (spec sections 1 and 3).

Pure string functions: they never raise on any response text.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Callable

THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"
BOXED = "\\boxed{"
_WHITESPACE = re.compile(r"[ \t\n\r]*")


@dataclass(frozen=True)
class ParsedResponse:
    """Where the reasoning ends.

    `head` is the response text kept in o' (up to and including `<answer>`, or `\\boxed{`),
    `gap` the whitespace to put between it and the reference, `tail` what closes the answer.
    `block` is where the answer block starts in the response (and in `head`): the index of
    `<answer>` (or `\\boxed{`); the reasoning is `response[:block]`.
    """

    valid: bool
    head: str = ""
    gap: str = ""
    tail: str = ""
    block: int = 0


INVALID = ParsedResponse(valid=False)


def _answer_gap(response: str, end: int) -> str:
    """The whitespace the model wrote right after `<answer>`, or one space if it wrote none."""
    ws = _WHITESPACE.match(response, end).group(0)
    return ws or " "


def parse_r1(response: str) -> ParsedResponse:
    """Valid iff `<think>`, `</think>`, `<answer>` each occur exactly once, in that order."""
    if any(response.count(tag) != 1 for tag in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN)):
        return INVALID
    t0, t1, a0 = (response.index(tag) for tag in (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN))
    if not t0 < t1 < a0:
        return INVALID
    end = a0 + len(ANSWER_OPEN)
    return ParsedResponse(True, response[:end], _answer_gap(response, end), " " + ANSWER_CLOSE, a0)


def parse_r1_nothink(response: str) -> ParsedResponse:
    """Valid iff `<answer>` occurs exactly once."""
    if response.count(ANSWER_OPEN) != 1:
        return INVALID
    a0 = response.index(ANSWER_OPEN)
    end = a0 + len(ANSWER_OPEN)
    return ParsedResponse(True, response[:end], _answer_gap(response, end), " " + ANSWER_CLOSE, a0)


def parse_boxed(response: str) -> ParsedResponse:
    """The answer is the content of the last `\\boxed{...}`: o' keeps the text up to it."""
    start = response.rfind(BOXED)
    if start < 0:
        return INVALID
    return ParsedResponse(True, response[:start + len(BOXED)], "", "}", start)


_R1_SHAPE = re.compile(r"^<think>.*?</think>.*?<answer>.*?</answer>.*$", re.DOTALL)
_NOTHINK_SHAPE = re.compile(r"^.*?<answer>.*?</answer>.*$", re.DOTALL)
_BOXED_SHAPE = re.compile(r"\\boxed\{.+\}", re.DOTALL)


def r1_shape(text: str) -> bool:
    tags = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)
    return all(text.count(t) == 1 for t in tags) and _R1_SHAPE.match(text) is not None


def r1_nothink_shape(text: str) -> bool:
    tags = (ANSWER_OPEN, ANSWER_CLOSE)
    return all(text.count(t) == 1 for t in tags) and _NOTHINK_SHAPE.match(text) is not None


def boxed_shape(text: str) -> bool:
    return _BOXED_SHAPE.search(text) is not None


@dataclass(frozen=True)
class FormatMode:
    """A response format (`reward.format_mode`): where its reasoning ends, and its full shape."""

    parse: Callable[[str], ParsedResponse]
    full_shape: Callable[[str], bool]  # on the left-stripped response


# The registry of format modes: its keys are the allowed values of reward.format_mode.
FORMAT_MODES: dict[str, FormatMode] = {
    "r1": FormatMode(parse_r1, r1_shape),
    "r1_nothink": FormatMode(parse_r1_nothink, r1_nothink_shape),
    "boxed": FormatMode(parse_boxed, boxed_shape),
}


def format_mode(mode: str) -> FormatMode:
    try:
        return FORMAT_MODES[mode]
    except KeyError:
        raise ValueError(f"unknown format mode {mode!r}; choose one of {', '.join(FORMAT_MODES)}") from None


def parse_response(response: str, mode: str = "r1") -> ParsedResponse:
    return format_mode(mode).parse(response)


def answer_block_start(response: str, mode: str = "r1") -> int | None:
    """Where the answer block starts in a format-valid response (the index of `<answer>`, or of the
    last `\\boxed{`): the reasoning is `response[:start]`; None when the response is not valid."""
    parsed = parse_response(response, mode)
    return parsed.block if parsed.valid else None


def format_reward(response: str, mode: str = "r1") -> float:
    """1.0 iff the response has the mode's full shape (all tags exactly once, in order), else 0.0."""
    return float(format_mode(mode).full_shape(response.lstrip()))


def has_repetition(response: str, window: int = 10, min_count: int = 10) -> bool:
    """True iff some run of `window` consecutive whitespace-separated words occurs `min_count`+ times."""
    words = response.split()
    if len(words) < window + min_count - 1:
        return False
    counts = Counter(tuple(words[i:i + window]) for i in range(len(words) - window + 1))
    return max(counts.values()) >= min_count
