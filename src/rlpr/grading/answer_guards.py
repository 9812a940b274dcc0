"""Where the reference is mentioned in a statement, and what keeps a mention from being the
statement's answer (see answer_slot.py for the roles in which it answers):

- it does not end its phrase: more of a name or another noun follows ("7 leap years",
  "Augustus Caesar" for Augustus is a form of its own), or a longer name ends with it ("Romulus
  Augustus");
- it is one of several candidates ("X or Y", "X, Y and Z", "X, Y." with Y a bare name);
- it stands where the question puts a term it gives ("The singular of 'cactus' is cacti.");
- between the verb and it, something opens another role (a comma, "with", "not", "or",
  "including", "might") or names something else ("is called the Mirror Cube by the creators of
  the Rubik's Cube").
"""

from __future__ import annotations

import re
import unicodedata

from rlpr.grading.normalization import normalize_answer
from rlpr.grading.wording import (ADJUNCT_PREPOSITIONS, ALIAS_OPENERS, ASIDES, AUX, BE, BREAK,
                                             CONCLUSION, DEMONYM, FILLERS, FUNCTION, HEDGES, MONTHS, OPPOSITE, PRONOUNS, REFINERS,
                                             QUALIFIERS, STARTERS, TITLES, WH, Question, Token, is_verb,
                                             main_verb, tokens, words)

_LIST_JOINERS = (",", "or", "and", "nor", "/", "&")
# What may follow "or" without naming another candidate: "or so", "or more", "or simply X".
_NOT_ALTERNATIVE = frozenset("so more less fewer simply rather also known".split())
# A statement is read up to this many tokens, and its first mentions of the reference only, so
# that degenerate text ("Paris, Paris, Paris, ...") costs milliseconds.
_MAX_TOKENS = 200
_MAX_MENTIONS = 10


def gold_words(golds: list[str]) -> list[list[str]]:
    """Each reference form as normalized words, longest first; initials also run together
    ("J. K. Rowling" is also "JK Rowling"); a reference with commas also with them, so that it
    is matched whole ("March 5, 2010", "Paris, France")."""
    forms: list[list[str]] = []
    for gold in golds:
        if "," in gold:
            with_commas = [t.norm for t in tokens(gold) if not t.punct or t.norm == ","]
            if with_commas and with_commas[0] != "," and with_commas[-1] != "," and with_commas not in forms:
                forms.append(with_commas)
        plain = words(gold)
        merged, run = [], ""
        for w in plain:
            if len(w) == 1 and w.isalpha():
                run += w
                continue
            merged += [run, w] if run else [w]
            run = ""
        merged += [run] if run else []
        forms += [f for f in (plain, merged) if f and f not in forms]
    return sorted(forms, key=len, reverse=True)


def occurrences(toks: list[Token], forms: list[list[str]]) -> list[tuple[int, int]]:
    """Spans [start, end) of whole reference forms among the tokens, longest forms first."""
    found, taken = [], set()
    for form in forms:
        n = len(form)
        for i in range(len(toks) - n + 1):
            span = range(i, i + n)
            if all(map(same_spelling, (toks[k].norm for k in span), form)) and not taken.intersection(span):
                found.append((i, i + n))
                taken.update(span)
    return sorted(found)


def same_spelling(said: str, gold: str) -> bool:
    """A word of the reference as written, or, for a word of six letters or more, with an accent or
    a doubled letter more or less ("ampeère" for "ampere", "Phillipines" for "Philippines"); a
    letter more at its end is another word ("Bulgarian" is not "Bulgaria")."""
    if said == gold:
        return True
    if min(len(said), len(gold)) < 6:
        return False
    return _spelling_key(said) == _spelling_key(gold)


def _spelling_key(word: str) -> str:
    plain = "".join(ch for ch in unicodedata.normalize("NFKD", word) if not unicodedata.combining(ch))
    return re.sub(r"(.)\1+", r"\1", plain)


def skip_parenthetical(toks: list[Token], j: int) -> int:
    """The index after a parenthetical that starts at j ("nitrogen (N2) and ..."), else j."""
    if j >= len(toks) or toks[j].norm != "(":
        return j
    depth = 0
    for k in range(j, len(toks)):
        depth += (toks[k].norm == "(") - (toks[k].norm == ")")
        if depth == 0:
            return k + 1
    return len(toks)


