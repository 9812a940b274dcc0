"""LLM-as-judge over an OpenAI-compatible chat-completions API (stdlib urllib, no new dependency).

The judge is only asked about responses the rule grader marked wrong, so it can turn "wrong" into
"right" but never the reverse. Requests run concurrently (a thread pool), each with a timeout and
retries with exponential backoff; a request that still fails is counted and keeps the rule
verdict, so a flaky judge never crashes an evaluation. The API key is read from an environment
variable and only ever placed in the Authorization header: it is never logged or returned.
A reply larger than `max_reply_bytes` (4 MiB by default; a verdict needs a few hundred bytes) is a
failed judgment, refused from its Content-Length or cut as it arrives (issue 29, item 12).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import random
import re
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from rlpr.errors import MAX_SECONDS, within

log = logging.getLogger(__name__)

JUDGE_PROMPT = """You are grading an answer to a question against the reference answer.

Question:
{question}

Reference answer:
{reference}

Response:
{response}

Is the final answer of the response equivalent to the reference answer? Ignore the reasoning and \
formatting; only the final answer matters. Reply with exactly one word: YES or NO."""

# The final answer sits at the end; a long rambling response is cut from the front.
MAX_RESPONSE_CHARS = 6_000
_VERDICT = re.compile(r"\b(YES|NO)\b")
MAX_REPLY_BYTES = 4 * 1024 * 1024


@dataclass
class JudgeConfig:
    url: str
    model: str
    key_env: str = "OPENAI_API_KEY"
    concurrency: int = 8
    timeout: float = 30.0
    retries: int = 3  # extra attempts after the first
    max_tokens: int = 8
    backoff: float = 0.5  # seconds before the first retry; doubles each time
    max_reply_bytes: int = MAX_REPLY_BYTES  # a larger reply is a failed judgment, never read whole

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--judge-url must start with http:// or https://, got {self.url!r}")
        if not self.model:
            raise ValueError("--judge-model is required with --judge-url")
        if not (within(self.concurrency, 1, 1024) and within(self.retries, 0, 100)
                and within(self.timeout, 0, MAX_SECONDS, low_open=True) and within(self.backoff, 0, MAX_SECONDS)
                and self.max_reply_bytes >= 1):
            raise ValueError(f"need --judge-concurrency in 1..1024 (threads), --judge-retries in 0..100, "
                             f"--judge-timeout in (0, {MAX_SECONDS:g}] and --judge-backoff in [0, {MAX_SECONDS:g}] "
                             f"seconds and a reply size limit >= 1 byte")


class JudgeError(Exception):
    """One failed attempt; `retry` says whether trying again may help (timeouts, 5xx, 429)."""

    def __init__(self, reason: str, retry: bool):
        super().__init__(reason)
        self.retry = retry


def endpoint(url: str) -> str:
    """{url}/chat/completions, or the url itself when it already names that endpoint."""
    url = url.rstrip("/")
    return url if url.endswith("/chat/completions") else url + "/chat/completions"


def judge_messages(question: str, response: str, reference: str) -> list[dict]:
    if len(response) > MAX_RESPONSE_CHARS:
        response = "..." + response[-MAX_RESPONSE_CHARS:]
    return [{"role": "user", "content": JUDGE_PROMPT.format(
        question=question.strip(), reference=reference.strip(), response=response.strip())}]


def parse_verdict(content: str) -> bool | None:
    """True for YES, False for NO (the first of them in the reply), None when neither appears."""
    m = _VERDICT.search(content.upper())
    return None if m is None else m.group(1) == "YES"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """urllib would replay the Authorization header to wherever a redirect points: refuse."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx then surfaces as an HTTPError (a non-retried failure)


