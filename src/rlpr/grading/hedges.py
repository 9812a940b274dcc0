"""An answer that offers another after it is not committed, whatever the grader (issue 43, item 8).

Each grader already refuses several candidates offered side by side ("B or D", "Paris, Lyon"). What
slipped through was an alternative *after* the committed answer, in wordings the graders did not
list: a parenthetical ("The answer is B (or possibly C).", "Paris (maybe Lyon)", "\\boxed{12}
(or 13)"), a separator ("Paris; Lyon", "Paris | Lyon", "Bobby Scott \\ Bob Russell", "1969 -- or
1970"), a question mark ("Paris(?) or Lyon"), or two numbers where the reference is one ("It was
1969, 1970."). `hedged_after` looks at the text right after every mention of the credited answer
in the decisive part of the response (`decisive.decisive_part`); a grader's credit stands only when
none of them offers another candidate there. A parenthetical that qualifies the answer ("Paris
(France)", "B (the second option)", "Paris (also known as the City of Light)", "B (not C)") offers
none.
"""

from __future__ import annotations

import re
from typing import Callable

from rlpr.grading.wording import FILLERS, FUNCTION, main_verb, tokens, words

# What closes the answer itself before a hedge: the tag, the box, math and bold markup, quotes
_CLOSERS = re.compile(r"(?:\s*(?:</answer>|\}|\$|\*\*|\*|[\"'’”`]))*")
_PAREN = re.compile(r"\s*[(\[]((?:[^()\[\]\n]|[(\[][^()\[\]\n]{0,40}[)\]]){0,160})[)\]]")
_QUESTION_OR = re.compile(r"\s*(?:\(\s*\?\s*\)|\?)\s*,?\s*(?:or\b|/)", re.IGNORECASE)
# Words that offer an alternative inside a parenthetical
_ALTERNATIVE = re.compile(r"\b(?:or|maybe|perhaps|possibly|probably|alternatively|otherwise|else|might|could|"
                          r"either|though|although|if\s+not|likely|plausible|possible|as\s+well|too)\b", re.IGNORECASE)
# ... unless the parenthetical qualifies, names or negates instead
_QUALIFIES = re.compile(r"\b(?:also\s+(?:known|called|spelled|written|named|referred|abbreviated)|or\s+so|or\s+more|"
                        r"or\s+less|or\s+fewer|a\.?k\.?a|i\.\s?e|e\.\s?g|(?<!if\s)not|never|wrong|incorrect|false|"
                        r"isn['’]t|wasn['’]t|rather\s+than|instead\s+of|ruled?\s+out|eliminat\w*)\b", re.IGNORECASE)
# Separators of alternatives: a slash or a bar ("Paris/Lyon"), a backslash only standing alone
# between spaces ("Bobby Scott \\ Bob Russell"; never a LaTeX command: "5.2 \\text{ m/s}", "\\,",
# "\\times 10^{3}", "\\%", the control space "\\ "), a dash only with "or" ("1969 -- or 1970";
# "invisible – this encompasses ..." explains), a semicolon only before a bare name ("Milky Way;
# Andromeda"; "descend; however, ..." goes on)
_SEPARATOR = re.compile(r"(?:\s*[|/]|\s+\\(?=\s))\s*(?:or\b)?\s*(?P<item>.*)", re.IGNORECASE)
_DASH_OR = re.compile(r"\s*(?:-+|[–—])\s*or\b\s*(?P<item>.*)", re.IGNORECASE)
_SEMICOLON = re.compile(r"\s*;\s*(?:or\b\s*)?(?P<item>(?:(?:the|a|an)\s+)?(?:[A-Z0-9][\w'’-]*\s*){1,3})(?:[.!?]|$)")
# What may follow "or" without naming another candidate: "- or more specifically", "/ or so"
_NOT_AN_ITEM = re.compile(r"(?:more|less|fewer|so|rather|simply|specifically|even|better)\b", re.IGNORECASE)
_COMMA_NUMBER = re.compile(r"\s*,\s*(?P<number>-?\d+(?:\.\d+)?)\s*(?:[.!?;)]|$)")
_ITEM_END = re.compile(r"[.,;:!?()\[\]\n]")
_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?")
_MARKERS = frozenset("or maybe perhaps possibly probably alternatively otherwise else might could either though "
                     "although also if not likely plausible possible well too answer it is was be".split())


