"""Which answer cue and which form of score A make the fallback reward rank correct responses
first? ROC-AUC of B, B - A and the reward against the grader's verdict, on sampled responses.

Under the spec-1b fallback, a tagless response is scored as Q + response + cue + y*; score A is
either the paper's prompt-only form (Q + " " + y*) or the same cue after the prompt. This reads
the samples that training runs write (`runs/NAME/samples/*.jsonl`: prompt, response, reference,
graded `correct`), keeps the prompts whose responses are mixed (some right, some wrong), and
re-scores them with the embedded model under each cue and A form.

    python benchmarks/answer_cue.py /tmp/rlpr-learning/runs/*/samples --max-rows 400

Writes benchmarks/results/answer_cue.{json,md}.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
CUES = ["\n<answer> ", "\nAnswer: ", "\nThe answer is "]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folders", nargs="+", help="samples folders of training runs")
    p.add_argument("--max-rows", type=int, default=400)
    p.add_argument("--output", default=str(RESULTS / "answer_cue"))
    args = p.parse_args()

    from rlpr.config import RewardConfig
    from rlpr.data.prompts import chat_text
    from rlpr.evaluation.reward_quality import roc_auc
    from rlpr.model.loading import load_model
    from rlpr.reward.probability_reward import ProbabilityReward

    rows = [json.loads(line) for folder in args.folders for f in sorted(glob.glob(f"{folder}/*.jsonl"))
            for line in open(f) if line.strip()]
    by_prompt: dict[str, list[dict]] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt"], []).append(r)
    mixed = [g for g in by_prompt.values() if 0 < sum(r["correct"] for r in g) < len(g)]
    rows = [r for g in mixed for r in g][:args.max_rows]
    model, tok = load_model("default")
    texts = [chat_text(tok, [{"role": "user", "content": r["prompt"]}]) for r in rows]
    labels = [bool(r["correct"]) for r in rows]
    results = []
    for cue in CUES:
        for form in ("prompt", "cue"):
            reward = ProbabilityReward(RewardConfig(invalid_fallback="free", alpha=0.0, answer_cue=cue,
                                                    score_a_form=form), tok)
            outs = reward(model, texts, [r["response"] for r in rows], [r["reference"] for r in rows])
            b = [o.score_b for o in outs]
            results.append({
                "cue": cue, "score_a_form": form, "auc_b": roc_auc(b, labels),
                "auc_b_minus_a": roc_auc([o.score_b - o.score_a for o in outs], labels),
                "auc_reward": roc_auc([o.reward for o in outs], labels),
                "b_correct": statistics.fmean(x for x, y in zip(b, labels) if y),
                "b_wrong": statistics.fmean(x for x, y in zip(b, labels) if not y),
                "a_mean": statistics.fmean(o.score_a for o in outs),
                "reward_positive": statistics.fmean(o.reward > 0 for o in outs)})
            print(results[-1], flush=True)
    lines = [f"{len(rows)} sampled responses to {len(mixed)} prompts with mixed correctness "
             f"({sum(labels)} graded correct); pooled ROC-AUC against the grader's verdict.\n",
             "| cue | score A form | AUC B | AUC B - A | AUC reward | mean B correct / wrong | mean A | reward > 0 |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| `{r['cue']!r}` | {r['score_a_form']} | {r['auc_b']:.3f} | {r['auc_b_minus_a']:.3f} | "
                     f"{r['auc_reward']:.3f} | {r['b_correct']:.3f} / {r['b_wrong']:.3f} | {r['a_mean']:.3f} | "
                     f"{100 * r['reward_positive']:.0f}% |")
    Path(args.output + ".md").write_text("\n".join(lines) + "\n")
    Path(args.output + ".json").write_text(json.dumps({"rows": len(rows), "prompts": len(mixed),
                                                       "results": results}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
