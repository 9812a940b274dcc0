"""A long soak of `rlpr serve` against hostile and careless clients (issue 29; docs/reliability.md): the real
command on 127.0.0.1 (a tiny random Llama, an API key, the default connection cap) under bursts of 100
clients, back-to-back clients, slowloris clients, oversized and malformed requests at once. Every request
must be answered (its expected status, or 503 when full) or, for a trickling client, cut at its deadline;
the server's RSS and threads are sampled every 0.2 s.

    python benchmarks/serve_soak.py [--seconds 120] [--read-timeout 2]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

from harness import files, record

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
KEY_ENV, KEY = "RLPR_SOAK_KEY", "sk-soak-5e1d"
GOOD = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
CLIENT_TIMEOUT = 30.0
TRICKLE_PAUSE = 0.2


def request_bytes(body=None, key=KEY, raw_body=None, length=None, extra=b""):
    data = raw_body if raw_body is not None else json.dumps(body).encode()
    length = length if length is not None else str(len(data)).encode()
    head = [b"POST /v1/chat/completions HTTP/1.1", b"Host: x", b"Content-Type: application/json",
            b"Content-Length: " + length]
    if key:
        head.append(b"Authorization: Bearer " + key.encode())
    return b"\r\n".join(head) + b"\r\n" + extra + b"\r\n" + data


def exchange(port, data: bytes):
    """(outcome, seconds): the reply's status, or "closed" (no answer), or "no reply" (timeout)."""
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as s:
            try:
                s.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                pass  # answered early: read the answer
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
                head, sep, body = reply.partition(b"\r\n\r\n")
                if sep:
                    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                      if line.lower().startswith(b"content-length")))
                    if len(body) >= length:
                        json.loads(body[:length])  # every answer is JSON
                        return int(head.split()[1]), time.monotonic() - start
            return "closed", time.monotonic() - start
    except ConnectionResetError:
        return "closed", time.monotonic() - start
    except TimeoutError:
        return "no reply", time.monotonic() - start
    except (OSError, ValueError) as e:
        return f"error {type(e).__name__}", time.monotonic() - start


def trickle(port, data: bytes):
    """Send a byte every TRICKLE_PAUSE s until the server answers or closes: (its status, e.g. 408
    at the deadline or 503 when full, or "closed", seconds from connect), or ("not cut", ...) when
    the whole request went out."""
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_TIMEOUT) as s:
            for i in range(len(data)):
                try:
                    s.sendall(data[i:i + 1])
                except (BrokenPipeError, ConnectionResetError):
                    return "closed", time.monotonic() - start
                if select.select([s], [], [], TRICKLE_PAUSE)[0]:
                    elapsed = time.monotonic() - start
                    try:
                        reply = s.recv(65536)
                    except ConnectionResetError:
                        reply = b""
                    return (int(reply.split()[1]) if reply.startswith(b"HTTP/1.1 ") else "closed"), elapsed
            return "not cut", time.monotonic() - start
    except OSError as e:
        return f"error {type(e).__name__}", time.monotonic() - start


def kinds():
    """name -> (function of the port, the statuses it may get besides 503)."""
    good = request_bytes(GOOD)
    head = good.partition(b"\r\n\r\n")[0] + b"\r\n\r\n"
    return {
        "valid": (lambda p: exchange(p, good), {200}),
        "slow headers": (lambda p: trickle(p, b"POST /v1/chat/completions HTTP/1.1\r\nX-Slow: " + b"a" * 10_000),
                         {408, "closed"}),
        "slow body": (lambda p: trickle(p, head + b" " * 10_000), {408, "closed"}),
        "declared 20 MB": (lambda p: exchange(p, request_bytes(GOOD, length=b"20000000") + b" " * 65536), {413}),
        "512 KB without the key": (lambda p: exchange(p, request_bytes(
            key=None, raw_body=b"{" + b" " * 512 * 1024 + b"}")), {401}),
        "10 MB declared, wrong key": (lambda p: exchange(p, request_bytes(
            key="sk-wrong", raw_body=b"", length=b"10000000")), {401}),
        "Content-Length \u00b2": (lambda p: exchange(p, request_bytes(GOOD, length=b"\xb2")), {400}),
        "two Content-Lengths": (lambda p: exchange(p, request_bytes(GOOD, extra=b"Content-Length: 5\r\n")), {400}),
        "chunked": (lambda p: exchange(p, request_bytes(GOOD, extra=b"Transfer-Encoding: chunked\r\n")), {411}),
        "garbled request line": (lambda p: exchange(p, b"\x00\xffHELLO\r\n\r\n"), {400}),
        "70 KB header line": (lambda p: exchange(p, request_bytes(GOOD, extra=b"X-Big: " + b"b" * 70_000 + b"\r\n")),
                              {431}),
        "200 headers": (lambda p: exchange(p, request_bytes(GOOD, extra=b"X-H: h\r\n" * 200)), {431}),
        "PUT": (lambda p: exchange(p, b"PUT / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"), {405}),
        "100k-deep JSON": (lambda p: exchange(p, request_bytes(raw_body=b"[" * 100_000 + b"]" * 100_000)), {400}),
        "5000-digit number": (lambda p: exchange(p, request_bytes(raw_body=b'{"messages": [], "seed": '
                                                                  + b"7" * 5000 + b"}")), {400}),
        "lone surrogate": (lambda p: exchange(p, request_bytes(raw_body=json.dumps(
            {"messages": [{"role": "user", "content": "\ud800"}]}).encode())), {400}),
    }


