"""The words the free-form rules read: tokens of a statement, its sentences, its main verb, the
question's words and the word it asks for, and the word lists the rules name."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from rlpr.grading.normalization import normalize_answer

BE = frozenset("is are was were be been being am".split())
AUX = BE | frozenset("has have had can could will would shall should may might must do does did "
                     "'s isnt arent wasnt werent".split())
# Verbs the statements of short answers use, besides be/have and the lowercase "-ed" forms.
VERBS = frozenset(
    "wrote written made make makes gave give gives given sank took taken became become becomes won "
    "built known called named says said uses use means mean lies lie carries carry contains equals "
    "consists covers spans comes come goes refers pumps orbits flows stands belongs includes "
    "produces holds grows speak speaks spoken got get gets found begins began ran runs".split())
NOT_VERBS = frozenset("red bed need hundred seed speed feed breed indeed sacred naked wicked ragged "
                      "rugged".split())
RELATIVE = frozenset("that which who whom whose where when".split())
ARITHMETIC = frozenset("divided multiplied added subtracted raised".split())
REFINERS = frozenset("specifically namely particularly precisely".split())  # ", specifically in the Himalayas"
NEGATION = frozenset("not never no neither nor isnt arent wasnt werent doesnt dont didnt cannot "
                     "cant wont".split())
HEDGES = frozenset("maybe perhaps possibly probably might could may".split())
# Words between the verb and the reference that put the reference in another role.
BREAK = NEGATION | HEDGES | frozenset(
    "with without which who whom whose where while whereas although though but and or plus "
    "alongside including besides except unlike than instead rather versus vs either if unless "
    "such minority".split())
# Words that may follow the reference: a new phrase or clause starts there.
FUNCTION = AUX | RELATIVE | frozenset(
    "in on at of to from by for with without as than and or but nor because since although though "
    "after before during until near around about over under between into onto upon through "
    "throughout across within also it its this these those there here so thus hence therefore "
    "then too only each all both either per like unlike such approximately roughly while whereas "
    "located situated known famous being making meaning not due specifically primarily mainly typically "
    "usually commonly generally often widely especially particularly mostly largely chiefly".split())
FILLERS = frozenset("now left total all altogether only exactly each then too".split())  # "8 apples left"
PRONOUNS = frozenset("it this that there he she they these those answer which what".split())
WH = frozenset("what which who whom whose how where when".split())
CONCLUSION = frozenset("so therefore thus hence".split())
CONTRAST = frozenset("however but actually technically".split())
# Superlatives and their opposites: a subject with the opposite of the question's asks another question
# ("The shortest river in South America is the Amazon" for the longest).
_OPPOSITES = [("longest", "shortest"), ("largest", "smallest"), ("biggest", "smallest"), ("tallest", "shortest"),
              ("highest", "lowest"), ("deepest", "shallowest"), ("hottest", "coldest"), ("oldest", "youngest"),
              ("oldest", "newest"), ("fastest", "slowest"), ("heaviest", "lightest"), ("closest", "farthest"),
              ("nearest", "farthest"), ("closest", "furthest"), ("earliest", "latest"), ("most", "least"),
              ("first", "last")]
OPPOSITE = {}
for _a, _b in _OPPOSITES:
    OPPOSITE.setdefault(_a, set()).add(_b)
    OPPOSITE.setdefault(_b, set()).add(_a)
INTERJECTIONS = frozenset("yes so well sure indeed".split())
MONTHS = frozenset("january february march april may june july august september october november "
                   "december jan feb mar apr jun jul aug sep sept oct nov dec".split())
DEMONYM = re.compile(r"(?:ian|ean|can|ish|ese|ic)$")  # Scandinavian, Korean, African, Spanish, Arabic
TITLES = frozenset("president minister king queen sir dr mr mrs ms prof professor saint st lord lady "
                   "emperor pope general captain".split())
QUALIFIERS = frozenset("standard modern classical official old north northern south southern east eastern "
                       "west western central upper lower greater".split())  # "Standard Persian"
ADJUNCT_PREPOSITIONS = frozenset("in on at near during".split())  # ", in Dallas" adds to the slot
# Prepositions a question may open with ("In which year ...?"), mirrored by an answer's opening phrase
OPENING_PREPOSITIONS = frozenset("in on at during from to by for with".split())
ALIAS_OPENERS = (["also", "known", "as"], ["known", "as"], ["also", "called"], ["or", "simply"])
# Asides between commas that leave the slot as it was: "is, of course, 'teeth'"
ASIDES = (["of", "course"], ["in", "fact"], ["indeed"], ["actually"], ["obviously"], ["simply"], ["clearly"],
          ["in", "english"], ["in", "short"])
# Capitalized words that start a sentence (after an initial, "F. Kennedy", a name follows instead).
STARTERS = frozenset("it its the this that these those there he she they we i in a an however but "
                     "so and also both each yes no on at as for".split())


# --------------------------------------------------------------------------- tokens

@dataclass(frozen=True)
class Token:
    raw: str  # as written, without quotes
    norm: str  # normalize_answer of the word; the character itself for punctuation
    punct: bool
    cap: bool = False  # written with a capital first letter
    stop: bool = False  # an initial that kept its period ("F." in "John F. Kennedy")


_QUOTES = "\"'“”‘’`«»*_"
_OPENERS = "([{"
_CLOSERS = ")]}.,;:!?"
_POSSESSIVE = re.compile(r"(\w)['’]s\b")
_GLUED = re.compile(r"\b(of|in|is|to|at|on|by|and|the)([A-Z][a-z])")  # "ofPoland"
_ABBREVIATION = re.compile(r"(?:[A-Za-z]\.){2,}")  # J.K. U.S.
_INITIAL = re.compile(r"[A-Z]\.")
_MONTH_ABBREVIATION = re.compile(r"(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|Dec)\.")  # "Feb. 14, 1963" keeps its period


def tokens(text: str) -> list[Token]:
    """Words and punctuation marks of `text`: quotes dropped, articles dropped, "'s" split off a
    word, a missing space after a short word put back ("ofPoland"); "J.K." and an initial
    followed by more words ("F. Kennedy") stay one word."""
    text = _GLUED.sub(r"\1 \2", _POSSESSIVE.sub(r"\1 's", unicodedata.normalize("NFKC", text)))
    out: list[Token] = []
    chunks = text.split()
    for n, chunk in enumerate(chunks):
        if re.fullmatch(r"'s[.,;:!?)\]}\"']*", chunk):
            out.append(Token("'s", "'s", False))
            chunk = chunk[2:]
        chunk = chunk.strip(_QUOTES)
        initial = n + 1 < len(chunks) and (_INITIAL.fullmatch(chunk) or _MONTH_ABBREVIATION.fullmatch(chunk)) is not None
        head, tail = [], []
        while chunk and (chunk[0] in _OPENERS or chunk[0] in _QUOTES):
            head += [chunk[0]] if chunk[0] in _OPENERS else []
            chunk = chunk[1:]
        while chunk and (chunk[-1] in _CLOSERS or chunk[-1] in _QUOTES) \
                and not initial and not _ABBREVIATION.fullmatch(chunk):
            tail += [chunk[-1]] if chunk[-1] in _CLOSERS else []
            chunk = chunk[:-1]
        out.extend(Token(p, p, True) for p in head)
        norm = normalize_answer(chunk) if chunk else ""
        if norm:
            out.append(Token(chunk, norm, False, chunk[0].isupper(), initial))
        elif chunk and chunk.lower() not in ("a", "an", "the"):
            out.append(Token(chunk, chunk, True))
        out.extend(Token(p, p, True) for p in reversed(tail))
    return out


def words(text: str) -> list[str]:
    """The normalized words of `text` (no punctuation, no articles)."""
    return [t.norm for t in tokens(text) if not t.punct]


def stem(word: str) -> str:
    """A plural's singular, roughly: "hours" -> "hour" (so "24 hours" repeats "How many hours")."""
    return word[:-1] if len(word) > 3 and word.endswith("s") and not word.endswith("ss") else word


