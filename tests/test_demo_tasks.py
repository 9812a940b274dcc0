"""Tests for the built-in demo tasks: determinism, held-out split, balance and correct answers.

Answers are re-derived here independently of the generators (parsing the question text), and the
fact tables are spot-checked against facts typed out separately.
"""

from __future__ import annotations

import datetime
import os
import random
import re
import string
import subprocess
import sys
from collections import Counter

import pytest

from rlpr.data import demo_tasks
from rlpr.data.demo_tasks import FAMILIES, acceptable_answers, demo_examples, pool_size
from rlpr.data.templates import NOTHINK_INSTRUCTION, R1_SYSTEM_PROMPT

pytestmark = pytest.mark.unit


def question_of(example) -> str:
    """The question text of an 'r1' example (its user turn)."""
    return example.prompt[-1]["content"]


def family_of(example) -> str:
    return example.data_source.removeprefix("demo/")


# --- determinism and splits ---


def test_same_arguments_give_identical_examples():
    assert demo_examples("train", 100, seed=3) == demo_examples("train", 100, seed=3)
    assert demo_examples("val", 50, seed=3) == demo_examples("val", 50, seed=3)


def test_different_seeds_give_different_examples():
    a = [question_of(e) for e in demo_examples("train", 100, seed=0)]
    b = [question_of(e) for e in demo_examples("train", 100, seed=1)]
    assert a != b


def test_stable_across_processes():
    """Python's hash() is salted per process; the pool must not depend on it."""
    code = ("from rlpr.data.demo_tasks import demo_examples as d; "
            "print('|'.join(e.prompt[-1]['content'] for e in d('val', 30, seed=5)))")
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env={**os.environ, "PYTHONHASHSEED": salt}).stdout.strip()
        for salt in ("1", "2")
    }
    here = "|".join(question_of(e) for e in demo_examples("val", 30, seed=5))
    assert outputs == {here}


def test_smaller_n_is_a_prefix():
    assert demo_examples("train", 40) == demo_examples("train", 200)[:40]


@pytest.mark.parametrize("seed", [0, 7])
def test_train_and_val_share_no_question(seed):
    train = {question_of(e) for e in demo_examples("train", pool_size("train", seed), seed=seed)}
    val = {question_of(e) for e in demo_examples("val", pool_size("val", seed), seed=seed)}
    assert train and val and not train & val


def test_questions_are_unique_within_a_split():
    questions = [question_of(e) for e in demo_examples("train", 2000)]
    assert len(set(questions)) == len(questions)


def test_val_does_not_depend_on_train_n():
    demo_tasks._pool.cache_clear()
    first = demo_examples("val", 300)
    for n in (1, 200, 2000):
        demo_examples("train", n)
        assert demo_examples("val", 300) == first


def test_required_sizes_are_available():
    for seed in (0, 1, 2):
        assert pool_size("train", seed) >= 2000
        assert pool_size("val", seed) >= 300
    assert len(demo_examples("train", 2000)) == 2000
    assert len(demo_examples("val", 300)) == 300


def test_fields():
    for i, e in enumerate(demo_examples("val", 50)):
        assert e.uid == f"demo-val-{i}"
        assert family_of(e) in FAMILIES
        assert e.ability == "general"
        assert e.acceptable[0] == e.reference


# --- balance and answer shape ---


def test_families_are_balanced():
    counts = Counter(family_of(e) for e in demo_examples("train", 200))
    assert len(FAMILIES) >= 10
    assert len(counts) >= 10
    assert max(counts.values()) <= 0.2 * 200


def test_answers_are_short_and_non_empty():
    for split, n in (("train", 2000), ("val", 300)):
        for e in demo_examples(split, n):
            assert e.reference.strip() == e.reference
            assert 0 < len(e.reference) <= 40


def test_number_answers_accept_words():
    assert acceptable_answers("4") == ["4", "four"]
    assert "forty-two" in acceptable_answers("42") and "forty two" in acceptable_answers("42")
    assert {"twenty thousand", "20,000"} <= set(acceptable_answers("20000"))
    assert "three hundred twelve" in acceptable_answers("312")
    assert acceptable_answers("Paris") == ["Paris"]
    assert "Kiev" in acceptable_answers("Kyiv")


# --- templates ---


def test_r1_template():
    for e in demo_examples("train", 20, template="r1"):
        assert [m["role"] for m in e.prompt] == ["system", "user"]
        assert e.prompt[0]["content"] == R1_SYSTEM_PROMPT


def test_r1_nothink_template():
    r1 = demo_examples("train", 20, template="r1")
    nothink = demo_examples("train", 20, template="r1_nothink")
    for a, b in zip(r1, nothink):
        assert [m["role"] for m in b.prompt] == ["user"]
        assert b.prompt[0]["content"] == f"{question_of(a)}\n\n{NOTHINK_INSTRUCTION}"
        assert (a.reference, a.uid) == (b.reference, b.uid)


# --- errors ---


def test_bad_split_raises():
    with pytest.raises(ValueError, match="split"):
        demo_examples("test")


