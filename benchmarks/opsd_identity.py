"""The OPSD identity, measured over whole training runs (issue 41, item 3).

For a model whose conditionals were one consistent joint distribution, the OPSD sum of a response o,
sum_t [log p(o_t | c(q, y*), o_<t) - log p(o_t | q, o_<t)], would equal RLPR's log-form debiased reward
log p(y* | q, o) - log p(y* | q). Each step of a `reward.kind=opsd` run measures both per response with
the teacher's weights (rlpr/train/opsd.py, `Distiller.identity`: score B's and score A's texts with the
run's cue conventions); this script runs short `small`-preset runs on the embedded SmolLM2-135M-Instruct
and on Gemma 3 270M (`--model gemma`, as the other benchmarks) and pools every response of each run:
Pearson's r and Spearman's rho with 95% intervals (Fisher z), the mean gap and the two sides' spread,
the least-squares slope of RLPR's side on the OPSD sum, and the per-step values of metrics.jsonl.

    python benchmarks/opsd_identity.py [--models smollm2 gemma] [--steps 8] [--seed 0] [--threads 2]

Writes benchmarks/results/opsd_identity.json and .md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' "Loading weights" bars (read at its import)
ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
# the identity's side of the run: OPSD with its defaults (the initial model as teacher, the JSD loss);
# no held-out evaluation (it does not enter the identity) and no checkpoints beyond the last
RUN = ["reward.kind=opsd", "data.val=", "trainer.report=false", "trainer.sample_every=0", "trainer.progress=false",
       "trainer.tensorboard=false", "trainer.save_every=0"]


def fisher_interval(r: float, n: int) -> tuple[float, float]:
    """The 95% interval of a correlation by Fisher's z (n - 3 degrees of freedom)."""
    if n < 4 or not math.isfinite(r) or abs(r) >= 1:
        return float("nan"), float("nan")
    z, half = math.atanh(r), 1.96 / math.sqrt(n - 3)
    return math.tanh(z - half), math.tanh(z + half)


def slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of y on x."""
    mx, my = statistics.fmean(x), statistics.fmean(y)
    sxx = sum((a - mx) ** 2 for a in x)
    return sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx if sxx else float("nan")


def summarize(pairs: list[tuple[int, float, float]]) -> dict:
    """Pooled statistics of (step, OPSD sum, RLPR's log reward) pairs."""
    from rlpr.algorithms.opsd import pearson, spearman

    x, y = [p[1] for p in pairs], [p[2] for p in pairs]
    r, rho = pearson(x, y), spearman(x, y)
    gaps = [a - b for a, b in zip(x, y)]
    return {"n": len(pairs), "pearson": r, "pearson_ci95": fisher_interval(r, len(pairs)), "spearman": rho,
            "spearman_ci95": fisher_interval(rho, len(pairs)), "mean_gap": statistics.fmean(gaps),
            "sd_gap": statistics.stdev(gaps), "mean_opsd_sum": statistics.fmean(x), "sd_opsd_sum": statistics.stdev(x),
            "mean_rlpr_log": statistics.fmean(y), "sd_rlpr_log": statistics.stdev(y), "slope_rlpr_on_opsd": slope(x, y)}


def run_model(model: str, steps: int, seed: int) -> dict:
    """One `reward.kind=opsd` run of `steps` steps; its pooled pairs, step-1 pairs and per-step metrics."""
    sys.path.insert(0, str(ROOT))
    from learning import MODELS

    from rlpr.config import load_config
    from rlpr.train.setup import load_data
    from rlpr.train.tracking import read_metrics
    from rlpr.train.trainer import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = load_config("small", [*MODELS[model], *RUN, f"trainer.max_steps={steps}", f"trainer.seed={seed}",
                                    f"trainer.output_dir={out}", "trainer.name=identity"])
        start = time.perf_counter()
        (Path(out) / "identity").mkdir()
        trainer = Trainer(cfg, Path(out) / "identity", examples=load_data(cfg))
        trainer.distiller.pairs = []  # every response's (step, S, R)
        trainer.run()
        seconds = time.perf_counter() - start
        per_step = [{k: m.get(k) for k in ("step", "opsd/identity_pearson", "opsd/identity_spearman",
                                           "opsd/identity_mean_gap", "opsd/identity_n", "opsd/jsd",
                                           "opsd/log_ratio_mean", "perf/teacher_s", "perf/identity_s", "perf/step_s")}
                    for m in read_metrics(Path(out) / "identity") if "opsd/identity_n" in m]
    pairs = trainer.distiller.pairs
    return {"model": model, "steps": steps, "seed": seed, "seconds": seconds, "teacher": cfg.opsd.teacher,
            "pooled": summarize(pairs), "step1": summarize([p for p in pairs if p[0] == 1]), "per_step": per_step,
            "pairs": [[s, round(a, 6), round(b, 6)] for s, a, b in pairs]}


def fmt_ci(ci) -> str:
    return f"[{ci[0]:.2f}, {ci[1]:.2f}]" if all(math.isfinite(c) for c in ci) else "n/a"


def markdown(results: list[dict], threads: int) -> str:
    lines = ["# The OPSD identity over whole runs", "",
             "Per response o of every step of a `reward.kind=opsd` run (`small` preset, the teacher = the initial "
             "model), with the teacher's weights p: the OPSD sum S = sum_t [log p(o_t | c(q, y*), o_<t) - "
             "log p(o_t | q, o_<t)] and RLPR's log-form debiased reward R = log p(y* | q, o) - log p(y* | q) "
             "(score B's and score A's texts, the run's cue conventions). For a consistent joint S = R for every "
             "response. `python benchmarks/opsd_identity.py`, "
             f"{threads} thread(s); the pairs are in opsd_identity.json.", "",
             "| model | steps | responses | Pearson r (95% CI) | Spearman rho (95% CI) | mean S - R (sd) | "
             "mean S (sd) | mean R (sd) | slope of R on S | step 1: r, rho |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for res in results:
        p, s1 = res["pooled"], res["step1"]
        lines.append(f"| {res['model']} | {res['steps']} | {p['n']} | {p['pearson']:.2f} {fmt_ci(p['pearson_ci95'])} | "
                     f"{p['spearman']:.2f} {fmt_ci(p['spearman_ci95'])} | {p['mean_gap']:.2f} ({p['sd_gap']:.2f}) | "
                     f"{p['mean_opsd_sum']:.2f} ({p['sd_opsd_sum']:.2f}) | {p['mean_rlpr_log']:.2f} "
                     f"({p['sd_rlpr_log']:.2f}) | {p['slope_rlpr_on_opsd']:.3f} | {s1['pearson']:.2f}, "
                     f"{s1['spearman']:.2f} |")
    lines += ["", "Per step (metrics.jsonl: `opsd/identity_pearson`, `opsd/identity_spearman`, "
              "`opsd/identity_mean_gap`):", "", "| model | step | Pearson | Spearman | mean gap | n |", "|---|---|---|---|---|---|"]
    for res in results:
        for m in res["per_step"]:
            lines.append(f"| {res['model']} | {m['step']} | {m['opsd/identity_pearson']:.2f} | "
                         f"{m['opsd/identity_spearman']:.2f} | {m['opsd/identity_mean_gap']:.2f} | "
                         f"{int(m['opsd/identity_n'])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2", "gemma"])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--output", default=str(RESULTS / "opsd_identity"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = [run_model(m, args.steps, args.seed) for m in args.models]
    Path(args.output + ".json").write_text(json.dumps({"threads": args.threads, "runs": results}, indent=1) + "\n")
    text = markdown(results, args.threads)
    Path(args.output + ".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
