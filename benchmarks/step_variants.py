"""The demo's training step under variants of rlpr's defaults, in one process: in each round every
variant starts from the same state (trainable weights, optimizer, scheduler, prompt stream) and runs
the same two steps (the same step numbers and so sampling seeds: the same samples, since no variant
changes a number), the second timed so that it follows a step of its own variant; the variants'
order rotates from round to round, and medians are stated. Turns inside one process meet the same
load, which moved whole processes by 15% between minutes on a shared machine, more than the effects
measured here; and from the same state the work is identical (a policy that keeps training shortens
its responses: steps fell from 10.8 to 6.5 s over five rounds when each variant went on from the
last one's weights).

Variants (issue 42):
- `default`: rlpr as it ships;
- `trim_always`: glibc's free heap given back to the OS after the rollout, the reward and the update
  of every step (`malloc_trim`, rlpr's behaviour before 2026-11-29; now only where the free heap
  exceeds a quarter of the machine's available memory, model/memory.py);
- `model_forward`: decode steps through the model's own forward instead of the layers called
  directly (rollout/direct_step.py).

Second part, in the same process: the demo rollout (4 prompts x 8 responses x 64 new tokens, new
prompts each round, the same seeds both ways) and one greedy pass over the held-out questions (16
new tokens, as the demo's evaluation), direct step and model forward alternating, and whether the
tokens are identical.

    python benchmarks/step_variants.py --output benchmarks/results/step_variants_amd
    python benchmarks/step_variants.py --quick          # smoke test: 1 round, 16 tokens
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

VARIANTS = ("default", "trim_always", "model_forward")
DEFAULT_TRIM_SHARE = 0.25  # model/memory.py's TRIM_SHARE as shipped (read before any variant changes it)
PHASES = ("step_s", "rollout_s", "reward_s", "update_s", "sync_s")


def apply(variant: str) -> None:
    """Switch this process to `variant` (module settings read at every call)."""
    from rlpr.model import memory
    from rlpr.rollout import direct_step

    memory.TRIM_SHARE = 0.0 if variant == "trim_always" else DEFAULT_TRIM_SHARE
    direct_step.ENABLED = variant != "model_forward"


def snapshot(trainer) -> dict:
    """What a training step reads and changes: the trainable weights and the state a checkpoint keeps
    beside them (optimizer, schedules, prompt stream, score A's cache, RNG: rlpr.train.state)."""
    import copy

    from rlpr.train.state import trainer_state

    return {"weights": [p.detach().clone() for p in trainer.trainable], "state": copy.deepcopy(trainer_state(trainer))}


def restore(trainer, snap: dict) -> None:
    """Put `snapshot`'s state back, as resuming from a checkpoint does (score A's cache too: each
    variant computes A for the round's prompts, as the first did)."""
    import copy

    import torch

    from rlpr.train.state import put_back

    with torch.no_grad():
        for p, w in zip(trainer.trainable, snap["weights"]):
            p.copy_(w)
    state = copy.deepcopy(snap["state"])
    put_back(trainer, state, state)


def steps(trainer, args) -> dict:
    """Part 1: `--rounds` rounds; in each, every variant (in a rotated order) starts from the same
    state (weights, optimizer, prompt stream) and runs the same two steps (the same step numbers,
    so the same sampling seeds: the same samples, since no variant changes the numbers), the
    second timed."""
    import torch

    out = {v: [] for v in VARIANTS}
    step = 0
    for _ in range(args.warmup):
        step += 1
        trainer.train_step(step)
        trainer.step = step
    for r in range(args.rounds):
        snap = snapshot(trainer)
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            apply(variant)
            restore(trainer, snap)
            for k in (1, 2):
                m = trainer.train_step(step + k)
                trainer.step = step + k
            out[variant].append({**{k: m[f"perf/{k}"] for k in PHASES},
                                 "response_len_mean": m["rollout/response_len_mean"], "reward_mean": m["reward/mean"]})
            print(f"round {r + 1} {variant}: {m['perf/step_s']:.1f} s", flush=True)
        step += 2
    apply("default")
    same = all(len({round(rows[r][k], 9) for rows in out.values()}) == 1
               for r in range(args.rounds) for k in ("response_len_mean", "reward_mean"))
    return {"variants": out, "same_samples": same, "threads": torch.get_num_threads()}


def rollouts(trainer, args) -> dict:
    """Part 2: the rollout and a greedy held-out pass, direct step and model forward alternating."""
    from rlpr.rollout import direct_step

    engine, prompts = trainer.engine, trainer.train_prompts
    held_out = [p.token_ids for p in trainer.val_prompts]
    out = {w: {"rollout_s": [], "greedy_s": []} for w in ("direct", "model_forward")}
    same = True
    for rep in range(args.rounds):
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
    return {"ways": out, "identical_tokens": same, "held_out_questions": len(held_out)}


def report(res: dict) -> str:
    s = res["settings"]
    lines = [f"# Demo step under variants of rlpr's defaults ({res['date']})", "",
             f"{res['machine'].get('cpu', 'CPU')}, {res['machine']['cpu_count']} cores, {res['threads']} torch "
             f"threads; one process, speed.py's settings ({s['max_new_tokens']} new tokens), {s['warmup']} warm-up "
             f"step(s), then {s['rounds']} rounds in which each variant runs two steps on the round's prompts and the "
             f"second is timed, every variant from the same state (weights, optimizer, prompts, seeds; the same "
             f"samples in every round: {res.get('same_samples')}); medians. Load average {res['machine'].get('load_before')} before, "
             f"{res['machine'].get('load_after')} after. Peak RSS of the process: {res['peak_rss_gb']:.2f} GiB.", "",
             "| variant | " + " | ".join(p.removesuffix("_s") + " s" for p in PHASES) + " | / default, same round |",
             "|---|" + "---|" * (len(PHASES) + 1)]
    runs = res["variants"]
    med = {v: {k: statistics.median(r[k] for r in rows) for k in PHASES} for v, rows in runs.items() if rows}
    for v, m in med.items():  # each round's step over the default's in the same round
        ratio = statistics.median(a["step_s"] / b["step_s"] for a, b in zip(runs[v], runs["default"]))
        lines.append(f"| {v} | " + " | ".join(f"{m[k]:.2f}" for k in PHASES) + f" | {ratio:.2f} |")
    lines += ["", "Each round's timed step, s: " + "; ".join(
        f"{v} " + ", ".join(f"{r['step_s']:.1f}" for r in rows) for v, rows in runs.items() if rows), ""]
    r = res.get("rollouts")
    if r:
        med = {w: {k: statistics.median(v) for k, v in d.items()} for w, d in r["ways"].items()}
        d, m = med["direct"], med["model_forward"]
        lines += ["| decode steps through | demo rollout s | greedy held-out pass s |", "|---|---|---|",
                  f"| the layers called directly | {d['rollout_s']:.2f} | {d['greedy_s']:.2f} |",
                  f"| the model's forward | {m['rollout_s']:.2f} | {m['greedy_s']:.2f} |",
                  f"| ratio | {d['rollout_s'] / m['rollout_s']:.2f} | {d['greedy_s'] / m['greedy_s']:.2f} |", "",
                  f"The two ways alternating, medians of {s['rounds']}; greedy pass over "
                  f"{r['held_out_questions']} held-out questions, 16 new tokens; identical tokens: "
                  f"{r['identical_tokens']}.", ""]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="a multiple of 3: each variant first, second and third "
                        "in a round equally often (the first meets the round's shapes first: oneDNN builds kernels)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", default=None)
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.max_new_tokens = 1, 16
    import rlpr  # noqa: F401  (before torch, as `rlpr train`)
    from speedbench.report import machine, save
    from speedbench.settings import rlpr_config

    from rlpr.train.trainer import Trainer

    out = Path(args.output or (Path(tempfile.gettempdir()) / "rlpr-step-variants" if args.quick else
                               Path(__file__).resolve().parent / "results" / "step_variants"))
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "quick": args.quick,
           "settings": {"rounds": args.rounds, "warmup": args.warmup, "max_new_tokens": args.max_new_tokens},
           "machine": {**machine(), "load_before": round(os.getloadavg()[0], 1)}}
    work = Path(tempfile.mkdtemp(prefix="rlpr-variants-"))
    total = args.warmup + 2 * len(VARIANTS) * args.rounds  # the trainer's max_steps: every step below
    cfg, _ = rlpr_config(argparse.Namespace(warmup=0, steps=total, max_new_tokens=args.max_new_tokens, threads=0,
                                            quick=args.quick), str(work))
    trainer = Trainer(cfg, work / "run")
    res.update(steps(trainer, args))
    res["rollouts"] = rollouts(trainer, args)
    res["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    res["machine"]["load_after"] = round(os.getloadavg()[0], 1)
    print(save(res, out, report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
