"""The free-form (short answer) grader: an explicit answer matched after normalization, else the
answer the response's statements give (answer_slot.py)."""

from __future__ import annotations

import re

from rlpr.grading.answer_guards import gold_words
from rlpr.grading.answer_slot import Statement
from rlpr.grading.canonical import gold_variants, same_value
from rlpr.grading.extraction import NEGATED_ANSWER, answer_part, boxed_alternatives, explicit_answer
from rlpr.grading.decisive import corrected, decisive_part, uncommitted
from rlpr.grading.hedges import hedged_after, other_text, text_mentions
from rlpr.grading.normalization import answer_key, close_numbers, normalize_answer
from rlpr.grading.rendering import visible
from rlpr.grading.verdict import Grade
from rlpr.grading.wording import CONTRAST, FUNCTION, PRONOUNS, Question, main_verb, sentences, tokens, words

# How many statements are read while the ones before give no answer at all.
_MAX_STATEMENTS = 3
# One-word openings that are not an answer.
_INTERJECTIONS = frozenset("sure yes no ok okay well hmm hi hello great certainly absolutely indeed "
                           "correct right exactly alright oh ah wow".split())


def grade_short_answer(response: str, reference: str, acceptable: list[str] | None = None,
                       question: str | None = None, *, rel_tol: float = 0.0) -> Grade:
    """Correct when the response's final answer is the reference or an `acceptable` form, and no
    alternative follows it (`hedges.hedged_after`: "Paris (maybe Lyon)", "Paris; Lyon"); how the
    final answer is read: `_grade_short_answer`. The response is read as rendered
    (`rendering.visible`), a correction as its corrected answer ("Lyon -- no wait, Paris"), and a
    credited answer stands only when the decisive part offers no other candidate (decisive.py)."""
    response = corrected(visible(response), _read) or visible(response)
    g = _grade_short_answer(response, reference, acceptable, question, rel_tol=rel_tol)
    if g.correct:
        golds = [x for x in (reference, *(acceptable or [])) if x.strip()]
        zone, is_other = decisive_part(response), other_text(golds, question or "")
        if hedged_after(zone, text_mentions(zone, golds), is_other):
            return Grade(False, g.extracted, f"{g.rule}:alternative_after")
        normalized = {answer_key(x) for x in golds} - {""}
        why = uncommitted(zone, _read, is_other, lambda said: is_other(said) and not _matches(said, normalized, rel_tol)
                          and not _same_value(said, golds, rel_tol))
        if why:
            return Grade(False, g.extracted, f"{g.rule}:{why}")
    return g


def _matches(said_text: str, normalized: set[str], rel_tol: float) -> bool:
    """Whether an explicit answer is a reference form (normalized, or a number within `rel_tol`)."""
    said = answer_key(said_text)
    return bool(said) and (said in normalized or (rel_tol > 0 and close_numbers(said, normalized, rel_tol)))


def _read(text: str) -> str | None:
    """The answer a short-answer grader reads in a piece of text: its explicit answer's slot, else
    the text itself (a correction's short phrase)."""
    said = explicit_answer(text)
    return answer_head(said) if said is not None else (text.strip() or None)


def _grade_short_answer(response: str, reference: str, acceptable: list[str] | None = None,
                        question: str | None = None, *, rel_tol: float = 0.0) -> Grade:
    """Correct when the response's final answer is the reference or an `acceptable` form.

    The final answer is read as a person would, in this order:
    1. an answer part (`<answer>` tags or `\\boxed{}`), else the text after the last
       "answer is"/"answer:" (up to the end of its sentence): normalized exact match (numbers
       keep their sign; with `rel_tol` > 0, two numbers match within that relative error);
    2. else the response's statements (its sentences of two or more words, or a one-word first
       line), in order: the first that gives an answer decides. It is correct when the reference
       fills its answer slot (answer_slot.py: the predicate after the main verb, or the subject of
       an answer-first statement, ...; whole, not one of several candidates, not negated or
       hedged, not in the role of a term the question gives) and the next statement does not
       take it back ("However, technically, the opposite ... is ..."). It is wrong when it
       names the reference otherwise, mentions the word the question asks for without it ("The
       capital of France is Berlin."), is a question, or repeats the question. A statement that
       does neither ("Finland is a Scandinavian country.") or names the reference only among
       other candidates lets the next one decide, up to the third statement.
    """
    golds = [g for g in (reference, *(acceptable or [])) if normalize_answer(g)]
    normalized = {answer_key(g) for g in (reference, *(acceptable or []))} - {""}
    boxes = boxed_alternatives(response)
    if boxes:
        return Grade(False, " or ".join(boxes), "boxed:several_answers")
    whole = response.strip()
    if len(whole) <= 300 and {answer_key(whole), answer_key(answer_head(whole))} & normalized:
        # the reference itself ("March 5, 2010"), or before a clause ("Dr. Jesse Bennett, who ...")
        return Grade(True, whole, "whole_response:normalized_match")
    if len(whole) <= 300 and _same_value(whole, golds, rel_tol):  # "25%" for 0.25, "3rd of May 2001"
        return Grade(True, whole, "whole_response:canonical")
    answer = explicit_answer(response)
    if answer is not None:
        where = answer_part(response)[1]
        where = "answer_phrase" if where == "none" else where
        for said_text in dict.fromkeys((answer, answer_head(answer))):
            said = answer_key(said_text)
            if bool(said) and said in normalized:
                return Grade(True, said_text, f"{where}:normalized_match")
            if rel_tol > 0 and close_numbers(said, normalized, rel_tol):
                return Grade(True, said_text, f"{where}:numeric_rel_tol_{rel_tol:g}")
            if _same_value(said_text, golds, rel_tol):
                return Grade(True, said_text, f"{where}:canonical")
        return Grade(False, answer, f"{where}:{'negated' if NEGATED_ANSWER.match(answer) else 'normalized_match'}")
    # "May 3, 2001" also as "3rd of May 2001"; not a form the question itself gives ("the singular of 'dishes'")
    asked = set(words(question or ""))
    variants = [v for g in golds for v in gold_variants(g) if not set(words(v)) <= asked]
    return _grade_statements(response, list(dict.fromkeys(golds + variants)), question or "")


