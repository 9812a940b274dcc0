"""`rlpr score`: probability rewards for a JSONL file of (prompt, response, reference) rows.

All rows are validated before any model work, so a malformed file fails in a second with a
one-line error naming the row and the field; the output is written to a temporary file and renamed
at the end, so an interrupted run never leaves a half-written output.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from rlpr.config import Config
from rlpr.data.loading import check_messages, iter_jsonl
from rlpr.errors import DataError, atomic_output, json_safe, temporary_name
from rlpr.data.templates import build_messages
from rlpr.data.prompts import chat_text
from rlpr.train.progress import progress_bar

MAX_FIELD_CHARS = 1_000_000


def _check_text(row: dict, key: str, where: str, allow_empty: bool = False) -> str:
    if key not in row:
        raise DataError(f"{where}: field '{key}' is missing")
    value = row[key]
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type(value).__name__}")
    if not allow_empty and not value.strip():
        raise DataError(f"{where}: field '{key}' is empty")
    if len(value) > MAX_FIELD_CHARS:
        raise DataError(f"{where}: field '{key}' is too long ({len(value)} characters)")
    return value


def messages_of(row: dict, where: str, template: str) -> list[dict]:
    """A row's `prompt` as chat messages: a string question gets `template`."""
    prompt = row.get("prompt")
    if prompt is None:
        raise DataError(f"{where}: field 'prompt' is missing")
    if isinstance(prompt, str):
        _check_text(row, "prompt", where)
        return build_messages(prompt, template)
    if not isinstance(prompt, list) or not prompt:
        raise DataError(f"{where}: field 'prompt' must be a string or a non-empty list of chat messages")
    for j, m in enumerate(prompt):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: field 'prompt[{j}]' must be an object with string 'role' and 'content'")
    check_messages(prompt, where)  # known roles (no "robot"), ending with the user's turn
    return [{"role": m["role"], "content": m["content"]} for m in prompt]


def check_response_and_reference(row: dict, where: str) -> None:
    _check_text(row, "response", where, allow_empty=True)
    _check_text(row, "reference", where)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def read_score_rows(path: Path, template: str) -> list[tuple[dict, list[dict]]]:
    """(row, chat messages) per line, validated; raises DataError naming the row and field."""
    rows = []
    for where, row in iter_jsonl(path):
        messages = messages_of(row, where, template)
        check_response_and_reference(row, where)
        for key in ("score_a", "scoreA"):  # JSON readers take NaN and Infinity: refused here
            if key in row and not _finite(row[key]):
                raise DataError(f"{where}: field '{key}' must be a finite number, got {row[key]!r}")
        rows.append((row, messages))
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


def _verdicts(batch: list[tuple[dict, list[dict]]]) -> list[bool]:
    """The eval grader's verdict per row, for reward kinds that read it (verifier, hybrid): the
    grader of the row's data_source (short answer when it has none), read against the last user
    turn as the question."""
    from rlpr.grading import grade, grader_for

    verdicts = []
    for row, messages in batch:
        name = grader_for(str(row.get("data_source") or ""), str(row.get("ability") or ""))
        question = next((m["content"] for m in reversed(messages) if m["role"] == "user"), None)
        verdicts.append(grade(name, row["response"], row["reference"].strip(), question=question).correct)
    return verdicts


def score_file(cfg: Config, input_path: str, output_path: str, *, template: str = "plain",
               batch_rows: int = 32, model=None, tokenizer=None) -> int:
    """Score every row of `input_path` into `output_path`; returns the number of rows."""
    from rlpr.parallel.distributed import resolve_device
    from rlpr.model.loading import load_model
    from rlpr.reward.probability_reward import ProbabilityReward

    rows = read_score_rows(Path(input_path), template)
    out_path = Path(output_path)
    tmp = temporary_name(out_path)
    try:  # before the model loads: an unwritable output fails at once, in one line
        out_path.parent.mkdir(parents=True, exist_ok=True)
        tmp.touch()
        tmp.unlink()  # a probe: atomic_output writes it
    except OSError as e:
        raise DataError(f"{out_path}: cannot write the output ({e.strerror or e})") from None
    if model is None:
        model, tokenizer = load_model(cfg.model.path, device=resolve_device(cfg.model.device))
    max_length = getattr(model.config, "max_position_embeddings", None)
    reward = ProbabilityReward(cfg.reward, tokenizer, cfg.rollout.temperature, max_length)
    reward.warned_too_long = True  # the count is printed at the end instead
    with atomic_output(out_path) as f:  # a disk that fills up midway: no partial output, one line naming it
        too_long = _score_rows(rows, f, batch_rows, model, tokenizer, reward)
    print(f"scored {len(rows)} rows -> {out_path}", file=sys.stderr)
    if too_long:
        print(f"warning: {too_long} row(s) longer than the model's context ({max_length} tokens) were not scored: "
              f"too_long=true, score_b/delta/reward=null", file=sys.stderr)
    return len(rows)


def _score_rows(rows, f, batch_rows, model, tokenizer, reward) -> int:
    """Score every row into the open file `f`, a JSON line each; returns how many were too long to
    score."""
    too_long = 0
    with progress_bar(len(rows), "scoring") as advance:
        for start in range(0, len(rows), batch_rows):
            batch = rows[start:start + batch_rows]
            prompts = [chat_text(tokenizer, m) for _, m in batch]
            responses = [r["response"] for r, _ in batch]
            references = [r["reference"].strip() for r, _ in batch]
            given_a = [r.get("score_a", r.get("scoreA")) for r, _ in batch]
            verdicts = _verdicts(batch) if reward.kind.needs_grader else None
            outputs = reward(model, prompts, responses, references, precomputed_a=given_a, correct=verdicts)
            for (row, _), p, resp, ref, o in zip(batch, prompts, responses, references, outputs):
                record = dict(row)
                item = reward.score_b_text(p, resp, ref)
                record.update({
                    "valid": o.valid, "format": o.format, "score_b": o.score_b, "score_a": o.score_a,
                    "reward": o.reward, "fallback": o.fallback, "delta": o.delta,
                    "ref_tokens": reward.reference_tokens(item), "too_long": False,
                })
                if o.too_long:  # never a silent 0: the row could not be scored at all
                    record.update(score_b=None, delta=None, reward=None, too_long=True)
                    too_long += 1
                f.write(json.dumps(json_safe(record), ensure_ascii=False, allow_nan=False) + "\n")
            advance(len(batch))
    return too_long
