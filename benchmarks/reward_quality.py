"""Every reward variant's ROC-AUC against correctness on MMLU validation with the embedded model
(`rlpr reward-quality` under the published rules and with the 1b fallback), and with `--baseline` the
model's baseline Avg@1 on MATH-500 / MMLU-Pro / GSM8K slices (docs/benchmarks.md).

    python benchmarks/reward_quality.py [--questions 100] [--samples 8] [--labeled FILE]
    python benchmarks/reward_quality.py --baseline [--quick]

Reads ../shared/data (never copied; MMLU's validation split, never its test split) and writes
benchmarks/results/reward_quality.{json,md} or eval_baseline.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from harness import files, record

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
FALLBACKS = ("free", "none")
# --baseline: (converter format, source file, rows, rows with --quick, max new tokens)
BASELINE = {"math500": ("math", "math500/test.jsonl", 100, 10, 384),
            "mmlu_pro": ("mmlu_pro", "mmlu_pro/mmlu_pro_test_1000_seed0.jsonl", 200, 10, 256),
            "gsm8k": ("gsm8k", "gsm8k/test.jsonl", 200, 10, 256)}


def rlpr(*args: str) -> None:
    print("+ rlpr", " ".join(args), flush=True)
    subprocess.run([sys.executable, "-m", "rlpr", *args], check=True)


def summary_table(report: dict) -> list[str]:
    """One row per variant: pooled and within-group AUC with their CIs, and the within-group
    difference to the configured reward with its paired CI."""
    def num(x, signed=False):
        return "n/a" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")

    def ci(c, signed=False):
        return "n/a" if c is None else f"[{num(c[0], signed)}, {num(c[1], signed)}]"

    return files.table(["reward variant", "pooled AUC [95% CI]", "within-group AUC [95% CI]",
                        "within - reward [paired 95% CI]"],
                       ([f"{report['labels'][name]} (`{name}`)", f"{num(s['auc'])} {ci(s['auc_ci'])}",
                         f"{num(s['mean_group_auc'])} {ci(s['mean_group_auc_ci'])}", "" if name == "reward" else
                         f"{num(s['mean_group_auc_diff'], True)} {ci(s['mean_group_auc_diff_ci'], True)}"]
                        for name, s in report["scores"].items()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=100)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (model.threads)")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument("--labeled", default=None, help="a labeled JSONL built before (skips the sampling)")
    parser.add_argument("--build-seconds", type=float, default=None,
                        help="with --labeled: the wall seconds its build took, recorded as timings_s.build_s")
    parser.add_argument("--work", default="/tmp/rlpr-reward-quality")
    parser.add_argument("--render", action="store_true", help="only rewrite the .md from results/reward_quality.json")
    parser.add_argument("--baseline", action="store_true", help="the model's Avg@1 on three benchmarks instead")
    parser.add_argument("--quick", action="store_true", help="--baseline: 10 questions per benchmark")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if args.baseline:
        return baseline(work, args.quick)
    if args.render:
        print(files.save(files.load(RESULTS / "reward_quality"), RESULTS / "reward_quality", markdown))
        return 0
    threads = f"model.threads={args.threads}"
    timings = {"build_s": args.build_seconds} if args.labeled and args.build_seconds else {}
    labeled = Path(args.labeled) if args.labeled else work / f"mmlu_val_{args.questions}x{args.samples}.jsonl"
    if not args.labeled:
        parquet = work / "mmlu_val.parquet"
        rlpr("data", "convert", "--format", "mmlu", "--input", str(DATA / "mmlu" / "mmlu_val.jsonl"),
             "--output", str(parquet), "--limit", str(args.questions), "--template", "r1")
        start = time.time()
        rlpr("reward-quality", "--build-from", str(parquet), "--samples", str(args.samples),
             "--max-new-tokens", str(args.max_new_tokens), "--seed", "0", "--output", str(labeled), threads)
        timings["build_s"] = time.time() - start
    reports = {}
    for fallback in FALLBACKS:
        out = work / f"rq-{fallback}"
        start = time.time()
        rlpr("reward-quality", "--input", str(labeled), "--fallback", fallback, "--bootstrap", str(args.bootstrap),
             "--output", str(out), threads)
        timings[f"score_{fallback}_s"] = time.time() - start
        reports[fallback] = json.loads((out / "reward_quality.json").read_text())

    rows = [json.loads(line) for line in labeled.read_text().splitlines()]
    tagged = sum(1 for r in rows if "<answer>" in r["response"] and "</answer>" in r["response"])
    setting = {"model": "SmolLM2-135M-Instruct (embedded GGUF, fp32 scoring; bf16 sampling copy where fast)",
               "data": "MMLU validation (../shared/data/mmlu/mmlu_val.jsonl), first rows, r1 template",
               "questions": len({r["group"] for r in rows}), "samples_per_question": args.samples,
               "max_new_tokens": args.max_new_tokens, "temperature": 1.0, "seed": 0, "threads": args.threads,
               "labels": "the letter grader's verdicts", "responses_with_answer_tags": tagged,
               "labeled_file": str(labeled)}
    print(files.save({"setting": setting, "timings_s": timings, "reports": reports, **record.stamp()},
                     RESULTS / "reward_quality", markdown))
    return 0


def baseline(work: Path, quick: bool) -> int:
    """Avg@1 (r1 template, temperature 1.0, one sample) on the first rows of each BASELINE benchmark."""
    results, timings = {}, {}
    for name, (fmt, source, rows, quick_rows, max_new) in BASELINE.items():
        parquet, out = work / f"{name}.parquet", work / f"eval-{name}"
        rlpr("data", "convert", "--format", fmt, "--input", str(DATA / source), "--output", str(parquet),
             "--limit", str(quick_rows if quick else rows), "--template", "r1")
        start = time.time()
        rlpr("eval", "--model", "default", "--data", str(parquet), "--samples", "1", "--max-new-tokens", str(max_new),
             "--output", str(out))
        timings[f"eval_{name}_s"] = time.time() - start
        results[name] = {**json.loads((out / "results.json").read_text())[name], "max_new_tokens": max_new}
    payload = {"model": "SmolLM2-135M-Instruct (embedded GGUF, fp32; bf16 sampling copy)", "template": "r1",
               "temperature": 1.0, "samples_per_question": 1, "quick": quick, "benchmarks": results,
               "timings_s": timings, **record.stamp()}

    def render(res: dict) -> str:
        return "\n".join(["# The embedded model's baseline (benchmarks/reward_quality.py --baseline)", "", files.header(res), "",
                          *files.table(["benchmark", "questions", "max new tokens", "Avg@1", "format-valid", "mean length"],
                                       ([n, r["n_questions"], r["max_new_tokens"], f"{100 * r['accuracy']:.1f}%",
                                         f"{100 * r['format_valid_rate']:.1f}%", f"{r['mean_response_tokens']:.0f}"]
                                        for n, r in res["benchmarks"].items()))]) + "\n"

    print(files.save(payload, RESULTS / ("eval_baseline_quick" if quick else "eval_baseline"), render))
    return 0


def markdown(payload: dict) -> str:
    setting, timings, reports = payload["setting"], payload["timings_s"], payload["reports"]
    free, none = reports["free"], reports["none"]
    minutes = ", ".join(f"{k[:-2].replace('_', ' ')} {v / 60:.0f} min" for k, v in timings.items())
    lines = [f"# Reward quality on MMLU validation ({setting['questions']} questions x "
             f"{setting['samples_per_question']} samples)", "", files.header(payload), "",
             f"Embedded SmolLM2-135M-Instruct, r1 template, temperature 1.0, {setting['max_new_tokens']} new tokens, "
             f"seed 0; labels from the letter grader. {free['n_rows']} responses, "
             f"{setting['responses_with_answer_tags']} with answer tags; "
             f"{free['n_mixed_groups']} of {free['n_groups']} questions have both right and wrong responses "
             f"({free['n_mixed_rows']} rows, positive rate {free['positive_rate']:.3f}). "
             f"95% CIs from {free['bootstrap']} bootstrap resamples of questions (seed 0); the difference "
             f"column is paired (the same resamples). Wall time at {setting['threads']} thread, nice 10, on a "
             f"shared 2-core CPU: {minutes}.", "",
             "## With the 1b fallback (`--fallback free`: a tagless response is scored as reasoning + cue)", "",
             *summary_table(free), "",
             "## Published rules (`--fallback none`: a tagless response is unscored)", "",
             *summary_table(none), "",
             "AUC depends only on the order of the scores: aggregations that are monotone in one another "
             "(seq_likelihood and sum_logprob, geo_mean_prob and mean_logprob; all of them when y* is one "
             "token, as MMLU's letter) give equal AUCs of B, and within a question A is a constant, so B and "
             "B - A give equal within-group AUCs. The rule verifier's AUC is 1 by construction: the labels "
             "are its verdicts.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
