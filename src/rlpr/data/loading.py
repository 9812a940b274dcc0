"""Read training/evaluation data into `Example`s.

Two shapes are accepted: the verl/RLPR parquet layout unchanged (also as JSONL/JSON rows with the
same fields), and flat question/answer tables (JSONL/JSON/CSV/parquet) with a column mapping.
Every user mistake becomes a one-line `DataError` naming the file, row and field.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

from rlpr.data.records import Example
from rlpr.data.templates import build_messages
from rlpr.errors import DataError


@dataclass
class ColumnMapping:
    """Which fields of a flat table hold the question, the answer and (optional) the options."""

    question: str = "question"
    answer: str = "answer"
    choices: str = "choices"


def iter_jsonl(path: str | Path):
    """(where, row) per non-blank line of a JSONL file, `where` = "FILE: row N" (N = line
    number); a line that is not a JSON object raises a one-line DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            where = f"{path}: row {n}"
            try:
                line = raw.decode("utf-8-sig" if n == 1 else "utf-8")  # a BOM (Windows editors) is not data
            except UnicodeDecodeError as e:
                raise DataError(f"{where}: not valid UTF-8 (byte {e.start + 1} of the line)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
            if not isinstance(row, dict):
                raise DataError(f"{where}: expected a JSON object")
            yield where, row


def read_rows(path: str | Path) -> list[dict]:
    """Raw rows of a .parquet, .jsonl, .json or .csv file."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: file not found")
    suffix = path.suffix.lower()
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            return pq.read_table(path).to_pylist()
        if suffix == ".jsonl":
            return [row for _, row in iter_jsonl(path)]
        if suffix == ".json":
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, dict):  # {"examples": [...]} or {"data": [...]}
                lists = [v for v in data.values() if isinstance(v, list)]
                if len(lists) != 1:
                    raise DataError(f"{path}: expected a list of rows or an object with one list")
                data = lists[0]
            if not isinstance(data, list):
                raise DataError(f"{path}: expected a list of rows")
            return data
        if suffix == ".csv":
            with open(path, encoding="utf-8", newline="") as f:
                return list(csv.DictReader(f))
    except DataError:
        raise
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read ({type(e).__name__}: {e})") from None
    raise DataError(f"{path}: unsupported file type {suffix!r} (use .parquet, .jsonl, .json or .csv)")


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
        if isinstance(v, bool) or not isinstance(v, (str, int, float)):
            raise DataError(f"{where}: field '{name}' must be a string or a number, got {type(v).__name__}")
        if isinstance(v, float) and not math.isfinite(v):
            raise DataError(f"{where}: field '{name}' is not a finite number ({v})")
        text = str(v).strip()
        if not text:
            raise DataError(f"{where}: field '{name}' is empty")
        out.append(text)
    return out


def _check_messages(prompt, where: str) -> list[dict]:
    if isinstance(prompt, str):
        prompt = [{"role": "user", "content": prompt}]
    if not isinstance(prompt, list) or not prompt:
        raise DataError(f"{where}: field 'prompt' must be a non-empty list of chat messages")
    for j, m in enumerate(prompt):
        if not isinstance(m, dict) or "role" not in m or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: field 'prompt[{j}]' must have 'role' and string 'content'")
        if m["role"] not in ROLES:
            raise DataError(f"{where}: field 'prompt[{j}].role' is {m['role']!r}; expected one of {', '.join(ROLES)}")
    return prompt


def _from_verl(row: dict, where: str, index: int) -> Example:
    prompt = _check_messages(row.get("prompt"), where)
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
        except json.JSONDecodeError:
            raise DataError(f"{where}: field '{mapping.choices}' is not a JSON list") from None
    if not isinstance(choices, list):
        raise DataError(f"{where}: field '{mapping.choices}' must be a list")
    from rlpr.data.templates import format_choices

    text = format_choices(question, [str(c) for c in choices]) if choices else question
    return Example(
        prompt=build_messages(text, template, multiple_choice=bool(choices)),
        reference=answer,
        uid=str(row.get("id", row.get("idx", index))),
        data_source=source,
        acceptable=acceptable,
        choices=[str(c) for c in choices],
        score_a=_score_a(row, where),
    )


def load_examples(path: str | Path, template: str = "r1",
                  mapping: ColumnMapping | None = None) -> list[Example]:
    """Load a data file as Examples. verl rows keep their own prompt; flat rows get `template`."""
    path = Path(path)
    rows = read_rows(path)
    if not rows:
        raise DataError(f"{path}: no rows")
    mapping = mapping or ColumnMapping()
    out = []
    for i, row in enumerate(rows):
        where = f"{path}: row {i + 1}"
        if not isinstance(row, dict):
            raise DataError(f"{where}: expected an object with named fields")
        if "reward_model" in row or ("prompt" in row and mapping.question not in row):
            out.append(_from_verl(row, where, i))
        else:
            out.append(_from_flat(row, where, i, mapping, template, path.stem))
    return out
