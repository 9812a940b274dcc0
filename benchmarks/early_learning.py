"""Why RLPR learns slower early than the label-free rewards (issue 61, item 1): per-step accounting of
one RLPR run and one self-certainty run at the `small` preset, from their metrics.jsonl.

    python benchmarks/early_learning.py run                      # trains both, one after the other
    python benchmarks/early_learning.py report RUN_A RUN_B ...   # the tables from finished runs
    python benchmarks/early_learning.py compare                  # item 3: the variants' rows, fair in compute

The per-step quantities (COLUMNS) are compared as means over the filter's warm-up and after it, and as
totals (docs/training.md, "Filling the batch"); `compare` reads the learning rows of the early-learning
variants (`learning.py --variants rlpr,rlpr_fill,rlpr_lr2x --output benchmarks/results/early_learning_runs`)
at equal steps and equal rollouts (learnbench/budget.py). Writes results/early_learning.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import yaml
from harness import files, record
from harness.files import header, save, table
from learnbench import budget
from learnbench.records import read_records
from learnbench.rows import load_rows

OUT = Path(__file__).resolve().parent / "results" / "early_learning"
RUNS = OUT.with_name("early_learning_runs.jsonl")
KINDS = ("probability", "self_certainty")
# (metric key, column title, total it adds up to or None)
COLUMNS = [("filter/generated_groups", "generated", True), ("filter/passed_groups", "passed", True),
           ("policy/groups", "trained", True), ("policy/tokens", "tokens", True),
           ("policy/adv_abs_mean", "mean abs A", False), ("policy/grad_norm", "grad norm", False),
           ("filter/mean_std", "group std", False), ("reward/mean", "reward", False),
           ("filter/nonzero_std_frac", "groups with std > 0", False), ("policy/entropy", "entropy", False),
           ("rollout/responses", "responses", True),
           ("rollout/responses_total", "responses so far", False)]


def train(kind: str, steps: int, out: Path, seed: int) -> float:
    """One `rlpr train --preset small` run of `kind` (one torch thread); its wall time in seconds."""
    args = [sys.executable, "-m", "rlpr", "train", "--preset", "small", "model.threads=1",
            f"trainer.max_steps={steps}", f"reward.kind={kind}", f"trainer.seed={seed}",
            f"trainer.output_dir={out}", f"trainer.name={kind}"]
    tick = time.time()
    subprocess.run(args, check=True)
    return time.time() - tick


def load(run: Path) -> dict:
    """A run's steps (the COLUMNS keys), its held-out accuracy before/after and its config's essentials."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    steps = [{"step": r["step"], **{k: r.get(k) for k, _, _ in COLUMNS}} for r in rows if "policy/updates" in r]
    evals = {r["step"]: r.get("eval/accuracy") for r in rows if "eval/accuracy" in r}
    return {"run": run.name, "kind": cfg["reward"]["kind"], "seed": cfg["trainer"]["seed"],
            "warmup_steps": cfg["algorithm"]["filter_warmup_steps"],
            "max_sampling_tries": cfg["algorithm"]["max_sampling_tries"],
            "train_s": sum(r.get("perf/step_s") or 0.0 for r in rows), "steps": steps,
            "accuracy_before": evals.get(0), "accuracy_after": evals.get(max(evals)) if evals else None}


def mean(values) -> float:
    values = [v for v in values if v is not None and math.isfinite(v)]
    return sum(values) / len(values) if values else float("nan")


def summarize(run: dict) -> dict:
    """Means over the warm-up steps (no filter) and the filtered steps; totals over the run."""
    w = run["warmup_steps"]
    parts = {"warm-up": [s for s in run["steps"] if s["step"] <= w],
             "filtered": [s for s in run["steps"] if s["step"] > w], "all": run["steps"]}
    out = {name: {k: mean(s[k] for s in steps) for k, _, _ in COLUMNS} for name, steps in parts.items()}
    out["total"] = {k: sum(s[k] or 0 for s in run["steps"]) for k, _, adds in COLUMNS if adds}
    out["steps_without_update"] = sum(not s["policy/groups"] for s in run["steps"])
    return out


def fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:.3g}"


