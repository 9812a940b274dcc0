"""Does RLPR teach the embedded model? A small, honest learning benchmark (issue 7).

Trains SmolLM2-135M-Instruct with LoRA from the demo preset and evaluates it on held-out
questions before and after, for four variants, over several seeds:

- `rlpr`: the default (mean token probability, debiased by score A, EMA std filter),
- `no_debias`: reward.debias=false,
- `no_std_filter`: algorithm.std_filter=false,
- `seq_likelihood`: reward.aggregation=seq_likelihood instead of the mean token probability.

Datasets: the built-in demo tasks (train/held-out split of the generator), and real data:
MMLU questions from `../shared/data/mmlu` (train on the `val` split, evaluate on the `dev`
split; the `test` split is never used). Every run is evaluated with the SAME scorer (the `rlpr`
variant's reward) and greedy decoding, so that rewards are comparable across variants:
mean probability reward, score B, exact-match / letter accuracy, format rate, response length.

    python benchmarks/learning.py            # full: about 2 hours on 2 CPU cores
    python benchmarks/learning.py --quick    # under 15 minutes (1 seed, demo tasks, 3 steps)

Two 1-thread workers use 2 cores better than one 2-thread process (small matmuls scale poorly):
    python benchmarks/learning.py --threads 1 & python benchmarks/learning.py --threads 1 --reverse

Each finished run is appended to benchmarks/results/learning.jsonl, and a re-run skips runs that
are already there (so an interrupted benchmark loses at most the run in progress); the summary
goes to learning.json and learning.md (mean and sample standard deviation over seeds).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
SHARED = ROOT.parent.parent / "shared" / "data"

VARIANTS = {
    "rlpr": [],
    "no_debias": ["reward.debias=false"],
    "no_std_filter": ["algorithm.std_filter=false"],
    "seq_likelihood": ["reward.aggregation=seq_likelihood"],
}
METRICS = ["eval/accuracy", "eval/reward_mean", "eval/score_b_mean", "eval/format_rate", "eval/response_len_mean"]


def datasets(workdir: Path, val_size: int) -> dict[str, list[str]]:
    """Config overrides per dataset; MMLU is converted once to verl parquet in `workdir`."""
    from rlpr.data.convert import convert_file

    out = {"demo": ["data.train=demo", "data.val=demo", f"data.demo_val_size={val_size}"]}
    mmlu = SHARED / "mmlu"
    if mmlu.is_dir():
        train, val = workdir / "mmlu_val.parquet", workdir / "mmlu_dev.parquet"
        if not train.exists():
            convert_file("mmlu", mmlu / "mmlu_val.jsonl", train, template="r1_user")
            convert_file("mmlu", mmlu / "mmlu_dev.jsonl", val, template="r1_user")
        out["mmlu"] = [f"data.train={train}", f"data.val={val}", f"data.val_limit={val_size}"]
    return out


def evaluate(trainer, base_cfg) -> dict:
    """Held-out evaluation of `trainer`'s policy with the common (rlpr variant's) scorer."""
    from rlpr.data.prompts import prepare_prompts
    from rlpr.forward import causal_lm
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.trainer import load_examples_for

    cfg = trainer.cfg
    examples = load_examples_for(base_cfg, "val")[:base_cfg.data.val_limit or None]
    trainer.val_prompts, _ = prepare_prompts(examples, trainer.tokenizer, cfg.data.max_prompt_tokens,
                                             cfg.data.prefill)
    max_length = getattr(causal_lm(trainer.policy).config, "max_position_embeddings", None)
    trainer.reward = ProbabilityReward(base_cfg.reward, trainer.tokenizer, cfg.rollout.temperature, max_length)
    trainer.cfg = base_cfg  # score A from the adapter-off base, with the common reward settings
    try:
        return trainer.evaluate()
    finally:
        trainer.cfg = cfg


def training_summary(run_dir: Path) -> dict:
    from rlpr.tracking import read_metrics

    steps = [r for r in read_metrics(run_dir) if "reward/mean" in r]

    def avg(key, part=slice(None)):
        values = [r[key] for r in steps[part] if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    return {"steps": len(steps), "train_reward_first": avg("reward/mean", slice(0, 2)),
            "train_reward_last": avg("reward/mean", slice(-2, None)),
            "nonzero_std_frac": avg("filter/nonzero_std_frac"), "kept_frac": avg("filter/kept_frac"),
            "min_kept_groups": min((r.get("filter/kept_groups", 0) for r in steps), default=0),
            "step_s": avg("perf/step_s")}


def run_one(dataset: str, variant: str, seed: int, overrides: list[str], workdir: Path) -> dict:
    from rlpr.config import load_config
    from rlpr.trainer import Trainer

    base = load_config("demo", overrides + [f"trainer.seed={seed}"])
    cfg = load_config("demo", overrides + VARIANTS[variant] + [
        f"trainer.seed={seed}", "data.val=", "trainer.tensorboard=false", "trainer.progress=false",
        f"trainer.output_dir={workdir / 'runs'}", f"trainer.name={dataset}-{variant}-{seed}-{time.time_ns()}"])
    start = time.time()
    trainer = Trainer(cfg, Path(cfg.trainer.output_dir) / cfg.trainer.name)
    trainer.run()
    after = evaluate(trainer, base)
    return {"dataset": dataset, "variant": variant, "seed": seed, **{f"after/{k}": after[k] for k in METRICS},
            **training_summary(trainer.run_dir), "seconds": time.time() - start}


def run_base(dataset: str, overrides: list[str]) -> dict:
    """The untrained model (LoRA B = 0), evaluated like the trained ones; greedy, so seed-free."""
    from rlpr.config import load_config
    from rlpr.trainer import Trainer

    cfg = load_config("demo", overrides + ["trainer.tensorboard=false", "trainer.progress=false"])
    start = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, Path(tmp))
        before = evaluate(trainer, cfg)
    return {"dataset": dataset, "variant": "base", "seed": None, **{f"before/{k}": before[k] for k in METRICS},
            "questions": before["eval/questions"], "seconds": time.time() - start}


def read_rows(log_path: Path, settings: dict) -> list[dict]:
    rows = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    return [r for r in rows if r.get("settings") == settings]


def claim(workdir: Path, job: tuple, settings: dict) -> bool:
    """Several workers (e.g. two 1-thread processes on 2 cores) share the job list: each job is
    claimed by creating a file; delete `workdir/claims` to re-run abandoned jobs."""
    claims = workdir / "claims"
    claims.mkdir(exist_ok=True)
    name = "-".join(str(v) for v in (*job, *settings.values()))
    try:
        (claims / name).open("x").close()
        return True
    except FileExistsError:
        return False


def summarise(rows: list[dict]) -> tuple[list[dict], str]:
    base = {r["dataset"]: r for r in rows if r["variant"] == "base"}
    table, lines = [], [
        ("| data | variant | seeds | accuracy before | accuracy after | reward before | reward after | "
         "score B before | score B after | format after | length after | groups with std > 0 (train) | s/step |"),
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for dataset in base:
        b = base[dataset]
        for variant in VARIANTS:
            runs = [r for r in rows if r["dataset"] == dataset and r["variant"] == variant]
            if not runs:
                continue
            entry = {"dataset": dataset, "variant": variant, "seeds": [r["seed"] for r in runs],
                     "questions": b["questions"]}
            for k in METRICS:
                values = [r[f"after/{k}"] for r in runs]
                entry[f"before/{k}"] = b[f"before/{k}"]
                entry[f"after/{k}"] = statistics.fmean(values)
                entry[f"after_sd/{k}"] = statistics.stdev(values) if len(values) > 1 else 0.0
            for k in ("nonzero_std_frac", "kept_frac", "step_s"):
                values = [r[k] for r in runs if r.get(k) is not None]
                entry[k] = statistics.fmean(values) if values else None
            table.append(entry)

            def pm(k, scale=1.0, digits=3):  # no spread from a single seed
                spread = f" ± {entry[f'after_sd/{k}'] * scale:.{digits}f}" if len(runs) > 1 else ""
                return f"{entry[f'after/{k}'] * scale:.{digits}f}{spread}"

            lines.append(
                f"| {dataset} | {variant} | {len(runs)} | {b['before/eval/accuracy'] * 100:.1f}% | "
                f"{pm('eval/accuracy', 100, 1)}% | {b['before/eval/reward_mean']:.4f} | {pm('eval/reward_mean', 1, 4)} | "
                f"{b['before/eval/score_b_mean']:.4f} | {pm('eval/score_b_mean', 1, 4)} | "
                f"{pm('eval/format_rate', 100, 1)}% | {pm('eval/response_len_mean', 1, 1)} | "
                f"{(entry['nonzero_std_frac'] or 0) * 100:.0f}% | {entry['step_s'] or 0:.0f} |")
    return table, "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, demo tasks only, 3 steps, 16 questions")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--val-size", type=int, default=40, help="held-out questions per dataset")
    parser.add_argument("--lr", type=float, default=2e-4)
    parser.add_argument("--data", default="demo,mmlu", help="comma-separated: demo, mmlu")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--mmlu-variants", default="rlpr", help="variants also run on MMLU (time budget)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--output", default=str(RESULTS / "learning"))
    parser.add_argument("--reverse", action="store_true", help="take jobs in reverse order (a second worker)")
    parser.add_argument("--report", action="store_true", help="only summarise the runs already in the .jsonl")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "rlpr-learning"))
    args = parser.parse_args()
    if args.quick:
        args.seeds, args.steps, args.val_size, args.data = 1, 3, 16, "demo"
        args.output = str(RESULTS / "learning_quick")
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = Path(args.output + ".jsonl")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    settings = {"steps": args.steps, "val_size": args.val_size, "lr": args.lr, "seeds": args.seeds}
    done = read_rows(log_path, settings)
    have = {(r["dataset"], r["variant"], r["seed"]) for r in done}
    common = [f"trainer.max_steps={args.steps}", f"trainer.lr={args.lr}", f"model.threads={args.threads}"]
    start = time.time()
    all_data = {} if args.report else datasets(workdir, args.val_size)
    for dataset in [] if args.report else args.data.split(","):
        if dataset not in all_data:
            sys.exit(f"--data: unknown or unavailable dataset {dataset!r} (have {', '.join(all_data)})")
        overrides = all_data[dataset] + common
        variants = args.variants.split(",") if dataset == "demo" else args.mmlu_variants.split(",")
        jobs = [(dataset, "base", None)] + [(dataset, v, s) for v in variants for s in range(args.seeds)]
        for job in reversed(jobs) if args.reverse else jobs:
            if job[1] != "base" and job[1] not in VARIANTS:
                sys.exit(f"--variants: unknown variant {job[1]!r} (have {', '.join(VARIANTS)})")
            if job in have or not claim(workdir, job, settings):
                continue
            print(f"[{time.time() - start:6.0f}s] {job}", flush=True)
            row = run_base(dataset, overrides) if job[1] == "base" else run_one(*job, overrides, workdir)
            row["settings"] = settings
            done.append(row)
            with log_path.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)
    done = read_rows(log_path, settings)  # with the rows of other workers
    table, markdown = summarise(done)
    total = sum(r["seconds"] for r in done)
    header = (f"Learning benchmark: {args.steps} steps x 4 prompts x 8 responses x 64 tokens per run, "
              f"lr {args.lr}, {args.val_size} held-out questions per dataset, greedy; "
              f"the runs took {total / 60:.0f} min in sum (several workers overlap in wall time).\n\n")
    Path(args.output + ".md").write_text(header + markdown)
    Path(args.output + ".json").write_text(json.dumps({"settings": settings, "total_minutes": total / 60,
                                                       "table": table, "runs": done}, indent=1))
    print(header + markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
