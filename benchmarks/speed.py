"""Speed of an rlpr training step against TRL's GRPOTrainer doing the same work (issue 6).

On the embedded SmolLM2-135M-Instruct, each trainer in its own process, their steps alternating
(harness/baton.py: setup, rlpr's step 1, TRL's step 1, rlpr's step 2, ...; one computes while
the other waits), so that both meet the same load from other processes:

1. rlpr: `--warmup` untimed + `--steps` timed `Trainer.train_step` calls at the demo settings
   (LoRA r16/alpha32, 4 prompts x 8 responses x 64 new tokens, the preset's micro-batch, bf16 rollout copy,
   bf16 autocast update, r1_user template + "<think>" pre-filled, reward.invalid_fallback=free),
   with exactly one rollout round per step (std filter off, max_sampling_tries=1). Breakdown per
   step: rollout, score B, score A, old log-probs, update, the rest (weight sync to the rollout
   copy, parsing, advantages). Then the held-out evaluation as the demo runs it.
2. TRL 1.16 `GRPOTrainer` on a fresh copy of the same model, the same prompts in the same order
   (the same chat-templated text with "<think>" pre-filled, given as plain-text prompts), the same
   LoRA, 8 generations x 4 prompts per optimizer step (per-device batch = the micro-batch, accumulated),
   64 new tokens, temperature 1.0, beta 0, clip 0.2/0.27, entropy bonus 1e-3, bf16 autocast on
   CPU, gradient checkpointing off, and a reward function that computes the SAME probability
   reward with rlpr's `ProbabilityReward` on TRL's current model (score A with the adapter off,
   cached per prompt, as rlpr does). Steps are timed with a `TrainerCallback`.
3. Micro-benchmarks in a fresh process after both (`--micro-only`), on a fresh model: (a) the
   score-B path on 32 prompt+response+reference texts from a rollout vs one bare forward of the
   model over the same number of tokens; (b) rollout throughput of `HFRollout` at batch 32 (bf16)
   vs the weight-streaming floor of a decode step.

The ratio is stated of the means and of each timed step pair (rlpr's step k over TRL's step k,
adjacent in time), with the median of the pairs. Peak RSS per part comes from a background thread
sampling its process's RSS every 20 ms (psutil), beside the process's `ru_maxrss`.

    python benchmarks/speed.py                    # full: about 10-15 minutes on an idle 2-core CPU
    python benchmarks/speed.py --quick            # smoke test (1+1 steps, 16 tokens), a few minutes
    python benchmarks/speed.py --steps 3 --warmup 1 --skip-micro

Writes benchmarks/results/speed.json (all numbers, settings, versions, date, notes) and speed.md
(`--quick` writes to /tmp/rlpr-speed-quick/ unless --output is given). TRL is only needed by this
benchmark; it is not a dependency of rlpr.

This file is the entry point (the command line, the two sides' processes and their turns, the
micro-benchmarks' child process); the parts are the package beside it, speedbench/: settings.py (the
demo settings both trainers run at, the prompts in rlpr's order), memory.py (PeakRSS), tokens.py,
score_b_paths.py, rlpr_side.py (part 1), trl_side.py (part 2), micro.py (part 3) and report.py (notes,
speed.json, speed.md; markdown(), also importable from here, re-renders a saved result); the turns and
the machine record come from the shared harness/ (baton.py, record.py, files.py). A
package named `speed` would shadow this script for `import speed`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

if str(Path(__file__).resolve().parent) not in sys.path:  # run as a script, or loaded from its path by a test
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness.baton import Baton, alternate, start  # noqa: E402  (standard library only)

RESULTS = Path(__file__).resolve().parent / "results"
QUICK_OUTPUT = Path(tempfile.gettempdir()) / "rlpr-speed-quick" / "speed"
SIDES = ("rlpr", "trl")


def markdown(res: dict) -> str:
    """speed.markdown(json) re-renders a saved result."""
    from speedbench.report import markdown as render

    return render(res)


def run_micro_in_child(args, path: Path) -> dict:
    """The micro-benchmarks in a fresh interpreter: after TRL in the same process they once ran
    3-4x slower (decode floor 149 vs 593 tok/s), so they must not inherit the parent's state."""
    import subprocess

    cmd = [sys.executable, __file__, "--micro-only", str(path), "--micro-new-tokens", str(args.micro_new_tokens),
           "--micro-reps", str(args.micro_reps), "--max-new-tokens", str(args.max_new_tokens),
           "--threads", str(args.threads)]
    subprocess.run(cmd, check=True)
    return json.loads(path.read_text())


def prompts_digest(prompts: list) -> str:
    """One hash of the prompts' texts in order: the two sides must train on the same ones."""
    return hashlib.sha256("\x00".join(p.text for p in prompts).encode()).hexdigest()[:16]


def run_side(args) -> int:
    """One child: rlpr's or TRL's steps, each a turn of the baton; writes its part to --side-out. Its
    first turn begins before torch is imported, so that neither side's imports run during the
    other's work (rlpr picks its threads from what else keeps the CPUs busy)."""
    baton = Baton(args.baton)
    baton.begin()  # the setup turn: imports, model, trainer; run_rlpr / run_trl end it
    if args.side == "rlpr":  # as `rlpr train` runs: rlpr loaded before torch bounds OpenMP's idle spin
        import rlpr  # noqa: F401  (TRL's side keeps libgomp's default, as a TRL user has it)
    import torch

    from speedbench.memory import PeakRSS
    from speedbench.settings import demo_prompts

    if args.threads:
        torch.set_num_threads(args.threads)
    work = Path(args.side_out).parent
    with PeakRSS() as mem:
        if args.side == "rlpr":
            from speedbench.rlpr_side import run_rlpr

            part, prompts = run_rlpr(args, work, baton)
        else:
            from speedbench.trl_side import run_trl

            prompts = demo_prompts(args, str(work), 4 * (args.warmup + args.steps))
            part = run_trl(args, work, prompts, baton)
    part["memory"] = mem.to_dict()
    part["gomp_spincount"] = os.environ.get("GOMP_SPINCOUNT")  # None: libgomp's default (300,000)
    part["prompts_digest"] = prompts_digest(prompts)
    Path(args.side_out).write_text(json.dumps(part, default=str))
    return 0


