"""Does a statement answer with the reference? It does when a mention of the reference fills the
statement's ANSWER SLOT and no guard of answer_guards.py rules that mention out (it ends its
phrase, is not one of several candidates, not in the role of a term the question gives).

The answer slot, in the order a reader looks for it:
- the predicate: after the main verb, nothing between them opening another role or naming
  something else, and the subject restating the question ("The Eiffel Tower is located in the
  city of Paris, France.", "There are 24 hours in a day.", "...was written by J.K. Rowling.");
- the subject of an answer-first statement whose predicate restates the question ("The heart is
  the main organ that pumps blood through the body."), also after an apposition ("The Danube
  River, one of ..., flows through Vienna");
- the subject when the predicate only repeats what the question gave ("The capital of Denmark
  is Copenhagen." for "Copenhagen is the capital of which country?");
- the reference in an opening phrase that mirrors the question's ("In which sport ...?": "In
  baseball, the term ... is used");
- a name between commas after a subject restating the question ("The British Prime Minister
  ..., Winston Churchill, earned ..."), a by-phrase in the subject ("'Hamlet' by William
  Shakespeare is ..."), the word right after the one the question asks for ("the chemical symbol
  (Al)"), a relative clause after it saying it is that ("hydrochloric acid, which is the primary
  component of stomach acid"), or the whole of a statement without a verb ("a single shelf").
Negated ("is not"), hedged ("might be", "probably", "must have been") or listed answers fill no
slot.
"""

from __future__ import annotations

from rlpr.grading.answer_guards import Mentions, skip_parenthetical
from rlpr.grading.wording import (ALIAS_OPENERS, BE, CONTRAST, FILLERS, FUNCTION, INTERJECTIONS, NEGATION,
                                  OPENING_PREPOSITIONS, PRONOUNS, REFINERS, WH, hedged, is_verb)

# Where the slot starts again between the verb and the reference: a refinement (", specifically in
# the Himalayas", ", namely X"), an emphasis ("nothing but X", "none other than X") or a correction
# ("is often called Y but is actually X").
_NAMING = frozenset("called named known termed".split())