class Mentions:
    """A statement's tokens (from its last conclusion clause: ", so he has 8 apples"), its main
    verb and the spans where the reference is mentioned."""

    def __init__(self, statement: str, question: Question, forms: list[list[str]]):
        toks = tokens(statement)[:_MAX_TOKENS]
        start = max([i + 1 for i in range(1, len(toks) - 1)
                     if toks[i].norm in CONCLUSION and toks[i - 1].norm in (",", ";")], default=0)
        self.toks = toks[start:]
        self.q = question
        self.forms = forms
        self.gold = {w for f in forms for w in f}
        self.verb = main_verb(self.toks)
        self.spans = occurrences(self.toks, forms)[:_MAX_MENTIONS]

    def word(self, j: int) -> str:
        return self.toks[j].norm if 0 <= j < len(self.toks) else ""

    def clause_end(self, a: int) -> int:
        """The first punctuation mark at or after a."""
        k = a
        while k < len(self.toks) and not self.toks[k].punct:
            k += 1
        return k

    # -- the phrase ends with the reference
    def ends_phrase(self, e: int) -> bool:
        """What follows the reference ends its phrase: the end, punctuation or a function word,
        after words of the question and fillers ("24 hours in a day", "8 apples left")."""
        toks, j = self.toks, e
        if toks[e - 1].stop:
            return True
        while j < len(toks) and toks[j].norm == ")":
            j += 1
        if self.word(j) in REFINERS and j + 1 < len(toks) and toks[j + 1].punct:
            return False  # "honey specifically – honeydew": a refinement names the answer
        while j < len(toks) and not toks[j].punct and toks[j].norm not in self.gold | FUNCTION \
                and (self.q.has(toks[j].norm) or toks[j].norm in FILLERS):
            j += 1
        return j == len(toks) or toks[j].punct or toks[j].norm in FUNCTION

    def longer_name(self, s: int) -> bool:
        """A longer name ends with the reference ("Romulus Augustus"); a qualifier before it does
        not make another name ("Standard Persian", "North Africa")."""
        prev = self.toks[s - 1] if s else None
        if prev is not None and prev.norm in MONTHS and self.toks[s].norm.isdigit():
            return False  # "in July 1969": a year after its month
        return (prev is not None and prev.cap and not prev.punct and not self.q.has(prev.norm)
                and prev.norm not in self.gold | TITLES | STARTERS | FUNCTION | QUALIFIERS)

    # -- several candidates
    def _item(self, j: int) -> tuple[list[str], int]:
        """The words of a list item starting at j (up to punctuation, a function word or a verb;
        hyphenated words split: "closed-ended", and never a verb: "wide-beamed") and where it ends."""
        out = []
        while j < len(self.toks) and not self.toks[j].punct and self.toks[j].norm not in FUNCTION \
                and not (is_verb(self.toks[j]) and "-" not in self.toks[j].raw):
            out += [w for w in (normalize_answer(x) for x in re.split(r"[-‐]", self.toks[j].raw)) if w]
            j += 1
        return out, j

    def _same_answer(self, item: list[str]) -> bool:
        return any(item[:len(f)] == f or item[-len(f):] == f for f in self.forms)

    def listed(self, s: int, e: int) -> bool:
        """The reference is one of several candidates: "X or Y", "Y or X", "X (or Y)", "X, Y and
        Z", "X, Y, Z", or "X, Y." with Y a bare name (not after "in": "located in Paris, France"
        is one place). An equivalent form beside it ("amperes or AMP", "'closed' or
        'closed-ended'") or words of the question ("Paris, France" for the capital of France) are
        not other candidates."""
        toks = self.toks
        if {"combination", "mixture", "blend", "mix"} & set(self.words(s - 4, s)) and "of" in self.words(s - 3, s):
            return False  # "the combination of chickpeas and oil": the parts of one answer
        if self.word(s - 1) in _LIST_JOINERS[1:] + ("vs", "versus") and s >= 2 and not toks[s - 2].punct:
            return True
        j, others = e, 0
        while j < len(toks) and toks[j].norm == ")":
            j += 1
        if self.word(j) == "(" and self.word(j + 1) in ("or", "and", "nor"):
            item, _ = self._item(j + 2)
            if item and not self._same_answer(item):
                return True
        j = skip_parenthetical(toks, j)
        while j < len(toks) and toks[j].norm in _LIST_JOINERS:
            joiner, k = toks[j].norm, j + 1
            after_comma = joiner == "," and self.word(k) in ("or", "and", "nor")
            if after_comma:  # ", or maybe Y", ", and Y"
                joiner, k = self.word(k), k + 1
            while self.word(k) in HEDGES | {"either", "even", "else"}:
                k += 1
            item, end = self._item(k)
            if not item and joiner in ("or", "nor") and k < len(toks) and not toks[k].punct \
                    and self.word(k) not in _NOT_ALTERNATIVE:
                return True  # "X or in the Gospel of Luke": another candidate all the same
            if not item:  # "and is closely related to ...": a clause, not a list
                return False
            if after_comma and joiner == "and" and not (end == len(toks) or toks[end].punct):
                return False  # ", and the music by Bob Russell": a clause of its own
            if not self._same_answer(item) and not (joiner == "," and all(map(self.q.has, item))):
                if joiner != ",":
                    return True
                others += 1
                last = end == len(toks) or toks[end].norm in ".!"
                in_place = bool({"in", "at", "near", "from"} & set(self.words(s - 3, s)))
                # a second name, or in a statement without a verb anything ending it ("X, Y")
                if others == 1 and last and (self.verb is None or all(t.cap for t in toks[k:end])) \
                        and not in_place:
                    return True
            j = skip_parenthetical(toks, end)
        return others >= 2

    def words(self, a: int, b: int) -> list[str]:
        return [t.norm for t in self.toks[max(a, 0):b] if not t.punct]

    # -- the role of a given term
    def swapped(self, s: int) -> bool:
        """The reference stands where the question puts a term it gives, and that term stands
        elsewhere: the two words before the reference come right before a given word in the
        question, and the statement names that word after the reference ("The singular of the
        noun 'cactus' is cacti." for "What is the singular of the noun 'cacti'?") or as the
        subject of "is" ("France is the capital of Paris.")."""
        before = [t.norm for t in self.toks[max(0, s - 2):s] if not t.punct]
        if len(before) < 2 or before[-1] in AUX:
            return False
        elsewhere = {t.norm for t in self.toks[s + 1:]}
        if self.verb is not None and self.verb < s and self.toks[self.verb].norm in BE:
            elsewhere |= set(self.words(0, self.verb))
        qw = self.q.words
        return any(qw[i:i + 2] == before and i + 2 < len(qw) and qw[i + 2] not in WH
                   and qw[i + 2] in elsewhere for i in range(len(qw) - 1))

    # -- between the verb and the reference
    def breaks_between(self, a: int, b: int) -> bool:
        """Whether something strictly between a and b opens another role: punctuation or a word
        of BREAK; not a colon right after the verb ("is: 8"), nor a comma in a date ("July 4,
        1776") or a place ("in Paris, France"), before an adjunct (", in Dallas") or an alias (",
        also known as Farsi")."""
        aside = set()
        for k in range(a + 1, b):  # ", of course," and the like: skipped whole
            if self.toks[k].norm == ",":
                for words_ in ASIDES:
                    m = k + 1 + len(words_)
                    if self.words(k + 1, m) == words_ and self.word(m) == "," and m < b:
                        aside.update(range(k, m + 1))
        for k in range(a + 1, b):
            t = self.toks[k]
            if k in aside or (t.norm == ":" and k == a + 1):
                continue
            if t.norm == "," and (self._date_comma(k) or self._place_comma(k)
                                  or self.word(k + 1) in ADJUNCT_PREPOSITIONS
                                  or any(self.words(k + 1, k + 1 + len(o)) == o for o in ALIAS_OPENERS)):
                continue
            if t.punct or (t.norm in BREAK and not (t.cap and t.norm in MONTHS)):
                return True
        return False

    def _date_comma(self, k: int) -> bool:
        return self.word(k - 2) in MONTHS and self.word(k - 1).isdigit() and self.word(k + 1)[:1].isdigit()

    def _place_comma(self, k: int) -> bool:
        """A comma inside a place after "in"/"at": "located in Paris, France"."""
        j = k - 1
        while j >= 0 and self.toks[j].cap and not self.toks[j].punct:
            j -= 1
        return j < k - 1 and self.word(j) in ("in", "at") and k + 1 < len(self.toks) and self.toks[k + 1].cap

    def names_another(self, a: int, s: int) -> bool:
        """Strictly between a and the reference (at s) the slot already names something else: a
        name (a capitalized word inside the sentence, not from the question, not a month, title
        or nationality, not a place before a comma, not leading into a reference form: "Standard
        Persian") or, before a number, another number ("7 days in 2 weeks"; not a date's day)."""
        starts = {x for x, _ in self.spans}
        numeric = self.toks[s].norm.replace(".", "").isdigit()
        for k in range(a + 1, s):
            t = self.toks[k]
            if t.punct or (k and self.toks[k - 1].punct) or self.q.has(t.norm) \
                    or t.norm in self.gold | FUNCTION | STARTERS | PRONOUNS:
                continue
            if t.cap and t.norm not in MONTHS | TITLES and not DEMONYM.search(t.norm) \
                    and not self._leads_into(k, starts) and not self._in_place(k):
                return True
            if numeric and t.norm.isdigit() and not {self.word(k - 1), self.word(k + 1)} & MONTHS:
                return True
        return False

    def _leads_into(self, k: int, starts: set[int]) -> bool:
        while k < len(self.toks) and self.toks[k].cap and k not in starts:
            k += 1
        return k in starts

    def _in_place(self, k: int) -> bool:
        j = k
        while j < len(self.toks) and self.toks[j].cap:
            j += 1
        return self.word(j) == "," and self._place_comma(j)

    def echoes_question(self, a: int, b: int) -> bool:
        """The words from a to b restate the question (a subject such as "The capital of
        France", "There", "The answer to this classic question"); anything does without one."""
        ws = self.words(a, b)
        if any(OPPOSITE.get(w, set()) & set(self.q.words) for w in ws):
            return False  # "The shortest river ..." for the longest
        return (not ws or not self.q.words or "answer" in ws or all(w in PRONOUNS | FUNCTION for w in ws)
                or any(self.q.has(w) and w not in FUNCTION for w in ws))
