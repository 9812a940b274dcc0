"""The free-form (short answer) grader: an explicit answer matched after normalization, else the
answer a response's first statement gives."""

from __future__ import annotations

import re
import unicodedata

from rlpr.evaluation.graders.extraction import answer_part, explicit_answer
from rlpr.evaluation.graders.normalization import answer_key, close_numbers, normalize_answer
from rlpr.evaluation.graders.verdict import Grade


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
    answer = explicit_answer(response)
    if answer is not None:
        said = answer_key(answer)
        normalized = {answer_key(g) for g in (reference, *(acceptable or []))} - {""}
        where = answer_part(response)[1]
        where = "answer_phrase" if where == "none" else where
        if bool(said) and said in normalized:
            return Grade(True, answer, f"{where}:normalized_match")
        if rel_tol > 0 and close_numbers(said, normalized, rel_tol):
            return Grade(True, answer, f"{where}:numeric_rel_tol_{rel_tol:g}")
        return Grade(False, answer, f"{where}:normalized_match")
    statement = first_statement(response)
    if statement is None:
        return Grade(False, None, "none")
    return Grade(statement_answers(statement, golds, question or ""), statement, "first_statement")


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