def hedged_after(zone: str, mentions: list[tuple[int, int]], is_other: Callable[[str], bool]) -> bool:
    """Whether, right after one of the answer's `mentions` (character spans in `zone`), the text
    offers another candidate (`is_other` says whether a piece of text names one)."""
    for start, end in mentions:
        tail = zone[end:end + 240].split("\n")[0]
        tail = tail[_CLOSERS.match(tail).end():]
        if _QUESTION_OR.match(tail):
            return True
        paren = _PAREN.match(tail)
        if paren and _ALTERNATIVE.search(paren[1]) and not _QUALIFIES.search(paren[1]) and is_other(paren[1]):
            return True
        sep = _SEPARATOR.match(tail) or _DASH_OR.match(tail)
        if sep:
            item = _ITEM_END.split(sep["item"], maxsplit=1)[0]
            ratio = "/" in tail[:sep.start("item")] and _NUMBER.fullmatch(zone[start:end].strip()) \
                and _NUMBER.match(item.strip())  # "60 / 360": a fraction, not two answers
            if item.strip() and not ratio and not _NOT_AN_ITEM.match(item.strip()) and len(words(item)) <= 5 \
                    and main_verb(tokens(item)) is None and is_other(item):
                return True
        semicolon = _SEMICOLON.match(tail)
        if semicolon and is_other(semicolon["item"]):
            return True
        comma = _COMMA_NUMBER.match(tail)  # "1969, 1970": a second number where the reference is one
        if comma and _NUMBER.fullmatch(zone[start:end].strip("()")) and is_other(comma["number"]):
            return True
    return False


# --------------------------------------------------------------------------- per grader

def letter_mentions(zone: str, letter: str) -> list[tuple[int, int]]:
    """Where an option letter stands alone in `zone` ("B", "(B)", "**B**")."""
    pattern = re.compile(r"(?<![\w'’])\(?" + re.escape(letter) + r"\)?(?![\w'’])")
    return [m.span() for m in pattern.finditer(zone)]


def other_letter(gold: str, valid: str) -> Callable[[str], bool]:
    """`is_other` for multiple choice: the text names a valid option letter other than `gold`."""
    def names_one(text: str) -> bool:
        found = re.findall(r"(?<![\w'’])([A-Z])(?![\w'’])|\(([a-z])\)", text)
        return any((a or b).upper() in valid and (a or b).upper() != gold for a, b in found)
    return names_one


def text_mentions(zone: str, golds: list[str]) -> list[tuple[int, int]]:
    """Where a reference form is written in `zone` (its words in order, any case, any spacing)."""
    spans = []
    for gold in golds:
        parts = [re.escape(p) for p in gold.split()]
        if not parts:
            continue
        pattern = re.compile(r"(?<!\w)" + r"\s+".join(parts) + r"(?!\w)", re.IGNORECASE)
        spans += [m.span() for m in pattern.finditer(zone)]
    return sorted(set(spans))


def other_text(golds: list[str], question: str = "") -> Callable[[str], bool]:
    """`is_other` for free-form and math answers: the text holds a number that is not the
    reference's, or a word that is neither the reference's nor the question's nor a function word."""
    known = {w for g in golds for w in words(g)} | set(words(question)) | FUNCTION | FILLERS | _MARKERS
    numbers = {n.replace(",", "") for g in golds for n in _NUMBER.findall(g)}

    gold_words = {w for g in golds for w in words(g)}

    def names_one(text: str) -> bool:
        if any(n.replace(",", "") not in numbers for n in _NUMBER.findall(text)):
            return True
        # a number in words is another number too ("one" where the reference is "Cathy Dennis")
        return any(w not in known and (not w.isdigit() or w not in gold_words | numbers) for w in words(text))
    return names_one