def test_too_large_n_raises():
    with pytest.raises(ValueError, match="questions"):
        demo_examples("val", pool_size("val") + 1)
    with pytest.raises(ValueError):
        demo_examples("train", -1)


# --- answers re-derived independently ---

FACTORS = {
    ("centimeters", "meters"): 100, ("millimeters", "centimeters"): 10,
    ("meters", "kilometers"): 1000, ("grams", "kilograms"): 1000,
    ("milliliters", "liters"): 1000, ("inches", "feet"): 12, ("minutes", "hours"): 60,
    ("seconds", "minutes"): 60, ("hours", "days"): 24, ("days", "weeks"): 7,
    ("months", "years"): 12,
}
A_MONDAY = datetime.date(2024, 1, 1)
THIRTY_DAY_MONTHS = {"April", "June", "September", "November"}


def derive_unit_conversion(q):
    small, n, big = re.fullmatch(r"How many (\w+) are in (\d+) (\w+)\?", q).groups()
    return str(int(n) * FACTORS[small, big])


def derive_weekday(q):
    pattern = r"What day of the week comes (\d+) days? (after|before) (\w+)\?"
    k, direction, day = re.fullmatch(pattern, q).groups()
    start = next(A_MONDAY + datetime.timedelta(i) for i in range(7)
                 if (A_MONDAY + datetime.timedelta(i)).strftime("%A") == day)
    step = int(k) if direction == "after" else -int(k)
    return (start + datetime.timedelta(step)).strftime("%A")


def derive_month(q):
    if m := re.fullmatch(r"How many days are in (\w+)\?", q):
        assert m[1] != "February"
        return "30" if m[1] in THIRTY_DAY_MONTHS else "31"
    direction, name = re.fullmatch(r"Which month comes right (after|before) (\w+)\?", q).groups()
    first = datetime.date(2023, datetime.datetime.strptime(name, "%B").month, 15)
    return (first + datetime.timedelta(30 if direction == "after" else -30)).strftime("%B")


def derive_extreme_number(q):
    pattern = r"Which is the (largest|smallest) of these numbers: (.+)\?"
    kind, listed = re.fullmatch(pattern, q).groups()
    numbers = [int(x) for x in listed.split(", ")]
    return str(max(numbers) if kind == "largest" else min(numbers))


def derive_sort_words(q):
    words = q.removeprefix("Sort these words alphabetically: ").split(", ")
    return ", ".join(sorted(words))


def derive_alphabet_order(q):
    if m := re.fullmatch(r"Which comes first in the alphabet: '(\w+)' or '(\w+)'\?", q):
        return sorted([m[1], m[2]])[0]
    pattern = r"Which letter comes right (after|before) ([A-Z]) in the alphabet\?"
    direction, letter = re.fullmatch(pattern, q).groups()
    i = string.ascii_uppercase.index(letter)
    return string.ascii_uppercase[i + 1 if direction == "after" else i - 1]


def derive_word_length(q):
    return str(len(re.findall(r"[a-z]", re.search(r"'(\w+)'", q)[1])))


def derive_letter_count(q):
    pattern = r"How many times does the letter '(\w)' appear in '(\w+)'\?"
    letter, word = re.fullmatch(pattern, q).groups()
    return str(sum(1 for ch in word if ch == letter))


def derive_vowel_count(q):
    word = re.search(r"the word '(\w+)'", q)[1]
    return str(len(re.findall(r"[aeiou]", word)))


