"""The judge client against real servers in the slow, flaky and error fault modes (flaky a real
`rlpr serve` process, the other two the same server in this process: each process start costs
about 8 s of imports), the server's OpenAI-compatible API in-process, and `rlpr eval --judge-url`
end to end.

The served judge is a "yes-man": a tiny Llama whose weights are edited so that greedy decoding
always says " Yes", so verdicts are deterministic without a real model.
"""

from __future__ import annotations

import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from rlpr.evaluation.judge import JudgeClient, JudgeConfig, endpoint, judge_messages, parse_verdict

pytestmark = pytest.mark.integration

SENTINEL_KEY = "sk-rlpr-test-SENTINEL-7f3a9c"
KEY_ENV = "RLPR_TEST_JUDGE_KEY"
ITEMS = [("What is 2+2?", "<answer>four</answer>", "4"), ("Capital of France?", "paris", "Paris"),
         ("1/2 as a decimal?", "0.50", "0.5"), ("Largest planet?", "Jupiter!", "Jupiter")]


def yes_man(tokenizer):
    """A tiny Llama that greedily answers ' Yes' to anything: the final norm keeps only hidden
    dimension 0 (kept positive by a large embedding offset) and ' Yes' has the largest weight on it
    in the tied embedding / output matrix."""
    from rlpr.model.loading import tiny_llama

    model = tiny_llama(tokenizer, layers=2, hidden=64, seed=1)
    yes = tokenizer(" Yes", add_special_tokens=False)["input_ids"][0]
    with torch.no_grad():
        model.model.norm.weight.zero_()
        model.model.norm.weight[0] = 1.0
        emb = model.model.embed_tokens.weight
        emb[:, 0] = 10.0
        emb[yes, 0] = 20.0
    return model


def _save(model, tokenizer, path):
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def _start_server(model_dir, log_path, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    env.pop(KEY_ENV, None)
    cmd = [sys.executable, "-m", "rlpr", "serve", "--model", model_dir, "--port", "0", "--threads", "1",
           "--max-new-tokens", "4", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log_path, "w"), text=True, env=env)


