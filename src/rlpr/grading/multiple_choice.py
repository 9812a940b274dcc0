"""The multiple-choice grader: which option letter a response chooses."""

from __future__ import annotations

import re
import string

from rlpr.grading.extraction import answer_part, boxed_alternatives, last_line, weak_cue_text
from rlpr.grading.decisive import corrected, decisive_part, uncommitted
from rlpr.grading.hedges import hedged_after, letter_mentions, other_letter
from rlpr.grading.normalization import normalize_answer
from rlpr.grading.rendering import visible
from rlpr.grading.verdict import Grade

LETTERS = string.ascii_uppercase

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
    Explicit phrases thus outrank option text anywhere outside the answer part. One committed
    answer: a letter in a list of several ("B or D", "Answer: B, D", "B, or maybe D", boxed
    side by side) is read as "B/D", which is wrong whatever the order; a negated letter ("not
    (B)", "B is wrong") is never read. The response is read as rendered (`rendering.visible`), a
    correction read as its corrected letter, and a credited letter stands only when the decisive
    part offers no other letter (decisive.py; hedges.py).
    """
    response = visible(response)
    valid = LETTERS[:len(choices)] if choices else LETTERS
    gold = _letter_in(visible(reference), valid, choices)

    def read(text: str) -> str | None:
        return _response_letter_rule(text, valid, choices)[0]

    response = corrected(response, read) or response
    boxed = {_letter_in(b, valid, choices) for b in boxed_alternatives(response)} - {None}
    if len(boxed) > 1:  # "\boxed{B} or \boxed{D}"
        return Grade(False, "/".join(sorted(boxed)), "boxed:several_options")
    letter, rule = _response_letter_rule(response, valid, choices)
    if letter is not None and letter == gold:  # one committed letter: no alternative offered after it
        zone, is_other = decisive_part(response), other_letter(gold, valid)
        if hedged_after(zone, letter_mentions(zone, gold), is_other):
            return Grade(False, letter, f"{rule}:alternative_after")
        why = uncommitted(zone, read, is_other)
        if why:
            return Grade(False, letter, f"{rule}:{why}")
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
    line = last_line(weak)
    letter = _letter_in(line, valid, choices)
    if letter:
        plain = _LETTER_MARKUP.sub("", weak).rstrip()
        listed = _listed_with(plain, plain.rfind(_LETTER_MARKUP.sub("", line).strip()), valid)
        return ("/".join(listed) if len(listed) > 1 and letter in listed else letter), "last_line"
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
    """The letter of the last non-negated match of `pattern`, or "B/D" when that letter is one of
    a list of several options ("B or D", "Answer: B, D", "A, B, C or D")."""
    last = None
    for m in pattern.finditer(text):
        found = next(g for g in m.groups() if g).upper()
        if found in valid and not _negated(text, m):
            last = m
    if last is None:
        return None
    letter = next(g for g in last.groups() if g).upper()
    listed = _listed_with(text, last.start(last.lastindex), valid)
    return "/".join(listed) if len(listed) > 1 else letter


# A list of option letters: two or more letters joined by ",", "/", "&", "or", "and", "nor",
# "vs" or only spaces ("A B C D"), possibly hedged ("B or maybe D", "either B or D"). A letter is a capital that starts no
# word, or a letter of either case in parentheses.
_LIST_LETTER = r"(?:\(([A-Za-z])\)|(?<![\w'’])([A-Z])(?![\w'’]))"
_LIST_JOIN = (r"(?:[\s*)\].]*(?:[,/&;]\s*(?:(?:or|and|nor)\b\s*)?|(?:or|and|nor|vs\.?|versus)\b\s*)|[\s*)\]]+)"
              r"(?:(?:either|maybe|perhaps|possibly|probably|even|also)\b\s*)*[\s*(\[]*")
_LETTER_IN_LIST = re.compile(_LIST_LETTER)
_LETTER_LIST = re.compile(r"(?:" + _LIST_LETTER + _LIST_JOIN + r")+" + _LIST_LETTER)


def _listed_with(text: str, position: int, valid: str) -> list[str]:
    """The distinct valid option letters of the list of letters that holds the letter at
    `position`, in order, negated ones left out ("B, D is wrong"); [] when it stands alone."""
    for m in _LETTER_LIST.finditer(text):
        if m.start() <= position < m.end():
            letters = []
            for x in _LETTER_IN_LIST.finditer(text, m.start(), m.end()):
                found = (x.group(1) or x.group(2)).upper()
                if found in valid and found not in letters and not _negated(text, x):
                    letters.append(found)
            return letters
    return []


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
