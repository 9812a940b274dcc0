"""Read training/evaluation data into `Example`s.

Two shapes are accepted: the verl/RLPR parquet layout unchanged (also as JSONL/JSON rows with the
same fields), and flat question/answer tables with a column mapping, from any source
rlpr.data.sources reads (files, compressed files, Hugging Face `datasets` folders).
Every user mistake becomes a one-line `DataError` naming the file, row and field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from rlpr.data.records import Example
# iter_jsonl and read_rows are re-exported: callers read them from here
from rlpr.data.sources import Table, check_text, iter_jsonl, parse_source, read_rows, read_tables  # noqa: F401
from rlpr.data.templates import build_messages
from rlpr.errors import PARSE_ERRORS, DataError, parse_error_reason


@dataclass
class ColumnMapping:
    """Which fields of a flat table hold the question, the answer and (optional) the options."""

    question: str = "question"
    answer: str = "answer"
    choices: str = "choices"
    # a worked-solution column (opsd.context=solution; "": none), required in every row when set and
    # kept in the example's extra_info under its name (verl rows: a top-level field or in extra_info)
    solution: str = ""


def solution_text(value, where: str, field: str) -> str:
    """A row's worked solution: a non-empty string (opsd.context=solution shows it to the teacher)."""
    if value is None:
        raise DataError(f"{where}: field '{field}' is missing (opsd.context=solution reads it)")
    if not isinstance(value, str) or not value.strip():
        raise DataError(f"{where}: field '{field}' must be a non-empty string (opsd.context=solution reads it)")
    return value


def _score_a(row: dict, where: str) -> float | None:
    for key in ("score_a", "scoreA"):
        if row.get(key) is not None:
            try:
                value = float(row[key])
            except (TypeError, ValueError):
                raise DataError(f"{where}: field '{key}' is not a number: {row[key]!r}") from None
            if not math.isfinite(value):
                raise DataError(f"{where}: field '{key}' is not finite")
            return value
    return None


ROLES = ("system", "user", "assistant")


