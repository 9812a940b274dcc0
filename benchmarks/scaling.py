"""Step time and peak memory of one full RLPR training step against response length and group size
(issue 27: memory must grow at most linearly with the response length; docs/distributed.md).

Each point (L new tokens forced, group size n) is `rlpr.train.trainer.train` for one step in a fresh
child process (`--child`), with hooks that only read memory: the peak-RSS counter (VmHWM) is reset
right before the step and at each phase's start and end, so `peak_rss_gb` is the step's own peak and
`phase_peak_gb` says in which phase. `model_gb` comes from one more child (`--setup-child`): the
Trainer as `rlpr train` builds it plus every gradient and AdamW's two moments. Resumable: the
finished points are lines of OUTPUT.jsonl.

    python benchmarks/scaling.py [--quick] [--points L:n,...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # run as a script, or loaded from its path by a test
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import record  # noqa: E402
from harness.memory import hwm_gb, reset_peak, rss_gb  # noqa: E402
from scaling_report import BASE_L, BASE_N, criterion, notes, summarise, verdict_text, write  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
QUICK_OUTPUT = Path(tempfile.gettempdir()) / "rlpr-scaling-quick" / "scaling"
# cheap points first: the first ones give the time estimate of the rest
FULL_POINTS = [(256, 2), (512, 2), (1024, 2), (512, 4), (512, 8), (2048, 2), (4096, 2)]
QUICK_POINTS = [(16, 2), (32, 2)]


# -- one point, in a child process --------------------------------------------------------------

def overrides(args, length: int, n: int, output_dir: str, name: str) -> list[str]:
    return [f"model.path={args.model}", "model.lora=false", "model.gradient_checkpointing=true",
            f"model.threads={args.threads}",
            f"trainer.micro_batch_tokens={args.budget}", "trainer.prompts_per_step=1", "trainer.mini_batch_prompts=1",
            f"rollout.responses_per_prompt={n}", f"rollout.max_new_tokens={length}",
            f"rollout.min_new_tokens={length}",
            "algorithm.std_filter=false", "algorithm.max_sampling_tries=1",
            "data.val=", f"data.demo_train_size={args.train_prompts}",
            "trainer.eval_before=false", "trainer.max_steps=1", "trainer.report=false", "trainer.save_every=0",
            "trainer.sample_every=0", "trainer.progress=false", "trainer.trackers=[jsonl]",
            "trainer.tensorboard=false", f"trainer.output_dir={output_dir}", f"trainer.name={name}"]


def run_child(args, length: int, n: int, out: Path) -> None:
    """One training step at (length, n) in this (fresh) process; its row goes to `out`."""
    import torch  # noqa: F401

    from rlpr.config import load_config
    from rlpr.model.memory import release_memory
    from rlpr.train import trainer as T

    with tempfile.TemporaryDirectory(prefix="rlpr-scaling-") as work:
        cfg = load_config("demo", overrides(args, length, n, work, "point"))
        seen: dict = {"phase_peak_gb": {}}
        phases, stack, state = seen["phase_peak_gb"], [], {"active": False, "peak": 0.0}

        def mark() -> None:
            """Fold the peak since the last reset into every open phase and the step, then reset."""
            peak = hwm_gb()
            for name in stack:
                phases[name] = max(phases.get(name, 0.0), peak)
            state["peak"] = max(state["peak"], peak)
            reset_peak()

        def phase(name, fn):
            def run(*a, **k):
                if not state["active"]:
                    return fn(*a, **k)
                mark()
                stack.append(name)
                try:
                    return fn(*a, **k)
                finally:
                    mark()
                    stack.pop()
            return run

        original_init, original_step = T.Trainer.__init__, T.Trainer.train_step

        def init(self, *a, **k):
            original_init(self, *a, **k)
            release_memory(force=True)
            seen["setup_rss_gb"] = rss_gb()
            seen["setup_peak_rss_gb"] = hwm_gb()
            # per-phase peaks: the weight sync, the rollout, score B, the update's forwards/backwards
            # and (inside it) the clip + AdamW step
            self.engine.sync = phase("sync", self.engine.sync)
            self.engine.generate = phase("rollout", self.engine.generate)
            self.score = phase("reward", self.score)
            self.update = phase("update", self.update)
            self.strategy.step = phase("optimizer_step", self.strategy.step)

        def train_step(self, step):
            release_memory(force=True)
            seen["rss_before_step_gb"] = rss_gb()
            seen["peak_reset"] = reset_peak()
            state["active"] = True
            metrics = original_step(self, step)
            mark()
            state["active"] = False
            # the step's peak: the largest of the peaks between resets (perf/peak_rss_gb, ru_maxrss, only
            # holds the part since the last phase began)
            seen["step_peak_rss_gb"] = state["peak"]
            release_memory(force=True)
            seen["rss_after_step_gb"] = rss_gb()
            return metrics

        T.Trainer.__init__, T.Trainer.train_step = init, train_step
        tick = time.perf_counter()
        T.train(cfg)
        seen["child_wall_s"] = time.perf_counter() - tick
        lines = [json.loads(x) for x in (Path(work) / "point" / "metrics.jsonl").read_text().splitlines() if x.strip()]
        metrics = [m for m in lines if "perf/step_s" in m][-1]
        row = {"response_tokens": length, "group_size": n, **seen,
               "metrics": {k: v for k, v in metrics.items() if k.startswith(("perf/", "rollout/", "policy/", "reward/"))}}
        out.write_text(json.dumps(row))


def run_setup_child(args, out: Path) -> None:
    """model_gb: the Trainer as `rlpr train` builds it, plus every parameter's gradient and AdamW's
    moments (materialised by one optimizer step on zero gradients)."""
    import torch

    from rlpr.config import load_config
    from rlpr.model.memory import release_memory
    from rlpr.parallel import distributed as dist
    from rlpr.train.run_dir import prepare_run_dir
    from rlpr.train.setup import load_data
    from rlpr.train.trainer import Trainer

    with tempfile.TemporaryDirectory(prefix="rlpr-scaling-setup-") as work:
        cfg = load_config("demo", overrides(args, BASE_L, BASE_N, work, "setup"))
        dist.init_from_env(dist.resolve_device(cfg.model.device))
        examples = load_data(cfg)
        run_dir = Path(work) / "setup"
        prepare_run_dir(run_dir, cfg, examples, False)
        start_rss = rss_gb()
        trainer = Trainer(cfg, run_dir, examples=examples)
        release_memory(force=True)
        setup = rss_gb()
        params = sum(p.numel() for p in trainer.trainable)
        for p in trainer.trainable:
            p.grad = torch.zeros_like(p)
        trainer.optimizer.step()  # AdamW allocates exp_avg and exp_avg_sq here
        release_memory(force=True)
        row = {"kind": "setup", "interpreter_rss_gb": start_rss, "trainer_rss_gb": setup, "model_gb": rss_gb(),
               "trainable_params": params, "setup_peak_rss_gb": hwm_gb(),
               "rollout_dtype": str(next(trainer.engine.model.parameters()).dtype).removeprefix("torch."),
               "mixed_precision": trainer.mixed_precision, "torch_threads": torch.get_num_threads()}
        out.write_text(json.dumps(row))


# -- the parent ---------------------------------------------------------------------------------

def spawn(args, extra: list[str], timeout: float | None) -> dict:
    """Run `extra` (--child L:n or --setup-child) in a fresh process with this run's settings; its row."""
    with tempfile.TemporaryDirectory(prefix="rlpr-scaling-child-") as tmp:
        out = Path(tmp) / "row.json"
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "TOKENIZERS_PARALLELISM": "false"}
        if args.omp_wait_policy:
            env["OMP_WAIT_POLICY"] = args.omp_wait_policy
        if args.malloc_mmap_threshold:  # glibc: a fixed threshold (no dynamic raise to 32 MiB on free)
            env["MALLOC_MMAP_THRESHOLD_"] = str(args.malloc_mmap_threshold)
        tick = time.perf_counter()
        cmd = [sys.executable, __file__, "--model", args.model, "--threads", str(args.threads), "--budget",
               str(args.budget), "--train-prompts", str(args.train_prompts), "--omp-wait-policy", args.omp_wait_policy,
               *extra, "--out", str(out)]
        proc = subprocess.run(cmd, env=env, timeout=timeout, capture_output=True, text=True)
        if proc.returncode or not out.exists():
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-15:]
            raise RuntimeError(f"child {' '.join(extra)} failed (rc {proc.returncode}):\n" + "\n".join(tail))
        row = json.loads(out.read_text())
        row["process_wall_s"] = time.perf_counter() - tick
        return row


