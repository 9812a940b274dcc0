"""The rollout copy's Linear layers on oneDNN-prepacked weights (rollout.prepacked_weights) against plain F.linear.

In one process, on the embedded SmolLM2-135M-Instruct's rollout copy as the demo trainer builds it
(model.rollout_dtype=auto: bf16 on CPUs with fast bf16, fp32 capped to AVX2), alternating the two
ways `--reps` times and reporting medians:

1. one pass over every Linear layer of the copy at 1-256 input rows (a decode step's products);
2. the demo's rollout: 4 prompts x 8 responses x 64 new tokens (a new set of prompts per repetition,
   the same prompts and seeds for both ways), and whether the tokens are identical;
3. the weight sync that follows a step (LoRA merged and copied; with prepacking also laid out again).

    python benchmarks/prepacked.py --output benchmarks/results/prepacked_amd
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/prepacked.py --output benchmarks/results/prepacked_amd_avx2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from speedbench.report import machine, save


ROWS = (1, 8, 16, 24, 32, 64, 128, 256)
WAYS = ("plain", "prepacked")


def timed(fn) -> float:
    tick = time.perf_counter()
    fn()
    return time.perf_counter() - tick


def measure(reps: int, workdir: Path) -> dict:
    from rlpr.config import load_config
    from rlpr.model.prepacked import PrepackedLinear
    from rlpr.train.trainer import Trainer

    cfg = load_config("demo", [f"trainer.output_dir={workdir}", "trainer.tensorboard=false", "trainer.progress=false",
                               "rollout.prepacked_weights=on"])
    trainer = Trainer(cfg, workdir / "run")
    engine, model = trainer.engine, trainer.engine.model
    layers = [m for m in model.modules() if isinstance(m, PrepackedLinear)]

    def way(name: str) -> None:  # plain: the same modules without their layout (F.linear)
        for m in layers:
            if name == "prepacked":
                m.repack()
            else:
                m.packed = None

    seconds: dict = {w: {"linears": {r: [] for r in ROWS}, "rollout": [], "sync": []} for w in WAYS}
    tokens: dict = {w: [] for w in WAYS}
    with torch.no_grad():
        for rep in range(reps):
            prompts = [trainer.train_prompts[(4 * rep + i) % len(trainer.train_prompts)].token_ids for i in range(4)]
            for name in (WAYS if rep % 2 == 0 else WAYS[::-1]):
                way(name)
                for rows in ROWS:
                    xs = {n: torch.randn(rows, n, dtype=model.dtype) for n in {m.in_features for m in layers}}
                    seconds[name]["linears"][rows].append(timed(lambda: [m(xs[m.in_features]) for m in layers]))
                out: list = []
                seconds[name]["rollout"].append(timed(lambda: out.extend(engine.generate(
                    prompts, 8, max_new_tokens=64, temperature=1.0, top_p=1.0, seeds=[rep, 1, 2, 3]))))
                tokens[name].append([r.token_ids for r in out])
                engine.prepacked = name == "prepacked"
                seconds[name]["sync"].append(timed(lambda: engine.sync(trainer.policy)))
    med = {w: {"linears_ms": {r: 1e3 * statistics.median(v) for r, v in seconds[w]["linears"].items()},
               "rollout_s": statistics.median(seconds[w]["rollout"]), "sync_s": statistics.median(seconds[w]["sync"])}
           for w in WAYS}
    same = sum(a == b for x, y in zip(tokens["plain"], tokens["prepacked"]) for a, b in zip(x, y))
    return {"rollout_dtype": str(model.dtype).replace("torch.", ""), "reps": reps, "linear_layers": len(layers),
            "median": med, "raw_s": seconds, "identical_responses": same,
            "responses": sum(len(x) for x in tokens["plain"]),
            "generated_tokens": {w: sum(len(t) for x in tokens[w] for t in x) for w in WAYS}}


def report(res: dict) -> str:
    r, caps = res["row"], res["machine"]["isa_caps"]
    p, q = r["median"]["plain"], r["median"]["prepacked"]
    lines = [f"# The rollout copy's Linear layers prepacked for oneDNN vs plain ({res['date']})", "",
             f"SmolLM2-135M-Instruct's rollout copy ({r['rollout_dtype']}, {r['linear_layers']} Linear layers) as the demo "
             f"builds it; {res['machine']['cpu']}, {res['machine']['cpu_count']} CPUs"
             + (f" (capped: {', '.join(f'{k}={v}' for k, v in caps.items())})" if caps else "")
             + f"; medians of {r['reps']} alternating repetitions in one process.", "",
             "| input rows | plain ms | prepacked ms | prepacked / plain |", "|---|---|---|---|"]
    for rows in p["linears_ms"]:
        a, b = p["linears_ms"][rows], q["linears_ms"][rows]
        lines.append(f"| {rows} | {a:.1f} | {b:.1f} | {b / a:.2f} |")
    lines += ["", "(one pass over every Linear layer of the copy: a decode step's products at that many rows)", "",
              "| | plain | prepacked | prepacked / plain |", "|---|---|---|---|",
              f"| demo rollout s (4 x 8 x 64 tokens) | {p['rollout_s']:.2f} | {q['rollout_s']:.2f} | "
              f"{q['rollout_s'] / p['rollout_s']:.2f} |",
              f"| weight sync s | {p['sync_s']:.3f} | {q['sync_s']:.3f} | {q['sync_s'] / p['sync_s']:.2f} |",
              f"| generated tokens (all repetitions) | {r['generated_tokens']['plain']} | "
              f"{r['generated_tokens']['prepacked']} | |", "",
              f"**Rollout prepacked / plain: {q['rollout_s'] / p['rollout_s']:.2f}; per step net of the sync: "
              f"{p['rollout_s'] + p['sync_s'] - q['rollout_s'] - q['sync_s']:.2f} s saved.** Identical responses: "
              f"{r['identical_responses']} of {r['responses']} (bf16: the same products bit for bit; fp32: another "
              "summation order, so a sampled token can differ where two are nearly tied).", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "results" / "prepacked"))
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": machine(),
           "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="rlpr-prepacked-") as tmp:
        res["row"] = measure(args.reps, Path(tmp))
    print(save(res, args.output, report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
