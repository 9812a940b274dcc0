"""Where can RLPR's debiasing act? A training-free look at saved training samples.

Score A is one number per prompt, so B - A shifts a whole group by a constant. Every group
estimator (grpo, rloo, dr_grpo, reinforce_pp) subtracts the group's mean and cancels that shift;
only a baseline shared across prompts (algorithm.advantage=reinforce: the batch's mean reward)
compares B - A of one prompt with B - A of another. So A can change:

- the ranking across prompts (what a batch baseline sees): compare B and B - A by the ROC-AUC of
  correct against wrong responses within each step's batch, and pooled over the mixed-correctness
  groups (the paper's protocol, as `rlpr reward-quality`);
- not the ranking within a group (what GRPO sees): B and B - A give equal within-group AUCs;
- the threshold clip: `threshold_0` gives 0 to every response with B <= A, which ties those
  responses within a group (the within-group AUC of the clipped reward can differ from B's),
  zeroes whole groups, and lowers the group std that the std filter reads (the filter reads the
  std of the reward as trained: of B - A unclipped it would equal B's).

Input: training runs' samples folders (`<run>/samples/step_*.jsonl`, written every
`trainer.sample_every` steps: per response score_b, score_a, the trained reward and the grader's
verdict `correct`), by default those of the learning benchmark's work dir (the runs of the current
benchmark). A group seen before (same prompt and responses: runs of one seed and settings share
their first steps) is read once; files without score A (a run without debiasing, or a verifier
reward) are skipped. A step's batch here is the groups its samples file holds
(`rlpr.train.metrics.sample_rows`: the first 4 groups generated in the step, before the std
filter), not necessarily the groups trained on. Nothing is sampled or scored.

    python benchmarks/debias_mechanism.py [--from 'DIR/runs/*/samples' ...] [--output PATH]
    python benchmarks/debias_mechanism.py --rows benchmarks/results/debias_mechanism.json  # recompute

Writes <output>.json (the input, the report and every row used) and <output>.md (default
benchmarks/results/debias_mechanism).
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent
DEFAULT_FROM = str(Path(tempfile.gettempdir()) / f"rlpr-learning-{os.getuid()}" / "runs" / "*" / "samples")
# score name -> its value from a row (b, a, reward); "reward" is what the run trained with
COLUMNS = {
    "B": lambda r: r["b"],
    "B - A": lambda r: r["b"] - r["a"],
    "reward (trained)": lambda r: r["reward"],
}


def read_samples(patterns: list[str]) -> tuple[list[dict], dict]:
    """Rows {batch, group, b, a, reward, correct} from the samples folders matching `patterns`;
    `batch` is (run, step), `group` (run, step, prompt), run the name of the folder's parent. Also
    what was read and skipped (`folders`: those that gave rows)."""
    from rlpr.errors import DataError

    rows, seen = [], set()
    info = {"folders": [], "files": 0, "files_without_a": 0, "duplicate_groups": 0}
    for folder in sorted({f for p in patterns for f in glob.glob(p)}):
        files = sorted(glob.glob(f"{folder}/step_*.jsonl"))
        if not files:
            continue
        run = Path(folder).parent.name
        for path in files:
            try:
                lines = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: not JSON lines ({e})") from None
            scored = [x for x in lines if x.get("correct") is not None and x.get("score_b") is not None]
            if not any(x.get("score_a") for x in scored):
                info["files_without_a"] += 1
                continue
            info["files"] += 1
            if folder not in info["folders"]:
                info["folders"].append(folder)
            step = Path(path).stem
            groups: dict[str, list[dict]] = defaultdict(list)
            for x in scored:
                groups[x["prompt"]].append(x)
            for prompt, members in groups.items():
                signature = (prompt, tuple(x["response"] for x in members))
                if signature in seen:
                    info["duplicate_groups"] += 1
                    continue
                seen.add(signature)
                rows += [{"batch": (run, step), "group": (run, step, prompt), "b": x["score_b"],
                          "a": x["score_a"], "reward": x["reward"], "correct": bool(x["correct"])} for x in members]
    return rows, info


def read_saved_rows(path: str) -> tuple[list[dict], dict]:
    """The rows (and input) an earlier output's .json recorded."""
    saved = json.loads(Path(path).read_text())
    rows = [{**r, "batch": tuple(r["batch"]), "group": tuple(r["group"])} for r in saved["rows"]]
    return rows, {**saved["input"], "rows_from": path}