def load_rows(path: Path, key: dict) -> list[dict]:
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("settings") == key]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 points (L = 16, 32 at n = 2), output under /tmp")
    parser.add_argument("--points", default="", help="L:n,L:n,... instead of the full grid")
    parser.add_argument("--model", default="default", help="model.path (default: the embedded model)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per child (model.threads)")
    parser.add_argument("--budget", type=int, default=8192, help="trainer.micro_batch_tokens")
    parser.add_argument("--train-prompts", type=int, default=8,
                        help="data.demo_train_size (score A is precomputed for these at set-up)")
    parser.add_argument("--omp-wait-policy", default="PASSIVE", help="the children's OMP_WAIT_POLICY ('': unset)")
    parser.add_argument("--malloc-mmap-threshold", type=int, default=0,
                        help="the children's MALLOC_MMAP_THRESHOLD_ in bytes (0: glibc's dynamic default)")
    parser.add_argument("--note", action="append", default=[], help="a remark about this run, printed under Notes")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per child")
    parser.add_argument("--output", default=None, help="path stem for .jsonl/.json/.md/.png")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)  # "L:n" in a fresh process
    parser.add_argument("--setup-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        length, n = (int(v) for v in args.child.split(":"))
        run_child(args, length, n, Path(args.out))
        return 0
    if args.setup_child:
        run_setup_child(args, Path(args.out))
        return 0

    points = QUICK_POINTS if args.quick else FULL_POINTS
    if args.points:
        points = [tuple(int(v) for v in p.split(":")) for p in args.points.split(",")]
    stem = Path(args.output) if args.output else (QUICK_OUTPUT if args.quick else RESULTS / "scaling")
    stem = stem.with_suffix("") if stem.suffix in (".json", ".md", ".png", ".jsonl") else stem
    log = stem.with_suffix(".jsonl")
    log.parent.mkdir(parents=True, exist_ok=True)
    key = {"model": args.model, "budget": args.budget, "threads": args.threads, "train_prompts": args.train_prompts,
           "omp_wait_policy": args.omp_wait_policy,  # a point measured under other settings is measured again
           **({"malloc_mmap_threshold": args.malloc_mmap_threshold} if args.malloc_mmap_threshold else {})}
    started = time.time()

    def append(row: dict) -> None:
        row = {**row, "settings": key, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        with log.open("a") as f:
            f.write(json.dumps(row) + "\n")

    done = load_rows(log, key)
    for text in args.note:
        if not any(r.get("kind") == "note" and r.get("text") == text for r in done):
            append({"kind": "note", "text": text})
    if not any(r.get("kind") == "setup" for r in done):
        print("== set-up (model_gb)", flush=True)
        append(spawn(args, ["--setup-child"], args.timeout))
    for length, n in points:
        done = load_rows(log, key)
        if any(r.get("response_tokens") == length and r.get("group_size") == n for r in done):
            print(f"== L={length} n={n}: already in {log}, skipped", flush=True)
            continue
        print(f"== L={length} n={n}", flush=True)
        try:
            row = spawn(args, ["--child", f"{length}:{n}"], args.timeout)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            print(f"   failed: {e}", file=sys.stderr, flush=True)
            continue
        append(row)
        r = summarise(row)
        print(f"   step {r['step_s']:.1f} s (rollout {r['rollout_s']:.1f}, reward {r['reward_s']:.1f}, "
              f"update {r['update_s']:.1f}), peak {r['peak_rss_gb']:.2f} GiB "
              f"({', '.join(f'{k} {v:.2f}' for k, v in (r['phase_peak_gb'] or {}).items())}), process "
              f"{row['process_wall_s']:.0f} s", flush=True)

    done = load_rows(log, key)
    setup = next((r for r in done if r.get("kind") == "setup"), None)
    by = {}
    for r in done:
        if r.get("kind") is None:
            by[(r["response_tokens"], r["group_size"])] = r  # the latest measurement of a point
    order = sorted(by, key=lambda p: (p[1] != BASE_N, p[1], p[0]))
    rows = [summarise(by[p]) for p in order]
    import torch

    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "quick": args.quick, "settings": key,
           "commit": record.commit(),
           "machine": {**record.machine(), "platform": platform.platform(), "torch": torch.__version__},
           "model_gb": setup["model_gb"] if setup else None, "setup": setup, "rows": rows,
           "run_notes": [r["text"] for r in done if r.get("kind") == "note"],
           "missing": [p for p in points if p not in by], "wall_s_this_invocation": time.time() - started}
    res["criterion"] = None if args.quick else criterion(rows, res["model_gb"])
    if res["model_gb"] is not None:
        res["verdict_text"] = verdict_text(rows, res["model_gb"])
    res["notes"] = notes(res, args)
    text = write(res, stem)
    print(text)
    print(f"wrote {stem.with_suffix('.json')}, .md, .png ({time.time() - started:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