MALFORMED = ["Content-Length \u00b2", "two Content-Lengths", "chunked", "garbled request line", "70 KB header line",
             "200 headers", "PUT", "100k-deep JSON", "5000-digit number", "lone surrogate"]
OVERSIZED = ["declared 20 MB", "512 KB without the key", "10 MB declared, wrong key"]


def build_model(folder: Path) -> None:
    from rlpr.model.loading import load_tokenizer, tiny_llama

    tokenizer = load_tokenizer("default")
    model = tiny_llama(tokenizer, layers=2, hidden=64, seed=0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def start_server(model: Path, read_timeout: float, log_path: Path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               **{KEY_ENV: KEY})
    cmd = [sys.executable, "-m", "rlpr", "serve", "--model", str(model), "--host", "127.0.0.1", "--port", "0",
           "--threads", "1", "--max-new-tokens", "4", "--api-key-env", KEY_ENV, "--read-timeout", str(read_timeout)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=open(log_path, "w"), text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"rlpr serve exited: {log_path.read_text()[-2000:]}")
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            if line.startswith("serving "):
                return proc, int(line.rsplit(":", 1)[1])
    proc.kill()
    raise RuntimeError("rlpr serve did not start in 120 s")


def proc_status(pid: int) -> dict:
    fields = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "Threads"):
            fields[key] = int(value.split()[0])
    return fields


def run_all(threads: list[threading.Thread]) -> None:
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def soak(port: int, pid: int, seconds: float) -> dict:
    table = kinds()
    records: list[tuple[str, object, float]] = []  # (kind, outcome, seconds); list.append is atomic
    stop_at = time.monotonic() + seconds
    samples = []

    def loop(names):  # one client, request after request; after a 503 it waits its Retry-After (1 s)
        for name in itertools.cycle(names):
            if time.monotonic() >= stop_at:
                return
            records.append((name, *(answer := table[name][0](port))))
            if answer[0] == 503:
                time.sleep(1.0)

    def one(barrier):
        barrier.wait()
        records.append(("burst", *table["valid"][0](port)))

    def bursts():  # 100 clients at once every 15 s
        while time.monotonic() < stop_at:
            started, barrier = time.monotonic(), threading.Barrier(100)
            run_all([threading.Thread(target=one, args=(barrier,)) for _ in range(100)])
            time.sleep(max(0.0, min(15.0 - (time.monotonic() - started), stop_at - time.monotonic())))

    def monitor():
        while time.monotonic() < stop_at + 1:
            try:
                samples.append(proc_status(pid))
            except OSError:
                return
            time.sleep(0.2)

    workers = [threading.Thread(target=monitor), threading.Thread(target=bursts)]
    workers += [threading.Thread(target=loop, args=(["valid"],)) for _ in range(8)]
    workers += [threading.Thread(target=loop, args=(["slow headers"] if i % 2 else ["slow body"],)) for i in range(30)]
    workers += [threading.Thread(target=loop, args=(OVERSIZED,)) for _ in range(2)]
    workers += [threading.Thread(target=loop, args=(MALFORMED[i::4],)) for i in range(4)]
    rss_start = proc_status(pid)
    started = time.monotonic()
    run_all(workers)
    elapsed = time.monotonic() - started
    rss_end = proc_status(pid)

    by_kind = defaultdict(Counter)
    failures = Counter()
    for name, outcome, _ in records:
        by_kind[name][str(outcome)] += 1
        allowed = table["valid" if name == "burst" else name][1] | {503}
        if outcome not in allowed:
            failures[f"{name}: {outcome}"] += 1
    answered = [(n, o, t) for n, o, t in records if isinstance(o, int)]
    slow = [(o, t) for n, o, t in records if n.startswith("slow")]
    cut = [t for o, t in slow if o in (408, "closed")]  # at the deadline (503s: refused at once)
    ok = sorted(t for n, o, t in records if o == 200)
    every = sorted(t for _, _, t in answered)

    def pct(values, q):
        return round(values[min(len(values) - 1, int(q * len(values)))] * 1000, 1) if values else None

    return {
        "seconds": round(elapsed, 1),
        "requests": len(records),
        "answered": len(answered),
        "slowloris_connections": len(slow),
        "slowloris_answered_408": sum(o == 408 for o, _ in slow),
        "closed_at_deadline": sum(o == "closed" for o, _ in slow),
        "slowloris_refused_503": sum(o == 503 for o, _ in slow),
        "failures": sum(failures.values()),
        "failure_kinds": dict(failures),
        "status_counts": dict(Counter(str(o) for _, o, _ in records)),
        "by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "latency_ms_200": {"p50": pct(ok, 0.5), "p99": pct(ok, 0.99), "max": pct(ok, 1.0), "n": len(ok)},
        "latency_ms_answered": {"p50": pct(every, 0.5), "p99": pct(every, 0.99), "max": pct(every, 1.0)},
        "cut_after_s": {"p50": round(statistics.median(cut), 2) if cut else None,
                        "max": round(max(cut), 2) if cut else None},
        "server_rss_mib": {"start": round(rss_start["VmRSS"] / 1024, 1), "end": round(rss_end["VmRSS"] / 1024, 1),
                           "peak": round(max(s["VmHWM"] for s in samples) / 1024, 1)},
        "server_threads": {"start": rss_start["Threads"], "end": rss_end["Threads"],
                           "peak": max(s["Threads"] for s in samples)},
    }


