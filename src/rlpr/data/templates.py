"""Prompt templates (spec section 6): turn a question into chat messages.

`r1` and `r1_nothink` are the published templates. `r1_user` puts the r1 instruction into the
user turn, which small models follow more often than a system prompt (spec section 1b). `steps`
asks for step-by-step reasoning and a last "Answer:" line (the reasoning track). OPSD's teacher
context is built here too (`teacher_messages`).
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
# the reasoning track's instruction (data.template=steps; the `reasoning` preset): a derivation, then a
# last line the graders read ("Answer: ..."); the 135M model copies a placeholder such as <answer>
STEP_INSTRUCTION = 'Think step by step. Then write the final answer on the last line, starting with "Answer:".'

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


def steps(question: str, mc: str) -> list[dict]:
    return [{"role": "user", "content": f"{question}{mc}\n\n{STEP_INSTRUCTION}"}]


# The registry of templates, (question, multiple-choice instruction or "") -> chat messages: its
# keys are the allowed values of data.template.
TEMPLATES: dict[str, Callable[[str, str], list[dict]]] = {
    "r1": r1, "r1_nothink": r1_nothink, "r1_user": r1_user, "plain": plain, "steps": steps,
}


def build_messages(question: str, template: str = "r1", multiple_choice: bool = False) -> list[dict]:
    """Chat messages for one question under a named template."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown template {template!r}; choose one of {', '.join(TEMPLATES)}")
    return TEMPLATES[template](question, f"\n{MC_INSTRUCTION}" if multiple_choice else "")


# OPSD's teacher context (spec section 10, docs/opsd.md): opsd.template names one of these, or is a
# text of its own with {reference} and {question}. `matched` builds the teacher's turn from the
# student's own: the reference (or worked-solution) block, then the student's turn unchanged; the
# reference code's transition sentence joins the block only where the student is itself asked to
# reason (opsd.transition). `reference_code` is the reference code's fixed wording (data_collator.py),
# which asks every student for step-by-step reasoning: rlpr's default before issue 58.
REFERENCE_BLOCK = "Here is a reference answer to the question below:\n{reference}\n\n"
SOLUTION_BLOCK = "Here is a reference solution to the problem below:\n{reference}\n\n"
TRANSITION = ("After understanding the reference solution and the rationale behind each step, now articulate your "
              "own step-by-step reasoning that derives the same final answer to the problem below:\n\n")
REFERENCE_CODE_TEMPLATE = SOLUTION_BLOCK + TRANSITION + "{question}"
TEACHER_TEMPLATES = {"matched": None, "reference_code": REFERENCE_CODE_TEMPLATE}
TRANSITIONS = ("auto", "always", "never")
# what makes a student prompt one that asks for reasoning (opsd.transition=auto): the r1 family's
# instructions ("reason step by step", "think about the question", "the reasoning process")
_ASKS_TO_REASON = re.compile(r"step[- ]by[- ]step|\breason|\bthink", re.IGNORECASE)


def asks_to_reason(messages: list[dict]) -> bool:
    """Whether any turn of the student's chat asks for reasoning (opsd.transition=auto)."""
    return any(_ASKS_TO_REASON.search(m["content"]) for m in messages)


def teacher_block(messages: list[dict], shown: str, context: str = "reference", transition: str = "auto") -> str:
    """The block `matched` puts before the student's last user turn: the reference (context reference
    or none) or the worked solution (context solution), and the transition sentence where
    `transition` is always, or auto and the student is asked to reason."""
    block = (SOLUTION_BLOCK if context == "solution" else REFERENCE_BLOCK).replace("{reference}", shown)
    return block + (TRANSITION if transition == "always" or (transition == "auto" and asks_to_reason(messages))
                    else "")


def teacher_messages(messages: list[dict], template: str, reference: str, *, context: str = "reference",
                     transition: str = "auto") -> list[dict]:
    """OPSD's teacher context c(q, y*) (spec section 10): the prompt's chat messages with its last user
    turn rewritten. `template` matched: `teacher_block` + the turn as the student has it; any other
    (reference_code, or a text of its own): the template with {reference} replaced by `reference`
    and {question} by the turn's text, in one pass (a reference that contains "{question}" stays as
    written)."""
    last = max(i for i, m in enumerate(messages) if m["role"] == "user")
    question = messages[last]["content"]
    if template == "matched":
        filled = teacher_block(messages, reference, context, transition) + question
    else:
        text = TEACHER_TEMPLATES.get(template) or template
        filled = re.sub(r"\{(reference|question)\}", lambda m: reference if m.group(1) == "reference" else question,
                        text)
    return [dict(m, content=filled) if i == last else dict(m) for i, m in enumerate(messages)]
