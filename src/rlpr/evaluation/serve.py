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

Issue 29: a burst of clients waits in a listen backlog of 1024 (it was 5: 42 of 100 simultaneous
clients were lost); a request must arrive whole (request line, headers and body) within
`read_timeout` of its first byte being awaited, however slowly it trickles; at most
`max_connections` connections are served at once, each by a thread, as many more wait for a free
thread without one (for at most `read_timeout`), and the rest get 503 at once; the API key is
checked before the body is read; requests that killed the handler thread with no reply (a
Content-Length of '²', a 5000-digit number, 100k-deep JSON) and text that is not Unicode (a lone
surrogate) get 400, and whatever else goes wrong answers 500 JSON rather than nothing.
"""

from __future__ import annotations

import collections
import hmac
import io
import json
import logging
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

from rlpr.data.prompts import chat_text
from rlpr.config import Config
from rlpr.errors import MAX_SECONDS, within

log = logging.getLogger(__name__)

FAULT_MODES = ("none", "slow", "error", "flaky")
MAX_BODY_BYTES = 10_000_000
READ_TIMEOUT_S = 30.0  # a request (headers and body) must arrive within this; else 408 and closed
MAX_CONNECTIONS = 64  # connections served at once, a thread each; as many more may wait
LISTEN_BACKLOG = 1024  # connections the kernel holds until accepted (capped by net.core.somaxconn)
DRAIN_BYTES = 1 << 20  # after an early answer (401, 413, ...), at most this much unread body is discarded
DRAIN_SECONDS = 2.0
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
                                              top_p=top_p, seeds=[seed], min_new_tokens=0)[0].token_ids
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


class Faults:
    """Injected failures for tests: slow (sleep first), error (always 500), flaky (every other
    request, the first included, is a 500)."""

    def __init__(self, mode: str = "none", delay: float = 2.0):
        if mode not in FAULT_MODES:
            raise ValueError(f"--fault-mode must be one of {', '.join(FAULT_MODES)}, got {mode!r}")
        if not within(delay, 0, MAX_SECONDS):
            raise ValueError(f"--fault-delay must be in [0, {MAX_SECONDS:g}] seconds, got {delay}")
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


class _DeadlineReader(io.RawIOBase):
    """The connection's bytes (for a BufferedReader), every read bounded by the current request's
    deadline rather than by a fixed timeout per read: a client trickling a byte a second cannot
    hold its thread past the deadline."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.deadline = math.inf
        self.received = 0  # bytes of the current request received so far
        self.timed_out = False

    def start(self, seconds: float) -> None:
        self.deadline, self.received, self.timed_out = time.monotonic() + seconds, 0, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            self.timed_out = True
            raise TimeoutError("the request's deadline passed")
        self.sock.settimeout(remaining)
        try:
            n = self.sock.recv_into(buffer)
        except TimeoutError:
            self.timed_out = True
            raise
        self.received += n
        return n


