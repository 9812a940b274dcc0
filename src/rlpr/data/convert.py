"""Turn public benchmark files into the verl/RLPR parquet layout.

Each benchmark ships its own shape (a "#### N" solution, a \\boxed{} answer, lettered options, a
list of acceptable answers); one small function per format maps a row to an `Example`, and the
result is written so that `load_examples` reads it back unchanged.
"""

from __future__ import annotations

import ast
import glob
import logging
import os
import random
import re
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rlpr.data.loading import ColumnMapping, _from_flat
from rlpr.data.records import DataError, Example
from rlpr.errors import normal_modes, owned_temporary_prefix, remove_leftovers
from rlpr.data.sources import parse_source, read_rows
from rlpr.data.templates import LETTERS, build_messages, format_choices

log = logging.getLogger(__name__)

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BBH_LETTER = re.compile(r"\(([A-Z])\)")
_BBH_OPTION = re.compile(r"^\([A-Z]\) (.*)$", re.M)
_UID_KEYS = ("id", "idx", "unique_id", "question_id", "Record ID")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...} or \\fbox{...}, matching braces (answers nest them)."""
    starts = list(_BOXED.finditer(text))
    if not starts:
        return None
    begin = i = starts[-1].end()
    depth = 1
    while i < len(text):
        if text[i] == "\\":  # \{ and \} are literal braces, not grouping
            i += 2
            continue
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[begin:i]
        i += 1
    return None


@dataclass
class _Row:
    """One input row plus what a converter needs to render it and to name it in errors."""

    data: dict
    where: str
    index: int
    template: str
    mapping: ColumnMapping
    source: str

    def error(self, key: str, problem: str) -> DataError:
        return DataError(f"{self.where}: field '{key}' {problem}")

    def text(self, *keys: str) -> str:
        """The first of `keys` present (dumps disagree: problem or question), non-empty."""
        key = next((k for k in keys if k in self.data), None)
        if key is None:
            raise self.error(keys[0], "is missing")
        value = self.data[key]
        if not isinstance(value, str) or not value.strip():
            raise self.error(key, "must be a non-empty string")
        return value

    def scalar(self, key: str) -> str:
        """A short answer as a string; AMC stores 27.0 for 27, which no grader should see."""
        value = self.data.get(key)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
            raise self.error(key, f"must be a non-empty answer, got {value!r}")
        return str(value).strip()

    def boxed(self, key: str) -> str:
        answer = last_boxed(self.text(key))
        if not answer or not answer.strip():
            raise self.error(key, "has no non-empty \\boxed{...} answer")
        return answer.strip()

    def options(self, key: str) -> list[str]:
        value = self.data.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(o, str) for o in value):
            raise self.error(key, "must be a non-empty list of option strings")
        if len(value) > len(LETTERS):
            raise self.error(key, f"has {len(value)} options; at most {len(LETTERS)}")
        return value

    def letter(self, key: str, n_options: int) -> str:
        """The correct option as a letter; HF dumps of MMLU store its index instead."""
        value = self.data.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n_options:
            return LETTERS[value]
        if isinstance(value, str) and value.strip() in LETTERS[:n_options]:
            return value.strip()
        raise self.error(key, f"must be one of {LETTERS[0]}-{LETTERS[n_options - 1]}, got {value!r}")

    def meta(self, key: str) -> str:
        """Metadata as a string, "" when absent: every row of a format gets the same keys and
        types, which pyarrow needs to write the extra_info struct."""
        value = self.data.get(key)
        return "" if value is None else str(value)

    def example(self, question: str, reference: str, *, choices: Sequence[str] = (),
                acceptable: Sequence[str] = (), mc: bool = False, **extra: str) -> Example:
        return Example(
            prompt=build_messages(question, self.template, multiple_choice=mc),
            reference=reference,
            choices=list(choices),
            acceptable=list(acceptable),
            extra_info=extra,
        )


def _gsm8k(r: _Row) -> Example:
    """GSM8K's answer is a worked solution ending in "#### N": N is the reference, and the solution
    (its calculator annotations <<48/2=24>> taken out, the "#### N" line as "Answer: N") is kept as the
    row's `solution` for OPSD's teacher (opsd.context=solution)."""
    worked, sep, final = r.text("answer").rpartition("####")
    reference = final.strip().replace(",", "")
    if not sep or not reference:
        raise r.error("answer", "has no final '#### <number>' line")
    solution = re.sub(r"<<[^<>]*>>", "", worked).strip()
    return r.example(r.text("question"), reference, solution=f"{solution}\nAnswer: {reference}")


def _math(r: _Row) -> Example:
    """MATH-style rows; the original release has only a solution, later dumps an answer field."""
    reference = r.scalar("answer") if "answer" in r.data else r.boxed("solution")
    return r.example(r.text("problem", "question"), reference,
                     subject=r.meta("subject"), level=r.meta("level"))


def _minerva(r: _Row) -> Example:
    return r.example(r.text("problem"), r.boxed("solution"), type=r.meta("type"))


def _aime(r: _Row) -> Example:
    """AIME and AMC: a problem and a short numeric answer."""
    return r.example(r.text("problem", "question"), r.scalar("answer"))


def _mmlu(r: _Row) -> Example:
    choices = r.options("choices")
    return r.example(format_choices(r.text("question"), choices), r.letter("answer", len(choices)),
                     choices=choices, mc=True, subject=r.meta("subject"))


def _mmlu_pro(r: _Row) -> Example:
    options = r.options("options")
    return r.example(format_choices(r.text("question"), options), r.letter("answer", len(options)),
                     choices=options, mc=True, category=r.meta("category"))


def _bbh(r: _Row) -> Example:
    """The input already lists "(A) ..." options; a "(B)" target is graded as the letter B."""
    question, target = r.text("input"), r.text("target").strip()
    task = r.source.removeprefix("bbh/")
    letter = _BBH_LETTER.fullmatch(target)
    if not letter:  # free-form targets (Yes, valid, 24, sorted words)
        return r.example(question, target, task=task)
    choices = _BBH_OPTION.findall(question)
    if LETTERS.index(letter.group(1)) >= len(choices):
        raise r.error("target", f"is {target} but 'input' lists {len(choices)} options")
    return r.example(question, letter.group(1), choices=choices, mc=True, task=task)


def _nq_open(r: _Row) -> Example:
    answers = r.data.get("answer")
    if not isinstance(answers, list) or not answers or not all(
            isinstance(a, str) and a.strip() for a in answers):
        raise r.error("answer", "must be a non-empty list of answer strings")
    return r.example(r.text("question"), answers[0].strip(), acceptable=answers)


class SkipRow(Exception):
    """A converter skips this row (e.g. a TheoremQA question that needs its picture); the
    message is the reason, counted per reason by `convert_rows`."""


def _theoremqa_answer(r: _Row) -> str:
    """TheoremQA's Answer as the text graders read, keeping its JSON type (issue 34): True/False,
    an integer "6", a float "3.14159" / "1.0" / "-6e+25" (a whole float stays a float, so the
    grader applies 4%, not the integer rule), a list "[1, 2]" / "[0.5, 1.0]" or an option "(a)"."""
    value = r.data.get("Answer")
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, (list, tuple)):
        if not value or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
            raise r.error("Answer", f"must be a list of numbers, got {value!r}")
        return "[" + ", ".join(repr(v) for v in value) + "]"
    if isinstance(value, float):  # a float stays a float ("1.0", "-6e+25"): 4%, not round()
        return repr(value)
    return r.scalar("Answer")


def _theoremqa(r: _Row) -> Example:
    """TheoremQA (TIGER-AI-Lab/TheoremQA): Question, Answer, Answer_type (bool, integer, float,
    list of integer, list of float, option); questions with a Picture are skipped (text-only
    evaluation, as RLPR's 747 questions)."""
    if r.data.get("Picture"):
        raise SkipRow("picture question")
    answer_type = r.meta("Answer_type")
    if not answer_type:
        raise r.error("Answer_type", "is missing")
    return r.example(r.text("Question", "question"), _theoremqa_answer(r), answer_type=answer_type,
                     field=r.meta("field"), subfield=r.meta("subfield"))


GPQA_SHUFFLE_SEED = 0


def _gpqa(r: _Row) -> Example:
    """GPQA (idavidrein/gpqa CSV): the correct answer is always listed first in the file, so the
    four options are shuffled with a fixed per-row seed (stored in extra_info with the order)."""
    question = r.text("Question").strip()
    original = [r.text("Correct Answer").strip()] + [
        r.text(f"Incorrect Answer {i}").strip() for i in (1, 2, 3)]
    row_key = r.meta("Record ID") or str(r.index)
    order = list(range(4))
    random.Random(f"gpqa:{GPQA_SHUFFLE_SEED}:{row_key}").shuffle(order)
    options = [original[i] for i in order]
    return r.example(format_choices(question, options), LETTERS[order.index(0)], choices=options,
                     mc=True, shuffle_seed=str(GPQA_SHUFFLE_SEED),
                     option_order=",".join(map(str, order)),
                     domain=r.meta("High-level domain"), subdomain=r.meta("Subdomain"))


def _arc(r: _Row) -> Example:
    """ARC (AI2 JSONL): question.stem, question.choices [{label, text}], answerKey; 3-5 options,
    labels A-E or 1-5 (re-lettered A-E)."""
    q = r.data.get("question")
    if not isinstance(q, dict):
        raise r.error("question", "must be an object with 'stem' and 'choices'")
    stem, choices = q.get("stem"), q.get("choices")
    if not isinstance(stem, str) or not stem.strip():
        raise r.error("question.stem", "must be a non-empty string")
    if not isinstance(choices, list) or not 3 <= len(choices) <= 5 or not all(
            isinstance(c, dict) and isinstance(c.get("text"), str) and "label" in c for c in choices):
        raise r.error("question.choices", "must list 3-5 options, each with 'label' and 'text'")
    labels = [str(c["label"]).strip() for c in choices]
    key = str(r.data.get("answerKey", "")).strip()
    if key not in labels:
        raise r.error("answerKey", f"must be one of {', '.join(labels)}, got {key!r}")
    options = [c["text"].strip() for c in choices]
    return r.example(format_choices(stem.strip(), options), LETTERS[labels.index(key)],
                     choices=options, mc=True)


def _simpleqa(r: _Row) -> Example:
    """SimpleQA (openai/simple-evals simple_qa_test_set.csv): problem, answer, metadata (a
    Python dict literal with topic and answer_type)."""
    meta = r.data.get("metadata")
    if isinstance(meta, str):
        try:
            meta = ast.literal_eval(meta)
        except (ValueError, SyntaxError):
            meta = {}
    meta = meta if isinstance(meta, dict) else {}
    return r.example(r.text("problem"), r.text("answer").strip(),
                     topic=str(meta.get("topic") or ""), answer_type=str(meta.get("answer_type") or ""))


def _jsonl(r: _Row) -> Example:
    """Flat rows are read exactly as `load_examples` reads them, so both paths agree."""
    return _from_flat(r.data, r.where, r.index, r.mapping, r.template, r.source)


_CONVERTERS: dict[str, tuple[Callable[[_Row], Example], str]] = {
    "gsm8k": (_gsm8k, "math"),
    "math": (_math, "math"),
    "minerva": (_minerva, "math"),
    "aime": (_aime, "math"),
    "mmlu": (_mmlu, "general"),
    "mmlu_pro": (_mmlu_pro, "general"),
    "bbh": (_bbh, "general"),
    "nq_open": (_nq_open, "general"),
    "theoremqa": (_theoremqa, "math"),
    "gpqa": (_gpqa, "general"),
    "arc": (_arc, "general"),
    "simpleqa": (_simpleqa, "general"),
    "jsonl": (_jsonl, "general"),
}
FORMATS = tuple(_CONVERTERS)


def _converter(fmt: str) -> tuple[Callable[[_Row], Example], str]:
    if fmt not in _CONVERTERS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return _CONVERTERS[fmt]


def _uid(row: dict, index: int) -> str:
    return str(next((row[k] for k in _UID_KEYS if row.get(k) is not None), index))


def convert_rows(fmt: str, rows: list[dict], *, source: str, template: str = "r1",
                 mapping: ColumnMapping | None = None, path: str | None = None,
                 skipped: dict[str, int] | None = None) -> list[Example]:
    """One Example per row; `path` (else `source`) names the input in error messages. Rows a
    converter skips are counted per reason in `skipped` (when given)."""
    convert, ability = _converter(fmt)
    mapping = mapping or ColumnMapping()
    examples = []
    for i, data in enumerate(rows):
        where = f"{path or source}: row {i + 1}"
        if not isinstance(data, dict):
            raise DataError(f"{where}: expected an object with named fields")
        try:
            example = convert(_Row(data, where, i, template, mapping, source))
        except SkipRow as skip:
            if skipped is not None:
                skipped[str(skip)] = skipped.get(str(skip), 0) + 1
            continue
        example.uid, example.data_source, example.ability = _uid(data, i), source, ability
        examples.append(example)
    return examples


def _write_parquet(rows: list[dict], path: Path) -> None:
    """Write via a temp file and os.replace so a crash never leaves a half-written output.

    Columns are the union over all rows: `pa.Table.from_pylist` takes them from the first row only
    and would silently drop e.g. a `score_a` that the first row lacks.
    """
    columns = dict.fromkeys(key for row in rows for key in row)
    table = pa.table({key: [row.get(key) for row in rows] for key in columns})
    path.parent.mkdir(parents=True, exist_ok=True)
    # a killed convert's temporary is removed by the next one (issue 60, S16: nothing removed it)
    remove_leftovers(path.parent, f".{glob.escape(path.name)}.tmp-*", "data convert", log, owned_only=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=owned_temporary_prefix(path.name))
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        normal_modes(tmp)  # mkstemp's 0600: the mode a plain write gets under the umask
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def read_input_rows(path: str | Path) -> list[dict]:
    """The rows of a benchmark file (compressed too: "x.csv.gz" is the CSV inside it) or folder."""
    return read_rows(path)


def _input_stem(path: Path) -> str:
    return parse_source(path).stem


def convert_file(fmt: str, input_path: str | Path, output_path: str | Path, *, template: str = "r1",
                 mapping: ColumnMapping | None = None, limit: int | None = None,
                 source: str | None = None, skipped: dict[str, int] | None = None) -> int:
    """Convert one file (optionally gzipped) to verl parquet; returns the number of rows written.

    `source` (the data_source, which picks the grader and its rule) defaults to the format name,
    or "bbh/<task>" from a BBH file name. Skipped rows are counted per reason in `skipped`.
    """
    _converter(fmt)  # a typo fails before any reading
    skipped = {} if skipped is None else skipped
    input_path, output_path = Path(input_path), Path(output_path)
    if output_path.suffix.lower() != ".parquet":
        raise ValueError(f"{output_path}: the output is parquet; name it *.parquet")
    rows = read_input_rows(input_path)[:limit]
    if not rows:
        raise DataError(f"{input_path}: no rows")
    source = source or (f"bbh/{_input_stem(input_path)}" if fmt == "bbh" else fmt)
    examples = convert_rows(fmt, rows, source=source, template=template, mapping=mapping,
                            path=str(input_path), skipped=skipped)
    if not examples:
        reasons = ", ".join(f"{n} {reason}" for reason, n in skipped.items())
        raise DataError(f"{input_path}: every row was skipped ({reasons})")
    _write_parquet([e.to_verl_row() for e in examples], output_path)
    return len(examples)
