"""Prompt templates (spec section 6): turn a question into chat messages.

`r1` and `r1_nothink` are the published templates. `r1_user` puts the r1 instruction into the
user turn, which small models follow more often than a system prompt (spec section 1b).
"""

from __future__ import annotations

import re
import string
from typing import Callable

R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant "
    "solves it. The assistant first thinks about the reasoning process in the mind and then "
    "provides the user with the answer. The reasoning process and answer are enclosed within "
    "<think> </think> and <answer> </answer> tags, respectively, i.e., <think> reasoning "
    "process here </think> <answer> answer here </answer>."
)
NOTHINK_INSTRUCTION = (
    "Please reason step by step, and put your final answer within <answer> </answer>."
)
R1_USER_INSTRUCTION = (
    "First think about the question inside <think> </think> tags, then give only the final "
    "answer inside <answer> </answer> tags, like this: <think> reasoning here </think> "
    "<answer> answer here </answer>"
)
MC_INSTRUCTION = "Answer with only the letter of the correct option."

LETTERS = string.ascii_uppercase


def format_choices(question: str, choices: list[str]) -> str:
    """Append lettered options ("A. ...") to a multiple-choice question."""
    if len(choices) > len(LETTERS):
        raise ValueError(f"too many options ({len(choices)}); at most {len(LETTERS)}")
    lines = [f"{LETTERS[i]}. {c}" for i, c in enumerate(choices)]
    return question.rstrip() + "\n\n" + "\n".join(lines)


def r1(question: str, mc: str) -> list[dict]:
    return [{"role": "system", "content": R1_SYSTEM_PROMPT}, {"role": "user", "content": question + mc}]


def r1_nothink(question: str, mc: str) -> list[dict]:
    return [{"role": "user", "content": f"{question}\n\n{NOTHINK_INSTRUCTION}{mc}"}]


def r1_user(question: str, mc: str) -> list[dict]:
    return [{"role": "user", "content": f"{question}\n\n{R1_USER_INSTRUCTION}{mc}"}]


def plain(question: str, mc: str) -> list[dict]:
    return [{"role": "user", "content": question + mc}]


# The registry of templates, (question, multiple-choice instruction or "") -> chat messages: its
# keys are the allowed values of data.template.
TEMPLATES: dict[str, Callable[[str, str], list[dict]]] = {
    "r1": r1, "r1_nothink": r1_nothink, "r1_user": r1_user, "plain": plain,
}


def build_messages(question: str, template: str = "r1", multiple_choice: bool = False) -> list[dict]:
    """Chat messages for one question under a named template."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")
    return TEMPLATES[template](question, f"\n{MC_INSTRUCTION}" if multiple_choice else "")


def teacher_messages(messages: list[dict], template: str, reference: str) -> list[dict]:
    """OPSD's teacher context c(q, y*) (spec section 10): the prompt's chat messages with its last user
    turn rewritten by `template`, {reference} replaced by `reference` and {question} by that turn's
    text, in one pass (a reference that contains "{question}" stays as written)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    question = messages[last]["content"]
    filled = re.sub(r"\{(reference|question)\}", lambda m: reference if m.group(1) == "reference" else question,
                    template)
    return [dict(m, content=filled) if i == last else dict(m) for i, m in enumerate(messages)]