def _error_bytes(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


def make_handler(generator: ChatGenerator, model_name: str, faults: Faults, api_key: str | None = None,
                 read_timeout: float = READ_TIMEOUT_S):
    expected = f"Bearer {api_key}".encode() if api_key else None

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        default_request_version = "HTTP/1.1"  # not 0.9: an answer to a garbled request line has a status line
        timeout = read_timeout  # for writes; reads are bounded by the request's deadline

        def setup(self):
            super().setup()
            self.rfile.close()  # the socket's own file: replaced by one that keeps the deadline
            self._reader = _DeadlineReader(self.connection)
            self.rfile = io.BufferedReader(self._reader, 65536)
            self._body_unread = False

        def handle_one_request(self):
            """The base class's, with one deadline for the whole request, 408 for a request cut
            by it, and a JSON 500 (never silence) for anything unexpected."""
            self._reader.start(read_timeout)
            self._replied = False
            self.raw_requestline, self.requestline, self.command, self.request_version = b"", "", "", "HTTP/1.1"
            try:
                super().handle_one_request()  # it closes the connection on a timeout, without a reply
            except OSError:  # the client went away
                self.close_connection = True
                return
            except Exception:
                log.exception("serve: handling a request failed")
                self.close_connection = True
                if not self._replied:
                    self._error(500, "internal error while handling the request", "server_error")
                return
            if self._reader.timed_out and not self._replied and (self._reader.received or self.raw_requestline):
                self.close_connection = True
                self._error(408, f"the request did not arrive within {read_timeout:g} s")

        def finish(self):
            super().finish()
            if self._body_unread and not self._reader.timed_out:
                _drain(self.connection, min(DRAIN_SECONDS, read_timeout))

        def send_error(self, code, message=None, explain=None):
            """The base class's errors (a malformed request line or header, 414, 431, an unknown
            method) as JSON, like every other answer."""
            if code == HTTPStatus.NOT_IMPLEMENTED:  # no do_<METHOD>
                code = HTTPStatus.METHOD_NOT_ALLOWED
                message = f"method {self.command!r} is not allowed; use GET or POST"
            self.close_connection = True
            self._error(int(code), message or self.responses.get(code, ("bad request",))[0])

        def handle_expect_100(self):
            """`Expect: 100-continue`: a wrong key is answered 401 before the client sends its body."""
            if self.command == "POST" and not self._authorized():
                return False
            return super().handle_expect_100()

        def _authorized(self) -> bool:
            if expected is None:
                return True
            given = (self.headers.get("Authorization") or "").encode("latin-1", "replace")
            if hmac.compare_digest(given, expected):
                return True
            self.close_connection = True
            self._body_unread = self.command == "POST"
            self._error(401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error")
            return False

        def log_message(self, fmt, *args):  # the request line only, at debug level
            log.debug("%s %s", self.address_string(), fmt % args)

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self._replied = True
            crowded = getattr(self.server, "crowded", None)
            if crowded and crowded():  # free this thread for a waiting connection after answering
                self.close_connection = True
            try:
                self.connection.settimeout(read_timeout)  # reads may have left a shorter one
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if self.close_connection:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
            except OSError:  # the client gave up, or stopped reading (timeout)
                self.close_connection = True

        def _error(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
            self._send(status, {"error": {"message": message, "type": kind}})

        def _refuse_body(self, status: int, message: str) -> None:
            """An answer sent without reading the body: the connection closes after it."""
            self.close_connection = self._body_unread = True
            self._error(status, message)

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
            if not self._authorized():  # before the body: a client without the key costs no memory
                return
            if path != "/v1/chat/completions":
                return self._refuse_body(404, f"no route POST {path}")
            if self.headers.get("Transfer-Encoding"):
                return self._refuse_body(411, "send the body with a Content-Length (no Transfer-Encoding)")
            lengths = {v.strip() for v in self.headers.get_all("Content-Length") or ["0"]}
            header = lengths.pop() if len(lengths) == 1 else "several"
            if not (header.isascii() and header.isdigit()):  # "abc", "-5", "²" (str.isdigit() says yes)
                return self._refuse_body(400, "Content-Length must be a non-negative integer")
            if len(header) > 12 or int(header) > MAX_BODY_BYTES:
                return self._refuse_body(413, "request body too large")
            length = int(header)
            try:
                raw = self.rfile.read(length) if length else b""
            except TimeoutError:
                self.close_connection = True
                return self._error(408, f"the body did not arrive within {read_timeout:g} s")
            if len(raw) < length:  # the client closed before sending its whole body
                self.close_connection = True
                return self._error(400, "the body is shorter than its Content-Length")
            try:
                body = json.loads(raw or b"null")
                if not isinstance(body, dict):
                    raise RequestError("the body must be a JSON object")
                request = parse_chat_request(body)
            except RequestError as e:
                return self._error(400, str(e))
            except RecursionError:
                return self._error(400, "the body is not valid JSON (nested too deeply)")
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, a number of over 4300 digits
                detail = "" if isinstance(e, (json.JSONDecodeError, UnicodeDecodeError)) else \
                    " (a number with too many digits)"
                return self._error(400, f"the body is not valid JSON{detail}")
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


def _drain(sock: socket.socket, seconds: float) -> None:
    """After an answer sent before the body was read: stop sending, discard what the client still
    sends (at most DRAIN_BYTES, for at most `seconds`), so that closing does not reset the
    connection, which can destroy the answer before the client reads it."""
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline, left = time.monotonic() + seconds, DRAIN_BYTES
        while left > 0 and (remaining := deadline - time.monotonic()) > 0:
            sock.settimeout(remaining)
            chunk = sock.recv(min(left, 65536))
            if not chunk:
                break
            left -= len(chunk)
    except OSError:
        pass


class Server(ThreadingHTTPServer):
    """ThreadingHTTPServer with a deep listen backlog and a connection cap: at most
    `max_connections` connections are served at once (a thread each, reused for waiting ones);
    as many more wait without a thread for at most `wait` seconds; the rest, and those that waited
    too long, get 503 at once. `stats` counts connections, refusals and the peaks."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address, handler, max_connections: int = MAX_CONNECTIONS, wait: float = READ_TIMEOUT_S):
        self.max_connections, self.wait = max_connections, wait
        self._lock = threading.Lock()
        self._waiting: collections.deque = collections.deque()
        self.active = 0
        self.stats = {"connections": 0, "refused": 0, "peak_active": 0, "peak_waiting": 0}
        busy = (f"the server is busy ({max_connections} connections open and as many waiting); "
                "retry shortly")
        body = _error_bytes(busy, "server_busy")
        self._busy = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n" % len(body)) + body
        super().__init__(address, handler)

    def crowded(self) -> bool:
        """Connections are waiting for a thread (an answer then closes its connection)."""
        return bool(self._waiting)

    def process_request(self, request, client_address):
        with self._lock:
            self.stats["connections"] += 1
            if self.active < self.max_connections:
                self.active += 1
                self.stats["peak_active"] = max(self.stats["peak_active"], self.active)
            elif len(self._waiting) < self.max_connections:
                self._waiting.append((request, client_address, time.monotonic() + self.wait))
                self.stats["peak_waiting"] = max(self.stats["peak_waiting"], len(self._waiting))
                return
            else:
                request, client_address = None, request
        if request is None:
            return self._refuse(client_address)
        try:
            threading.Thread(target=self._serve_connections, args=(request, client_address), daemon=True,
                             name="rlpr-serve").start()
        except RuntimeError:  # no thread to be had
            with self._lock:
                self.active -= 1
            self._refuse(request)

    def _serve_connections(self, request, client_address) -> None:
        """Serve one connection, then the longest-waiting one, until none waits."""
        while request is not None:
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
            request, expired = None, []
            with self._lock:
                now = time.monotonic()
                while self._waiting and request is None:
                    waiting, address, until = self._waiting.popleft()
                    if until >= now:
                        request, client_address = waiting, address
                    else:
                        expired.append(waiting)
                if request is None:
                    self.active -= 1
            for sock in expired:
                self._refuse(sock)

    def service_actions(self):
        """Between accepts (at least twice a second): 503 for connections that waited too long."""
        expired, now = [], time.monotonic()
        with self._lock:
            while self._waiting and self._waiting[0][2] < now:
                expired.append(self._waiting.popleft()[0])
        for sock in expired:
            self._refuse(sock)

    def _refuse(self, sock: socket.socket) -> None:
        """503 without a thread: the reply fits the socket's buffer, so nothing here blocks; what
        the client already sent is discarded so that closing does not reset the connection."""
        with self._lock:
            self.stats["refused"] += 1
        try:
            sock.setblocking(False)
            sock.sendall(self._busy)
            for _ in range(16):
                if not sock.recv(65536):
                    break
        except OSError:
            pass
        self.shutdown_request(sock)

    def handle_error(self, request, client_address):
        log.exception("serve: a connection from %s failed", client_address[0] if client_address else "?")

    def server_close(self):
        super().server_close()
        with self._lock:
            waiting, self._waiting = list(self._waiting), collections.deque()
        for sock, _, _ in waiting:
            self.shutdown_request(sock)


def _check_server_bounds(read_timeout: float, max_connections: int) -> None:
    """--read-timeout a finite number of seconds (1e308 overflowed the socket's timeout: a traceback),
    --max-connections a number of threads the machine can start."""
    if not within(read_timeout, 0, MAX_SECONDS, low_open=True):
        raise ValueError(f"--read-timeout must be in (0, {MAX_SECONDS:g}] seconds, got {read_timeout}")
    if not within(max_connections, 1, 65536):
        raise ValueError(f"--max-connections must be in 1..65536 (a thread each), got {max_connections}")


def make_server(generator: ChatGenerator, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                faults: Faults | None = None, api_key: str | None = None,
                read_timeout: float = READ_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS) -> Server:
    _check_server_bounds(read_timeout, max_connections)
    return Server((host, port), make_handler(generator, model_name, faults or Faults(), api_key, read_timeout),
                  max_connections, read_timeout)


def serve(cfg: Config, checkpoint: str | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          fault_mode: str = "none", fault_delay: float = 2.0, name: str | None = None, max_prompt_tokens: int = 0,
          api_key_env: str | None = None, read_timeout: float = READ_TIMEOUT_S,
          max_connections: int = MAX_CONNECTIONS) -> None:
    """Load the policy (`model.path`, `model.device`, `model.threads` of `cfg`) and serve it until
    interrupted, capping a request's max_tokens at `rollout.max_new_tokens`; prints one line once
    it accepts requests."""
    from rlpr.model.loading import load_policy
    from rlpr.parallel.distributed import resolve_device
    from rlpr.parallel.threads import use_threads

    model_path, device = cfg.model.path, cfg.model.device
    max_new_tokens = cfg.rollout.max_new_tokens
    use_threads(cfg.model.threads, device=device)
    if max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    faults = Faults(fault_mode, fault_delay)
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise ValueError(f"--api-key-env {api_key_env}: that environment variable is not set or empty")
    _check_server_bounds(read_timeout, max_connections)
    if max_prompt_tokens < 0:
        raise ValueError("--max-prompt-tokens must be >= 0")
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
                             model_name, host, port, faults, api_key, read_timeout, max_connections)
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
