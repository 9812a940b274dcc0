"""The listening side of `rlpr serve`: a ThreadingHTTPServer with a deep listen backlog and a cap
on the connections served at once (as many more wait without a thread; the rest get 503 at once,
without one), and make_server, which checks --read-timeout and --max-connections and pairs the
server with a handler. It is kept apart because admitting connections is a concern of its own
(issue 29: a backlog of 5 lost 42 of 100 simultaneous clients), whatever each connection's handler
then does with its request.
"""

from __future__ import annotations

import collections
import json
import logging
import socket
import threading
import time
from http.server import ThreadingHTTPServer
from typing import TYPE_CHECKING

from rlpr.errors import MAX_SECONDS, within
from rlpr.evaluation.serve_http import READ_TIMEOUT_S, Faults, make_handler

if TYPE_CHECKING:  # an annotation only: the server takes any generator, and needs no torch
    from rlpr.evaluation.serve_generator import ChatGenerator

log = logging.getLogger("rlpr.evaluation.serve")  # the name its records had before the split

MAX_CONNECTIONS = 64  # connections served at once, a thread each; as many more may wait
LISTEN_BACKLOG = 1024  # connections the kernel holds until accepted (capped by net.core.somaxconn)


def _error_bytes(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind}}).encode()


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
