"""`rlpr serve` against hostile or broken clients (issue 16, item 7): every request gets 200 or a
4xx JSON error, nothing blocks a thread forever, the server stays up, and a bounded soak test."""

import json
import resource
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rlpr.evaluation.serve import ChatGenerator, make_server

pytestmark = pytest.mark.integration

KEY = "sk-test-never-logged-5d1f"


def _yes_man(tokenizer):
    from rlpr.model.loading import tiny_llama

    return tiny_llama(tokenizer, layers=1, hidden=32, seed=0)


@pytest.fixture(scope="module")
def hardened(tokenizer):
    """A real server (tiny model) with an API key, a 64-token prompt cap and a 1 s read timeout."""
    gen = ChatGenerator(_yes_man(tokenizer), tokenizer, max_new_tokens=2, max_prompt_tokens=64)
    server = make_server(gen, "tiny", port=0, api_key=KEY, read_timeout=1.0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _raw(port, data: bytes, timeout=10.0) -> tuple[int, dict]:
    """Send raw bytes, return (status, JSON body) of the reply."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        reply = b""
        while chunk := s.recv(65536):
            reply += chunk
            head, sep, body = reply.partition(b"\r\n\r\n")
            if sep:
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                if len(body) >= length:
                    return int(head.split()[1]), json.loads(body[:length])
    raise AssertionError(f"no complete reply: {reply[:200]!r}")


def _post(port, body: dict | None = None, *, key=KEY, raw_body: bytes | None = None, length: str | None = None):
    data = raw_body if raw_body is not None else json.dumps(body).encode()
    headers = [b"POST /v1/chat/completions HTTP/1.1", b"Host: x", b"Content-Type: application/json",
               b"Content-Length: " + (length or str(len(data))).encode()]
    if key:
        headers.append(b"Authorization: Bearer " + key.encode())
    return _raw(port, b"\r\n".join(headers) + b"\r\n\r\n" + data)


GOOD = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def test_api_key_is_required_and_health_is_open(hardened):
    assert _post(hardened, GOOD)[0] == 200
    status, reply = _post(hardened, GOOD, key=None)
    assert status == 401 and reply["error"]["type"] == "authentication_error"
    assert _post(hardened, GOOD, key="sk-wrong")[0] == 401
    assert _raw(hardened, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200
    assert _raw(hardened, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 401


@pytest.mark.parametrize("body,status,message", [
    ({**GOOD, "stop": 5}, 400, "'stop' must be a string"),
    ({**GOOD, "seed": 1e30}, 400, "'seed' must be in"),
    ({**GOOD, "seed": -1}, 400, "'seed' must be in"),
    ({**GOOD, "temperature": float("nan")}, 400, "finite numbers"),
    ({**GOOD, "max_tokens": 2.5}, 400, "integers"),
    ({"messages": [{"role": "user", "content": "word " * 200}]}, 400, "this server accepts at most 64"),
])
def test_malformed_requests_get_400_json(hardened, body, status, message):
    code, reply = _post(hardened, raw_body=json.dumps(body, allow_nan=True).encode())
    assert code == status and message in reply["error"]["message"]


@pytest.mark.parametrize("length,status", [("abc", 400), ("-5", 400), ("99999999999", 413)])
def test_bad_content_length(hardened, length, status):
    assert _post(hardened, GOOD, length=length)[0] == status


def test_a_body_shorter_than_its_length_times_out_with_408(hardened):
    start = time.monotonic()
    status, reply = _post(hardened, raw_body=b'{"messages": [', length="500")
    assert status == 408 and "did not arrive" in reply["error"]["message"]
    assert time.monotonic() - start < 5.0  # read timeout 1 s, not forever


def test_soak_mixed_traffic(hardened):
    """200 requests from 16 concurrent clients mixing valid, malformed, unauthorized and oversized
    bodies: every one answered 200 or 4xx JSON, the server alive at the end; RSS growth printed."""
    kinds = [lambda: _post(hardened, GOOD), lambda: _post(hardened, raw_body=b"{not json"),
             lambda: _post(hardened, GOOD, key=None), lambda: _post(hardened, {**GOOD, "seed": 1e30}),
             lambda: _post(hardened, {"messages": [{"role": "user", "content": "x " * 500}]}),
             lambda: _post(hardened, GOOD, length="abc"), lambda: _post(hardened, GOOD, length="20000000")]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        statuses = list(pool.map(lambda i: kinds[i % len(kinds)]()[0], range(200)))
    elapsed = time.monotonic() - start
    assert all(s == 200 or 400 <= s < 500 for s in statuses), sorted(set(statuses))
    assert statuses.count(200) == len(range(0, 200, len(kinds)))
    assert _raw(hardened, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200
    growth = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    print(f"soak: 200 requests, 16 clients, {elapsed:.1f} s, peak RSS growth {growth:.1f} MiB")
    assert elapsed < 120


def test_the_key_never_reaches_the_log(tokenizer, caplog):
    import logging

    gen = ChatGenerator(_yes_man(tokenizer), tokenizer, max_new_tokens=1)
    server = make_server(gen, "tiny", port=0, api_key=KEY)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with caplog.at_level(logging.DEBUG):
            _post(server.server_address[1], GOOD)
            _post(server.server_address[1], GOOD, key="sk-wrong-guess")
    finally:
        server.shutdown()
        server.server_close()
    assert KEY not in caplog.text and "sk-wrong-guess" not in caplog.text
