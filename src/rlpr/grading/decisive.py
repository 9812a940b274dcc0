"""The decisive part of a response, read whole, the same way by every grader (issue 59, item 2).

THE DECISIVE PART of a response is what a reader takes as its answer: from its first answer cue (an
`<answer>` tag, a `\\boxed{}`, "the answer is", "Answer:", "final answer", "I choose / pick / select
/ go with") to the end of the response; without a cue, the text weak cues are read from (a short
response whole, or its short closing paragraph), else its first three lines. Reasoning before the
first cue is not part of it. The graders read it whole:

- a CORRECTION withdraws what it corrects: after "no wait", "wait", "actually", "I mean", "I
  meant", "correction", "scratch that", "make that", "on second thought", "sorry", "oops", "let me
  correct", the answer read after the last such marker is the response's answer ("Answer: C -- no
  wait, D" answers D). A marker counts only where an answer follows it: an answer cue, or a short
  phrase that names a candidate (a capitalized name, a number, an option letter, LaTeX), so
  "Actually, this follows from Newton's law" corrects nothing;
- two different answers are NOT COMMITTED, whatever stands between them: a second answer cue whose
  answer is another candidate (two "Final answer:" lines, two tags, two boxes, "I choose C" after
  "Answer: B"), or an OFFER of another candidate: a sentence that opens with "then again", "or",
  "alternatively", "second choice", "P.S.", "maybe", "perhaps", "on the other hand", "another
  answer" ..., or the answer's own sentence going on with such a word, followed by a short phrase
  without a verb that names another candidate ("Answer: B. Then again, C.", "B, or possibly C");
  "X is also / equally valid / correct / possible" with X another candidate; a condition in the
  answer's sentence ("B, unless the question means C"). A restatement of the same answer ("The
  answer is B. So, B." "\\boxed{8} ... the answer is 8") is not another candidate.

Which text names another candidate is the grader's own question (`is_other`: another option letter,
another value, words that are neither the reference's nor the question's), and so is what an answer
cue's answer is (`read`).
"""

from __future__ import annotations

import re
from typing import Callable

from rlpr.grading.extraction import _matching_braces, weak_cue_text
from rlpr.grading.wording import AUX, VERBS, tokens, words

# An answer cue: where the decisive part starts and where a second answer is read.
CUE = re.compile(r"<answer>|\\(?:boxed|fbox)\s*\{|\b(?:final\s+)?answer[\s*]*(?:is\b|:)|\bfinal\s+answer\b"
                 r"|\bI\s+(?:would\s+|will\s+|'ll\s+)?(?:choose|chose|pick|picked|select|selected|go\s+with)\b",
                 re.IGNORECASE)
_CORRECTION = re.compile(
    r"\b(?:no\s*,?\s*wait|wait\s*,?\s*no|wait|actually|I\s+mean|I\s+meant|correction|scratch\s+that|make\s+that|"
    r"on\s+second\s+thoughts?|(?:up)?on\s+reflection|on\s+reconsideration|let\s+me\s+reconsider|sorry|oops|"
    r"let\s+me\s+correct(?:\s+that)?)\b(?:[\s,:;.!*—–]|-(?![\d.]))*", re.IGNORECASE)
# Words before the corrected or offered value that are not the value: "it is", "the answer is", "option".
_LEAD = re.compile(
    r"^(?:[\s,:;.*—–]|-+(?=[\s-])|\b(?:it|this|that|the\s+(?:correct\s+)?answer|my\s+answer|I\s+think|I\s+would\s+say|"
    r"is|was|'s|’s|could|might|may|would|can|will|also|equally|even|just|well|be|rather|instead|"
    r"option|choice|answer|the\s+answer\s+is)\b)+", re.IGNORECASE)
