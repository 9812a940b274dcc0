"""Built-in demo tasks: short-answer general questions generated from a seed, no files needed.

RLPR rewards the policy's probability of the reference answer, so a demo needs questions with
short, unambiguous free-form references across many domains (not only arithmetic). Each family
below is a tiny generator `fn(rng) -> (question, answer)`; `demo_examples` draws a deterministic
pool from all of them and holds out a validation split by a stable hash of the question text, so
train and val never share a question and val does not depend on how much train data is requested.
"""

from __future__ import annotations

import calendar
import hashlib
import random
from collections import deque
from functools import lru_cache
from typing import Callable

from rlpr.data.demo_tables import (  # noqa: F401 (re-exported: tests and benchmarks read them here)
    ALIASES, ANIMAL_SOUNDS, ANTONYMS, CAPITALS, COLORS, COUNT_WORDS, ELEMENT_SYMBOLS, ITEMS, LANGUAGES, MONTHS,
    NAMES, PLURALS, SORT_WORDS, UNIT_FACTORS, VOWELS, WEEKDAYS)
from rlpr.data.reasoning_tasks import REASONING_FAMILIES
from rlpr.data.records import Example
from rlpr.data.templates import build_messages

SPLITS = ("train", "val")
VAL_EVERY = 8  # about one question in 8 is held out for validation
DRAWS_PER_FAMILY = 600  # exhausts the small fact tables; leaves room above n=2000 train, 300 val

# --- task families ---