class JudgeClient:
    """Judges (question, response, reference) triples; counts calls and failures."""

    def __init__(self, cfg: JudgeConfig):
        cfg.validate()
        self.cfg = cfg
        self.url = endpoint(cfg.url)
        self._key = os.environ.get(cfg.key_env, "")
        if not self._key:
            log.warning("judge: environment variable %s is not set; sending requests without a key",
                        cfg.key_env)
        self._opener = urllib.request.build_opener(_NoRedirect)
        self._lock = threading.Lock()
        self.calls = 0
        self.failed = 0
        self._warned_size = False

    def judge_many(self, items: list[tuple[str, str, str]]) -> list[bool | None]:
        """Verdicts in order; None where the judgment failed after all retries."""
        if not items:
            return []
        with ThreadPoolExecutor(max_workers=min(self.cfg.concurrency, len(items))) as pool:
            return list(pool.map(lambda t: self.judge(*t), items))

    def judge(self, question: str, response: str, reference: str) -> bool | None:
        """One verdict, or None (counted as failed) when every attempt failed."""
        with self._lock:
            self.calls += 1
        reason = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                delay = self.cfg.backoff * 2 ** (attempt - 1)
                time.sleep(delay * (0.5 + random.random()))  # jitter: retries do not stampede
            try:
                verdict = parse_verdict(self._post_within_deadline(judge_messages(question, response, reference)))
            except JudgeError as e:
                reason = str(e)
                if not e.retry:
                    break
                continue
            if verdict is not None:
                return verdict
            reason = "reply has neither YES nor NO"
            break
        with self._lock:
            self.failed += 1
        log.debug("judge: failed after %d attempt(s): %s", attempt + 1, reason)
        return None

    def _post_within_deadline(self, messages: list[dict]) -> str:
        """`_post` with a wall-clock deadline of `timeout` seconds for the whole request (the
        socket timeout alone bounds each read, so a server trickling one byte a second could hold
        a request for minutes). The worker thread stops reading at the deadline too."""
        deadline = time.monotonic() + self.cfg.timeout
        box: dict = {}

        def work():
            try:
                box["reply"] = self._post(messages, deadline)
            except BaseException as e:  # handed to the caller
                box["error"] = e

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(self.cfg.timeout)
        if worker.is_alive():
            raise JudgeError("timeout (no complete reply within the deadline)", retry=True)
        if "error" in box:
            raise box["error"]
        return box["reply"]

    def _post(self, messages: list[dict], deadline: float = float("inf")) -> str:
        """One chat-completions request; the reply's text, or JudgeError (never the key)."""
        body = json.dumps({"model": self.cfg.model, "messages": messages, "temperature": 0,
                           "max_tokens": self.cfg.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        limit = self.cfg.max_reply_bytes
        try:
            with self._opener.open(request, timeout=self.cfg.timeout) as reply:
                declared = (reply.headers.get("Content-Length") or "").strip()
                if declared.isascii() and declared.isdigit() and len(declared) < 20 and int(declared) > limit:
                    raise self._too_large(f"{int(declared)} bytes declared")
                chunks, size = [], 0
                while chunk := reply.read1(65536):  # what has arrived, so the deadline is checked often
                    chunks.append(chunk)
                    size += len(chunk)
                    if size > limit:  # no Content-Length (chunked), or more than it said
                        raise self._too_large(f"cut after {size} bytes")
                    if time.monotonic() > deadline:
                        raise TimeoutError
                data = json.loads(b"".join(chunks).decode("utf-8"))
        except urllib.error.HTTPError as e:
            e.close()
            raise JudgeError(f"HTTP {e.code}", retry=e.code >= 500 or e.code in (408, 429)) from None
        except TimeoutError:  # socket.timeout is an alias
            raise JudgeError("timeout", retry=True) from None
        except urllib.error.URLError as e:
            what = "timeout" if isinstance(e.reason, TimeoutError) else f"connection error ({type(e.reason).__name__})"
            raise JudgeError(what, retry=True) from None
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            raise JudgeError(f"connection error ({type(e).__name__})", retry=True) from None
        except (ValueError, RecursionError):  # not JSON, not UTF-8, a 5000-digit number, 100k-deep nesting
            raise JudgeError("reply is not JSON", retry=True) from None
        try:
            return str(data["choices"][0]["message"]["content"] or "")
        except (KeyError, IndexError, TypeError):
            raise JudgeError("reply has no choices[0].message.content", retry=False) from None

    def _too_large(self, size: str) -> JudgeError:
        """A reply over the size limit: not retried (the same question gets the same reply), and
        one warning per client, so a misconfigured judge URL is seen without -v."""
        reason = f"reply over the {self.cfg.max_reply_bytes}-byte limit ({size})"
        with self._lock:
            warn, self._warned_size = not self._warned_size, True
        if warn:
            log.warning("judge: %s; counted as a failed judgment", reason)  # the URL may hold a key
        return JudgeError(reason, retry=False)
