"""The demo's training step under variants of rlpr's defaults, each in a fresh process, the
variants' processes alternating `--reps` times (so that they meet the same load), medians reported.

Variants (issue 42):
- `default`: rlpr as it ships;
- `trim_always`: glibc's free heap given back to the OS after the rollout, the reward and the update
  of every step (`malloc_trim`, rlpr's behaviour before 2026-11-29; now only where the free heap
  exceeds a quarter of the machine's available memory, model/memory.py);
- `model_forward`: decode steps through the model's own forward instead of the layers called
  directly (rollout/direct_step.py).

Second part, in one process: the demo rollout (4 prompts x 8 responses x 64 new tokens, new prompts
each repetition, the same seeds both ways) and one greedy pass over the 100 held-out questions (16
new tokens, as the demo's evaluation), direct step and model forward alternating, and whether the
tokens are identical.

    python benchmarks/step_variants.py --output benchmarks/results/step_variants_amd
    python benchmarks/step_variants.py --quick          # smoke test: 1 rep, 1 step, 16 tokens
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("default", "trim_always", "model_forward")
PHASES = ("step_s", "rollout_s", "reward_s", "update_s", "sync_s")


def apply(variant: str) -> None:
    if variant == "trim_always":
        from rlpr.model import memory

        memory.TRIM_SHARE = 0.0
    elif variant == "model_forward":
        from rlpr.rollout import direct_step

        direct_step.ENABLED = False


def run_variant(args) -> dict:
    """`--warmup` + `--steps` demo steps (speed.py's settings) in this process; the timed steps' means."""
    import rlpr  # noqa: F401  (before torch, as `rlpr train`)
    import torch

    from speedbench.settings import rlpr_config

    from rlpr.train.trainer import Trainer

    apply(args.variant)
    work = Path(tempfile.mkdtemp(prefix="rlpr-variant-"))
    cfg, _ = rlpr_config(args, str(work))
    trainer = Trainer(cfg, work / "run")
    rows = []
    for step in range(1, args.warmup + args.steps + 1):
        m = trainer.train_step(step)
        trainer.step = step
        if step > args.warmup:
            rows.append({k: m[f"perf/{k}"] for k in PHASES})
    return {"variant": args.variant, "threads": torch.get_num_threads(),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20,
            **{k: statistics.fmean(r[k] for r in rows) for k in PHASES}}


def rollouts(args) -> dict:
    """Part 2: the rollout and a greedy held-out pass, direct step and model forward alternating."""
    import torch

    from speedbench.settings import rlpr_config

    from rlpr.rollout import direct_step
    from rlpr.train.trainer import Trainer

    work = Path(tempfile.mkdtemp(prefix="rlpr-direct-"))
    cfg, _ = rlpr_config(args, str(work))
    trainer = Trainer(cfg, work / "run")
    engine, prompts = trainer.engine, trainer.train_prompts
    held_out = [p.token_ids for p in trainer.val_prompts]
    out = {w: {"rollout_s": [], "greedy_s": []} for w in ("direct", "model_forward")}
    same = True
    for rep in range(args.reps):
        batch = [p.token_ids for p in prompts[4 * rep:4 * rep + 4]]
        tokens = {}
        for way in (("direct", "model_forward") if rep % 2 == 0 else ("model_forward", "direct")):
            direct_step.ENABLED = way == "direct"
            tick = time.perf_counter()
            got = engine.generate(batch, 8, max_new_tokens=args.max_new_tokens, temperature=1.0, top_p=1.0,
                                  seeds=[rep * 100 + i for i in range(4)])
            out[way]["rollout_s"].append(time.perf_counter() - tick)
            tick = time.perf_counter()
            greedy = engine.generate(held_out, 1, max_new_tokens=16, temperature=0.0, min_new_tokens=0)
            out[way]["greedy_s"].append(time.perf_counter() - tick)
            tokens[way] = [r.token_ids for r in got + greedy]
        same = same and tokens["direct"] == tokens["model_forward"]
    direct_step.ENABLED = True
    return {"ways": out, "identical_tokens": same, "held_out_questions": len(held_out),
            "threads": torch.get_num_threads()}


def report(res: dict) -> str:
    s = res["settings"]
    lines = [f"# Demo step under variants of rlpr's defaults ({res['date']})", "",
             f"{res['machine'].get('cpu', 'CPU')}, {res['machine']['cpu_count']} cores; {s['reps']} repetitions, "
             f"each variant a fresh process of {s['warmup']} warm-up + {s['steps']} timed steps at speed.py's settings "
             f"({s['max_new_tokens']} new tokens), the variants alternating; medians of the per-process means. Load "
             f"average {res['machine'].get('load_before')} before.", "",
             "| variant | " + " | ".join(p.removesuffix("_s") + " s" for p in PHASES) + " | peak RSS GiB |",
             "|---|" + "---|" * (len(PHASES) + 1)]
    for v, runs in res["variants"].items():
        if not runs:
            continue
        med = {k: statistics.median(r[k] for r in runs) for k in (*PHASES, "peak_rss_gb")}
        lines.append(f"| {v} | " + " | ".join(f"{med[k]:.2f}" for k in PHASES) + f" | {med['peak_rss_gb']:.2f} |")
    lines += ["", "Each process's step seconds: " + "; ".join(
        f"{v} " + ", ".join(f"{r['step_s']:.1f}" for r in runs) for v, runs in res["variants"].items() if runs), ""]
    r = res.get("rollouts")
    if r:
        med = {w: {k: statistics.median(v) for k, v in d.items()} for w, d in r["ways"].items()}
        d, m = med["direct"], med["model_forward"]
        lines += ["| decode steps through | demo rollout s | greedy held-out pass s |", "|---|---|---|",
                  f"| the layers called directly | {d['rollout_s']:.2f} | {d['greedy_s']:.2f} |",
                  f"| the model's forward | {m['rollout_s']:.2f} | {m['greedy_s']:.2f} |",
                  f"| ratio | {d['rollout_s'] / m['rollout_s']:.2f} | {d['greedy_s'] / m['greedy_s']:.2f} |", "",
                  f"One process, the two ways alternating, medians of {s['reps']}; greedy pass over "
                  f"{r['held_out_questions']} held-out questions, 16 new tokens; identical tokens: "
                  f"{r['identical_tokens']}.", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", default=None)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # a child
    args = parser.parse_args()
    args.threads = 0
    if args.quick:
        args.reps, args.steps, args.max_new_tokens = 1, 1, 16
    if args.variant:
        print(json.dumps(run_variant(args)))
        return 0
    import os

    from speedbench.report import machine, save

    out = Path(args.output or (Path(tempfile.gettempdir()) / "rlpr-step-variants" if args.quick else
                               Path(__file__).resolve().parent / "results" / "step_variants"))
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "quick": args.quick,
           "settings": {"reps": args.reps, "steps": args.steps, "warmup": args.warmup,
                        "max_new_tokens": args.max_new_tokens},
           "machine": {**machine(), "load_before": round(os.getloadavg()[0], 1)},
           "variants": {v: [] for v in VARIANTS}}
    for rep in range(args.reps):
        for variant in VARIANTS[rep % len(VARIANTS):] + VARIANTS[:rep % len(VARIANTS)]:  # rotate the order
            cmd = [sys.executable, __file__, "--variant", variant, "--reps", str(args.reps), "--steps", str(args.steps),
                   "--warmup", str(args.warmup), "--max-new-tokens", str(args.max_new_tokens)]
            row = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            res["variants"][variant].append(row)
            print(f"rep {rep + 1} {variant}: {row['step_s']:.1f} s per step", flush=True)
            save(res, out, report)
    res["rollouts"] = rollouts(args)
    print(save(res, out, report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
