"""One connection of `rlpr serve`: the request handler (routes, the API key checked before the body
is read, Content-Length rules, one deadline for a whole request however slowly it trickles, a JSON
answer for every error, the base class's included), the faults injected for tests of a judge
client's timeouts and retries, and the draining of an unread body after an early answer. It is
kept apart because it is the per-request I/O: what a body means is serve_protocol's, generation
is serve_generator's, and how many connections are served at once is serve_server's.
"""

from __future__ import annotations

import hmac
import io
import json
import logging
import math
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING

from rlpr.errors import MAX_SECONDS, within
from rlpr.evaluation.serve_protocol import RequestError, completion_json, parse_chat_request

if TYPE_CHECKING:  # an annotation only: the handler calls any generator, and needs no torch
    from rlpr.evaluation.serve_generator import ChatGenerator

log = logging.getLogger("rlpr.evaluation.serve")  # the name its records had before the split

FAULT_MODES = ("none", "slow", "error", "flaky")
MAX_BODY_BYTES = 10_000_000
READ_TIMEOUT_S = 30.0  # a request (headers and body) must arrive within this; else 408 and closed
DRAIN_BYTES = 1 << 20  # after an early answer (401, 413, ...), at most this much unread body is discarded
DRAIN_SECONDS = 2.0


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