# A sentence that offers another candidate opens with one of these (or the answer's sentence goes on with one).
_OFFER = re.compile(
    r"\b(?:then\s+again|on\s+the\s+other\s+hand|alternatively|or|or\s+else|otherwise|if\s+not|either|"
    r"(?:second|another|other|alternative|backup)\s+(?:possible\s+)?(?:choice|guess|option|answer|pick|candidate|"
    r"possibility)s?|p\.?\s?s\b\.?|maybe|perhaps|possibly|probably|could\s+(?:also\s+)?be|might\s+(?:also\s+)?be|"
    r"may\s+(?:also\s+)?be|it\s+could\s+also\s+be|(?:also|equally)\s+(?:possible|plausible|likely)|"
    r"(?:some|others|many)\s+(?:say|believe|think|argue|claim)(?:\s+it\s+is)?)(?!\w)",  # whole words: not "orange"
    re.IGNORECASE)
# "X is also valid", "(option C is equally correct)": X, the words before, is offered.
_ALSO_VALID = re.compile(
    r"([^.;:!?()\n,]{1,40}?)\s{1,3}(?:is|are|would\s+be|could\s+be|might\s+be|seems)\s+(?:also|equally|just\s+as)\s+"
    r"(?:valid|correct|right|possible|plausible|acceptable|likely|good|defensible)\b", re.IGNORECASE)
_CONDITION = re.compile(r"\b(?:unless|except\s+if|if\s+(?:the\s+question|you|we|it)\b)", re.IGNORECASE)
_SENTENCE = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)|\n")
# Where an offered or corrected value ends (outside brackets): not the point of 0.5, the comma of 1,000
# or the minus of "p - q"
_CLAUSE_END = re.compile(r"[.,](?!\d)|[;:!?\n]|\s(?:--+|[—–])\s")
_CANDIDATE = re.compile(r"^[\"'“‘(*$\\]*(?:[A-Z0-9]|\\)")
_NOT_CANDIDATE = re.compile(r"^(?:I|It|This|That|These|Those|There|The|Let|We|So|But|And|Yes|No|However)\b")
_PRONOUN = re.compile(r"(?:it|this|that|these|those|there|both|either|each|such|all|which)\b", re.IGNORECASE)
_MAX_ITEM_WORDS = 6
# A decisive part is read whole up to this many characters; a longer one (degenerate text after an
# early cue) by its first and last halves of it, and at most _MAX_CUES of its cues, so it costs milliseconds.
_MAX_PART_CHARS = 4_000
_MAX_CUES = 30


def decisive_start(response: str) -> int | None:
    """Where the decisive part starts: the first answer cue, or None when there is none."""
    m = CUE.search(response)
    return m.start() if m else None


def _bounded(part: str) -> str:
    half = _MAX_PART_CHARS // 2
    return part if len(part) <= _MAX_PART_CHARS else part[:half] + "\n" + part[-half:]


def decisive_part(response: str) -> str:
    """The decisive part (see the module's docstring)."""
    start = decisive_start(response)
    if start is not None:
        return response[start:]
    weak = weak_cue_text(response)
    return weak if weak is not None else "\n".join(response.splitlines()[:3])


def _cue_unit(text: str, m: re.Match) -> str:
    """The text an answer cue gives: the tag with its content, the box, or the phrase's line."""
    cue = m.group().lower()
    if cue.startswith("<answer"):
        close = text.lower().find("</answer>", m.end())
        return text[m.start():close + 9 if close >= 0 else len(text)]
    if cue.startswith("\\"):
        end = _matching_braces(text, m.end() - 1).get(m.end() - 1)
        return text[m.start():end + 1] if end is not None else text[m.start():]
    rest = text[m.end():]  # to the line's end: the grader's reader ends the answer at its sentence's end
    stops = [x.start() for x in (re.search(r"\n|</answer>", rest, re.IGNORECASE),) if x]
    return text[m.start():m.end() + min(stops, default=len(rest))]


def corrected(response: str, read: Callable[[str], str | None]) -> str | None:
    """The response to grade after the last correction in the decisive part that an answer follows:
    the text after it when it holds an answer cue `read` finds an answer in, else "The answer is "
    and the text after it when that opens with a short value (`_item`; for "wait", "actually",
    "sorry", "oops" one that opens like a candidate); None when nothing is corrected."""
    part = _bounded(decisive_part(response))
    for m in list(reversed(list(_CORRECTION.finditer(part))))[:_MAX_CUES]:
        after = part[m.end():].strip()
        cue = CUE.search(after)
        if cue is not None and read(after) is not None:
            return after
        head = _item(after)  # the gate: a short value without a verb; the answer is read whole after it
        weak = _WEAK_CORRECTION.fullmatch(m.group().strip(" \t,:;.!*—–-"))
        value = "The answer is " + _LEAD.sub("", after, count=1)
        if head and (_candidate_like(head) or not weak) and read(value) is not None:
            return value
    return None


