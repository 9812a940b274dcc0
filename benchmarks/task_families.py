"""Which demo task families can RL improve? Base-model greedy, sampled (Avg@k) and pass@k per family.

RL sharpens what a model can already sometimes do: sampled accuracy moves toward pass@k. So the
families worth training on are those where pass@k is well above the sampled accuracy (issue 14).
Measured on TRAINING-split questions only (the `small` preset's split, one question in 2 held
out; the held-out split is never looked at to choose tasks),
per prompt template, with the grader `rlpr eval` uses (the first-statement rule for free-form
answers, see rlpr.grading.grade_short_answer).

    python benchmarks/task_families.py                          # about 20 min on 2 cores
    python benchmarks/task_families.py --per-family 8 --templates plain   # a quick look

Writes benchmarks/results/task_families.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def measure(template: str, per_family: int, samples: int, max_new_tokens: int, families: list[str],
            threads: int = 0, seed: int = 0) -> dict:
    import torch

    from rlpr.seeding import SEED_MIX
    from rlpr.data.demo_tasks import FAMILIES, demo_examples, pool_size
    from rlpr.data.prompts import prepare_prompts
    from rlpr.grading import grade, grader_for
    from rlpr.model.loading import load_model
    from rlpr.rollout.hf import HFRollout

    model, tok = load_model("default")
    if threads:
        torch.set_num_threads(threads)
    engine = HFRollout(model, tok, torch.float32, batch_sequences=64)  # fp32: faster than bf16 without AVX512-BF16
    # the train split of the `small` preset (one question in 2 held out): its held-out questions
    # are never looked at to choose the families
    examples = demo_examples("train", n=pool_size("train", val_every=2), template=template, val_every=2)
    by_family = defaultdict(list)
    for ex in examples:
        family = ex.data_source.split("/", 1)[1]
        if len(by_family[family]) < per_family:
            by_family[family].append(ex)
    out = {}
    for family in families or FAMILIES:
        exs = by_family[family]
        prompts, _ = prepare_prompts(exs, tok, 1024)
        ids = [p.token_ids for p in prompts]
        greedy = engine.generate(ids, 1, max_new_tokens=max_new_tokens, temperature=0.0)
        sampled = engine.generate(ids, samples, max_new_tokens=max_new_tokens, temperature=1.0,
                                  seeds=[seed * SEED_MIX + i for i in range(len(ids))])

        def ok(ex, text):
            q = ex.prompt[-1]["content"]
            return grade(grader_for(ex.data_source, ex.ability, bool(ex.choices)), text, ex.reference,
                         acceptable=ex.acceptable or None, question=q).correct

        g = [ok(ex, r.text) for ex, r in zip(exs, greedy)]
        s = [[ok(ex, r.text) for r in sampled[i * samples:(i + 1) * samples]] for i, ex in enumerate(exs)]
        out[family] = {"questions": len(exs), "greedy": statistics.fmean(g),
                       "avg_k": statistics.fmean(sum(row) / samples for row in s),
                       "pass_k": statistics.fmean(any(row) for row in s),
                       "len": statistics.fmean(len(r.token_ids) for r in sampled),
                       "example": {"q": exs[0].prompt[-1]["content"], "ref": exs[0].reference,
                                   "greedy": greedy[0].text, "sample": sampled[0].text}}
        print(template, family, {k: round(v, 3) for k, v in out[family].items() if k != "example"}, flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-family", type=int, default=24)
    p.add_argument("--samples", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--templates", default="plain,r1_user")
    p.add_argument("--families", default="", help="comma-separated (default: all)")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--output", default=str(RESULTS / "task_families"))
    args = p.parse_args()
    start = time.time()
    families = [f for f in args.families.split(",") if f]
    results = {t: measure(t, args.per_family, args.samples, args.max_new_tokens, families, args.threads)
               for t in args.templates.split(",")}
    lines = [f"Base SmolLM2-135M-Instruct on {args.per_family} training-split questions per family, "
             f"{args.samples} samples at temperature 1.0 and greedy, {args.max_new_tokens} new tokens "
             f"({(time.time() - start) / 60:.0f} min).\n",
             "| template | family | greedy | Avg@k (sampled) | pass@k | pass@k - Avg@k | tokens |", "|---|---|---|---|---|---|---|"]
    for t, fams in results.items():
        for f, r in sorted(fams.items(), key=lambda kv: kv[1]["avg_k"] - kv[1]["pass_k"]):
            lines.append(f"| {t} | {f} | {r['greedy']:.2f} | {r['avg_k']:.2f} | {r['pass_k']:.2f} | "
                         f"{r['pass_k'] - r['avg_k']:.2f} | {r['len']:.0f} |")
    Path(args.output + ".md").write_text("\n".join(lines) + "\n")
    Path(args.output + ".json").write_text(json.dumps({"settings": vars(args), "results": results}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
