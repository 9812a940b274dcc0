"""Built-in reasoning tasks: questions a small model answers better by working them out, each with a
short worked solution beside its answer (issue 58's reasoning track; docs/learning.md).

Each family is `fn(rng) -> (question, answer, solution)`. The solution is the derivation a student
could imitate in a few dozen tokens and ends with "Answer: <answer>": the OPSD teacher is shown it
(opsd.context=solution, stored in the example's extra_info under opsd.solution_column), RLPR and
the graders read only the answer. These families draw their own pool (rlpr.data.demo_tasks), so
the short-answer families' questions and splits stay as they were.
"""

from __future__ import annotations

import random
from typing import Callable

from rlpr.data.demo_tables import COUNT_WORDS, ITEMS, MONTHS, NAMES, UNIT_FACTORS, WEEKDAYS


def _answer(steps: str, answer: str) -> str:
    return f"{steps}\nAnswer: {answer}"


def add_two_digit(rng: random.Random) -> tuple[str, str, str]:
    """Two-digit addition, tens and ones apart (a carry in about half the draws)."""
    a, b = rng.randint(11, 89), rng.randint(11, 89)
    tens, ones = a // 10 * 10 + b // 10 * 10, a % 10 + b % 10
    return (f"What is {a} + {b}?", str(a + b),
            _answer(f"Tens: {a // 10 * 10} + {b // 10 * 10} = {tens}. Ones: {a % 10} + {b % 10} = {ones}. "
                    f"{tens} + {ones} = {a + b}.", str(a + b)))


def subtract_two_digit(rng: random.Random) -> tuple[str, str, str]:
    """Two-digit subtraction: take away the tens, then the ones."""
    a = rng.randint(30, 99)
    b = rng.randint(11, a - 5)
    mid = a - b // 10 * 10
    return (f"What is {a} - {b}?", str(a - b),
            _answer(f"{a} - {b // 10 * 10} = {mid}. {mid} - {b % 10} = {a - b}.", str(a - b)))


def multiply_by_digit(rng: random.Random) -> tuple[str, str, str]:
    """A two-digit number times a digit, split into tens and ones."""
    a, b = rng.randint(12, 49), rng.randint(2, 9)
    tens, ones = a // 10 * 10 * b, a % 10 * b
    return (f"What is {a} × {b}?", str(a * b),
            _answer(f"{a // 10 * 10} × {b} = {tens}. {a % 10} × {b} = {ones}. {tens} + {ones} = {a * b}.",
                    str(a * b)))


def two_step_word_problem(rng: random.Random) -> tuple[str, str, str]:
    """Gets some, then gives some away: two operations in order."""
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    a, b = rng.randint(3, 20), rng.randint(2, 15)
    c = rng.randint(1, a + b - 1)
    return (f"{name} has {a} {item}, gets {b} more, then gives {c} away. How many {item} does {pronoun} have now?",
            str(a + b - c),
            _answer(f"{name} starts with {a}. {a} + {b} = {a + b}. {a + b} - {c} = {a + b - c}.", str(a + b - c)))


def groups_word_problem(rng: random.Random) -> tuple[str, str, str]:
    """Equal groups plus a few extra: a product, then a sum."""
    name, pronoun = rng.choice(NAMES)
    item = rng.choice(ITEMS)
    bags, each, extra = rng.randint(2, 6), rng.randint(2, 9), rng.randint(1, 9)
    total = bags * each + extra
    return (f"{name} has {bags} boxes with {each} {item} in each box, and {extra} more {item}. "
            f"How many {item} does {pronoun} have?", str(total),
            _answer(f"{bags} × {each} = {bags * each}. {bags * each} + {extra} = {total}.", str(total)))


def _counted_on(names: list[str], start: int, k: int) -> tuple[str, str]:
    """(the name k places after names[start], cyclically; the count that reaches it, one name a step)."""
    steps = [names[(start + i) % len(names)] for i in range(1, k + 1)]
    return steps[-1], _answer(f"Counting from {names[start]}: " + ", ".join(f"{i} {n}" for i, n in enumerate(steps, 1))
                              + ".", steps[-1])


def weekday_steps(rng: random.Random) -> tuple[str, str, str]:
    """A weekday a few days later, counted day by day."""
    start, k = rng.randrange(7), rng.randint(2, 8)
    return (f"Today is {WEEKDAYS[start]}. What day of the week will it be in {k} days?",
            *_counted_on(WEEKDAYS, start, k))


def month_steps(rng: random.Random) -> tuple[str, str, str]:
    """A month a few months later, counted month by month."""
    start, k = rng.randrange(12), rng.randint(2, 6)
    return (f"It is {MONTHS[start]}. Which month will it be in {k} months?", *_counted_on(MONTHS, start, k))


def letter_count_spelled(rng: random.Random) -> tuple[str, str, str]:
    """How often a letter occurs, found by spelling the word out."""
    word = rng.choice(COUNT_WORDS)
    letter = rng.choice(sorted(set(word)))
    n = word.count(letter)
    return (f"How many times does the letter '{letter}' appear in the word '{word}'?", str(n),
            _answer(f"Spell it: {'-'.join(word)}. The letter '{letter}' appears {n} "
                    f"time{'s' if n != 1 else ''}.", str(n)))


def word_length_spelled(rng: random.Random) -> tuple[str, str, str]:
    """A word's length, counted letter by letter."""
    word = rng.choice(COUNT_WORDS)
    counted = ", ".join(f"{ch} {i}" for i, ch in enumerate(word, 1))
    return (f"How many letters are in the word '{word}'?", str(len(word)),
            _answer(f"Count them: {counted}.", str(len(word))))


def unit_steps(rng: random.Random) -> tuple[str, str, str]:
    """A unit conversion as one multiplication by the factor."""
    small, big, factor = rng.choice(UNIT_FACTORS)
    n = rng.randint(2, 9)
    return (f"How many {small} are in {n} {big}?", str(n * factor),
            _answer(f"One {big[:-1]} is {factor} {small}. {n} × {factor} = {n * factor}.", str(n * factor)))


def compare_sums(rng: random.Random) -> tuple[str, str, str]:
    """Which of two small sums is larger: both worked out, then compared."""
    a, b, c, d = (rng.randint(2, 30) for _ in range(4))
    while a + b == c + d:
        d = rng.randint(2, 30)
    bigger = f"{a} + {b}" if a + b > c + d else f"{c} + {d}"
    answer = str(max(a + b, c + d))
    return (f"Which is larger, {a} + {b} or {c} + {d}? Give the larger total.", answer,
            _answer(f"{a} + {b} = {a + b}. {c} + {d} = {c + d}. {bigger} is larger.", answer))


REASONING_FAMILIES: dict[str, Callable[[random.Random], tuple[str, str, str]]] = {
    "add_two_digit": add_two_digit,
    "subtract_two_digit": subtract_two_digit,
    "multiply_by_digit": multiply_by_digit,
    "two_step_word_problem": two_step_word_problem,
    "groups_word_problem": groups_word_problem,
    "weekday_steps": weekday_steps,
    "month_steps": month_steps,
    "letter_count_spelled": letter_count_spelled,
    "word_length_spelled": word_length_spelled,
    "unit_steps": unit_steps,
    "compare_sums": compare_sums,
}