def _by(rows: list[dict], key: str) -> dict:
    out = defaultdict(list)
    for i, r in enumerate(rows):
        out[r[key]].append(i)
    return out


def separation(rows: list[dict], n_boot: int = 1000, seed: int = 0) -> dict:
    """Per score column (COLUMNS): the within-group, pooled (mixed groups) and per-batch ROC-AUCs of
    correct against wrong responses with bootstrap CIs, and what the threshold clip does to the
    groups (see the module docstring)."""
    from rlpr.evaluation.reward_quality import _mean, auc_report, bootstrap_ci, roc_auc

    labels = [r["correct"] for r in rows]
    groups = [r["group"] for r in rows]
    columns = {name: [f(r) for r in rows] for name, f in COLUMNS.items()}
    report = auc_report(columns, labels, groups, n_boot=n_boot, seed=seed, baseline="B")
    batches = [idx for idx in _by(rows, "batch").values()
               if any(labels[i] for i in idx) and not all(labels[i] for i in idx)]
    report["n_batches"] = len(_by(rows, "batch"))
    report["n_mixed_batches"] = len(batches)
    for name, scores in columns.items():
        per_batch = [roc_auc([scores[i] for i in idx], [labels[i] for i in idx]) for idx in batches]

        def batch_auc(picked, per_batch=per_batch):
            return _mean([per_batch[k] for k in picked])

        entry = report["scores"][name]
        entry["batch_auc"] = batch_auc(range(len(batches)))
        entry["batch_auc_ci"] = bootstrap_ci(batch_auc, len(batches), n_boot, seed)
        base = [roc_auc([columns["B"][i] for i in idx], [labels[i] for i in idx]) for idx in batches]

        def diff(picked, per_batch=per_batch, base=base):
            a, b = _mean([per_batch[k] for k in picked]), _mean([base[k] for k in picked])
            return None if a is None or b is None else a - b

        if name != "B":
            entry["batch_auc_diff"] = diff(range(len(batches)))
            entry["batch_auc_diff_ci"] = bootstrap_ci(diff, len(batches), n_boot, seed)
    # the clip and the std filter
    members = list(_by(rows, "group").values())

    def std(values):
        return statistics.stdev(values) if len(values) > 1 else 0.0

    a_of_group = [rows[idx[0]]["a"] for idx in members]
    report["clip"] = {
        "n_groups": len(members),
        "responses_b_at_most_a": sum(r["b"] <= r["a"] for r in rows) / len(rows),
        "correct_b_at_most_a": _share([r["b"] <= r["a"] for r in rows if r["correct"]]),
        "wrong_b_at_most_a": _share([r["b"] <= r["a"] for r in rows if not r["correct"]]),
        "groups_all_clipped": sum(all(rows[i]["b"] <= rows[i]["a"] for i in idx) for idx in members) / len(members),
        "groups_zero_std_b": sum(std([rows[i]["b"] for i in idx]) < 1e-6 for idx in members) / len(members),
        "mean_group_std_b": statistics.fmean(std([rows[i]["b"] for i in idx]) for idx in members),
        "mean_group_std_reward": statistics.fmean(std([rows[i]["reward"] for i in idx]) for idx in members),
        "sd_of_a_across_prompts": std(a_of_group),
        "mean_a": statistics.fmean(a_of_group),
        "mean_b": statistics.fmean(r["b"] for r in rows),
    }
    return report


