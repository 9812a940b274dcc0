"""Which prompt template does the embedded model follow? (issue 7)

For each template variant, samples `--samples` responses to `--prompts` held-out demo questions
and reports: the fraction of responses valid under the r1 parsing rules, the format-reward rate,
and the fraction of groups whose reward has non-zero standard deviation (a learning signal),
under the spec's rules (no fallback) and with the section-1b fallback.

    python benchmarks/templates.py [--prompts 100 --samples 8 --max-new-tokens 96]

Writes benchmarks/results/templates.json and templates.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from rlpr.config import RewardConfig
from rlpr.data.demo_tasks import demo_examples
from rlpr.data.prompts import prepare_prompts
from rlpr.model.loading import load_model
from rlpr.reward.parsing import parse_response
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.rollout.hf import HFRollout

RESULTS = Path(__file__).resolve().parent / "results"
VARIANTS = [  # (name, template, prefill)
    ("r1 system prompt", "r1", ""),
    ("r1 instruction in user turn", "r1_user", ""),
    ("r1 system prompt + <think> pre-filled", "r1", "<think>"),
    ("r1 user turn + <think> pre-filled", "r1_user", "<think>"),
]


def nonzero_std_fraction(rewards: list[float], n: int) -> float:
    groups = [rewards[i:i + n] for i in range(0, len(rewards), n)]
    return sum(statistics.stdev(g) > 1e-6 for g in groups) / len(groups)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--output", default=str(RESULTS / "templates"))
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tokenizer = load_model("default")
    engine = HFRollout(model, tokenizer, torch.bfloat16, batch_sequences=32)
    spec = ProbabilityReward(RewardConfig(), tokenizer)
    fallback = ProbabilityReward(replace(RewardConfig(), invalid_fallback="free"), tokenizer)
    rows = []
    for name, template, prefill in VARIANTS:
        start = time.time()
        examples = demo_examples("val", n=args.prompts, seed=0, template=template)
        prompts, _ = prepare_prompts(examples, tokenizer, 4096, prefill)
        rollouts = engine.generate([p.token_ids for p in prompts], args.samples,
                                   max_new_tokens=args.max_new_tokens, seeds=[p.index for p in prompts])
        by_prompt = [prompts[r.prompt_index] for r in rollouts]
        texts = [p.text for p in by_prompt]
        responses = [p.response_text(r.text) for p, r in zip(by_prompt, rollouts)]
        refs = [p.example.reference for p in by_prompt]
        strict = spec(model, texts, responses, refs)
        loose = fallback(model, texts, responses, refs)
        row = {
            "variant": name, "template": template, "prefill": prefill,
            "valid_frac": sum(parse_response(r, "r1").valid for r in responses) / len(responses),
            "format_rate": sum(o.format for o in strict) / len(strict),
            "nonzero_std_groups_spec": nonzero_std_fraction([o.reward for o in strict], args.samples),
            "nonzero_std_groups_fallback": nonzero_std_fraction([o.reward for o in loose], args.samples),
            "mean_response_tokens": sum(len(r.token_ids) for r in rollouts) / len(rollouts),
            "seconds": time.time() - start,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"prompts": args.prompts, "samples": args.samples, "max_new_tokens": args.max_new_tokens,
            "model": "SmolLM2-135M-Instruct (embedded)", "data": "demo val split, seed 0"}
    out.with_suffix(".json").write_text(json.dumps({**meta, "variants": rows}, indent=2))
    lines = [f"{args.prompts} held-out demo prompts x {args.samples} samples, {args.max_new_tokens} new tokens, "
             "temperature 1.0", "",
             "| variant | r1-valid | format reward | groups with reward std > 0 (spec) | (fallback) | tokens |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {100 * r['valid_frac']:.1f}% | {100 * r['format_rate']:.1f}% | "
                     f"{100 * r['nonzero_std_groups_spec']:.0f}% | {100 * r['nonzero_std_groups_fallback']:.0f}% | "
                     f"{r['mean_response_tokens']:.0f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
