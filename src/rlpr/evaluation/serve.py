"""`rlpr serve`: a small OpenAI-compatible chat-completions server for a policy.

It lets any OpenAI client (or `rlpr eval --judge-url`) talk to a local or trained model, and its
fault modes (slow, error, flaky) let tests exercise a judge client's timeouts and retries against a
real HTTP server. Requests are handled in threads but generation is serialized by a lock: one CPU
model cannot usefully run two generations at once. Request headers are never logged.

Hardening (issue 16): prompts longer than `max_prompt_tokens` are refused before they can hold
the generation lock; an optional API key (`--api-key-env NAME`: the key is read from that
environment variable, compared in constant time, never logged) answers 401 without it; every
malformed request gets a 4xx JSON error (bad Content-Length, bodies over 10 MB, bodies that
never arrive: a read timeout per connection, out-of-range numbers); the server stays up.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import os
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from rlpr.data.prompts import chat_text
from rlpr.config import Config

log = logging.getLogger(__name__)

FAULT_MODES = ("none", "slow", "error", "flaky")
MAX_BODY_BYTES = 10_000_000
READ_TIMEOUT_S = 30.0  # a connection that sends nothing for this long is answered 408 and closed
MAX_SEED = 2**63 - 1


class RequestError(ValueError):
    """A malformed request: answered with HTTP 400 and this message."""


@dataclass
class Completion:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"


class ChatGenerator:
    """Chat messages -> one completion, with the request's sampling settings: by the model's own
    `generate`, or by a rollout engine (`engine`, e.g. rollout.engine=vllm) when one is given."""

    def __init__(self, model, tokenizer, max_new_tokens: int = 256, max_prompt_tokens: int | None = None,
                 engine=None):
        self.model = model
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_new_tokens = max_new_tokens
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        # default: what fits in the model's context beside the longest completion
        self.max_prompt_tokens = max_prompt_tokens or (context - max_new_tokens if context else None)
        self.lock = threading.Lock()

    @torch.no_grad()
    def __call__(self, messages: list[dict], *, temperature: float = 1.0, top_p: float = 1.0,
                 max_tokens: int | None = None, seed: int | None = None,
                 stop: list[str] | None = None) -> Completion:
        from transformers import GenerationConfig

        tok = self.tokenizer
        text = chat_text(tok, messages)
        ids = tok(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        if self.max_prompt_tokens and ids.shape[1] > self.max_prompt_tokens:
            raise RequestError(f"the prompt has {ids.shape[1]} tokens; this server accepts at most "
                               f"{self.max_prompt_tokens}")
        limit = min(max_tokens or self.max_new_tokens, self.max_new_tokens)
        sampling = dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0) if temperature > 0 \
            else dict(do_sample=False)
        config = GenerationConfig(max_new_tokens=limit, eos_token_id=tok.eos_token_id,
                                  pad_token_id=tok.pad_token_id, **sampling)
        with self.lock:
            if self.engine is not None:
                seed = seed if seed is not None else int(torch.randint(0, 2**62, ()).item())
                tokens = self.engine.generate([ids[0].tolist()], 1, max_new_tokens=limit, temperature=temperature,
                                              top_p=top_p, seeds=[seed])[0].token_ids
            else:
                if seed is not None:
                    torch.manual_seed(seed)
                ids = ids.to(self.model.device)
                out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                          generation_config=config)
                tokens = out[0, ids.shape[1]:].tolist()
        finish = "length"
        if tok.eos_token_id in tokens:
            tokens, finish = tokens[:tokens.index(tok.eos_token_id)], "stop"
        content = tok.decode(tokens, skip_special_tokens=True)
        for s in stop or []:
            if s and s in content:
                content, finish = content[:content.index(s)], "stop"
        return Completion(content, ids.shape[1], len(tokens), finish)


def parse_chat_request(body: dict) -> dict:
    """Validated generation arguments from a chat-completions body (RequestError if malformed)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise RequestError(f"'messages[{i}]' must have string 'role' and 'content'")
    if body.get("n", 1) != 1:
        raise RequestError("only n=1 is supported")
    if body.get("stream"):
        raise RequestError("streaming is not supported")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) for s in stop):
        raise RequestError("'stop' must be a string or a list of at most 4 strings")
    try:
        temperature = _number(body, "temperature", 1.0)
        top_p = _number(body, "top_p", 1.0)
        max_tokens = _integer(body, "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens")
        seed = _integer(body, "seed")
    except (TypeError, ValueError, OverflowError):
        raise RequestError("temperature/top_p must be finite numbers, max_tokens/seed integers") from None
    if temperature < 0 or not 0 < top_p <= 1 or (max_tokens is not None and max_tokens < 1):
        raise RequestError("need temperature >= 0, 0 < top_p <= 1, max_tokens >= 1")
    if seed is not None and not 0 <= seed <= MAX_SEED:
        raise RequestError(f"'seed' must be in [0, {MAX_SEED}]")
    return dict(messages=[{"role": m["role"], "content": m["content"]} for m in messages],
                temperature=temperature, top_p=top_p, max_tokens=max_tokens, seed=seed,
                stop=[str(s) for s in stop])


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


