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

The parts live beside this module, one concern each: the wire format (request checks, the response
object) in serve_protocol.py, the model side in serve_generator.py, one connection's handling in
serve_http.py, the connection cap and make_server in serve_server.py. This module keeps the
command itself (load the policy, listen, serve until interrupted) and imports every name again, so
that `rlpr.evaluation.serve.NAME` works for every public name it had.
"""

from __future__ import annotations

import os

from rlpr.config import Config
# every name below is re-exported: the CLI, tests and benchmarks import them from here
from rlpr.evaluation.serve_generator import ChatGenerator  # noqa: F401
from rlpr.evaluation.serve_http import (  # noqa: F401
    DRAIN_BYTES, DRAIN_SECONDS, FAULT_MODES, MAX_BODY_BYTES, READ_TIMEOUT_S, Faults, make_handler)
from rlpr.evaluation.serve_protocol import (  # noqa: F401
    MAX_SEED, Completion, RequestError, completion_json, parse_chat_request)
from rlpr.evaluation.serve_server import (  # noqa: F401
    LISTEN_BACKLOG, MAX_CONNECTIONS, Server, _check_server_bounds, make_server)


def serve(cfg: Config, checkpoint: str | None = None, *, host: str = "127.0.0.1", port: int = 8000,
          fault_mode: str = "none", fault_delay: float = 2.0, name: str | None = None, max_prompt_tokens: int = 0,
          api_key_env: str | None = None, read_timeout: float = READ_TIMEOUT_S,
          max_connections: int = MAX_CONNECTIONS, accept_base_change: bool = False) -> None:
    """Load the policy (`model.path`, `model.device`, `model.threads` of `cfg`) and serve it until
    interrupted, capping a request's max_tokens at `rollout.max_new_tokens`; prints one line once
    it accepts requests. `accept_base_change`: serve a LoRA checkpoint although its base changed."""
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
    model, tokenizer = load_policy(model_path, checkpoint, device=resolve_device(device),
                                   accept_base_change=accept_base_change)
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
