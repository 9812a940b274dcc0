"""Held-out evaluation during training: greedy and sampled accuracy (Avg@k, pass@k) with binomial
standard errors, and the before -> after report printed when a run ends."""

from __future__ import annotations

import logging
from contextlib import nullcontext

import torch

from rlpr.evaluation.metrics import binomial_se
from rlpr.model.memory import release_memory
from rlpr.parallel import distributed as dist
from rlpr.rollout.engines import keeping_caches, reusing_prompts

log = logging.getLogger("rlpr.train")

# Held-out samples are seeded apart from training rollouts, and the same before and after training.
EVAL_SEED = 7_000_003


@torch.no_grad()
def evaluate(trainer, responses: list | None = None, score: bool = True) -> dict:
    """Held-out evaluation of a Trainer's policy on its `val_prompts` (each rank its share; every
    rank calls it, it holds collectives): greedy responses (probability reward with
    `trainer.eval_reward`, score B, greedy accuracy, format, length) and, with
    `trainer.eval_samples` = k > 0, k samples per question at `trainer.eval_temperature` (default: the
    rollout temperature): Avg@k
    accuracy (spec section 7) and pass@k. Standard errors are binomial over the questions,
    sqrt(p (1 - p) / n).

    `responses`: a list to which one dict per question of this rank is appended, for re-grading
    without re-generating: {"prompt": its Prompt, "greedy": the greedy response as graded,
    "greedy_correct": its verdict, "samples": the k sampled responses, "samples_correct": theirs}.

    `score=False`: the greedy responses are graded only, without the probability reward (a scoring
    pass per response), for sets whose reward nobody reads; no reward, score B or format keys."""
    from rlpr.grading import grade_example

    trainer.display.phase("eval")  # on the live step display; left out of its ETA
    total = int(dist.sum_values([len(trainer.val_prompts)])[0])  # global: a rank may hold none
    if not total:
        return {}
    cfg = trainer.cfg
    k = cfg.trainer.eval_samples
    if dist.is_main():
        log.info("evaluating on %d held-out prompts (greedy%s)", total, f" and {k} samples each" if k else "")
    engine = trainer.engine
    engine.sync(trainer.policy, trainer.strategy.full_weights(trainer.policy))  # under fsdp layer by layer
    prompts = trainer.val_prompts
    max_new = cfg.trainer.eval_max_new_tokens or cfg.rollout.max_new_tokens
    # with samples, their pass starts from the greedy pass's prompt prefills (engines.reusing_prompts)
    with reusing_prompts(engine) if k else nullcontext():
        with keeping_caches(engine, trainer.keep_caches):  # score B continues the greedy responses' caches
            rollouts = engine.generate([p.token_ids for p in prompts], 1, max_new_tokens=max_new, temperature=0.0)
        release_memory()
        if score:
            rewards = trainer.score(prompts, rollouts, trainer.eval_reward)
            release_memory()
        samples = engine.generate([p.token_ids for p in prompts], k, max_new_tokens=max_new,
                                  temperature=cfg.trainer.eval_temperature or cfg.rollout.temperature,
                                  top_p=cfg.trainer.eval_top_p or cfg.rollout.top_p,
                                  seeds=[EVAL_SEED + p.index for p in prompts]) if k else []
    if score:
        correct = [bool(o.correct) for o in rewards]
    else:  # the verdicts trainer.score would attach
        rewards = []
        owners = [prompts[r.prompt_index] for r in rollouts]
        correct = [grade_example(p.example, p.response_text(r.text)).correct for p, r in zip(owners, rollouts)]
    kept: list[dict] = [{} for _ in prompts]  # per question (rollouts[j].prompt_index is its position)
    for r, c in zip(rollouts, correct):
        p = prompts[r.prompt_index]
        kept[r.prompt_index] = {"prompt": p, "greedy": p.response_text(r.text), "greedy_correct": c,
                                "samples": [], "samples_correct": []}
    sampled_right = sampled_any = 0.0
    if k:
        release_memory()
        for i, p in enumerate(prompts):
            texts = [p.response_text(r.text) for r in samples[i * k:(i + 1) * k]]
            right = [grade_example(p.example, text).correct for text in texts]
            sampled_right += sum(right) / k
            sampled_any += any(right)
            kept[i]["samples"], kept[i]["samples_correct"] = texts, right
    if responses is not None:
        responses.extend(kept)
    local = [sum(o.reward for o in rewards), sum(o.score_b for o in rewards), sum(correct),
             sum(o.format for o in rewards), sum(len(r.token_ids) for r in rollouts), len(rollouts),
             sampled_right, sampled_any]
    reward_sum, b_sum, right, fmt, length, n, avg_k, pass_k = dist.sum_values(local)
    n = max(n, 1)
    out = {"eval/reward_mean": reward_sum / n, "eval/score_b_mean": b_sum / n,
           "eval/greedy_accuracy": right / n, "eval/greedy_accuracy_se": binomial_se(right / n, n),
           "eval/format_rate": fmt / n, "eval/response_len_mean": length / n, "eval/questions": n}
    if not score:
        for key in ("eval/reward_mean", "eval/score_b_mean", "eval/format_rate"):
            del out[key]
    # eval/accuracy: Avg@k when sampled (the paper's metric), else greedy
    out["eval/accuracy"], out["eval/accuracy_se"] = out["eval/greedy_accuracy"], out["eval/greedy_accuracy_se"]
    if k:
        out.update({"eval/accuracy": avg_k / n, "eval/accuracy_se": binomial_se(avg_k / n, n),
                    f"eval/pass@{k}": pass_k / n, "eval/samples": k})
    return out


def held_out_report(summary: dict) -> str:
    """The held-out results before -> after, with binomial standard errors, for the console."""
    before, after = summary.get("before") or {}, summary.get("after") or {}
    if not after:
        return "held-out: not evaluated (data.val is empty or the run was interrupted)"
    k = after.get("eval/samples")
    rows = [("accuracy" + (f" (Avg@{k})" if k else " (greedy)"), "eval/accuracy", "eval/accuracy_se", True)]
    if k:
        rows += [("greedy accuracy", "eval/greedy_accuracy", "eval/greedy_accuracy_se", True),
                 (f"pass@{k}", f"eval/pass@{k}", None, True)]
    rows += [("mean reward (greedy)", "eval/reward_mean", None, False),
             ("score B (greedy)", "eval/score_b_mean", None, False)]
    lines = [f"held-out ({int(after['eval/questions'])} questions), before -> after:"]
    for label, key, se_key, percent in rows:
        def show(d):
            if key not in d:
                return "n/a"
            value = f"{100 * d[key]:.1f}%" if percent else f"{d[key]:.4f}"
            return value + (f" ± {100 * d[se_key]:.1f}" if se_key and se_key in d else "")
        lines.append(f"  {label:<22} {show(before):>14} -> {show(after)}")
    return "\n".join(lines)