def answer_texts(value, where: str, field: str) -> list[str]:
    """A reference answer (a string or a number) or a list of acceptable ones, as strings; None,
    NaN, booleans, mappings and empty strings are refused with one line naming the field (they
    used to become the references "None", "nan" or a dict's repr)."""
    values = value if isinstance(value, (list, tuple)) else [value]
    if not values:
        raise DataError(f"{where}: field '{field}' is an empty list")
    out = []
    for j, v in enumerate(values):
        name = f"{field}[{j}]" if isinstance(value, (list, tuple)) else field
        if v is None:  # a parquet struct or a table column without this key in some rows reads as null
            raise DataError(f"{where}: field '{name}' is missing (null)")
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise DataError(f"{where}: field '{name}' must be a string or a number, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise DataError(f"{where}: field '{name}' is not a finite number ({v})")
        text = str(v).strip()
        if not text:
            raise DataError(f"{where}: field '{name}' is empty")
        out.append(text)
    return out


def check_messages(prompt, where: str) -> list[dict]:
    """A row's chat messages, checked: each has a known role and string content, and the last is the
    user's turn, the one the model answers (issue 29: a prompt of only an assistant turn trained,
    the policy answering its own words). A string is one user turn."""
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise DataError(f"{where}: field 'prompt' must be a non-empty list of chat messages")
    for j, m in enumerate(prompt):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: field 'prompt[{j}]' must have 'role' and string 'content'")
        if m["role"] not in ROLES:
            raise DataError(f"{where}: field 'prompt[{j}].role' is {m['role']!r}; expected one of {', '.join(ROLES)}")
    if prompt[-1]["role"] != "user":
        last = len(prompt) - 1
        raise DataError(f"{where}: field 'prompt[{last}].role' is {prompt[-1]['role']!r}; a prompt must end with "
                        f"a user turn (the turn the model answers)")
    return prompt


def _from_verl(row: dict, where: str, index: int, solution: str = "") -> Example:
    prompt = check_messages(row.get("prompt"), where)
    rm = row.get("reward_model")
    if not isinstance(rm, dict) or "ground_truth" not in rm:
        raise DataError(f"{where}: field 'reward_model.ground_truth' is missing")
    # several acceptable answers: the first is the reference
    answers = answer_texts(rm["ground_truth"], where, "reward_model.ground_truth")
    gt, acceptable = answers[0], (answers if isinstance(rm["ground_truth"], (list, tuple)) else [])
    extra = row.get("extra_info") or {}
    if not isinstance(extra, dict):
        extra = {"value": extra}
    acceptable = acceptable or [str(a) for a in (extra.get("acceptable_answers") or [])]
    if solution:
        extra = {**extra, solution: solution_text(row[solution] if solution in row else extra.get(solution), where,
                                                  solution)}
    return Example(
        prompt=[{"role": m["role"], "content": m["content"]} for m in prompt],
        reference=gt,
        uid=str(extra.get("index", index)) if extra.get("index") is not None else str(index),
        data_source=str(row.get("data_source") or ""),
        ability=str(row.get("ability") or ""),
        style=str(rm.get("style") or "rule"),
        acceptable=acceptable,
        choices=[str(c) for c in (extra.get("choices") or [])],
        score_a=_score_a(row, where),
        extra_info=extra,
    )


def _from_flat(row: dict, where: str, index: int, mapping: ColumnMapping, template: str,
               source: str) -> Example:
    if mapping.question not in row:
        raise DataError(f"{where}: field '{mapping.question}' is missing (set the question column)")
    if mapping.answer not in row:
        raise DataError(f"{where}: field '{mapping.answer}' is missing (set the answer column)")
    question = row[mapping.question]
    if not isinstance(question, str) or not question.strip():
        raise DataError(f"{where}: field '{mapping.question}' must be a non-empty string")
    answers = answer_texts(row[mapping.answer], where, mapping.answer)
    answer, acceptable = answers[0], (answers if isinstance(row[mapping.answer], (list, tuple)) else [])
    choices = row.get(mapping.choices) or []
    if isinstance(choices, str):
        try:
            choices = json.loads(choices)
        except PARSE_ERRORS as e:  # not JSON, an integer of over 4300 digits, nesting a thousand deep
            raise DataError(f"{where}: field '{mapping.choices}' is not a JSON list ({parse_error_reason(e)})") from None
    if not isinstance(choices, list):
        raise DataError(f"{where}: field '{mapping.choices}' must be a list")
    from rlpr.data.templates import format_choices

    text = format_choices(question, [str(c) for c in choices]) if choices else question
    return Example(
        prompt=build_messages(text, template, multiple_choice=bool(choices)),
        reference=answer,
        # a column some rows lack reads as None from parquet and datasets: not an id
        uid=str(next((row[k] for k in ("id", "idx") if row.get(k) is not None), index)),
        data_source=source,
        acceptable=acceptable,
        choices=[str(c) for c in choices],
        score_a=_score_a(row, where),
        extra_info={mapping.solution: solution_text(row.get(mapping.solution), where, mapping.solution)}
        if mapping.solution else {},
    )


def load_examples(path: str | Path, template: str = "r1", mapping: ColumnMapping | None = None,
                  default_split: str | None = None) -> list[Example]:
    """Load a data source as Examples. verl rows keep their own prompt; flat rows get `template`.
    `default_split`: the split of a folder with several that names none (see `read_tables`)."""
    tables = read_tables(path, default_split)
    if not any(table.rows for table in tables):
        raise DataError(f"{path}: no rows")
    return examples_from_tables(tables, template, mapping or ColumnMapping(), parse_source(path).stem)


def examples_from_tables(tables: list[Table], template: str, mapping: ColumnMapping, source: str) -> list[Example]:
    """Rows as Examples, each error naming its table and row; `source`: the data_source of flat rows."""
    out = []
    for table in tables:
        for i, row in enumerate(table.rows):
            where = f"{table.where}: row {i + 1}"
            index = len(out)
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected an object with named fields")
            check_text(row, where)  # a lone surrogate (a .json's "\ud800"): not text
            if "reward_model" in row or ("prompt" in row and mapping.question not in row):
                out.append(_from_verl(row, where, index, mapping.solution))
            else:
                out.append(_from_flat(row, where, index, mapping, template, source))
    return out