def hedged(toks: list[Token]) -> bool:
    """Whether the words hedge: "maybe", "probably", "might", "could", "may" (not the month),
    "must have" ("Augustus must have been ...")."""
    return any((t.norm in HEDGES and not (t.cap and t.norm in MONTHS))
               or (t.norm == "must" and i + 1 < len(toks) and toks[i + 1].norm == "have")
               for i, t in enumerate(toks))


def is_verb(tok: Token) -> bool:
    """be/have/modal forms, "=", common verbs of answers (VERBS) and lowercase "-ed" words."""
    w = tok.norm
    if w == "=":
        return True
    if tok.punct or tok.cap and w not in AUX:
        return False
    return w in AUX or w in VERBS or (len(w) > 4 and w.endswith("ed") and w not in NOT_VERBS)


def main_verb(toks: list[Token]) -> int | None:
    """Index of the statement's main verb: the first verb that does not open a relative clause
    ("The pigment that makes leaves green IS ..."), sit in parentheses or mark a possessive."""
    depth = 0
    for i, t in enumerate(toks):
        depth += (t.norm == "(") - (t.norm == ")")
        if depth or not is_verb(t):
            continue
        if t.norm == "'s" and i and toks[i - 1].norm not in PRONOUNS:  # "Earth's", not "it's"
            continue
        if i and toks[i - 1].norm in RELATIVE:
            continue
        if t.norm in ARITHMETIC and i + 1 < len(toks) and toks[i + 1].norm in ("by", "to", "from"):
            continue  # "81 divided by 9 is ...": an expression, the subject
        if t.norm in ("called", "named", "termed") and i and not toks[i - 1].punct \
                and toks[i - 1].norm not in AUX | FUNCTION and main_verb(toks[i + 1:]) is not None:
            continue  # "Blood cells called erythrocytes do not ...": a participle of the subject
        return i
    return None