def markdown(result: dict) -> str:
    r = result
    lines = [
        "# `rlpr serve` soak (issue 29)", "", files.header(r), "",
        f"`python benchmarks/serve_soak.py --seconds {r['config']['seconds']} --read-timeout "
        f"{r['config']['read_timeout']}`: the real `rlpr serve` (tiny random Llama, embedded tokenizer, API key, "
        "default cap of 64 connections served and 64 waiting) on 127.0.0.1, for "
        f"{r['seconds']} s, against bursts of 100 simultaneous clients every 15 s, 8 back-to-back valid "
        "clients, 30 slowloris clients (a byte every 0.2 s), 2 clients sending oversized bodies and 4 malformed "
        "requests, one after another (after a 503 a looping client waits 1 s, its Retry-After). "
        f"Machine: {r['config']['cpus']} CPU cores shared with other work.", "",
    ]

    def spread(d, *keys):
        return " / ".join(str(d[k]) for k in keys)

    lat200, every = r["latency_ms_200"], r["latency_ms_answered"]
    lines += files.table(["", ""], [
        ["requests", r["requests"]], ["answered (HTTP status and a JSON body)", r["answered"]],
        ["slowloris connections: 408 at the deadline / closed at the deadline without an answer / 503 at once",
         f"{spread(r, 'slowloris_answered_408', 'closed_at_deadline', 'slowloris_refused_503')} (cut after p50 "
         f"{r['cut_after_s']['p50']} s, max {r['cut_after_s']['max']} s, deadline {r['config']['read_timeout']} s)"],
        ["failures (no answer, closed without one, unexpected status)", r["failures"]],
        ["latency of 200s, p50 / p99 / max", f"{spread(lat200, 'p50', 'p99', 'max')} ms ({lat200['n']} requests)"],
        ["latency of all answers, p50 / p99 / max", f"{spread(every, 'p50', 'p99', 'max')} ms"],
        ["server RSS start / end / peak", f"{spread(r['server_rss_mib'], 'start', 'end', 'peak')} MiB"],
        ["server threads start / end / peak", spread(r["server_threads"], "start", "end", "peak")]])
    lines += [""] + files.table(["kind", "outcomes"], ([kind, ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))]
                                                      for kind, counts in r["by_kind"].items()))
    if r["failure_kinds"]:
        lines += ["", "Failures: " + ", ".join(f"{k} ({v})" for k, v in r["failure_kinds"].items())]
    lines += ["", "503 is the answer of a full server (64 served, 64 waiting at most "
              f"{r['config']['read_timeout']} s for a thread); a slowloris client is answered 408 or "
              "closed at its deadline. Latencies run from connect to the whole reply, on the client."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--read-timeout", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="serve-soak-") as tmp:
        model = Path(tmp) / "tiny"
        build_model(model)
        proc, port = start_server(model, args.read_timeout, Path(tmp) / "serve.log")
        try:
            result = soak(port, proc.pid, args.seconds)
            alive = exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")[0] == 200
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
            proc.stdout.close()
        log_tail = (Path(tmp) / "serve.log").read_text()[-2000:]
    result["alive_after"] = alive
    result["server_log_tail"] = log_tail
    result["config"] = {"seconds": args.seconds, "read_timeout": args.read_timeout, "cpus": os.cpu_count()}
    result.update(record.stamp())
    files.save(result, RESULTS / "serve_soak", markdown)
    print(json.dumps({k: result[k] for k in ("requests", "answered", "closed_at_deadline", "failures",
                                             "latency_ms_200", "server_rss_mib", "server_threads", "alive_after")}))
    return 0 if result["failures"] == 0 and alive else 1


if __name__ == "__main__":
    raise SystemExit(main())
