"""An rlpr training step against TRL's GRPOTrainer doing the same work (issue 6; docs/benchmarks.md).

Each trainer runs in its own process (speedbench/rlpr_side.py, trl_side.py) and their steps alternate
(harness/baton.py), so that both meet the same load; the ratio is stated of the means and of each
adjacent step pair. TRL is needed by this benchmark only (`pip install trl==1.16.0`).

    python benchmarks/speed.py [--quick] [--steps 5 --warmup 1] [--output STEM]
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


def run_side(args) -> int:
    """One child: rlpr's or TRL's steps, each a turn of the baton; writes its part to --side-out. Its
    first turn begins before torch is imported, so that neither side's imports run during the
    other's work (rlpr picks its threads from what else keeps the CPUs busy)."""
    baton = Baton(args.baton)
    baton.begin()  # the setup turn: imports, model, trainer; run_rlpr / run_trl end it
    if args.side == "rlpr":  # as `rlpr train` runs: rlpr loaded before torch bounds OpenMP's idle spin
        import rlpr  # noqa: F401  (TRL's side keeps libgomp's default, as a TRL user has it)
    import torch

    from harness.memory import PeakRSS
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
    # one hash of the prompts' texts in order: the two sides must train on the same ones
    part["prompts_digest"] = hashlib.sha256("\x00".join(p.text for p in prompts).encode()).hexdigest()[:16]
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
    parser.add_argument("--skip-trl", action="store_true", help="rlpr's side only")
    parser.add_argument("--trl-bf16", action=argparse.BooleanOptionalAction, default=True,
                        help="TRL's bf16 flag (accelerate bf16 autocast on CPU)")
    parser.add_argument("--threads", type=int, default=0,
                        help="torch threads of both sides (0: rlpr its own choice, TRL torch's default)")
    parser.add_argument("--quick", action="store_true", help="1 warm-up + 1 timed step, 16 new tokens")
    parser.add_argument("--side", choices=SIDES, help=argparse.SUPPRESS)  # a child of the alternation
    parser.add_argument("--side-out", help=argparse.SUPPRESS)
    parser.add_argument("--baton", help=argparse.SUPPRESS)
    parser.add_argument("--output", default=None, help="path stem for .json/.md (default benchmarks/results/speed)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.warmup, args.max_new_tokens = 1, 1, 16
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.side:
        return run_side(args)
    import torch

    from harness.record import machine, versions
    from speedbench.report import write
    from speedbench.settings import demo_micro_batch

    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.output) if args.output else (QUICK_OUTPUT if args.quick else RESULTS / "speed")
    out = out.with_suffix("") if out.suffix in (".json", ".md") else out
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "quick": args.quick,
                 "settings": {"steps": args.steps, "warmup": args.warmup, "max_new_tokens": args.max_new_tokens,
                              "prompts_per_step": 4, "responses_per_prompt": 8,
                              "micro_batch_sequences": demo_micro_batch(),
                              "interleaved": True,  # each side in its own process, their steps alternating
                              "rss_method": "RSS (/proc/self/statm) sampled every 20 ms by a background thread (max per part); "
                                            "ru_maxrss = lifetime peak of the part's process"},
                 "versions": versions("peft", "accelerate", "trl"),
                 # isa_caps: an emulated AVX2 machine (benchmarks/demo_time.py's avx2 mode), the caps set
                 "machine": {**machine(), "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
                             "load_before": round(os.getloadavg()[0], 1)}}
    started = time.time()
    sides = ["rlpr"] if args.skip_trl else list(SIDES)
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
    res["wall_s"] = time.time() - started
    res["machine"]["load_after"] = round(os.getloadavg()[0], 1)
    text = write(res, args, out)
    print(text)
    print(f"wrote {out.with_suffix('.json')} and {out.with_suffix('.md')} ({res['wall_s']:.0f} s)", file=sys.stderr)
    return 0 if all(s in res for s in sides) else 1


if __name__ == "__main__":
    raise SystemExit(main())
