"""Speed of an rlpr training step against TRL's GRPOTrainer doing the same work (issue 6).

In one process, on the embedded SmolLM2-135M-Instruct:

1. rlpr: `--warmup` untimed + `--steps` timed `Trainer.train_step` calls at the demo settings
   (LoRA r16/alpha32, 4 prompts x 8 responses x 64 new tokens, the preset's micro-batch, bf16 rollout copy,
   bf16 autocast update, r1_user template + "<think>" pre-filled, reward.invalid_fallback=free),
   with exactly one rollout round per step (std filter off, max_sampling_tries=1). Breakdown per
   step: rollout, score B, score A, old log-probs, update, the rest (weight sync to the rollout
   copy, parsing, advantages).
2. TRL 1.16 `GRPOTrainer` on a fresh copy of the same model, the same prompts in the same order
   (the same chat-templated text with "<think>" pre-filled, given as plain-text prompts), the same
   LoRA, 8 generations x 4 prompts per optimizer step (per-device batch = the micro-batch, accumulated),
   64 new tokens, temperature 1.0, beta 0, clip 0.2/0.27, entropy bonus 1e-3, bf16 autocast on
   CPU, gradient checkpointing off, and a reward function that computes the SAME probability
   reward with rlpr's `ProbabilityReward` on TRL's current model (score A with the adapter off,
   cached per prompt, as rlpr does). Steps are timed with a `TrainerCallback`.
3. Micro-benchmarks in a fresh process (`--micro-only`), on a fresh model: (a) the score-B path on 32 prompt+response+reference texts
   from a rollout vs one bare forward of the model over the same number of tokens; (b) rollout
   throughput of `HFRollout` at batch 32 (bf16) vs the weight-streaming floor of a decode step.

Peak RSS per part comes from a background thread sampling the process RSS every 20 ms (psutil);
`ru_maxrss` (the process's lifetime peak) is recorded too, and is exact only for the first part,
rlpr, which therefore runs first. Between parts the previous objects are freed and `malloc_trim`
returns memory to the OS.

    python benchmarks/speed.py                    # full: about 15-25 minutes on an idle 2-core CPU
    python benchmarks/speed.py --quick            # smoke test (1+1 steps, 16 tokens), a few minutes
    python benchmarks/speed.py --steps 5 --warmup 1 --skip-micro

Writes benchmarks/results/speed.json (all numbers, settings, versions, date, notes) and speed.md
(`--quick` writes to /tmp/rlpr-speed-quick/ unless --output is given). TRL is only needed by this
benchmark; it is not a dependency of rlpr.

This file is the entry point (the command line, the order of the parts, the micro-benchmarks'
child process); the parts are the package beside it, speedbench/: settings.py (the demo settings
both trainers run at), memory.py (PeakRSS, freeing between parts), rlpr_side.py (part 1),
trl_side.py (part 2), micro.py (part 3) and report.py (versions, notes, speed.json, speed.md;
markdown(), also importable from here, re-renders a saved result). A package named `speed` would
shadow this script for `import speed`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch


if str(Path(__file__).resolve().parent) not in sys.path:  # run as a script, or loaded from its path by a test
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from speedbench.memory import PeakRSS, release_memory  # noqa: E402
from speedbench.micro import run_micro  # noqa: E402
from speedbench.report import machine, versions, write  # noqa: E402
from speedbench.report import markdown  # noqa: E402,F401  (speed.markdown(json) re-renders a saved result)
from speedbench.rlpr_side import run_rlpr  # noqa: E402
from speedbench.settings import demo_micro_batch, rlpr_config  # noqa: E402
from speedbench.trl_side import run_trl  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
QUICK_OUTPUT = Path(tempfile.gettempdir()) / "rlpr-speed-quick" / "speed"


def run_micro_in_child(args, path: Path) -> dict:
    """The micro-benchmarks in a fresh interpreter: after TRL in the same process they once ran
    3-4x slower (decode floor 149 vs 593 tok/s), so they must not inherit the parent's state."""
    import subprocess

    cmd = [sys.executable, __file__, "--micro-only", str(path), "--micro-new-tokens", str(args.micro_new_tokens),
           "--micro-reps", str(args.micro_reps), "--max-new-tokens", str(args.max_new_tokens),
           "--threads", str(args.threads)]
    subprocess.run(cmd, check=True)
    return json.loads(path.read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps per trainer")
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
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--quick", action="store_true", help="1 warm-up + 1 timed step, 16 new tokens, 1 rep")
    parser.add_argument("--micro-only", metavar="JSON", help=argparse.SUPPRESS)  # the child of run_micro_in_child
    parser.add_argument("--output", default=None, help="path stem for .json/.md (default benchmarks/results/speed)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.max_new_tokens, args.micro_new_tokens, args.micro_reps = 1, 1, 16, 16, 1
    out = Path(args.output) if args.output else (QUICK_OUTPUT if args.quick else RESULTS / "speed")
    out = out.with_suffix("") if out.suffix in (".json", ".md") else out
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.micro_only:
        with PeakRSS() as mem:
            micro = run_micro(args)
        micro["memory"] = mem.to_dict()
        Path(args.micro_only).write_text(json.dumps(micro, default=str))
        return 0

    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "quick": args.quick,
                 "settings": {"steps": args.steps, "warmup": args.warmup, "max_new_tokens": args.max_new_tokens,
                              "prompts_per_step": 4, "responses_per_prompt": 8,
                              "micro_batch_sequences": demo_micro_batch(),
                              "micro_new_tokens": args.micro_new_tokens, "micro_reps": args.micro_reps,
                              "rss_method": "psutil RSS sampled every 20 ms by a background thread (max per part); "
                                            "ru_maxrss = lifetime peak of the process"},
                 "versions": versions(),
                 # isa_caps: an emulated AVX2 machine (benchmarks/demo_time.py's avx2 mode), the caps set
                 "machine": {**machine(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
                             "load_before": round(os.getloadavg()[0], 1)}}
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="rlpr-speed-") as tmp:
        work = Path(tmp)
        prompts = None
        if not args.skip_rlpr:
            print("== rlpr", flush=True)
            with PeakRSS() as mem:
                res["rlpr"], prompts = run_rlpr(args, work)
            res["rlpr"]["memory"] = mem.to_dict()
            write(res, args, out)  # keep what is done if a later part fails
            release_memory()
        if not args.skip_trl:
            if prompts is None:  # the prompts rlpr would have used
                from rlpr.data.prompts import PromptStream, prepare_prompts
                from rlpr.model.loading import load_tokenizer
                from rlpr.train.setup import load_examples_for

                cfg, _ = rlpr_config(args, tmp)
                tok = load_tokenizer(cfg.model.path)
                train, _ = prepare_prompts(load_examples_for(cfg, "train"), tok, cfg.data.max_prompt_tokens,
                                           cfg.data.prefill)
                stream = PromptStream(len(train), cfg.trainer.seed, cfg.data.shuffle)
                prompts = [train[i] for i in stream.take(4 * (args.warmup + args.steps))]
            print("== TRL", flush=True)
            with PeakRSS() as mem:
                res["trl"] = run_trl(args, work, prompts)
            res["trl"]["memory"] = mem.to_dict()
            if "rlpr" in res:
                res["ratio_rlpr_over_trl"] = res["rlpr"]["mean"]["step_s"] / res["trl"]["mean"]["step_s"]
            write(res, args, out)
            release_memory()
        if not args.skip_micro:
            print("== micro-benchmarks (in a fresh process)", flush=True)
            res["micro"] = run_micro_in_child(args, work / "micro.json")
    res["wall_s"] = time.time() - started
    res["machine"]["load_after"] = round(os.getloadavg()[0], 1)
    text = write(res, args, out)
    print(text)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')} ({res['wall_s']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