def _wait_ready(proc, log_path, timeout=90.0) -> str:
    """The server's base URL from its 'serving ... on URL' line, once /health answers."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {open(log_path).read()[-2000:]}")
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("serving "):
                url = line.split(" on ")[-1].strip()
                with urllib.request.urlopen(url + "/health", timeout=5) as r:
                    assert json.loads(r.read()) == {"status": "ok"}
                return url
    raise RuntimeError("server did not start in time")


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory, tokenizer, tiny_model):
    root = tmp_path_factory.mktemp("models")
    return {"judge": _save(yes_man(tokenizer), tokenizer, root / "yes_man"),
            "policy": _save(tiny_model, tokenizer, root / "policy")}


@pytest.fixture(scope="module")
def servers(model_dirs, tmp_path_factory, tokenizer):
    """One server per fault mode: flaky a real `rlpr serve` process (the command a user runs), slow
    and error `make_server` in threads of this process, on the same yes-man."""
    from rlpr.evaluation.serve import ChatGenerator, make_server
    from rlpr.evaluation.serve_http import Faults

    logs = tmp_path_factory.mktemp("server_logs")
    proc = _start_server(model_dirs["judge"], logs / "flaky.log", "--fault-mode", "flaky")
    in_process = {}
    try:
        for mode, delay in (("slow", 1.0), ("error", 2.0)):
            gen = ChatGenerator(yes_man(tokenizer), tokenizer, max_new_tokens=4)
            server = in_process[mode] = make_server(gen, "judge", port=0, faults=Faults(mode, delay))
            threading.Thread(target=server.serve_forever, daemon=True).start()
        urls = {m: f"http://127.0.0.1:{s.server_address[1]}" for m, s in in_process.items()}
        urls["flaky"] = _wait_ready(proc, logs / "flaky.log")
        yield {"urls": urls, "logs": logs}
    finally:
        for server in in_process.values():
            server.shutdown()
            server.server_close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.stdout.close()


def _client(url, suffix="/v1", **kw) -> JudgeClient:
    cfg = dict(url=url + suffix, model="judge", key_env=KEY_ENV, concurrency=4, timeout=10.0,
               retries=2, backoff=0.02)
    cfg.update(kw)
    return JudgeClient(JudgeConfig(**cfg))


# --------------------------------------------------------------------------- pure helpers

def test_endpoint_and_verdict_parsing():
    assert endpoint("http://h:1/v1") == "http://h:1/v1/chat/completions"
    assert endpoint("http://h:1/v1/") == "http://h:1/v1/chat/completions"
    assert endpoint("https://h/v1/chat/completions") == "https://h/v1/chat/completions"
    assert parse_verdict("YES") is True and parse_verdict(" yes.") is True
    assert parse_verdict("No, they differ") is False and parse_verdict("Yes Yes Yes") is True
    assert parse_verdict("YESNO") is None and parse_verdict("") is None
    content = judge_messages("Q?", "x" * 10_000 + "final: 7", "7")[0]["content"]
    assert "final: 7" in content and "Reference answer:\n7" in content and "YES or NO" in content
    with pytest.raises(ValueError, match="--judge-model"):
        JudgeConfig("http://h/v1", "").validate()


# --------------------------------------------------------------------------- the server, in-process

@pytest.fixture(scope="module")
def local_server(tokenizer):
    from rlpr.evaluation.serve import ChatGenerator, make_server

    server = make_server(ChatGenerator(yes_man(tokenizer), tokenizer, max_new_tokens=4), "yes-man", port=0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def _request(url, body=None, raw=None):
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_server_api(local_server):
    assert _request(local_server + "/health") == (200, {"status": "ok"})
    status, models = _request(local_server + "/v1/models")
    assert status == 200 and models["data"][0]["id"] == "yes-man"
    body = {"model": "anything", "messages": [{"role": "user", "content": "Agree?"}],
            "temperature": 0, "max_tokens": 100}
    status, reply = _request(local_server + "/v1/chat/completions", body)
    assert status == 200 and reply["object"] == "chat.completion"
    assert reply["choices"][0]["message"] == {"role": "assistant", "content": " Yes Yes Yes Yes"}
    assert reply["choices"][0]["finish_reason"] == "length"  # capped by the server's max (4)
    usage = reply["usage"]
    assert usage["completion_tokens"] == 4 and usage["total_tokens"] == usage["prompt_tokens"] + 4
    status, reply = _request(local_server + "/v1/chat/completions", {**body, "max_tokens": 2})
    assert reply["choices"][0]["message"]["content"] == " Yes Yes" and reply["usage"]["completion_tokens"] == 2
    status, reply = _request(local_server + "/v1/chat/completions", {**body, "stop": "es Y"})
    assert reply["choices"][0] == {"index": 0, "message": {"role": "assistant", "content": " Y"},
                                   "finish_reason": "stop"}
    status, reply = _request(local_server + "/v1/chat/completions",
                             {**body, "temperature": 0.7, "top_p": 0.9, "seed": 3, "max_tokens": 3})
    assert status == 200 and reply["usage"]["completion_tokens"] <= 3


@pytest.mark.parametrize("body, raw, status", [
    ({"messages": []}, None, 400), ({"messages": [{"role": "user"}]}, None, 400),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, None, 400),
    ({"messages": [{"role": "user", "content": "x"}], "n": 2}, None, 400),
    (None, b"{not json", 400),
])
def test_server_rejects_bad_requests(local_server, body, raw, status):
    code, reply = _request(local_server + "/v1/chat/completions", body, raw)
    assert code == status and reply["error"]["message"]
    assert _request(local_server + "/v1/nothing", {"x": 1})[0] == 404


def test_judge_sends_bearer_key_and_never_follows_redirects(monkeypatch):
    """Against a recording stub: the key goes in the Authorization header, the body is as specified."""
    seen = []

    class Recorder(BaseHTTPRequestHandler):
        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append((self.path, self.headers.get("Authorization"), body))
            if self.path.startswith("/moved"):
                self.send_response(307)
                self.send_header("Location", "http://127.0.0.1:9/v1/chat/completions")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = json.dumps({"choices": [{"message": {"content": "NO"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(KEY_ENV, SENTINEL_KEY)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert _client(url).judge_many(ITEMS[:1]) == [False]
        assert _client(url, suffix="/v1/chat/completions").judge_many(ITEMS[:1]) == [False]
        moved = _client(url, suffix="/moved")  # a redirect is not followed: the key stays here
        assert moved.judge_many(ITEMS[:1]) == [None] and moved.failed == 1
    finally:
        server.shutdown()
        server.server_close()
    assert [(p, a) for p, a, _ in seen] == [("/v1/chat/completions", f"Bearer {SENTINEL_KEY}")] * 2 + [
        ("/moved/chat/completions", f"Bearer {SENTINEL_KEY}")]
    body = seen[0][2]
    assert body["model"] == "judge" and body["temperature"] == 0 and body["max_tokens"] > 0
    prompt = body["messages"][0]["content"]
    assert "What is 2+2?" in prompt and "<answer>four</answer>" in prompt


# --------------------------------------------------------------------------- against real servers

def attempts(client) -> dict:
    """Instrument `client`'s requests: how many are in flight at most, and how each attempt ended
    (its reply, or its error's message): behaviour to assert instead of wall-clock times."""
    record = {"in_flight": 0, "most": 0, "ends": []}
    lock = threading.Lock()
    post = client._post_within_deadline

    def counted(messages):
        with lock:
            record["in_flight"] += 1
            record["most"] = max(record["most"], record["in_flight"])
        try:
            reply = post(messages)
            record["ends"].append(reply)
            return reply
        except Exception as e:
            record["ends"].append(str(e))
            raise
        finally:
            with lock:
                record["in_flight"] -= 1

    client._post_within_deadline = counted
    return record


def test_slow_server_requests_overlap(servers):
    """Four 1-second requests with concurrency 4 are in flight together, not one after another."""
    client = _client(servers["urls"]["slow"], concurrency=4, timeout=10.0)
    record = attempts(client)
    assert client.judge_many(ITEMS) == [True] * 4
    assert record["most"] == 4
    assert (client.calls, client.failed) == (4, 0)


def test_slow_server_timeouts_are_counted_failures(servers):
    """Against 1-second replies, a 0.3 s deadline ends every attempt (2 per question, in parallel)."""
    client = _client(servers["urls"]["slow"], timeout=0.3, retries=1)
    record = attempts(client)
    assert client.judge_many(ITEMS) == [None] * 4
    assert (client.calls, client.failed) == (4, 4)
    assert len(record["ends"]) == 8 and all(e.startswith("timeout") for e in record["ends"]), record["ends"]
    assert record["most"] > 1


def test_flaky_server_retries_succeed(servers):
    url = servers["urls"]["flaky"]
    client = _client(url, concurrency=1, retries=2)
    assert client.judge_many(ITEMS) == [True] * 4 and client.failed == 0
    no_retry = _client(url, concurrency=1, retries=0)  # every other request fails
    verdicts = no_retry.judge_many(ITEMS)
    assert verdicts.count(None) == 2 and verdicts.count(True) == 2 and no_retry.failed == 2


def test_error_server_failures_are_counted(servers):
    client = _client(servers["urls"]["error"], retries=2)
    assert client.judge_many(ITEMS) == [None] * 4
    assert (client.calls, client.failed) == (4, 4)


def test_unreachable_judge_is_a_counted_failure():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once closed
    client = _client(f"http://127.0.0.1:{port}", retries=1)
    assert client.judge_many(ITEMS[:2]) == [None, None] and client.failed == 2


# --------------------------------------------------------------------------- rlpr eval --judge-url

def test_eval_with_judge_and_the_key_never_leaks(servers, model_dirs, tmp_path, monkeypatch, capsys, caplog):
    from rlpr.cli.main import main

    monkeypatch.setenv(KEY_ENV, SENTINEL_KEY)
    caplog.set_level(logging.DEBUG)
    data = tmp_path / "math500.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is {i} times 7?", "answer": str(7 * i)}) + "\n"
                            for i in range(2, 5)))
    common = ["-v", "eval", "--model", model_dirs["policy"], "--data", str(data), "--samples", "2",
              "--max-new-tokens", "4", "--judge-model", "judge", "--judge-key-env", KEY_ENV,
              "--judge-backoff", "0.02"]
    out_ok, out_err = tmp_path / "flaky", tmp_path / "error"
    assert main(common + ["--judge-url", servers["urls"]["flaky"] + "/v1", "--judge-concurrency", "1",
                          "--judge-retries", "3", "--output", str(out_ok)]) == 0
    assert main(common + ["--judge-url", servers["urls"]["error"] + "/v1/chat/completions",
                          "--judge-retries", "1", "--output", str(out_err)]) == 0

    ok = json.loads((out_ok / "results.json").read_text())["math500"]
    assert ok["judge_calls"] == 6 - round(6 * ok["rule_accuracy"]) and ok["judge_calls"] > 0
    assert ok["judge_failed"] == 0 and ok["accuracy"] == 1.0  # the yes-man accepts everything
    samples = [json.loads(line) for line in (out_ok / "samples.jsonl").read_text().splitlines()]
    assert all(s["correct"] for s in samples) and all(s["judged"] != s["rule_correct"] for s in samples)

    bad = json.loads((out_err / "results.json").read_text())["math500"]
    assert bad["judge_failed"] == bad["judge_calls"] > 0
    assert bad["accuracy"] == bad["rule_accuracy"]  # a failed judgment keeps the rule verdict

    captured = capsys.readouterr()
    texts = [captured.out, captured.err, caplog.text]
    texts += [p.read_text() for d in (out_ok, out_err) for p in d.iterdir()]
    texts += [p.read_text() for p in servers["logs"].iterdir()]
    assert not any(SENTINEL_KEY in t for t in texts)


