"""The chat-completions wire format of `rlpr serve`: a request body checked and turned into
generation arguments, and a completion turned into the standard response object. It is kept apart
from the HTTP code because it is pure logic (no socket, no model; only the response's id and
timestamp read the outside world): every malformed body (wrong types, a lone surrogate, numbers out
of range) becomes a RequestError, answered 400, and can be tested without a server.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass

from rlpr.config.ranges import temperature_problem

MAX_SEED = 2**63 - 1


class RequestError(ValueError):
    """A malformed request: answered with HTTP 400 and this message."""


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"


def parse_chat_request(body: dict) -> dict:
    """Validated generation arguments from a chat-completions body (RequestError if malformed)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RequestError(f"'messages[{i}]' must have string 'role' and 'content'")
        _check_text(m["role"], f"messages[{i}].role")
        _check_text(m["content"], f"messages[{i}].content")
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported")
    if body.get("stream"):
        raise RequestError("streaming is not supported")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
        raise RequestError("'stop' must be a string or a list of at most 4 strings")
    for s in stop:
        _check_text(s, "stop")
    try:
        temperature = _number(body, "temperature", 1.0)
        top_p = _number(body, "top_p", 1.0)
        max_tokens = _integer(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens")
        seed = _integer(body, "seed")
    except (TypeError, ValueError, OverflowError):
        raise RequestError("temperature/top_p must be finite numbers, max_tokens/seed integers") from None
    if temperature < 0 or not 0 < top_p <= 1 or (max_tokens is not None and max_tokens < 1):
        raise RequestError("need temperature >= 0, 0 < top_p <= 1, max_tokens >= 1")
    problem = temperature_problem(temperature, "greedy decoding")  # logits / T overflow: was a 500
    if problem:
        raise RequestError(f"'temperature' {problem}")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise RequestError(f"'seed' must be in [0, {MAX_SEED}]")
    return dict(messages=[{"role": m["role"], "content": m["content"]} for m in messages],
                temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
                stop=[str(s) for s in stop])


def _check_text(value: str, where: str) -> None:
    """JSON can spell a lone surrogate ("\\ud800"), which no tokenizer can encode: a 400, not a 500."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise RequestError(f"'{where}' is not valid Unicode text (it has a lone surrogate)") from None


def _number(body: dict, key: str, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(key)
    return float(value)


def _integer(body: dict, key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or int(value) != value:
        raise ValueError(key)
    return int(value)


def completion_json(c: Completion, model_name: str) -> dict:
    """The standard chat.completion response object."""
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model_name,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": c.text},
                     "finish_reason": c.finish_reason}],
        "usage": {"prompt_tokens": c.prompt_tokens, "completion_tokens": c.completion_tokens,
                  "total_tokens": c.prompt_tokens + c.completion_tokens},
    }