class Statement(Mentions):
    """One statement read against a question and the reference forms."""

    def answers(self) -> bool:
        """Whether some mention of the reference fills the answer slot."""
        for s, e in self.spans:
            if self.swapped(s) or self.longer_name(s):
                continue
            if self.listed(s, e) and not self.named_by_relative(s, e):
                continue
            roles = [self.in_predicate, self.bare_phrase]
            # a reference the question itself names ("the plural of 'deer'") answers there only
            if not all(map(self.q.has, self.words(s, e))):
                roles += [self.answer_first, self.reversed_form, self.apposition, self.by_phrase,
                          self.after_focus, self.named_by_relative, self.opening_phrase]
            if any(role(s, e) for role in roles):
                return True
        return False

    def undecided(self) -> bool:
        """The statement names the reference only among other candidates ("composed of nitrogen
        (N2) and oxygen (O2)"): the next statement may still choose."""
        return bool(self.spans) and all(self.listed(s, e) for s, e in self.spans)

    def attempts(self) -> bool:
        """Whether the statement gives some answer: it names the reference in another role, or
        it mentions the word the question asks for ("The capital of France is Berlin."), or it is
        one word ("Vienna.")."""
        return (bool(self.spans) or any(self.q.is_focus(t.norm) for t in self.toks)
                or len(self.words(0, len(self.toks))) == 1)

    def takes_back(self) -> bool:
        """The statement withdraws an answer: it opens with "however", "but", "actually" or
        "technically", its subject names what the question asks for and the reference is not in
        it ("However, technically, the opposite of 'majority' is 'non-majority'.")."""
        if not self.toks or self.toks[0].norm not in CONTRAST or self.spans:
            return False
        first = next((t.norm for t in self.toks[1:] if not t.punct and t.norm not in CONTRAST), "")
        if first in OPENING_PREPOSITIONS:  # "However, in languages spoken by migrants, ...": no new answer
            return False
        return any(self.q.is_focus(t.norm) for t in self.toks[:self.verb or 0])

    # -- the roles
    def in_predicate(self, s: int, e: int) -> bool:
        """After the main verb, nothing between opening another role, naming something else or
        hedging, the subject restating the question: "There are 24 hours in a day."."""
        v = self.verb
        if v is None or s <= v or self.toks[v].norm in NEGATION:  # "It wasn't X."
            return False
        start = self._slot_restart(v, s)
        naming = any(t.norm in _NAMING and self.q.has(t.norm) for t in self.toks[v:v + 2])  # "are called X"
        return (not self.breaks_between(start, s) and not self.names_another(start, s)
                and not hedged(self.toks[start:s]) and (self.echoes_question(0, v) or naming) and self.ends_phrase(e))

    def _slot_restart(self, v: int, s: int) -> int:
        """The verb, or the last refinement, emphasis or correction between it and the reference at s."""
        start = v
        for k in range(v + 1, s):
            w, before = self.toks[k].norm, self.word(k - 1)
            refines = w in REFINERS and before in (",", "more") and k + 1 < s and not is_verb(self.toks[k + 1])
            if refines or (w == "but" and before == "nothing") \
                    or (w == "than" and before == "other" and self.word(k - 2) in ("none", "no")) \
                    or (w == "actually" and "but" in self.words(v, k)):
                start = k
        return start

    def _intro_end(self) -> int:
        """Where the statement proper starts after an opening phrase without a verb and its comma
        ("At sea level, ...", "However, ...", "In Argentina, ..."), else 0."""
        if not self.toks or self.toks[0].norm not in FUNCTION | CONTRAST | INTERJECTIONS:
            return 0
        for i, t in enumerate(self.toks):
            if is_verb(t):
                return 0
            if t.norm == ",":
                return i + 1
        return 0

    def answer_first(self, s: int, e: int) -> bool:
        """The reference is the subject and the predicate restates the question (the word it asks
        for, or two of its words), not negated or hedged ("The heart is the main organ that pumps
        blood", "Calcium is a chemical element named Ca", "The electron carries a negative electric
        charge")."""
        toks = self.toks
        if s not in (0, self._intro_end()) and not (s == 1 and (toks[0].norm in INTERJECTIONS
                                                                 or toks[0].raw.lower() in ("a", "an", "the"))):
            return False
        j = skip_parenthetical(toks, e)
        if self.word(j) == ",":  # an apposition: ", one of the most iconic rivers in Europe,"
            k = j + 1
            alias = any(self.words(k, k + len(o)) == o for o in ALIAS_OPENERS)  # ", also known as the Nile Aqua,"
            while k < len(toks) and toks[k].norm != "," and (alias or not is_verb(toks[k])):
                k += 1
            j = k + 1 if self.word(k) == "," else j
        if j >= len(toks) or toks[j].punct:
            return False
        nxt = toks[j]
        if not (is_verb(nxt) or nxt.norm == "'s" or (not nxt.cap and self.q.has(nxt.norm))):
            return False
        predicate = toks[j:self.clause_end(j + 1)]
        restated = {t.norm for t in predicate if self.q.has(t.norm) and t.norm not in FUNCTION}
        asked = {w for w in self.q.words if w not in FUNCTION | WH}
        return (not NEGATION.intersection(t.norm for t in predicate) and not hedged(predicate)
                and bool(restated) and (len(restated) >= min(2, len(asked))
                                        or any(map(self.q.is_focus, restated))))

    def reversed_form(self, s: int, e: int) -> bool:
        """The subject, when the predicate only repeats what the question gave: "The capital of
        Denmark is Copenhagen." for "Copenhagen is the capital of which country?"."""
        v = self.verb
        if v is None or skip_parenthetical(self.toks, e) != v or self.toks[v].norm not in BE:
            return False
        rest = self.words(v + 1, self.clause_end(v + 1))
        return bool(rest) and all(self.q.has(w) or w in FILLERS for w in rest)

    def apposition(self, s: int, e: int) -> bool:
        """Between commas after a subject restating the question: "The British Prime Minister
        for the Second World War, Winston Churchill, earned ...", "The Sahara Desert, Africa,
        is ..."."""
        v = self.verb
        if v is None or s < 2 or self.word(s - 1) != "," or self.word(e) != "," or e + 1 != v:
            return False
        subject = self.toks[:s - 1]
        return (not any(t.punct for t in subject) and self.echoes_question(0, s - 1)
                and any(w not in FUNCTION | PRONOUNS for w in self.words(0, s - 1))
                and not self.names_another(-1, s - 1))

    def by_phrase(self, s: int, e: int) -> bool:
        """In a by-phrase of the subject: "The novel 'Don Quixote' by Miguel de Cervantes is ..."."""
        v = self.verb
        return (self.word(s - 1) == "by" and (v is None or (s < v and not self._agent_named(v)))
                and self.ends_phrase(e))

    def _agent_named(self, v: int) -> bool:
        """The predicate names another agent by name: "... was written by the playwright Robert Kenny"
        (not "... written by a Spanish-American author": a description)."""
        toks, end = self.toks, self.clause_end(v)
        for k in range(v, end):
            if toks[k].norm != "by":
                continue
            j = k + 1
            while j < end and toks[j].norm not in FUNCTION:
                j += 1
            if j > k + 1 and toks[j - 1].cap:
                return True
        return False

    def after_focus(self, s: int, e: int) -> bool:
        """Right after the first mention of the word the question asks for ("Aluminum is a
        chemical element with the chemical symbol (Al)"), or in parentheses right after words of
        the question ("The chemical formula of carbon dioxide is carbon dioxide (CO2).")."""
        if self.word(s - 1) == "(" and self.word(e) == ")" and s >= 2 and not self.toks[s - 2].punct \
                and self.q.has(self.word(s - 2)) and self.word(s - 2) not in FUNCTION:
            return True
        j = s - 1
        while j >= 0 and self.toks[j].norm in ("(", ":", "=", "is", "was", "are", "called", "named", ",", "which"):
            j -= 1  # "the chemical symbol (Al)", "its own currency, which is the Pound Sterling"
        if j < 0 or j == s - 1 or not self.q.is_focus(self.toks[j].norm):
            return False
        v = self.verb
        if v is not None and s < v and NEGATION.intersection(self.words(v, self.clause_end(v))):
            return False  # "Blood cells called erythrocytes do not carry oxygen."
        first = next(k for k, t in enumerate(self.toks) if self.q.is_focus(t.norm))
        return j == first and self.ends_phrase(e)

    def named_by_relative(self, s: int, e: int) -> bool:
        """A relative clause right after the reference says it is what the question asks for:
        "..., including hydrochloric acid, which is the primary component of stomach acid"."""
        j = skip_parenthetical(self.toks, e)
        if self.word(j) != "," or self.word(j + 1) not in ("which", "who") or self.word(j + 2) not in BE:
            return False
        clause = self.words(j + 3, self.clause_end(j + 3))
        return any(self.q.is_focus(w) for w in clause) and not NEGATION.intersection(clause)

    def opening_phrase(self, s: int, e: int) -> bool:
        """The question asks with a preposition ("IN which sport is ...?") and the statement opens
        with the same preposition and the reference, then a comma and the rest of the question:
        "In baseball, the term 'home run' is used ...", "In Southern Peru, specifically Machu
        Picchu is ..."."""
        qw, toks = self.q.words, self.toks
        if len(qw) < 2 or qw[1] not in WH or qw[0] not in OPENING_PREPOSITIONS or self.word(0) != qw[0]:
            return False
        comma = next((k for k, t in enumerate(toks) if t.punct), len(toks))
        if comma == len(toks) or toks[comma].norm != "," or e != comma or s < 1:
            return False
        if any(is_verb(t) for t in toks[1:comma]):
            return False
        rest = toks[comma + 1:self.clause_end(comma + 1)]
        restated = {t.norm for t in rest if self.q.has(t.norm) and t.norm not in FUNCTION | WH | self.gold}
        return (len(restated) >= 2 and not NEGATION.intersection(t.norm for t in rest) and not hedged(rest))

    def bare_phrase(self, s: int, e: int) -> bool:
        """A statement without a verb is one phrase ending with the reference: "a single shelf";
        so is the head before a relative clause or a clause of its own ("Paris, which is ...",
        "Paris, and this is ..."). A reference inside an opening phrase is not one ("Not X, but
        Y.")."""
        head = self._head_end()
        start = self._intro_end() - 1
        if start >= s:
            start = -1
        return ((self.verb is None or self.verb > head) and e <= head and not self.breaks_between(start, s)
                and not self.names_another(start, s) and self.ends_phrase(e))

    def _head_end(self) -> int:
        """Where a verbless head ends: the comma before a relative clause (", which ...") or
        before a clause with a verb after "and" (", and this is ..."); else the end (", but ..."
        may take the answer back)."""
        toks = self.toks
        for k, t in enumerate(toks):
            if t.norm != "," or k + 1 >= len(toks):
                continue
            nxt = toks[k + 1].norm
            if nxt in ("which", "who", "whom", "whose", "where"):
                return k
            if nxt == "and":
                end = self.clause_end(k + 2)
                if any(is_verb(x) for x in toks[k + 2:end]):
                    return k
        return len(toks)