def test_judge_deadline_covers_a_trickling_reply():
    """Issue 16, item 8: the timeout was per socket read, so a judge answering 1 byte a second held
    each question for 85 s with --judge-timeout 2; now the whole request has the deadline."""
    stop = threading.Event()

    class Trickle(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            body = json.dumps({"choices": [{"message": {"content": "YES"}}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            for byte in body:
                if stop.is_set():
                    return
                self.wfile.write(bytes([byte]))
                self.wfile.flush()
                time.sleep(0.5)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Trickle)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = _client(f"http://127.0.0.1:{server.server_port}", timeout=2.0, retries=0)
        record = attempts(client)
        assert client.judge("q", "r", "a") is None and client.failed == 1
        # the whole reply (about 25 s at this pace) would have said YES: the deadline ended it
        assert record["ends"] == ["timeout (no complete reply within the deadline)"]
    finally:
        stop.set()
        server.shutdown()


@pytest.mark.parametrize("declared", [True, False], ids=["content-length", "chunked"])
def test_judge_reply_size_is_capped(declared, caplog):
    """Issue 29, item 12: a judge reply had no size limit (a 400 MB reply took 1.6 GB of RSS). A
    reply over `max_reply_bytes` (4 MiB by default) is a failed judgment with a one-line warning;
    the client stops reading it (a declared size is refused before reading)."""
    sent = []
    total = 40 * 1024 * 1024  # a valid reply, "YES" and 40 MiB of spaces

    class Huge(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            head, tail = b'{"choices": [{"message": {"content": "YES', b'"}}]}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if declared:
                self.send_header("Content-Length", str(len(head) + total + len(tail)))
            else:
                self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunk = b" " * 65536
            try:
                for part in [head] + [chunk] * (total // len(chunk)) + [tail]:
                    self.wfile.write(part if declared else b"%x\r\n%s\r\n" % (len(part), part))
                    sent.append(len(part))
                if not declared:
                    self.wfile.write(b"0\r\n\r\n")
            except OSError:  # the client hung up
                pass
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Huge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = _client(f"http://127.0.0.1:{server.server_port}", timeout=30.0, retries=2)
        with caplog.at_level(logging.WARNING, logger="rlpr.evaluation.judge"):
            assert client.judge("q", "r", "a") is None and client.failed == 1
    finally:
        server.shutdown()
        server.server_close()
    assert sum(sent) < total // 2  # the client stopped reading near the cap
    warnings = [r.getMessage() for r in caplog.records if "limit" in r.getMessage()]
    assert len(warnings) == 1 and "over the 4194304-byte limit" in warnings[0] and "\n" not in warnings[0]


@pytest.mark.parametrize("reply", [b"[" * 100_000 + b"]" * 100_000, b'{"choices": ' + b"7" * 5000 + b"}"],
                         ids=["100k-deep", "5000-digit-integer"])
def test_judge_reply_that_json_cannot_hold_is_a_failed_judgment(reply):
    """A reply json.loads raises RecursionError or a plain ValueError on is a counted failure, not a
    crash of the evaluation."""

    class Odd(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        client = _client(f"http://127.0.0.1:{server.server_port}", retries=0)
        assert client.judge_many(ITEMS[:2]) == [None, None] and client.failed == 2
    finally:
        server.shutdown()
        server.server_close()