class Faults:
    """Injected failures for tests: slow (sleep first), error (always 500), flaky (every other
    request, the first included, is a 500)."""

    def __init__(self, mode: str = "none", delay: float = 2.0):
        if mode not in FAULT_MODES:
            raise ValueError(f"--fault-mode must be one of {', '.join(FAULT_MODES)}, got {mode!r}")
        self.mode, self.delay = mode, delay
        self._count = 0
        self._lock = threading.Lock()

    def fail_now(self) -> bool:
        """Called once per chat request, before generation: True -> answer 500."""
        if self.mode == "slow":
            time.sleep(self.delay)  # outside the generation lock: slow requests overlap
        if self.mode == "error":
            return True
        if self.mode == "flaky":
            with self._lock:
                self._count += 1
                return self._count % 2 == 1
        return False


def make_handler(generator: ChatGenerator, model_name: str, faults: Faults, api_key: str | None = None,
                 read_timeout: float = READ_TIMEOUT_S):
    expected = f"Bearer {api_key}".encode() if api_key else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = read_timeout  # per socket operation: a body that never arrives ends in 408

        def _authorized(self) -> bool:
            if expected is None:
                return True
            given = (self.headers.get("Authorization") or "").encode()
            if hmac.compare_digest(given, expected):
                return True
            self.close_connection = True
            self._error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error")
            return False

        def log_message(self, fmt, *args):  # the request line only, at debug level
            log.debug("%s %s", self.address_string(), fmt % args)

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (timeout)
                self.close_connection = True

        def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
            self._send(status, {"error": {"message": message, "type": kind}})

        def do_GET(self):
            path = self.path.split("?")[0].rstrip("/")
            if path != "/health" and not self._authorized():
                return
            if path == "/health":
                self._send(200, {"status": "ok"})
            elif path == "/v1/models":
                self._send(200, {"object": "list", "data": [
                    {"id": model_name, "object": "model", "created": 0, "owned_by": "rlpr"}]})
            else:
                self._error(404, f"no route GET {path}")

        def do_POST(self):
            path = self.path.split("?")[0].rstrip("/")
            header = (self.headers.get("Content-Length") or "0").strip()
            if not header.isdigit():  # "abc", "-5": the body's end is unknown, so close after answering
                self.close_connection = True
                return self._error(400, "Content-Length must be a non-negative integer")
            length = int(header)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                return self._error(413, "request body too large")
            try:
                raw = self.rfile.read(length) if length else b""
            except TimeoutError:
                self.close_connection = True
                return self._error(408, f"the body did not arrive within {read_timeout:g} s")
            if len(raw) < length:  # the client closed before sending its whole body
                self.close_connection = True
                return self._error(400, "the body is shorter than its Content-Length")
            if not self._authorized():
                return
            if path != "/v1/chat/completions":
                return self._error(404, f"no route POST {path}")
            try:
                body = json.loads(raw or b"null")
                if not isinstance(body, dict):
                    raise RequestError("the body must be a JSON object")
                request = parse_chat_request(body)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return self._error(400, "the body is not valid JSON")
            except RequestError as e:
                return self._error(400, str(e))
            if faults.fail_now():
                return self._error(500, f"injected fault ({faults.mode})", "server_error")
            try:
                completion = generator(**request)
            except RequestError as e:  # e.g. a prompt longer than the server accepts
                return self._error(400, str(e))
            except Exception as e:  # a generation bug answers 500, it never kills the server
                log.exception("generation failed")
                return self._error(500, f"generation failed: {type(e).__name__}", "server_error")
            self._send(200, completion_json(completion, model_name))

    return Handler


def make_server(generator: ChatGenerator, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                faults: Faults | None = None, api_key: str | None = None,
                read_timeout: float = READ_TIMEOUT_S) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), make_handler(generator, model_name, faults or Faults(), api_key,
                                                            read_timeout))
    server.daemon_threads = True
    return server


def serve(cfg: Config, checkpoint: str | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          fault_mode: str = "none", fault_delay: float = 2.0, name: str | None = None, max_prompt_tokens: int = 0,
          api_key_env: str | None = None, read_timeout: float = READ_TIMEOUT_S) -> None:
    """Load the policy (`model.path`, `model.device`, `model.threads` of `cfg`) and serve it until
    interrupted, capping a request's max_tokens at `rollout.max_new_tokens`; prints one line once
    it accepts requests."""
    from rlpr.model.loading import load_policy
    from rlpr.parallel.distributed import resolve_device

    model_path, device, threads = cfg.model.path, cfg.model.device, cfg.model.threads
    max_new_tokens = cfg.rollout.max_new_tokens
    if threads > 0:
        torch.set_num_threads(threads)
    if max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    faults = Faults(fault_mode, fault_delay)
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"--api-key-env {api_key_env}: that environment variable is not set or empty")
    if read_timeout <= 0 or max_prompt_tokens < 0:
        raise ValueError("--read-timeout must be positive and --max-prompt-tokens >= 0")
    model, tokenizer = load_policy(model_path, checkpoint, device=resolve_device(device))
    model_name = name or str(model_path)
    engine = None  # rollout.engine=hf: the model's own generate, one request at a time
    if cfg.rollout.engine != "hf":
        from rlpr.model.precision import resolve_rollout_dtype
        from rlpr.rollout.engines import build_engine

        engine = build_engine(model, tokenizer, cfg.rollout, resolve_rollout_dtype(cfg.model.rollout_dtype,
                                                                                  next(model.parameters()).device))
    try:
        server = make_server(ChatGenerator(model, tokenizer, max_new_tokens, max_prompt_tokens or None, engine),
                             model_name, host, port, faults, api_key, read_timeout)
    except OSError as e:
        raise ValueError(f"cannot listen on {host}:{port} ({e.strerror or e})") from None
    bound_host, bound_port = server.server_address[:2]
    print(f"serving {model_name} on http://{bound_host}:{bound_port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
