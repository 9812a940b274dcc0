"""Does RLPR teach the embedded model? Held-out accuracy before and after, against RLVR and ablations.

Trains SmolLM2-135M-Instruct (LoRA) with the `small` preset on the built-in demo tasks, over
several seeds, and evaluates every run on the SAME held-out questions (the demo `val` split of
the preset's task families, drawn by a hash of the question text before any training, never
trained on) with the SAME fixed scorer (SCORER below), exactly as RLPR evaluates:

- Avg@8: 8 samples per question at the rollout temperature, accuracy averaged (the paper's metric),
- greedy accuracy, pass@8, mean probability reward and score B of the greedy response, format
  rate, response length; standard errors are binomial over the held-out questions.

Variants (config overrides on top of the preset):

- `rlpr`: the preset as it is (mean token probability, debiased by score A, EMA std filter),
- `rlvr`: reward.kind=verifier (1 when the grader accepts the response: the paper's RLVR baseline),
- `no_debias`: reward.debias=false,  `no_std_filter`: algorithm.std_filter=false,
- `seq_likelihood`: reward.aggregation=seq_likelihood instead of the mean token probability,
- `verifree`, `nover`: VeriFree's and NOVER's rewards, advantages and losses (VARIANTS below) on the
  same data and scoring position,
- and `base`, the untrained model (evaluated once: every run starts from it).

    python benchmarks/learning.py              # the full benchmark (see --help for its size)
    python benchmarks/learning.py --quick      # a smaller smoke setting (1 seed, rlpr + base)

Two 1-thread workers share the job list (each job claimed by a file in the work dir; a worker
that needs the base evaluation waits for it):
    python benchmarks/learning.py --threads 1 & python benchmarks/learning.py --threads 1

Each finished run is appended to <output>.jsonl; a re-run skips the runs already there, so an
interrupted benchmark loses at most the runs in progress. The summary goes to <output>.json
(`{"runs": [...], "table": [...]}`), <output>.md and <output>.png (learning curves).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"

VARIANTS = {
    "rlpr": [],
    "rlvr": ["reward.kind=verifier"],
    "no_debias": ["reward.debias=false"],
    "no_std_filter": ["algorithm.std_filter=false"],
    "seq_likelihood": ["reward.aggregation=seq_likelihood"],
    # the verifier-free family on the same data, prompts and scoring position (the preset's spec-1b
    # answer turn: the embedded model does not write <answer> tags, so the presets' tag formats would
    # score nothing; docs/verifier-free.md). VeriFree: R = p(y* | x, z), RLOO, the policy gradient
    # summed over the reasoning (here the whole response) plus the R-weighted SFT term on y*, one
    # update per step (the preset's 4 prompts in one mini-batch), no std filter.
    "verifree": ["reward.aggregation=seq_likelihood", "reward.debias=false", "reward.shaping=identity",
                 "algorithm.advantage=rloo", "algorithm.std_filter=false", "algorithm.pg_tokens=reasoning",
                 "algorithm.loss_agg=seq_mean_token_sum", "algorithm.ref_sft_coef=1.0",
                 "algorithm.ref_sft_weight=reward", "algorithm.ref_sft_norm=sum", "algorithm.kl_coef=0",
                 "algorithm.entropy_coef=0"],
    # NOVER: the group rank of the reasoning perplexity (the whole response, scored with the
    # policy), GRPO, no std filter; every scored response is ranked (reward.nover_gate=scored), as
    # no response passes NOVER's strict tag format here
    "nover": ["reward.kind=nover", "reward.nover_gate=scored", "reward.debias=false", "algorithm.advantage=grpo",
              "algorithm.std_filter=false", "algorithm.kl_coef=0"],
}


def se(p: float, n: int) -> float:
    from rlpr.train.held_out import binomial_se  # the same standard error the trainer reports

    return binomial_se(p, n)


def in_ses(change: float, p: float, n: int) -> float:
    """A change in units of the binomial standard error of p (inf/nan when that error is 0)."""
    error = se(p, n)
    return change / error if error else (math.copysign(math.inf, change) if change else math.nan)


# The held-out reward and score-B columns use one fixed scorer for every run and preset version
# (the "\nAnswer: " cue with the prompt-only A, what the first benchmark's preset trained with), so
# that those columns compare across variants and across changes of the preset's own reward.
SCORER = ['reward.answer_cue="\\nAnswer: "', "reward.answer_turn=''", "reward.score_a_form=prompt"]


def make_trainer(preset: str, overrides: list[str], run_dir: Path):
    """A Trainer for `preset` + overrides whose evaluations use the common, fixed scorer (SCORER)."""
    from rlpr.config import load_config
    from rlpr.model.forward import causal_lm
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.train.tracking import Tracker
    from rlpr.train.trainer import Trainer

    common = load_config(preset, [o for o in overrides if not o.startswith(("reward.", "algorithm."))] + SCORER)
    cfg = load_config(preset, overrides + ["trainer.tensorboard=false", "trainer.progress=false"])
    trainer = Trainer(cfg, run_dir)
    max_length = getattr(causal_lm(trainer.policy).config, "max_position_embeddings", None)
    trainer.eval_reward = ProbabilityReward(common.reward, trainer.tokenizer, cfg.rollout.temperature, max_length)
    trainer.tracker = Tracker(run_dir, tensorboard=False)
    return trainer


def evaluation(trainer, limit: int = 0) -> dict:
    """trainer.evaluate() on all held-out questions, or on the first `limit` (learning curves)."""
    full = trainer.val_prompts
    trainer.val_prompts = full[:limit] if limit else full
    try:
        return trainer.evaluate()
    finally:
        trainer.val_prompts = full


def summary_of(ev: dict, suffix: str) -> dict:
    k = ev.get("eval/samples", 8)
    return {f"acc_{suffix}": ev["eval/accuracy"], f"greedy_{suffix}": ev["eval/greedy_accuracy"],
            f"reward_{suffix}": ev["eval/reward_mean"], f"pass8_{suffix}": ev.get(f"eval/pass@{k}"),
            f"score_b_{suffix}": ev["eval/score_b_mean"], f"format_{suffix}": ev["eval/format_rate"],
            f"len_{suffix}": ev["eval/response_len_mean"]}


def run_base(preset: str, overrides: list[str], curve_questions: int, workdir: Path) -> dict:
    """The untrained model on all held-out questions, and on the curve subset (every run's step 0)."""
    start = time.time()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        trainer = make_trainer(preset, overrides, Path(tmp))
        ev = evaluation(trainer)
        curve = [{"step": 0, **summary_of(evaluation(trainer, curve_questions), "curve")}] if curve_questions else []
    return {"variant": "base", "seed": None, "steps": 0, "n_heldout": ev["eval/questions"],
            **summary_of(ev, "before"), **summary_of(ev, "after"), "curve": curve, "seconds": time.time() - start}


def run_one(preset: str, overrides: list[str], variant: str, seed: int, steps: int, curve_every: int,
            curve_questions: int, get_base, workdir: Path) -> dict:
    """Train `steps` steps and evaluate; a few held-out points on the way for the curves.
    `get_base()` returns the base model's row (another worker may still be computing it: it is
    needed only once this run has finished)."""
    start = time.time()
    run_dir = workdir / "runs" / f"{variant}-{seed}-{time.time_ns()}"
    trainer = make_trainer(preset, overrides + VARIANTS[variant] + [f"trainer.seed={seed}",
                                                                    f"trainer.max_steps={steps}"], run_dir)
    curve, train = [], []
    for step in range(1, steps + 1):
        m = trainer.train_step(step)
        trainer.step = step
        trainer.tracker.log(step, m)
        train.append({"step": step, **{k: m.get(k) for k in (
            "reward/mean", "reward/accuracy", "reward/score_b_mean", "reward/score_a_mean", "filter/kept_frac",
            "filter/nonzero_std_frac", "rollout/response_len_mean", "rollout/distinct_frac", "policy/entropy",
            "perf/step_s")}})
        print(f"  {variant} seed {seed} step {step}: reward {m['reward/mean']:.3f} "
              f"acc {m.get('reward/accuracy', float('nan')):.3f} kept {m['filter/kept_frac']:.2f} "
              f"len {m['rollout/response_len_mean']:.1f} {m['perf/step_s']:.0f}s", flush=True)
        if curve_every and step % curve_every == 0 and step < steps:
            curve.append({"step": step, **summary_of(evaluation(trainer, curve_questions), "curve")})
    ev = evaluation(trainer)
    trainer.tracker.close()
    n = ev["eval/questions"]
    base = get_base()
    curve = ([dict(base["curve"][0])] if base.get("curve") else []) + curve  # step 0: the base model
    before = {k: v for k, v in base.items() if k.endswith("_before")}
    return {"variant": variant, "seed": seed, "steps": steps, "n_heldout": n, **before, **summary_of(ev, "after"),
            "curve": curve, "curve_questions": curve_questions, "train": train,
            "step_s": statistics.fmean(t["perf/step_s"] for t in train), "seconds": time.time() - start}


# --------------------------------------------------------------------------- summary

def summarise(rows: list[dict]) -> tuple[list[dict], str]:
    base = next((r for r in rows if r["variant"] == "base"), None)
    if base is None:
        return [], "(no base run yet)\n"
    n = base["n_heldout"]
    keys = ["acc", "greedy", "pass8", "reward", "score_b", "format", "len"]
    table = []
    lines = ["| variant | seeds | steps | Avg@8 before ± SE | Avg@8 after: mean ± sd (per run ± SE) | change in SEs "
             "| greedy before -> after | greedy change in SEs | pass@8 before -> after | reward before -> after "
             "| score B after | format after | length after | s/step | min/run |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for variant in ["base", *VARIANTS]:
        runs = [r for r in rows if r["variant"] == variant]
        if not runs:
            continue
        entry = {"variant": variant, "seeds": [r["seed"] for r in runs], "steps": runs[0]["steps"], "n_heldout": n}
        for k in keys:
            after = [r[f"{k}_after"] for r in runs]
            entry[f"{k}_before"] = base[f"{k}_before"]
            entry[f"{k}_after"] = statistics.fmean(after)
            entry[f"{k}_after_sd"] = statistics.stdev(after) if len(after) > 1 else 0.0
        # per seed: how many binomial standard errors (of the base accuracy) the change is
        entry["acc_change_se"] = [in_ses(r["acc_after"] - base["acc_before"], base["acc_before"], n) for r in runs]
        entry["greedy_change_se"] = [in_ses(r["greedy_after"] - base["greedy_before"], base["greedy_before"], n)
                                     for r in runs]
        entry["step_s"] = statistics.fmean(r.get("step_s", 0.0) for r in runs)
        entry["minutes_per_run"] = statistics.fmean(r["seconds"] for r in runs) / 60
        table.append(entry)

        def pm(k, scale=100.0, digits=1):
            spread = f" ± {entry[f'{k}_after_sd'] * scale:.{digits}f}" if len(runs) > 1 else ""
            return f"{entry[f'{k}_after'] * scale:.{digits}f}{spread}"

        per_run = ", ".join(f"{100 * r['acc_after']:.1f} ± {100 * se(r['acc_after'], n):.1f}" for r in runs)
        lines.append(
            f"| {variant} | {len(runs)} | {entry['steps']} | {100 * base['acc_before']:.1f}% ± {100 * se(base['acc_before'], n):.1f} "
            f"| {pm('acc')}% ({per_run}) | {', '.join(f'{c:+.1f}' for c in entry['acc_change_se'])} "
            f"| {100 * base['greedy_before']:.1f}% -> {pm('greedy')}% "
            f"| {', '.join(f'{c:+.1f}' for c in entry['greedy_change_se'])} "
            f"| {100 * base['pass8_before']:.1f}% -> {pm('pass8')}% "
            f"| {base['reward_before']:.3f} -> {pm('reward', 1, 3)} | {pm('score_b', 1, 3)} | {pm('format')}% "
            f"| {pm('len', 1, 1)} | {entry['step_s']:.0f} | {entry['minutes_per_run']:.0f} |")
    return table, "\n".join(lines) + "\n"


def smooth(values: list[float], width: int = 3) -> list[float]:
    """Trailing mean over `width` steps (one step is 32 samples: noisy)."""
    return [statistics.fmean(values[max(0, i - width + 1):i + 1]) for i in range(len(values))]


def plot(rows: list[dict], path: Path) -> None:
    """Held-out Avg@8 (curve points) and the training reward per step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colors = dict(zip(VARIANTS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    base = next((r for r in rows if r["variant"] == "base"), None)
    for r in rows:
        if r["variant"] == "base":
            continue
        c = colors.get(r["variant"])
        label = r["variant"] if r["seed"] == min(x["seed"] for x in rows if x["variant"] == r["variant"]) else None
        pts = r.get("curve", [])
        if pts:
            axes[0].plot([p["step"] for p in pts], [100 * p["acc_curve"] for p in pts], "o-", color=c, alpha=0.7,
                         label=label)
        axes[0].plot([r["steps"]], [100 * r["acc_after"]], "*", color=c, markersize=12)
        steps = [t["step"] for t in r["train"]]
        axes[1].plot(steps, smooth([t["reward/mean"] for t in r["train"]]), color=c, alpha=0.7, label=label)
        axes[2].plot(steps, smooth([100 * (t["reward/accuracy"] or 0) for t in r["train"]]), color=c, alpha=0.7,
                     label=label)
    if base:
        axes[0].axhline(100 * base["acc_before"], color="gray", ls="--", label="base, all held-out")
    axes[0].set(title="held-out Avg@k (%): lines on the curve subset,\nstars on all held-out questions", xlabel="step")
    axes[1].set(title="training reward (own reward kind; mean of 3 steps)", xlabel="step")
    axes[2].set(title="training rollouts graded correct (%, mean of 3 steps)", xlabel="step")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_rows(log_path: Path, settings: dict) -> list[dict]:
    rows = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()] if log_path.exists() else []
    return [r for r in rows if r.get("settings") == settings]


def claim(workdir: Path, job: tuple, settings: dict) -> bool:
    """Several workers share the job list: a job is claimed by creating a file (delete
    `workdir/claims` to re-run abandoned jobs)."""
    claims = workdir / "claims"
    claims.mkdir(exist_ok=True)
    name = "-".join(str(v) for v in (*job, *settings.values())).replace("/", "_").replace(" ", "")[:200]
    try:
        (claims / name).open("x").close()
        return True
    except FileExistsError:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--quick", action="store_true", help="1 seed, rlpr only, 4 steps, 40 held-out questions, "
                                                             "2 samples each (a smoke setting, not a result)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--heldout", type=int, default=200, help="held-out questions (demo val split)")
    parser.add_argument("--samples", type=int, default=8, help="k of Avg@k and pass@k")
    parser.add_argument("--curve-every", type=int, default=10, help="held-out curve point every N steps (0: none)")
    parser.add_argument("--curve-questions", type=int, default=50)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--set", nargs="*", default=[], help="extra config overrides for every run")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: all cores)")
    parser.add_argument("--output", default=str(RESULTS / "learning"))
    parser.add_argument("--reverse", action="store_true", help="take jobs in reverse order (a second worker)")
    parser.add_argument("--report", action="store_true", help="only summarise the runs already in the .jsonl")
    parser.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "rlpr-learning"))
    if "--quick" in sys.argv[1:]:  # smaller defaults; flags given explicitly still win
        parser.set_defaults(seeds=1, steps=4, heldout=40, samples=2, variants="rlpr", curve_every=2,
                            curve_questions=10, output=str(RESULTS / "learning_quick"))
    args = parser.parse_args()
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = Path(args.output + ".jsonl")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    overrides = [f"data.demo_val_size={args.heldout}", f"trainer.eval_samples={args.samples}",
                 f"model.threads={args.threads}", *args.set]
    settings = {"preset": args.preset, "steps": args.steps, "heldout": args.heldout, "samples": args.samples,
                "set": args.set}
    done = read_rows(log_path, settings)
    have = {(r["variant"], r["seed"]) for r in done}
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            sys.exit(f"--variants: unknown variant {v!r} (have {', '.join(VARIANTS)})")
    # the first two variants (rlpr, rlvr) for every seed first, then the ablations: a benchmark cut
    # short by time still compares RLPR with RLVR over all seeds
    head, tail = variants[:2], variants[2:]
    jobs = [("base", None)] + [(v, s) for s in range(args.seeds) for v in head] + \
        [(v, s) for v in tail for s in range(args.seeds)]
    start = time.time()
    for job in [] if args.report else (reversed(jobs) if args.reverse else jobs):
        if job in have or not claim(workdir, job, settings):
            continue
        def get_base() -> dict:
            while (base := next((r for r in read_rows(log_path, settings) if r["variant"] == "base"), None)) is None:
                time.sleep(20)  # another worker is evaluating the base model
            return base

        print(f"[{time.time() - start:6.0f}s] {job}", flush=True)
        if job[0] == "base":
            row = run_base(args.preset, overrides, args.curve_questions if args.curve_every else 0, workdir)
        else:
            row = run_one(args.preset, overrides, job[0], job[1], args.steps, args.curve_every,
                          args.curve_questions, get_base, workdir)
        row["settings"] = settings
        with log_path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        print({k: v for k, v in row.items() if k not in ("curve", "train")}, flush=True)
    done = read_rows(log_path, settings)
    table, markdown = summarise(done)
    total = sum(r["seconds"] for r in done)
    header = (f"Learning benchmark: preset `{args.preset}` {' '.join(args.set)}, {args.steps} steps per run, "
              f"{args.heldout} held-out questions x {args.samples} samples (Avg@{args.samples}) + greedy; "
              f"'change in SEs' = (after - base) / binomial SE of the base over the held-out questions, per seed; "
              f"runs took {total / 60:.0f} min in sum (workers overlap).\n\n")
    Path(args.output + ".md").write_text(header + markdown)
    Path(args.output + ".json").write_text(json.dumps({"settings": settings, "total_minutes": total / 60,
                                                       "table": table, "runs": done}, indent=1))
    if done:
        plot(done, Path(args.output + ".png"))
    print(header + markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