def _share(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def markdown(report: dict, info: dict) -> str:
    def num(x, signed=False):
        return "n/a" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")

    def ci(c, signed=False):
        return "" if c is None else f" [{num(c[0], signed)}, {num(c[1], signed)}]"

    c = report["clip"]
    lines = [
        "# Where debiasing can act: B against B - A on saved training samples",
        "",
        f"Command: `{info['command']}`.",
        "",
        f"Samples: {info['files']} step files from {len(info['folders'])} samples folders "
        f"({', '.join(f'`{f}`' for f in info['folders'])}; {info['files_without_a']} files without score A "
        f"skipped, {info['duplicate_groups']} groups seen before skipped); "
        f"{report['n_rows']} responses in {report['n_groups']} groups, {report['n_mixed_groups']} groups "
        f"({report['n_mixed_rows']} responses) with mixed correctness, {report['n_batches']} batches "
        f"({report['n_mixed_batches']} with both correct and wrong responses); correct rate "
        f"{report['positive_rate']:.3f}. 95% CIs: {report['bootstrap']} bootstrap resamples of groups "
        "(within-group, pooled) or of batches (batch); differences to B are paired.",
        "",
        "| score | within-group AUC (GRPO, RLOO, Dr.GRPO, REINFORCE++ see this) | pooled AUC, mixed groups "
        "(paper's protocol) | batch AUC (REINFORCE's batch baseline sees this) | pooled - B | batch - B |",
        "|---|---|---|---|---|---|",
    ]
    for name, s in report["scores"].items():
        lines.append(
            f"| {name} | {num(s['mean_group_auc'])}{ci(s['mean_group_auc_ci'])} | {num(s['auc'])}{ci(s['auc_ci'])} "
            f"| {num(s['batch_auc'])}{ci(s['batch_auc_ci'])} "
            f"| {num(s.get('auc_diff'), True)}{ci(s.get('auc_diff_ci'), True)} "
            f"| {num(s.get('batch_auc_diff'), True)}{ci(s.get('batch_auc_diff_ci'), True)} |")
    lines += [
        "",
        f"The clip (`threshold_0`) and the std filter: {100 * c['responses_b_at_most_a']:.1f}% of responses have "
        f"B <= A and earn 0 (correct {_pct(c['correct_b_at_most_a'])}, wrong {_pct(c['wrong_b_at_most_a'])}); "
        f"{100 * c['groups_all_clipped']:.1f}% of groups are all 0 after the clip (zero advantages under GRPO, "
        f"and below any std-filter threshold) against {100 * c['groups_zero_std_b']:.1f}% with zero std of B; mean "
        f"group std {c['mean_group_std_reward']:.4f} for the trained reward against {c['mean_group_std_b']:.4f} for B. "
        f"Score A: mean {c['mean_a']:.3f}, sd across prompts {c['sd_of_a_across_prompts']:.3f} (B: mean "
        f"{c['mean_b']:.3f}).",
        "",
        "Within a group A is a constant, so B and B - A rank a group's responses alike (equal within-group "
        "AUCs by construction); the trained reward clips B - A at 0, which ties the responses below A.",
    ]
    return "\n".join(lines) + "\n"


def _pct(x) -> str:
    return "n/a" if x is None else f"{100 * x:.1f}%"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="sources", nargs="*", default=[DEFAULT_FROM],
                        help="samples folders (globs); default: the learning benchmark's work dir")
    parser.add_argument("--rows", default=None, help="recompute from the rows an earlier output's .json recorded")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--output", default=str(ROOT / "results" / "debias_mechanism"))
    args = parser.parse_args()
    if args.rows:
        rows, info = read_saved_rows(args.rows)
    else:
        rows, info = read_samples(args.sources)
        info = {**info, "sources": args.sources,
                "command": "python benchmarks/debias_mechanism.py --from " + " ".join(f"'{s}'" for s in args.sources)}
    if not rows:
        sys.exit(f"no samples with score A under {', '.join(args.sources)}")
    report = separation(rows, args.bootstrap)
    body = json.dumps({"input": info, "report": report}, indent=1)[:-2]  # the rows one a line:
    lines = ",\n  ".join(json.dumps(r) for r in rows)
    Path(args.output + ".json").write_text(f'{body},\n "rows": [\n  {lines}\n ]\n}}\n')
    text = markdown(report, info)
    Path(args.output + ".md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
