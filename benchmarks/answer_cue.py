"""Which answer cue and which form of score A make the fallback reward rank correct responses
first, and pay more for a correct response than for saying nothing?

Under the spec-1b fallback a tagless response is scored as Q + response + cue + y*. The cue is a
string after the response (`reward.answer_cue`) or a follow-up user turn written by the chat
template (`reward.answer_turn`); score A is the paper's prompt-only form (Q + " " + y*) or the
same cue after an empty response (the model's answer without reasoning). For sampled responses
with the grader's verdict, per cue and A form:

- ROC-AUC of B, B - A and the reward against correctness, pooled over the prompts with mixed
  correctness (the paper's protocol) and the mean within-group AUC (what GRPO's ranking sees),
- mean B of correct and wrong responses, mean A,
- `correct beat empty`: the share of correct responses whose B exceeds the B of an empty
  response with the same cue (below that, the reward pays for saying less),
- `reward > 0`: the share of responses with a positive debiased reward (threshold_0).

Samples: drawn here from the base model on the preset's training prompts (`--prompts N`, seeded),
or read from training runs' samples folders (`runs/NAME/samples/*.jsonl`).

    python benchmarks/answer_cue.py                       # 48 training prompts x 8 samples
    python benchmarks/answer_cue.py --from runs/*/samples

Writes benchmarks/results/answer_cue.{json,md}.
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
# name -> (answer_cue, answer_turn)
CUES = {
    "'\\n<answer> '": ("\n<answer> ", ""),
    "'\\nAnswer: '": ("\nAnswer: ", ""),
    "turn: Repeat your answer in as few words as possible.": ("", "Repeat your answer in as few words as possible."),
    "turn: What is the answer? Reply with the answer only.": ("", "What is the answer? Reply with the answer only."),
}


def sample_rows(preset: str, prompts: int, seed: int, threads: int) -> tuple[list[dict], object, object]:
    """`prompts` training prompts of `preset` x its group size, sampled from the base model, graded."""
    sys.path.insert(0, str(ROOT))
    from learning import make_trainer

    with tempfile.TemporaryDirectory() as tmp:
        trainer = make_trainer(preset, [f"model.threads={threads}"], Path(tmp))
        groups = trainer.rollout_groups(list(range(min(prompts, len(trainer.train_prompts)))), seed=seed)
        rows = [{"prompt_text": g.prompt.text, "response": g.prompt.response_text(r.text),
                 "reference": g.prompt.example.reference, "correct": bool(o.correct), "group": k}
                for k, g in enumerate(groups) for r, o in zip(g.rollouts, g.rewards)]
        return rows, trainer.policy, trainer.tokenizer


def read_rows(folders: list[str]) -> list[dict]:
    from rlpr.data.prompts import chat_text
    from rlpr.model.loading import load_tokenizer

    tok = load_tokenizer("default")
    rows = [json.loads(line) for folder in folders for f in sorted(glob.glob(f"{folder}/*.jsonl"))
            for line in open(f) if line.strip()]
    prompts = {r["prompt"] for r in rows}
    ids = {p: i for i, p in enumerate(sorted(prompts))}
    return [{"prompt_text": chat_text(tok, [{"role": "user", "content": r["prompt"]}]), "response": r["response"],
             "reference": r["reference"], "correct": bool(r["correct"]), "group": ids[r["prompt"]]} for r in rows]


def measure(model, tokenizer, rows: list[dict]) -> list[dict]:
    from rlpr.config import RewardConfig
    from rlpr.evaluation.reward_quality import mean_group_auc, mixed_groups, pooled_auc
    from rlpr.reward.probability_reward import ProbabilityReward

    labels = [r["correct"] for r in rows]
    groups = list(mixed_groups([r["group"] for r in rows], labels).values())
    args = ([r["prompt_text"] for r in rows], [r["response"] for r in rows], [r["reference"] for r in rows])
    results = []
    for name, (cue, turn) in CUES.items():
        outs = {form: ProbabilityReward(RewardConfig(invalid_fallback="free", alpha=0.0, answer_cue=cue or RewardConfig.answer_cue,
                                                     answer_turn=turn, score_a_form=form), tokenizer)(model, *args)
                for form in ("cue", "prompt")}
        b = [o.score_b for o in outs["cue"]]
        empty = [o.score_a for o in outs["cue"]]  # the cue-form A is B of an empty response
        for form, out in outs.items():
            scores = {"b": b, "b_minus_a": [o.score_b - o.score_a for o in out], "reward": [o.reward for o in out]}
            results.append({
                "cue": name, "score_a_form": form,
                **{f"auc_{k}": pooled_auc(v, labels, groups) for k, v in scores.items()},
                **{f"within_auc_{k}": mean_group_auc(v, labels, groups) for k, v in scores.items()},
                "b_correct": statistics.fmean(x for x, y in zip(b, labels) if y),
                "b_wrong": statistics.fmean(x for x, y in zip(b, labels) if not y),
                "a_mean": statistics.fmean(o.score_a for o in out),
                "correct_beat_empty": statistics.fmean(x > e for x, e, y in zip(b, empty, labels) if y),
                "reward_positive": statistics.fmean(o.reward > 0 for o in out)})
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in results[-1].items()}, flush=True)
    return results, len(groups)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--from", dest="folders", nargs="*", default=[], help="samples folders of training runs")
    p.add_argument("--preset", default="small")
    p.add_argument("--prompts", type=int, default=48, help="training prompts to sample (without --from)")
    p.add_argument("--seed", type=int, default=11)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--output", default=str(RESULTS / "answer_cue"))
    args = p.parse_args()

    if args.folders:
        from rlpr.model.loading import load_model

        rows = read_rows(args.folders)
        model, tokenizer = load_model("default")
        source = f"{len(rows)} responses read from {', '.join(args.folders)}"
    else:
        rows, model, tokenizer = sample_rows(args.preset, args.prompts, args.seed, args.threads)
        source = (f"{len(rows)} responses of the base model to {args.prompts} training prompts of preset "
                  f"`{args.preset}` (seed {args.seed}, its group size, temperature and length)")
    results, mixed = measure(model, tokenizer, rows)
    lines = [f"{source}; {sum(r['correct'] for r in rows)} graded correct; {mixed} prompts with mixed correctness. "
             "AUC: pooled over those prompts / mean within a prompt. 'correct beat empty': share of correct "
             "responses whose B exceeds an empty response's B with the same cue.\n",
             "| cue | score A form | AUC B | AUC B - A | AUC reward (pooled / within) | mean B correct / wrong "
             "| mean A | correct beat empty | reward > 0 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['cue']} | {r['score_a_form']} | {r['auc_b']:.3f} / {r['within_auc_b']:.3f} "
                     f"| {r['auc_b_minus_a']:.3f} / {r['within_auc_b_minus_a']:.3f} "
                     f"| {r['auc_reward']:.3f} / {r['within_auc_reward']:.3f} "
                     f"| {r['b_correct']:.3f} / {r['b_wrong']:.3f} | {r['a_mean']:.3f} "
                     f"| {100 * r['correct_beat_empty']:.0f}% | {100 * r['reward_positive']:.0f}% |")
    Path(args.output + ".md").write_text("\n".join(lines) + "\n")
    Path(args.output + ".json").write_text(json.dumps({"source": source, "rows": len(rows), "mixed_prompts": mixed,
                                                       "results": results}, indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