def pair_ratios(res: dict) -> list[float]:
    """rlpr's step k over TRL's step k, for each timed k: steps next to each other in time."""
    trl = {r["step"]: r["step_s"] for r in res["trl"]["steps"] if not r["warmup"]}
    return [r["step_s"] / trl[r["step"]] for r in res["rlpr"]["steps"] if not r["warmup"] and r["step"] in trl]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps per trainer")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps before them")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--micro-new-tokens", type=int, default=128, help="new tokens in micro-benchmark (b)")
    parser.add_argument("--micro-reps", type=int, default=5, help="repetitions per micro measurement (median)")
    parser.add_argument("--skip-trl", action="store_true")
    parser.add_argument("--skip-rlpr", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--skip-micro", action="store_true")
    parser.add_argument("--skip-eval", action="store_true", help="leave out the held-out evaluation's timing")
    parser.add_argument("--trl-bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="TRL's bf16 flag (accelerate bf16 autocast on CPU)")
    parser.add_argument("--trl-model-dtype", choices=["float32", "bfloat16"], default="float32",
                        help="dtype of TRL's model copy (default: fp32 master weights, as rlpr)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads of both sides (0: rlpr its own choice, TRL torch's default)")
    parser.add_argument("--quick", action="store_true", help="1 warm-up + 1 timed step, 16 new tokens, 1 rep")
    parser.add_argument("--micro-only", metavar="JSON", help=argparse.SUPPRESS)  # the child of run_micro_in_child
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child of the alternation
    parser.add_argument("--side-out", help=argparse.SUPPRESS)
    parser.add_argument("--baton", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None, help="path stem for .json/.md (default benchmarks/results/speed)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.max_new_tokens, args.micro_new_tokens, args.micro_reps = 1, 1, 16, 16, 1
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.side:
        return run_side(args)
    import torch

    from speedbench.memory import PeakRSS
    from speedbench.micro import run_micro
    from harness.record import machine
    from speedbench.report import versions, write
    from speedbench.settings import demo_micro_batch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.micro_only:
        with PeakRSS() as mem:
            micro = run_micro(args)
        micro["memory"] = mem.to_dict()
        Path(args.micro_only).write_text(json.dumps(micro, default=str))
        return 0
    out = Path(args.output) if args.output else (QUICK_OUTPUT if args.quick else RESULTS / "speed")
    out = out.with_suffix("") if out.suffix in (".json", ".md") else out
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "quick": args.quick,
                 "settings": {"steps": args.steps, "warmup": args.warmup, "max_new_tokens": args.max_new_tokens,
                              "prompts_per_step": 4, "responses_per_prompt": 8,
                              "micro_batch_sequences": demo_micro_batch(),
                              "micro_new_tokens": args.micro_new_tokens, "micro_reps": args.micro_reps,
                              "interleaved": True,  # each side in its own process, their steps alternating
                              "rss_method": "psutil RSS sampled every 20 ms by a background thread (max per part); "
                                            "ru_maxrss = lifetime peak of the part's process"},
                 "versions": versions(),
                 # isa_caps: an emulated AVX2 machine (benchmarks/demo_time.py's avx2 mode), the caps set
                 "machine": {**machine(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
                             "load_before": round(os.getloadavg()[0], 1)}}
    started = time.time()
    sides = [s for s in SIDES if not getattr(args, f"skip_{s}")]
    with tempfile.TemporaryDirectory(prefix="rlpr-speed-") as tmp:
        work = Path(tmp)
        print(f"== {' and '.join(sides)}, steps alternating (each in its own process)", flush=True)
        children = []
        for name in sides:
            (work / name).mkdir()
            children.append(start(name, [sys.executable, __file__, *sys.argv[1:], "--side", name,
                                         "--side-out", str(work / name / "part.json")]))
        codes = alternate(children)
        for child, code in zip(children, codes):
            part = work / child.name / "part.json"
            if code or not part.exists():
                print(f"the {child.name} side failed (exit code {code})", file=sys.stderr)
                continue
            res[child.name] = json.loads(part.read_text())
        if "rlpr" in res and "trl" in res:
            res["ratio_rlpr_over_trl"] = res["rlpr"]["mean"]["step_s"] / res["trl"]["mean"]["step_s"]
            res["pair_ratios"] = pair_ratios(res)
            res["ratio_median_of_pairs"] = median(res["pair_ratios"]) if res["pair_ratios"] else None
            res["same_prompts"] = res["rlpr"]["prompts_digest"] == res["trl"]["prompts_digest"]
        write(res, args, out)  # keep what is done if the micro-benchmarks fail
        if not args.skip_micro:
            print("== micro-benchmarks (in a fresh process)", flush=True)
            res["micro"] = run_micro_in_child(args, work / "micro.json")
    res["wall_s"] = time.time() - started
    res["machine"]["load_after"] = round(os.getloadavg()[0], 1)
    text = write(res, args, out)
    print(text)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')} ({res['wall_s']:.0f} s)", file=sys.stderr)
    return 0 if all(s in res for s in sides) else 1


if __name__ == "__main__":
    raise SystemExit(main())