class Question:
    """What a statement is read against: the question's words and its FOCUS, the word it asks
    for (the head of the phrase after the wh-word: "What is the chemical SYMBOL for aluminum?",
    "Which ANIMAL says 'neigh'?", "How many DAYS ..."; none for "Who wrote ...?")."""

    def __init__(self, question: str):
        self.words = words(question)
        self.stems = {stem(w) for w in self.words}
        self.focus: str | None = None
        start = next((i + 1 for i, w in enumerate(self.words) if w in WH), len(self.words))
        for w in self.words[start:]:
            if w in AUX or w == "many":
                if self.focus:
                    break
                continue
            if w in FUNCTION or w in VERBS or w in WH:
                break
            self.focus = stem(w)

    def has(self, word: str) -> bool:
        return stem(word) in self.stems

    def is_focus(self, word: str) -> bool:
        return self.focus is not None and stem(word) == self.focus


# --------------------------------------------------------------------------- sentences

_END = re.compile(r"[.!?]+[\"'”’)\]]*(?=\s|$)|\n+")
_TITLE_ABBREVIATION = re.compile(r"(?:Dr|Mr|Mrs|Ms|St|Jr|Sr|vs|Prof|Mt|No|Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept?|Oct|Nov|"
                                 r"Dec)\.", re.IGNORECASE)
_NAME_PART = re.compile(r"[(\"'“‘]*(?:[A-Z]|(?:[A-Za-z]\.)+[A-Za-z])\.")  # "F." "J.K." "U.S."


def sentences(text: str) -> list[str]:
    """`text` cut into sentences: at . ! ? (after closing quotes or brackets: '"people." This')
    followed by a space, or at a line break; not after a title ("Dr.") or after an initial or
    abbreviation that a name or a lowercase word follows ("J. K. Rowling", "John F. Kennedy",
    "U.S. dollar")."""
    out, start = [], 0
    for m in _END.finditer(text):
        if m.group().startswith("."):
            before = text[:m.start() + 1].split()
            word = before[-1] if before else ""
            after = text[m.end():].split()
            following = after[0].strip(_QUOTES) if after else ""
            if _TITLE_ABBREVIATION.fullmatch(word.strip(_QUOTES + "(")):
                continue
            if _NAME_PART.fullmatch(word) and following and (
                    following[:1].islower() or following.lower().strip(",.") not in STARTERS):
                continue
        piece = text[start:m.end()].strip()
        if piece:
            out.append(piece)
        start = m.end()
    if text[start:].strip():
        out.append(text[start:].strip())
    return out