def capital(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(sorted(CAPITALS))
    return f"What is the capital of {country}?", CAPITALS[country]


def capital_country(rng: random.Random) -> tuple[str, str]:
    """The capital question asked the other way round (every capital in the table is unique)."""
    country = rng.choice(sorted(CAPITALS))
    name = country.removeprefix("the ")
    return f"{CAPITALS[country]} is the capital of which country?", name


def chemical_symbol(rng: random.Random) -> tuple[str, str]:
    """Asked both ways, so the fixed table yields twice as many questions."""
    element = rng.choice(sorted(ELEMENT_SYMBOLS))
    symbol = ELEMENT_SYMBOLS[element]
    if rng.random() < 0.5:
        return f"What is the chemical symbol for {element}?", symbol
    return f"Which chemical element has the symbol {symbol}?", element


def antonym(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(sorted(ANTONYMS))
    return f"What is the opposite of the word '{word}'?", ANTONYMS[word]


def plural(rng: random.Random) -> tuple[str, str]:
    noun = rng.choice(sorted(PLURALS))
    return f"What is the plural of the noun '{noun}'?", PLURALS[noun]


def singular(rng: random.Random) -> tuple[str, str]:
    """The plural question asked the other way round (every plural in the table is unique)."""
    noun = rng.choice(sorted(PLURALS))
    return f"What is the singular of the noun '{PLURALS[noun]}'?", noun


def color(rng: random.Random) -> tuple[str, str]:
    thing = rng.choice(sorted(COLORS))
    return f"What color is {thing}? Answer with one word.", COLORS[thing]


def animal_sound(rng: random.Random) -> tuple[str, str]:
    sound = rng.choice(sorted(ANIMAL_SOUNDS))
    return f"Which animal says '{sound}'?", ANIMAL_SOUNDS[sound]


def animal_makes(rng: random.Random) -> tuple[str, str]:
    """The animal-sound question asked the other way round."""
    sound = rng.choice(sorted(ANIMAL_SOUNDS))
    return f"What sound does a {ANIMAL_SOUNDS[sound]} make?", sound


def language(rng: random.Random) -> tuple[str, str]:
    country = rng.choice(sorted(LANGUAGES))
    return f"What is the main language spoken in {country}?", LANGUAGES[country]


def unit_conversion(rng: random.Random) -> tuple[str, str]:
    small, big, factor = rng.choice(UNIT_FACTORS)
    n = rng.randint(2, 30)
    return f"How many {small} are in {n} {big}?", str(n * factor)


def weekday(rng: random.Random) -> tuple[str, str]:
    start = rng.randrange(7)
    k = rng.randint(1, 10)
    direction, sign = rng.choice([("after", 1), ("before", -1)])
    days = "day" if k == 1 else "days"
    question = f"What day of the week comes {k} {days} {direction} {WEEKDAYS[start]}?"
    return question, WEEKDAYS[(start + sign * k) % 7]


def month(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["after", "before", "days"])
    if kind == "days":  # not February: its length depends on the year
        i = rng.choice([m for m in range(12) if m != 1])
        return f"How many days are in {MONTHS[i]}?", str(calendar.monthrange(2023, i + 1)[1])
    i = rng.randrange(12)
    if kind == "before":
        return f"Which month comes right before {MONTHS[i]}?", MONTHS[(i - 1) % 12]
    return f"Which month comes right after {MONTHS[i]}?", MONTHS[(i + 1) % 12]


def extreme_number(rng: random.Random) -> tuple[str, str]:
    numbers = rng.sample(range(1, 100), rng.choice([3, 4]))
    listed = ", ".join(map(str, numbers))
    if rng.random() < 0.5:
        return f"Which is the largest of these numbers: {listed}?", str(max(numbers))
    return f"Which is the smallest of these numbers: {listed}?", str(min(numbers))


def sort_words(rng: random.Random) -> tuple[str, str]:
    words = rng.sample(SORT_WORDS, 3)
    return f"Sort these words alphabetically: {', '.join(words)}", ", ".join(sorted(words))


def alphabet_order(rng: random.Random) -> tuple[str, str]:
    kind = rng.choice(["words", "after", "before"])
    if kind == "words":
        a, b = rng.sample(sorted(set(COUNT_WORDS)), 2)
        return f"Which comes first in the alphabet: '{a}' or '{b}'?", min(a, b)
    i = rng.randrange(1, 25)
    letter = chr(ord("A") + i)
    if kind == "after":
        return f"Which letter comes right after {letter} in the alphabet?", chr(ord(letter) + 1)
    return f"Which letter comes right before {letter} in the alphabet?", chr(ord(letter) - 1)


def word_length(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(COUNT_WORDS)
    return f"How many letters are in the word '{word}'?", str(len(word))


def letter_count(rng: random.Random) -> tuple[str, str]:
    word = rng.choice(COUNT_WORDS)
    letter = rng.choice(sorted(set(word)))
    return f"How many times does the letter '{letter}' appear in '{word}'?", str(word.count(letter))


def vowel_count(rng: random.Random) -> tuple[str, str]:
    """Vowels are listed in the question so 'y' is not a matter of opinion."""
    word = rng.choice(COUNT_WORDS)
    count = sum(ch in VOWELS for ch in word)
    return f"How many vowels (a, e, i, o, u) are in the word '{word}'?", str(count)


def word_problem(rng: random.Random) -> tuple[str, str]:
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    kind = rng.choice(["add", "sub", "mul", "div"])
    if kind == "add":
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        return (f"{name} has {a} {item} and gets {b} more. "
                f"How many {item} does {pronoun} have now?", str(a + b))
    if kind == "sub":
        a = rng.randint(5, 25)
        b = rng.randint(2, a - 1)
        return (f"{name} has {a} {item} and gives {b} of them to a friend. "
                f"How many {item} does {pronoun} have left?", str(a - b))
    a, b = rng.randint(2, 9), rng.randint(2, 9)
    if kind == "mul":
        return (f"{name} has {a} bags with {b} {item} in each bag. "
                f"How many {item} does {pronoun} have in total?", str(a * b))
    return (f"{name} shares {a * b} {item} equally among {a} friends. "
            f"How many {item} does each friend get?", str(b))


def arithmetic(rng: random.Random) -> tuple[str, str]:
    op = rng.choice("+-×")
    if op == "×":
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        return f"What is {a} × {b}?", str(a * b)
    a, b = rng.randint(10, 99), rng.randint(1, 99)
    if op == "-":
        a, b = max(a, b), min(a, b)
        return f"What is {a} - {b}?", str(a - b)
    return f"What is {a} + {b}?", str(a + b)


FAMILIES: dict[str, Callable[[random.Random], tuple[str, str]]] = {
    "capital": capital,
    "capital_country": capital_country,
    "chemical_symbol": chemical_symbol,
    "antonym": antonym,
    "plural": plural,
    "singular": singular,
    "color": color,
    "animal_sound": animal_sound,
    "animal_makes": animal_makes,
    "language": language,
    "unit_conversion": unit_conversion,
    "weekday": weekday,
    "month": month,
    "extreme_number": extreme_number,
    "sort_words": sort_words,
    "alphabet_order": alphabet_order,
    "word_length": word_length,
    "letter_count": letter_count,
    "vowel_count": vowel_count,
    "word_problem": word_problem,
    "arithmetic": arithmetic,
}

# --- acceptable answers ---

_ONES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
         "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen",
         "eighteen", "nineteen"]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> str:
    """English words for 0 <= n < 1,000,000 ("forty-two", "three thousand")."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + (f"-{_ONES[n % 10]}" if n % 10 else "")
    if n < 1000:
        return f"{_ONES[n // 100]} hundred" + (f" {number_words(n % 100)}" if n % 100 else "")
    rest = f" {number_words(n % 1000)}" if n % 1000 else ""
    return f"{number_words(n // 1000)} thousand{rest}"


def acceptable_answers(answer: str) -> list[str]:
    """The reference first, then forms a grader should treat as the same answer."""
    forms = [answer, *ALIASES.get(answer, [])]
    if answer.isdigit():
        n = int(answer)
        words = number_words(n)
        forms += [words, words.replace("-", " ")]
        if n >= 1000:
            forms.append(f"{n:,}")
    if ", " in answer:  # a sorted list of words
        forms += [answer.replace(", ", " "), answer.replace(", ", ",")]
    return list(dict.fromkeys(forms))


# --- pool, split and mixing ---


def _stable_int(text: str) -> int:
    """A hash that, unlike hash(), is the same in every process."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def split_of(question: str, val_every: int = VAL_EVERY) -> str:
    """Which split a question belongs to, by its text alone, so no seed or n can leak it. The val
    split for `val_every` = 2k contains the one for 2k' when k' is a multiple of k (8 -> 4 -> 2)."""
    return "val" if _stable_int(question) % val_every == 0 else "train"


def _interleave(by_family: dict[str, list[tuple]], rng: random.Random) -> tuple:
    """Round-robin over families (in a shuffled order each round) until every family runs dry."""
    queues = {name: deque(items) for name, items in by_family.items() if items}
    out = []
    while queues:
        order = sorted(queues)
        rng.shuffle(order)
        for name in order:
            out.append((name, *queues[name].popleft()))
            if not queues[name]:
                del queues[name]
    return tuple(out)


# the two kinds of family, each drawing a pool of its own (the short-answer pool is the same as before
# the reasoning families existed: its questions, splits and order never depend on them)
REGISTRIES = {"short_answer": FAMILIES, "reasoning": REASONING_FAMILIES}
ALL_FAMILIES = {**FAMILIES, **REASONING_FAMILIES}


@lru_cache(maxsize=8)
def _pool(seed: int, val_every: int = VAL_EVERY, kind: str = "short_answer"
          ) -> dict[str, tuple[tuple[str, str, str, str], ...]]:
    """Every unique (family, question, answer, worked solution or "") of one kind of family for a
    seed, per split, in mixed order."""
    seen: set[str] = set()
    by_split: dict[str, dict[str, list[tuple]]] = {s: {} for s in SPLITS}
    for name, fn in REGISTRIES[kind].items():
        rng = random.Random(_stable_int(f"{seed}:{name}"))
        for _ in range(DRAWS_PER_FAMILY):
            question, answer, *solution = fn(rng)
            if question not in seen:
                seen.add(question)
                by_split[split_of(question, val_every)].setdefault(name, []).append(
                    (question, answer, solution[0] if solution else ""))
    return {s: _interleave(by_split[s], random.Random(_stable_int(f"{seed}:{s}:order")))
            for s in SPLITS}


def family_kind(families) -> str:
    """Which pool `families` draw from: short_answer (also for none: all the short-answer families)
    or reasoning; a list that mixes the two is refused."""
    kinds = {kind for kind, registry in REGISTRIES.items() for f in families or () if f in registry}
    if len(kinds) > 1:
        raise ValueError(f"demo task families {', '.join(families)} mix short-answer and reasoning families "
                         f"(reasoning: {', '.join(REASONING_FAMILIES)}); train on one kind at a time")
    return kinds.pop() if kinds else "short_answer"


def _questions(split: str, seed: int, families, val_every: int = VAL_EVERY) -> tuple:
    if split not in SPLITS:
        raise ValueError(f"unknown demo split {split!r}; choose 'train' or 'val'")
    unknown = sorted(set(families or ()) - set(ALL_FAMILIES))
    if unknown:
        raise ValueError(f"unknown demo task famil{'ies' if len(unknown) > 1 else 'y'} {', '.join(unknown)}; "
                         f"choose from {', '.join(ALL_FAMILIES)}")
    if val_every < 2:
        raise ValueError(f"val_every must be at least 2, got {val_every}")
    pool = _pool(seed, val_every, family_kind(families))[split]
    return tuple(q for q in pool if q[0] in families) if families else pool


def pool_size(split: str, seed: int = 0, families: list[str] | tuple = (), val_every: int = VAL_EVERY) -> int:
    """How many unique questions `split` has for `seed` (the largest n `demo_examples` accepts),
    counting only `families` when given; one question in `val_every` is held out."""
    return len(_questions(split, seed, tuple(families), val_every))


def demo_examples(split: str = "train", n: int = 200, seed: int = 0, template: str = "r1",
                  families: list[str] | tuple = (), val_every: int = VAL_EVERY,
                  solution_key: str = "solution") -> list[Example]:
    """The first `n` demo examples of `split` for `seed` (of `families` only, when given), as
    chat-prompted Examples; a reasoning family's worked solution is kept in extra_info[solution_key].

    Deterministic for (split, n, seed, families); a smaller n gives a prefix of a larger one, and
    the val split is the same whatever train n is asked for.
    """
    questions = _questions(split, seed, tuple(families), val_every)
    if not 0 <= n <= len(questions):
        which = f" of families {', '.join(families)}" if families else ""
        raise ValueError(f"demo {split} split has {len(questions)} questions{which} for seed {seed}; got n={n}")
    return [
        Example(
            prompt=build_messages(question, template),
            reference=answer,
            uid=f"demo-{split}-{i}",
            data_source=f"demo/{family}",
            ability="general",
            acceptable=acceptable_answers(answer),
            extra_info={solution_key: solution} if solution else {},
        )
        for i, (family, question, answer, solution) in enumerate(questions[:n])
    ]