def markdown(data: dict) -> str:
    runs = data["runs"]
    names = [r["kind"] for r in runs]
    lines = ["# Early learning: where RLPR's steps differ from self-certainty's (issue 61)", "",
             *([header(data), ""] if data.get("machine") else []), data.get("note", ""), "", "## Means per step (warm-up: no filter; filtered: the filter on), totals", "",
             "Ratio: the first run's value over the second's.", ""]
    parts = ("warm-up", "filtered", "all", "total")
    head = ["quantity"] + [f"{part}: {' / '.join(names)}" + (" (ratio)" if len(runs) == 2 else "") for part in parts]

    def cell(part: str, key: str) -> str:
        values = [r["summary"][part].get(key) for r in runs]
        if any(v is None for v in values):
            return ""
        ratio = f" ({fmt(values[0] / values[1])})" if len(values) == 2 and values[1] else ""
        return " / ".join(fmt(v) for v in values) + ratio

    lines += table(head, ([title, *(cell(part, key) for part in parts)] for key, title, _ in COLUMNS[:-1]))
    lines += ["", *table(["run", "steps without an update", "held-out Avg@8 before", "after", "training s (steps)"], (
        [f"{r['kind']} (seed {r['seed']})", r["summary"]["steps_without_update"],
         *(fmt(100 * a) + "%" if a is not None else "-" for a in (r["accuracy_before"], r["accuracy_after"])),
         fmt(r["train_s"])] for r in runs))]
    for r in runs:
        lines += ["", f"## Per step: {r['kind']}", "", *table(["step", *(t for _, t, _ in COLUMNS)], (
            [s["step"], *(fmt(s[k]) for k, _, _ in COLUMNS)] for s in r["steps"]))]
    if data.get("findings"):
        lines += ["", "## What it points to", "", data["findings"]]
    if data.get("comparison"):
        c = data["comparison"]
        lines += ["", "## The variants at equal steps and at equal rollouts (item 3)", "", c.get("note", ""), "",
                  *budget.markdown(c)]
        if c.get("findings"):
            lines += ["", c["findings"]]
    if data.get("longer"):
        c = data["longer"]
        lines += ["", f"## Trained longer: {c['steps']} steps (item 3)", "", c.get("note", ""), "", *budget.markdown(c)]
    return "\n".join(lines) + "\n"


def longer_rows(steps: int, variants: list[str]):
    """`keep` for comparison_runs: the `small` preset's SmolLM2 rows of `variants` at `steps` steps, graded
    with the current grader (the learning benchmark's main .jsonl holds every preset, model and length)."""
    from rlpr.grading import GRADER_VERSION

    def keep(row: dict) -> bool:
        s = row.get("settings", {})
        return (row["steps"] == steps and row["variant"] in variants and s.get("preset") == "small"
                and not s.get("model") and not s.get("set") and s.get("grader_version") == GRADER_VERSION)
    return keep


def comparison_runs(rows_path: Path, keep=lambda row: row.get("rollouts") is not None) -> list[dict]:
    """The trained rows of a learning-benchmark .jsonl that `keep` accepts (by default those that record
    their rollouts), each with its curve in rollouts (budget.curve)."""
    out = []
    for row in load_rows(rows_path):
        if row["variant"] == "base" or not keep(row):
            continue
        records = read_records(rows_path.parent / row["responses"]) if row.get("responses") else []
        out.append({k: row.get(k) for k in ("variant", "seed", "steps", "acc_after", "n_heldout", "rollouts", "wall_s")}
                   | {"curve_points": budget.curve(row, records), "n_curve": row.get("curve_questions") or 0})
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="train RLPR and self-certainty at the small preset, then report")
    r.add_argument("--steps", type=int, default=20)
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--runs", type=Path, default=Path("runs/early_learning"))
    rep = sub.add_parser("report", help="the tables from finished run directories")
    rep.add_argument("runs", type=Path, nargs="+")
    cmp = sub.add_parser("compare", help="item 3: the variants' learning rows at equal steps and equal rollouts")
    cmp.add_argument("--rows", type=Path, default=RUNS, help="the learning benchmark's .jsonl of those runs")
    cmp.add_argument("--longer", type=Path, help="also compare this .jsonl's rows at --longer-steps (the best RLPR "
                     "setting against RLPR and self-certainty trained longer: results/learning.jsonl)")
    cmp.add_argument("--longer-steps", type=int, default=60)
    cmp.add_argument("--longer-variants", default="rlpr,rlpr_lr2x,self_certainty")
    cmp.add_argument("--longer-note", default="", help="a paragraph over the longer comparison")
    for q in (r, rep, cmp):
        q.add_argument("--output", type=Path, default=OUT, help="path prefix of the result files (.json, .md)")
        q.add_argument("--note", default="", help="a paragraph under the title (machine, load, code)")
        q.add_argument("--findings", default="", help="the conclusions, as a paragraph at the end")
    args = p.parse_args(argv)
    if args.cmd == "compare":
        data = files.load(args.output) or {"runs": []}  # a new part of the result keeps the rest
        runs = comparison_runs(args.rows)
        if not runs:
            raise SystemExit(f"{args.rows}: no trained rows with rollouts recorded")
        data["comparison"] = budget.compare(runs) | {"note": args.note, "findings": args.findings}
        if args.longer:
            longer = comparison_runs(args.longer, longer_rows(args.longer_steps, args.longer_variants.split(",")))
            if not longer:
                raise SystemExit(f"{args.longer}: no rows of {args.longer_variants} at {args.longer_steps} steps")
            data["longer"] = budget.compare(longer) | {"note": args.longer_note}
        print(save(data | record.stamp(), args.output, markdown))
        return
    if args.cmd == "run":
        for kind in KINDS:
            train(kind, args.steps, args.runs, args.seed)
        dirs = [args.runs / kind for kind in KINDS]
    else:
        dirs = args.runs
    runs = [load(d) for d in dirs]
    for run in runs:
        run["summary"] = summarize(run)
    data = {"runs": runs, "note": args.note, "findings": args.findings}
    if comparison := (files.load(args.output) or {}).get("comparison"):  # item 3's comparison stays
        data["comparison"] = comparison
    print(save(data | record.stamp(), args.output, markdown))


if __name__ == "__main__":
    main()