# Markers that correct only before a candidate-like value ("Actually, this follows from ..." corrects nothing)
_WEAK_CORRECTION = re.compile(r"wait|actually|sorry|oops", re.IGNORECASE)


def _candidate_like(phrase: str) -> bool:
    """A phrase that opens like an answer: a capital (not "It", "The", ...), a digit, a quote, LaTeX."""
    return bool(_CANDIDATE.match(phrase)) and not _NOT_CANDIDATE.match(phrase)


# Offers that need a candidate-like item: "perhaps the most famous city" offers no other answer.
_WEAK_OFFER = re.compile(r"maybe|perhaps|possibly|probably|either", re.IGNORECASE)


def uncommitted(part: str, read: Callable[[str], str | None], is_other: Callable[[str], bool],
                differs: Callable[[str], bool] | None = None) -> str | None:
    """Why the decisive part `part` is not committed to one answer ("second_answer", "offers_another",
    "conditional"), or None (see the module's docstring). `differs` says whether an answer cue's
    answer is another than the credited one (default `is_other`)."""
    differs = differs or is_other
    part, first = _bounded(part), None
    for n, m in enumerate(CUE.finditer(part)):
        if n == _MAX_CUES:
            break
        unit = _cue_unit(part, m)
        if first is None:  # where the first answer ends: its tag or box, or for a phrase its cue
            first = m.start() + len(unit) if m.group()[:1] in "<\\" else m.end()
        said = read(unit)
        if said is not None and differs(said):
            return "second_answer"
    answer_end = first or 0
    for s, e in _sentences(part):
        sentence = part[s:e]
        holds_answer = s <= answer_end <= e
        for m in _OFFER.finditer(sentence):
            opens = not sentence[:m.start()].strip(" \t*-•>\"'")
            if not (opens or (holds_answer and s + m.start() >= answer_end)):
                continue
            item = _item(sentence[m.end():])
            needs_candidate = _WEAK_OFFER.fullmatch(m.group().strip()) or not opens
            if item and (_candidate_like(item) or not needs_candidate) and is_other(item):
                return "offers_another"
        for m in _ALSO_VALID.finditer(sentence):
            item = _item(m.group(1))
            if item and not _PRONOUN.match(item) and is_other(item):
                return "offers_another"
        cond = _CONDITION.search(sentence) if holds_answer else None
        if cond and s + cond.start() >= answer_end and is_other(sentence[cond.end():]):
            return "conditional"
    return None


def _item(text: str) -> str:
    """The candidate an offer or a correction names: the words after its lead ("it could also be",
    "option"), up to the clause's end outside brackets, when they are few and have no finite verb
    ("an armature of piped masonry" is a candidate, "the question means C" is not); else ""."""
    value = _LEAD.sub("", text.strip(), count=1)
    depth, end = 0, len(value)
    for m in re.finditer(r"[([{]|[)\]}]|" + _CLAUSE_END.pattern, value):
        if m.group() in "([{":
            depth += 1
        elif m.group() in ")]}":
            depth -= 1
            if depth < 0:
                end = m.start()
                break
        elif depth == 0:
            end = m.start()
            break
    head = value[:end].strip(" *\"'“”‘’`")
    if not head or len(words(head)) > _MAX_ITEM_WORDS or any(t.norm in AUX | VERBS for t in tokens(head)):
        return ""
    return head


def _sentences(text: str) -> list[tuple[int, int]]:
    spans, start = [], 0
    for m in _SENTENCE.finditer(text):
        if m.end() > start:
            spans.append((start, m.end()))
        start = m.end()
    if start < len(text):
        spans.append((start, len(text)))
    return spans
