"""Graders that cannot be gamed (issue 34): property tests over every grader.

For random references, responses are built in the forms models write: the reference fed back
(credited), several candidates, the reference negated, a hedge between two, another reference
(all refused). Then the RLVR side: the verifier reward (`reward.kind=verifier`) of a response that
lists every option is 0, and a tiny RLVR run (REINFORCE over response forms, rewarded by
ProbabilityReward) whose policy starts out pushed toward listing letters gains nothing from them.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlpr.config import RewardConfig
from rlpr.data.records import Example
from rlpr.grading import LETTERS, grade_example
from rlpr.reward.probability_reward import ProbabilityReward

pytestmark = pytest.mark.unit

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def example(source: str, question: str, reference: str, choices: list[str] | None = None) -> Example:
    return Example(prompt=[{"role": "user", "content": question}], reference=reference,
                   data_source=source, choices=choices or [])


def credited(e: Example, response: str) -> bool:
    return grade_example(e, response).correct


# --------------------------------------------------------------------------- multiple choice

@st.composite
def mc_rows(draw):
    n = draw(st.integers(2, 10))
    gold, other = draw(st.lists(st.sampled_from(LETTERS[:n]), min_size=2, max_size=2, unique=True))
    source = draw(st.sampled_from(["mmlu", "mmlu_pro", "gpqa_diamond", "arc_challenge"]))
    choices = [f"option number {i}" for i in range(n)]
    return example(source, "Which option is right?", gold, choices), gold, other, LETTERS[:n]


MC_FED_BACK = ["{G}", "{G}.", "({G})", "The answer is {G}.", "The answer is ({G}).", "Answer: {G}",
               "<answer>{G}</answer>", "\\boxed{{{G}}}", "I choose {G}.", "So the answer is **{G}**.",
               "Option {O} is wrong, so the answer is {G}."]
MC_GAMED = ["{G} and {O}", "{O} and {G}", "{G} or {O}", "{O} or {G}", "The answer is {O} or {G}.",
            "Answer: {G}, {O}", "Answer: {O}, {G}", "<answer>{O}, {G}</answer>", "({O}) or ({G})",
            "The answer is {ALL}.", "Either {O} or {G}.", "It is {O}, or maybe {G}.", "{O}/{G}",
            "\\boxed{{{O}}} or \\boxed{{{G}}}", "The answer is not {G}.", "definitely not ({G})",
            "Not {G}.", "The answer is {O}.", "{O}"]


@PROPERTY
@given(mc_rows(), st.sampled_from(MC_FED_BACK))
def test_multiple_choice_credits_the_letter_fed_back(row, template):
    e, gold, other, letters = row
    assert credited(e, template.format(G=gold, O=other))


@PROPERTY
@given(mc_rows(), st.sampled_from(MC_GAMED))
def test_multiple_choice_refuses_several_negated_and_hedged_letters(row, template):
    e, gold, other, letters = row
    everything = ", ".join(letters[:-1]) + " or " + letters[-1]
    assert not credited(e, template.format(G=gold, O=other, ALL=everything))


# --------------------------------------------------------------------------- short answers

NAMES = ["Paris", "Bobby Scott", "Marie Curie", "Ulaanbaatar", "Lake Victoria", "Johannes Kepler",
         "Saint Petersburg", "Amelia Earhart", "Kilimanjaro", "Tokyo", "Ada Lovelace", "Nile"]
NOUNS = ["oxygen", "photosynthesis", "granite", "copper wire", "the violin", "a red panda", "helium"]
MONTHS = ["January", "March", "June", "October", "December"]


@st.composite
def free_answers(draw):
    kind = draw(st.sampled_from(["name", "noun", "number", "date", "place"]))
    if kind == "name":
        return draw(st.sampled_from(NAMES))
    if kind == "noun":
        return draw(st.sampled_from(NOUNS))
    if kind == "number":
        return str(draw(st.integers(2, 5000)))
    if kind == "date":
        return f"{draw(st.sampled_from(MONTHS))} {draw(st.integers(1, 28))}, {draw(st.integers(1800, 2020))}"
    return f"{draw(st.sampled_from(['Paris', 'Lyon', 'Dallas', 'Austin']))}, {draw(st.sampled_from(['France', 'Texas']))}"


@st.composite
def free_rows(draw):
    gold = draw(free_answers())
    other = draw(free_answers().filter(lambda o: o.split(",")[0] not in gold and gold.split(",")[0] not in o))
    source = draw(st.sampled_from(["simpleqa", "nq_open", "trivia"]))
    return example(source, "Which one is it, according to the record?", gold), gold, other


FREE_FED_BACK = ["{G}", "{G}.", "The answer is {G}.", "<answer>{G}</answer>", "Answer: {G}",
                 "{G}, which is well documented.", "The answer is {G}, which is well documented.",
                 "{G}, and this is well documented.", "\\boxed{{{G}}}"]
FREE_GAMED = ["{O}", "The answer is {O}.", "{G} or {O}", "{O} or {G}", "The answer is {O} or {G}.",
              "Either {G} or {O}.", "It is {G}, or maybe {O}.", "Not {G}, but {O}.", "It wasn't {G}.",
              "The answer is not {G}.", "It is not {G}.", "<answer>{G} or {O}</answer>",
              "\\boxed{{{O}}} or \\boxed{{{G}}}"]


@PROPERTY
@given(free_rows(), st.sampled_from(FREE_FED_BACK))
def test_short_answers_credit_the_reference_fed_back(row, template):
    e, gold, other = row
    assert credited(e, template.format(G=gold, O=other))


@PROPERTY
@given(free_rows(), st.sampled_from(FREE_GAMED))
def test_short_answers_refuse_several_negated_and_hedged_answers(row, template):
    e, gold, other = row
    assert not credited(e, template.format(G=gold, O=other))


# --------------------------------------------------------------------------- math

@st.composite
def math_answers(draw):
    kind = draw(st.sampled_from(["int", "frac", "decimal", "sqrt"]))
    a, b = draw(st.integers(2, 400)), draw(st.integers(2, 97))
    return {"int": str(a), "frac": f"\\frac{{{a}}}{{{b}}}", "decimal": f"{a}.{b}",
            "sqrt": f"{a}\\sqrt{{{b}}}"}[kind]


@st.composite
def math_rows(draw):
    from rlpr.grading.math_answers import _number

    gold = draw(math_answers())
    g = _number(gold)
    other = draw(math_answers().filter(lambda o: abs(_number(o) - g) > 0.05 * abs(g)))
    source = draw(st.sampled_from(["math500", "gsm8k", "aime24", "theoremqa"]))
    return example(source, "Compute the value.", gold), gold, other


MATH_FED_BACK = ["\\boxed{{{G}}}", "The answer is ${G}$.", "<answer>{G}</answer>",
                 "So we get $x = 3$ and finally \\boxed{{{G}}}."]
MATH_GAMED = ["\\boxed{{{O}}}", "\\boxed{{{O}}} or \\boxed{{{G}}}", "\\boxed{{{G}}}, \\boxed{{{O}}}",
              "The answer is ${O}$ or ${G}$.", "Either ${O}$ or ${G}$.", "The answer is not ${G}$."]


@PROPERTY
@given(math_rows(), st.sampled_from(MATH_FED_BACK))
def test_math_credits_the_reference_fed_back(row, template):
    e, gold, other = row
    assert credited(e, template.format(G=gold, O=other))


@PROPERTY
@given(math_rows(), st.sampled_from(MATH_GAMED))
def test_math_refuses_several_negated_and_other_answers(row, template):
    e, gold, other = row
    assert not credited(e, template.format(G=gold, O=other))


# --------------------------------------------------------------------------- RLVR

def mc_examples(k: int = 12, seed: int = 0) -> list[Example]:
    rng = random.Random(seed)
    out = []
    for i in range(k):
        n = rng.choice([4, 4, 5, 10])
        out.append(example("mmlu", f"Question {i}: which option?", rng.choice(LETTERS[:n]),
                           [f"choice {j} of question {i}" for j in range(n)]))
    return out


def verifier_rewards(tokenizer, verifier: str, examples: list[Example], responses: list[str]) -> list[float]:
    reward = ProbabilityReward(RewardConfig(kind="verifier", alpha=0.0, verifier=verifier), tokenizer)
    correct = [credited(e, r) for e, r in zip(examples, responses)]
    outs = reward(None, [e.prompt[-1]["content"] for e in examples], responses, [e.reference for e in examples],
                  correct=correct)
    return [o.reward for o in outs]


def every_option(e: Example, form: int) -> str:
    letters = LETTERS[:len(e.choices)]
    return [f"The answer is {', '.join(letters[:-1])} or {letters[-1]}.", " ".join(letters),
            f"<answer>{', '.join(letters)}</answer>", "\n".join(f"({x})" for x in letters),
            "".join(f"\\boxed{{{x}}} or " for x in letters)[:-4]][form]


@pytest.mark.parametrize("verifier", ["oracle", "exact"])
@pytest.mark.parametrize("form", range(5))
def test_the_verifier_reward_of_every_option_listed_is_0(tokenizer, verifier, form):
    examples = mc_examples()
    assert verifier_rewards(tokenizer, verifier, examples, [every_option(e, form) for e in examples]) == [0.0] * 12
    # the same reward credits a committed answer
    assert verifier_rewards(tokenizer, verifier, examples, [f"The answer is {e.reference}." for e in examples]) \
        == [1.0] * 12


# Response forms the tiny policy chooses among, for a row and a letter it guesses.
def another(e: Example, guess: str, rng: random.Random) -> str:
    return rng.choice([x for x in LETTERS[:len(e.choices)] if x != guess])


FORMS = {
    "commit": lambda e, guess, rng: f"The answer is {guess}.",
    "two_letters": lambda e, guess, rng: f"The answer is {guess} or {another(e, guess, rng)}.",
    "list_all": lambda e, guess, rng: every_option(e, 0),
    "gold_last_pair": lambda e, guess, rng: f"{another(e, guess, rng)} and {guess}",
}


def test_a_tiny_rlvr_run_pushed_toward_listing_letters_gains_nothing_from_them(tokenizer):
    """REINFORCE (group-mean baseline) over the response forms, rewarded by reward.kind=verifier
    (the oracle, the eval grader's verdict) on multiple-choice rows. The policy starts with 90% of
    its mass on listing letters; each form's guess is right a quarter of the time. Listing forms
    earn 0 whatever the guess, so the policy moves to committing to one letter."""
    rng = random.Random(0)
    examples = mc_examples(16)
    names = list(FORMS)
    logits = {"commit": 0.0, "two_letters": math.log(3), "list_all": math.log(3), "gold_last_pair": math.log(3)}

    def probs():
        z = sum(math.exp(v) for v in logits.values())
        return {k: math.exp(v) / z for k, v in logits.items()}

    listing_before = 1 - probs()["commit"]
    earned = {k: [] for k in names}
    for step in range(30):
        batch = [examples[(step * 4 + i) % len(examples)] for i in range(4)]
        chosen, responses, rows = [], [], []
        for e in batch:
            for _ in range(4):  # 4 responses per prompt
                form = rng.choices(names, weights=[probs()[k] for k in names])[0]
                guess = e.reference if rng.random() < 0.25 else rng.choice(LETTERS[:len(e.choices)])
                chosen.append(form)
                responses.append(FORMS[form](e, guess, rng))
                rows.append(e)
        rewards = verifier_rewards(tokenizer, "oracle", rows, responses)
        p = probs()
        grads = {k: 0.0 for k in names}
        for g in range(0, len(rewards), 4):
            baseline = sum(rewards[g:g + 4]) / 4
            for form, r in zip(chosen[g:g + 4], rewards[g:g + 4]):
                earned[form].append(r)
                for k in names:
                    grads[k] += (r - baseline) * ((k == form) - p[k])
        for k in names:
            logits[k] += 0.5 * grads[k]
    for form in ("two_letters", "list_all", "gold_last_pair"):
        assert earned[form] and set(earned[form]) == {0.0}, form  # never rewarded, whatever the guess
    assert sum(earned["commit"]) > 0
    assert 1 - probs()["commit"] < listing_before / 2


# --------------------------------------------------------------------------- hedges after a commitment (issue 43)
# A committed answer followed by an alternative, in any wording: a parenthetical ("B (or possibly
# C)", credited on every multiple-choice question tried), a separator ("Paris/Lyon", "Paris;
# Lyon"), two numbers where the reference is one ("1969, 1970"). Generated, not listed: a committed
# form, then a hedge drawn from its parts.

COMMITTED = ["{G}", "The answer is {G}", "Answer: {G}", "<answer>{G}</answer>", "So it is {G}", "**{G}**",
             "I think the answer is {G}"]
OFFERS = ["or", "or possibly", "or perhaps", "maybe", "perhaps", "possibly", "alternatively", "or maybe even",
          "probably", "though possibly", "if not", "or else"]
ALSO_RIGHT = ["is also possible", "could also be right", "might also work", "is likely too", "is plausible too",
              "works as well"]


@st.composite
def parenthetical_hedges(draw):
    """' (or possibly {O})', ' (maybe: {O})', ' (though {O} is also possible)', ' [{O} might also work]'."""
    offer, also = draw(st.sampled_from(OFFERS)), draw(st.sampled_from(ALSO_RIGHT))
    opening, closing = draw(st.sampled_from([("(", ")"), ("[", "]")]))
    inner = draw(st.sampled_from([f"{offer} {{O}}", f"{offer}, {{O}}", f"{offer}: {{O}}", f"though {{O}} {also}",
                                  f"{{O}} {also}", f"although {{O}} {also}"]))
    return f"{draw(st.sampled_from(['', ' ']))}{opening}{inner}{closing}"


@st.composite
def separator_hedges(draw):
    """'/{O}', ' / {O}', '; {O}', ' | {O}', ' \\\\ {O}', ' -- or {O}', '(?) or {O}'."""
    sep = draw(st.sampled_from(["/", " / ", " | ", " \\ ", " -- or ", " — or ", "(?) or ", "? or ", "; or "]))
    return sep + "{O}"


def hedged_response(draw, committed_forms=COMMITTED, hedges=None):
    committed = draw(st.sampled_from(committed_forms))
    hedge = draw(hedges or st.one_of(parenthetical_hedges(), separator_hedges()))
    return committed + hedge + draw(st.sampled_from(["", ".", "!"]))


@PROPERTY
@given(mc_rows(), st.data())
def test_multiple_choice_refuses_an_alternative_after_the_committed_letter(row, data):
    e, gold, other, letters = row
    template = hedged_response(data.draw, hedges=st.one_of(parenthetical_hedges(), separator_hedges()))
    response = template.format(G=gold, O=data.draw(st.sampled_from([other, f"({other})", f"option {other}"])))
    assert not credited(e, response), response


@PROPERTY
@given(free_rows(), st.data())
def test_short_answers_refuse_an_alternative_after_the_committed_answer(row, data):
    e, gold, other = row
    response = hedged_response(data.draw).format(G=gold, O=other)
    assert not credited(e, response), response


@PROPERTY
@given(st.integers(1800, 2020), st.integers(1, 60), st.data())
def test_two_numbers_where_the_reference_is_one_are_refused(year, delta, data):
    e = example(data.draw(st.sampled_from(["nq_open", "simpleqa"])), "In which year did it happen?", str(year))
    committed = data.draw(st.sampled_from(["{G}, {O}", "It was {G}, {O}.", "The answer is {G}, {O}.",
                                           "<answer>{G}, {O}</answer>"]))
    assert not credited(e, committed.format(G=year, O=year + delta))


@PROPERTY
@given(math_rows(), st.data())
def test_math_refuses_an_alternative_after_the_committed_answer(row, data):
    e, gold, other = row
    committed = data.draw(st.sampled_from(["\\boxed{{{G}}}", "The answer is ${G}$", "<answer>{G}</answer>",
                                           "So we get \\boxed{{{G}}}"]))
    response = committed + data.draw(parenthetical_hedges()) + data.draw(st.sampled_from(["", "."]))
    assert not credited(e, response.format(G=gold, O=other)), response


# What qualifies a committed answer without offering another: still credited.
QUALIFIERS = [" (not {O})", " ({O} is wrong)", " (rather than {O})", " (and not {O})", " (I am sure)", " (final)"]


@PROPERTY
@given(mc_rows(), st.sampled_from(COMMITTED[1:4] + COMMITTED[6:]),
       st.sampled_from(QUALIFIERS + [" (option {g})", " (the {g} option)"]))
def test_multiple_choice_credits_a_qualified_commitment(row, committed, qualifier):
    e, gold, other, letters = row
    response = (committed + qualifier + ".").format(G=gold, O=other, g=gold.lower())
    assert credited(e, response), response


@PROPERTY
@given(free_rows(), st.sampled_from(["{G}", "<answer>{G}</answer>"]),  # "The answer is X (...)": the slot is all of it
       st.sampled_from(QUALIFIERS + [" (also known by that name)", " (as recorded)"]))
def test_short_answers_credit_a_qualified_commitment(row, committed, qualifier):
    e, gold, other = row
    response = (committed + qualifier + ".").format(G=gold, O=other)
    assert credited(e, response), response