def derive_word_problem(q):
    a, b = (int(x) for x in re.findall(r"\d+", q)[:2])
    if "more" in q:
        return str(a + b)
    if "gives" in q:
        return str(a - b)
    if "in each bag" in q:
        return str(a * b)
    assert "equally" in q
    return str(a // b)


def derive_arithmetic(q):
    a, op, b = re.fullmatch(r"What is (\d+) ([-+×]) (\d+)\?", q).groups()
    return str({"+": int(a) + int(b), "-": int(a) - int(b), "×": int(a) * int(b)}[op])


DERIVE = {
    "unit_conversion": derive_unit_conversion, "weekday": derive_weekday, "month": derive_month,
    "extreme_number": derive_extreme_number, "sort_words": derive_sort_words,
    "alphabet_order": derive_alphabet_order, "word_length": derive_word_length,
    "letter_count": derive_letter_count, "vowel_count": derive_vowel_count,
    "word_problem": derive_word_problem, "arithmetic": derive_arithmetic,
}

# Facts typed out independently of the module's tables: (question pattern, {subject: answer}).
KNOWN_FACTS = {
    "capital": (r"What is the capital of (.+)\?", {
        "France": "Paris", "Japan": "Tokyo", "Australia": "Canberra", "Canada": "Ottawa",
        "Brazil": "Brasilia", "Turkey": "Ankara", "Nigeria": "Abuja", "New Zealand": "Wellington",
        "Pakistan": "Islamabad", "Morocco": "Rabat", "the Czech Republic": "Prague"}),
    "chemical_symbol": (r"What is the chemical symbol for (\w+)\?", {
        "iron": "Fe", "gold": "Au", "silver": "Ag", "sodium": "Na", "potassium": "K",
        "lead": "Pb", "tin": "Sn", "mercury": "Hg", "copper": "Cu", "oxygen": "O"}),
    "antonym": (r"What is the opposite of the word '(\w+)'\?", {
        "hot": "cold", "up": "down", "full": "empty", "north": "south", "buy": "sell",
        "asleep": "awake", "inhale": "exhale", "heavy": "light", "early": "late"}),
    "plural": (r"What is the plural of the noun '(\w+)'\?", {
        "mouse": "mice", "child": "children", "knife": "knives", "sheep": "sheep",
        "goose": "geese", "city": "cities", "box": "boxes", "criterion": "criteria"}),
    "color": (r"What color is (.+)\? Answer with one word\.", {
        "fresh grass": "green", "coal": "black", "a carrot": "orange", "a flamingo": "pink",
        "the sky on a clear day": "blue", "fresh snow": "white"}),
    "animal_sound": (r"Which animal says '(.+)'\?", {
        "moo": "cow", "oink": "pig", "quack": "duck", "neigh": "horse", "hoot": "owl",
        "ribbit": "frog", "meow": "cat"}),
    "capital_country": (r"(.+) is the capital of which country\?", {
        "Paris": "France", "Tokyo": "Japan", "Canberra": "Australia", "Ottawa": "Canada",
        "Prague": "Czech Republic", "Wellington": "New Zealand", "Abuja": "Nigeria"}),
    "singular": (r"What is the singular of the noun '(\w+)'\?", {
        "mice": "mouse", "children": "child", "knives": "knife", "sheep": "sheep", "geese": "goose",
        "cities": "city", "criteria": "criterion"}),
    "animal_makes": (r"What sound does a (.+) make\?", {
        "cow": "moo", "pig": "oink", "duck": "quack", "horse": "neigh", "owl": "hoot", "frog": "ribbit"}),
    "language": (r"What is the main language spoken in (.+)\?", {
        "Brazil": "Portuguese", "the Netherlands": "Dutch", "Japan": "Japanese",
        "Mexico": "Spanish", "Iran": "Persian", "Israel": "Hebrew", "Egypt": "Arabic"}),
}
REVERSE_SYMBOLS = {v: k for k, v in KNOWN_FACTS["chemical_symbol"][1].items()}


def generated(name, count=300):
    rng = random.Random(f"test:{name}")
    return [FAMILIES[name](rng) for _ in range(count)]


@pytest.mark.parametrize("name", sorted(DERIVE))
def test_computed_families_answer_correctly(name):
    for question, answer in generated(name):
        assert answer == DERIVE[name](question), question


@pytest.mark.parametrize("name", sorted(KNOWN_FACTS))
def test_fact_families_match_known_facts(name):
    pattern, facts = KNOWN_FACTS[name]
    checked = set()
    for question, answer in generated(name):
        if (m := re.fullmatch(pattern, question)) and m[1] in facts:
            assert answer == facts[m[1]], question
            checked.add(m[1])
        elif m := re.fullmatch(r"Which chemical element has the symbol (\w+)\?", question):
            assert REVERSE_SYMBOLS.get(m[1], answer) == answer, question
        else:
            assert re.fullmatch(pattern, question), question
    assert len(checked) >= len(facts) // 2  # the spot checks actually ran


def test_every_family_is_checked():
    assert set(DERIVE) | set(KNOWN_FACTS) == set(FAMILIES)


# --------------------------------------------------------------------------- families and held-out fraction

def test_family_filter_and_held_out_fraction():
    from rlpr.data.demo_tasks import demo_examples, pool_size

    facts = ["capital", "capital_country", "animal_makes"]
    val = demo_examples("val", n=pool_size("val", families=facts, val_every=2), families=facts, val_every=2)
    train = demo_examples("train", n=pool_size("train", families=facts, val_every=2), families=facts, val_every=2)
    assert {e.data_source for e in val + train} == {f"demo/{f}" for f in facts}
    assert not {e.prompt[-1]["content"] for e in val} & {e.prompt[-1]["content"] for e in train}
    # the held-out split for 1 in 2 contains the one for 1 in 8: nothing held out before is trained on now
    every8 = {e.prompt[-1]["content"] for e in demo_examples("val", n=pool_size("val", families=facts),
                                                             families=facts)}
    assert every8 <= {e.prompt[-1]["content"] for e in val} and len(val) > 2 * len(every8)
    with pytest.raises(ValueError, match="unknown demo task family moon"):
        demo_examples("val", n=1, families=["moon"])
    with pytest.raises(ValueError, match="val_every must be at least 2"):
        pool_size("val", val_every=1)


def test_reverse_questions_have_one_answer():
    """The reverse families are only fair if the forward tables are one-to-one."""
    from rlpr.data.demo_tasks import ANIMAL_SOUNDS, CAPITALS, PLURALS

    for table in (CAPITALS, PLURALS, ANIMAL_SOUNDS):
        assert len(set(table.values())) == len(table)
