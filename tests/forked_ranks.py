"""Two ranks forked from a process that imported torch, transformers and rlpr once (a zygote).

Every torchrun launch of the suite paid those imports three times (the launcher and two ranks,
about 5 s of CPU each on 2 cores): most of a multi-process test's time. The zygote imports them
once per test worker; each launch forks two children that set the variables torchrun sets for a
rank (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) and run `python -m rlpr ...` or
a script in-process, so the code under test (env:// rendezvous, gloo, DDP / FSDP / DeepSpeed) is
the same. The zygote never runs a parallel region (OMP_NUM_THREADS=1 before torch loads), so the
children start with no OpenMP threads to lose across the fork. Launches that check the launchers
themselves keep the real ones (helpers.LAUNCHERS: torchrun, accelerate).

Protocol: one JSON request per line on stdin ({"argv", "env", "cwd", "logs", "timeout"}), one
JSON reply per line on stdout ({"codes", "stderr", "timed_out"}); helpers.Zygote is the client.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time

WORLD = 2


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_rank(rank: int, port: int, request: dict, reply_fd: int) -> None:
    """In a forked child: become rank `rank` and run the command; never returns."""
    import atexit
    import runpy

    code = 1
    try:
        os.setpgid(0, 0)
        os.close(reply_fd)
        for fd, path in ((1, f"{request['logs']}/rank{rank}.out"), (2, f"{request['logs']}/rank{rank}.err")):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.environ.clear()  # the test's environment at the launch, as a subprocess would have it
        os.environ.update(request["env"])
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), GROUP_RANK="0", ROLE_RANK=str(rank),
                          WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(WORLD), ROLE_WORLD_SIZE=str(WORLD),
                          MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.chdir(request["cwd"])
        argv = request["argv"]
        try:
            if argv[0] == "-m":
                sys.argv = [argv[1], *argv[2:]]
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = list(argv)
                runpy.run_path(argv[0], run_name="__main__")
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:
            import traceback

            traceback.print_exc()
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def launch(request: dict, reply_fd: int) -> dict:
    """Fork the ranks and wait for them; when one fails, the other is ended (torchrun does the
    same), and both are ended past the request's timeout."""
    port = free_port()
    sys.stdout.flush()
    sys.stderr.flush()
    pids = []
    for rank in range(WORLD):
        pid = os.fork()
        if pid == 0:
            run_rank(rank, port, request, reply_fd)
        pids.append(pid)
    codes: dict[int, int] = {}
    deadline, failed_at = time.monotonic() + request["timeout"], None
    while len(codes) < WORLD:
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
                if codes[pid] != 0 and failed_at is None:
                    failed_at = time.monotonic()
        now = time.monotonic()
        if len(codes) < WORLD and (now > deadline or (failed_at is not None and now > failed_at + 5)):
            for pid in pids:
                if pid not in codes:
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        time.sleep(0.05)
    stderr = "".join(open(f"{request['logs']}/rank{r}.err", errors="replace").read() for r in range(WORLD))
    return {"codes": [codes[pid] for pid in pids], "stderr": stderr, "timed_out": time.monotonic() > deadline}


def serve() -> None:
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what a library prints in this process (DeepSpeed at import) goes to stderr, not the replies
    os.environ["OMP_NUM_THREADS"] = "1"  # before torch loads OpenMP: no threads to fork
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import rlpr  # noqa: F401  (first, as in a run)
    import rlpr.cli  # noqa: F401
    import rlpr.train.trainer  # noqa: F401
    import torch.distributed  # noqa: F401
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        pass
    # what every rank imported next, about 5.8 s of CPU a rank: transformers' model, configuration and
    # tokenizer code (most of it behind peft's import), peft, accelerate, the graders' math_verify
    import accelerate  # noqa: F401
    import math_verify  # noqa: F401
    import peft  # noqa: F401
    import safetensors.torch  # noqa: F401
    from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM,  # noqa: F401
                              PreTrainedTokenizerFast, Qwen2ForCausalLM)
    print(json.dumps({"ready": True}), file=reply, flush=True)
    for line in sys.stdin:
        print(json.dumps(launch(json.loads(line), reply.fileno())), file=reply, flush=True)


if __name__ == "__main__":
    serve()