def _same_value(said: str, golds: list[str], rel_tol: float) -> bool:
    """The answer is a reference's value in another form (canonical.py), itself or before a clause."""
    return any(same_value(x, g, rel_tol) for x in dict.fromkeys((said, answer_head(said))) for g in golds)


# Where an explicit answer's slot ends: a relative clause (", which ...", ", who ..."), or a
# clause of its own after ", and" / "; " (one with a verb: ", and this is well known"; ", and
# Rome" is a second candidate and stays; ", but ..." may take the answer back and stays).
_RELATIVE_CLAUSE = re.compile(r",\s+(?=(?:which|who|whom|whose|where)\b)", re.IGNORECASE)
_CLAUSE_AFTER = re.compile(r"(?:,\s+(?=(?:and|but)\s)|;\s+)", re.IGNORECASE)


def answer_head(answer: str) -> str:
    """The answer slot of an explicit answer: what stands before a relative clause or a clause of
    its own ("Paris, which is the largest city" -> "Paris"; "Paris, and London" stays whole)."""
    head = _RELATIVE_CLAUSE.split(answer, maxsplit=1)[0]
    for m in _CLAUSE_AFTER.finditer(head):
        rest = head[m.end():]
        rest_toks = [t for t in tokens(rest) if t.norm != "and"]
        if main_verb(rest_toks) is not None:
            return head[:m.start()].strip()
    return head.strip()


def _grade_statements(response: str, golds: list[str], question: str) -> Grade:
    """The first statement that gives an answer decides (see `grade_short_answer`)."""
    found = statements(response, limit=_MAX_STATEMENTS + 1)
    if not found:
        return Grade(False, None, "none")
    q, forms, asked = Question(question), gold_words(golds), words(question)
    for n, text in enumerate(found[:_MAX_STATEMENTS], 1):
        statement = Statement(text, q, forms)
        if words(text) == asked or text.rstrip().endswith("?"):
            if statement.spans or words(text) == asked:
                return Grade(False, text, f"statement{n}:question")
            continue
        if statement.answers():
            following = found[n] if n < len(found) else ""
            if following and Statement(following, q, forms).takes_back():
                return Grade(False, f"{text} {following}", f"statement{n + 1}:taken_back")
            return Grade(True, text, f"statement{n}:answer_slot")
        if statement.undecided():
            continue
        if statement.attempts():
            return Grade(False, text, f"statement{n}:other_answer")
    return Grade(False, found[0], "statements:no_answer")


def statements(response: str, limit: int | None = None) -> list[str]:
    """The sentences of two or more words of a response, in order, at most `limit`, each cut into
    its coordinated clauses (`clauses`); a one-word sentence opening the response counts too
    ("Paris.", "Vienna. Warsaw is ..."), unless it is an interjection ("Sure!")."""
    out: list[str] = []
    lines = [line for line in response[:5_000].splitlines() if line.strip()]
    for i, line in enumerate(lines):
        pieces = [c for sentence in sentences(line) for c in clauses(sentence)]
        first = words(pieces[0]) if i == 0 and pieces else []
        if len(first) == 1 and first[0] not in _INTERJECTIONS:
            out.append(pieces[0])
        out += [p for p in pieces if len(words(p)) >= 2]
        if limit is not None and len(out) >= limit:
            return out[:limit]
    return out


# Where a sentence may join two clauses: ", and", ", but", ";" (the conjunction stays with the
# second clause: "but" can take an answer back).
_CLAUSE_JOINT = re.compile(r"(,\s+(?=(?:and|but)\s)|;\s+)")


def clauses(sentence: str) -> list[str]:
    """A sentence's coordinated clauses, each with a subject and a verb of its own: "The noun 'bus'
    is a noun, | and the plural form is 'buses'." A part without its own subject ("..., and is
    spoken in Lithuania") or verb ("red, and blue") stays with the clause before it, joined as
    written."""
    parts = _CLAUSE_JOINT.split(sentence)  # clause, joint, clause, joint, ...
    out = [parts[0]]
    for joint, part in zip(parts[1::2], parts[2::2]):
        if _has_subject_and_verb(part) and _has_subject_and_verb(out[-1]):
            out.append(part)
        else:
            out[-1] += joint + part
    return out


def _has_subject_and_verb(text: str) -> bool:
    """A verb after a subject that names something (not only "it", "they": a pronoun's clause
    goes on about the one before: "..., and it was a gift from the United States to France")."""
    toks = [t for t in tokens(text) if t.norm not in ("and", "but")]
    v = main_verb(toks)
    return v is not None and any(not t.punct and t.norm not in PRONOUNS | CONTRAST | FUNCTION for t in toks[:v])


def first_statement(response: str) -> str | None:
    """The first statement of a response (see `statements`), or None."""
    found = statements(response, limit=1)
    return found[0] if found else None


def statement_answers(statement: str, golds: list[str], question: str = "") -> bool:
    """Whether the reference (`golds`: it and its acceptable forms) fills the answer slot of one
    statement (answer_slot.py); a question never answers."""
    if statement.rstrip().endswith("?"):
        return False
    return Statement(statement, Question(question), gold_words(golds)).answers()
