"""Baseline of the embedded model: Avg@1 on MATH-500 / MMLU-Pro / GSM8K slices and the reward's
ROC-AUC against correctness on MMLU validation questions (8 samples each).

    python benchmarks/eval_baseline.py [--quick]

Reads ../shared/data (never copied), converts slices with `rlpr data convert`, runs `rlpr eval`
and `rlpr reward-quality`, and writes benchmarks/results/eval_baseline.json and .md.
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


def rlpr(*args: str) -> None:
    cmd = [sys.executable, "-m", "rlpr", *args]
    print("+ rlpr", " ".join(args), flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 questions per benchmark, 20 for AUC")
    parser.add_argument("--work", default="/tmp/rlpr-eval-baseline")
    args = parser.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    n_math, n_mc, n_gsm, n_auc = (10, 10, 10, 20) if args.quick else (100, 200, 200, 200)
    plan = [  # (format, source file, rows, max new tokens)
        ("math", DATA / "math500" / "test.jsonl", n_math, 384, "math500"),
        ("mmlu_pro", DATA / "mmlu_pro" / "mmlu_pro_test_1000_seed0.jsonl", n_mc, 256, "mmlu_pro"),
        ("gsm8k", DATA / "gsm8k" / "test.jsonl", n_gsm, 256, "gsm8k"),
    ]
    timings, results = {}, {}
    for fmt, source, rows, max_new, name in plan:
        parquet = work / f"{name}.parquet"
        rlpr("data", "convert", "--format", fmt, "--input", str(source), "--output", str(parquet),
             "--limit", str(rows), "--template", "r1")
        start = time.time()
        out = work / f"eval-{name}"
        rlpr("eval", "--model", "default", "--data", str(parquet), "--samples", "1",
             "--max-new-tokens", str(max_new), "--output", str(out))
        timings[f"eval_{name}_s"] = time.time() - start
        r = json.loads((out / "results.json").read_text())[name]
        results[name] = {**r, "max_new_tokens": max_new}

    mmlu = work / "mmlu_val.parquet"
    rlpr("data", "convert", "--format", "mmlu", "--input", str(DATA / "mmlu" / "mmlu_val.jsonl"),
         "--output", str(mmlu), "--limit", str(n_auc), "--template", "r1")
    labeled = work / "mmlu_labeled.jsonl"
    start = time.time()
    rlpr("reward-quality", "--build-from", str(mmlu), "--samples", "8", "--max-new-tokens", "128",
         "--output", str(labeled))
    auc = {}
    for fallback in ("none", "free"):
        out = work / f"rq-{fallback}"
        rlpr("reward-quality", "--input", str(labeled), "--fallback", fallback, "--output", str(out))
        auc[fallback] = json.loads((out / "reward_quality.json").read_text())
    timings["reward_quality_s"] = time.time() - start

    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"model": "SmolLM2-135M-Instruct (embedded GGUF, fp32; bf16 sampling copy)",
               "template": "r1", "temperature": 1.0, "samples_per_question": 1, "quick": args.quick,
               "benchmarks": results, "reward_quality_mmlu_val": auc, "timings_s": timings,
               "date": record.now(), "commit": record.commit(), "machine": record.machine()}
    suffix = "_quick" if args.quick else ""
    (RESULTS / f"eval_baseline{suffix}.json").write_text(json.dumps(payload, indent=2))
    lines = ["# The embedded model's baseline (benchmarks/eval_baseline.py)", "", files.header(payload), "",
             "| benchmark | questions | max new tokens | Avg@1 | format-valid | mean length |",
             "|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['n_questions']} | {r['max_new_tokens']} | {100 * r['accuracy']:.1f}% | "
                     f"{100 * r['format_valid_rate']:.1f}% | {r['mean_response_tokens']:.0f} |")
    (RESULTS / f"eval_baseline{suffix}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
