"""A step's groups and what is logged about them: reward and rollout metrics, sampled rows, memory.

Sums are taken over every rank (`rlpr.parallel.distributed.sum_values`, a no-op in one process)
before dividing, so the metrics do not depend on how groups are sharded.
"""

from __future__ import annotations

import logging
import math
import resource
from collections import Counter
from dataclasses import dataclass

import torch

from rlpr.data.prompts import Prompt
from rlpr.parallel import distributed as dist
from rlpr.reward.label_free import extracted_answer
from rlpr.reward.probability_reward import RewardOutput
from rlpr.rollout.hf import Rollout

log = logging.getLogger("rlpr.train")


@dataclass
class Group:
    """The n responses to one prompt, with their rewards."""

    prompt: Prompt
    rollouts: list[Rollout]
    rewards: list[RewardOutput]

    @property
    def scalar_rewards(self) -> list[float]:
        return [r.reward for r in self.rewards]

    @property
    def std(self) -> float:
        values = torch.tensor(self.scalar_rewards, dtype=torch.float64)
        return values.std(unbiased=True).item()


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


def mean(values) -> float:
    values = list(values)
    return sum(values) / len(values) if values else float("nan")


def rollout_metrics(groups: list[Group]) -> dict:
    """reward/* and rollout/* over every rank's groups; `_tokens` is the generated token count
    (the caller turns it into a throughput)."""
    outs = [r for g in groups for r in g.rewards]
    rolls = [r for g in groups for r in g.rollouts]
    keys = ["score_b", "score_a", "reward", "format", "fallback", "valid", "delta", "penalty", "len",
            "truncated", "count", "correct", "graded", "distinct", "groups", "too_long", "answers", "identical",
            "own"]
    local = [sum(o.score_b for o in outs), sum(o.score_a for o in outs), sum(o.reward for o in outs),
             sum(o.format for o in outs), sum(o.fallback for o in outs), sum(o.valid for o in outs),
             sum(o.delta for o in outs), sum(o.penalty < 0 for o in outs),
             sum(len(r.token_ids) for r in rolls), sum(not r.finished for r in rolls), len(outs),
             sum(o.correct or 0.0 for o in outs), sum(o.correct is not None for o in outs),
             sum(len({r.text.strip() for r in g.rollouts}) / max(len(g.rollouts), 1) for g in groups),
             len(groups), sum(o.too_long for o in outs),
             sum(distinct_answers(g) for g in groups), sum(identical_share(g) for g in groups),
             sum(o.scored_reference in (None, g.prompt.example.reference) for g in groups for o in g.rewards)]
    s = dict(zip(keys, dist.sum_values(local)))
    n = max(s["count"], 1)
    return {"reward/score_b_mean": s["score_b"] / n, "reward/score_a_mean": s["score_a"] / n,
            "reward/mean": s["reward"] / n, "reward/format_rate": s["format"] / n,
            "reward/valid_frac": s["valid"] / n, "reward/fallback_frac": s["fallback"] / n,
            "reward/delta_mean": s["delta"] / n, "reward/repetition_frac": s["penalty"] / n,
            # responses whose score B text was longer than the model's context (B = 0: unscored)
            "reward/too_long_frac": s["too_long"] / n,
            # responses scored against their own prompt's reference: 1 but under reward.shuffle_references,
            # where it must be 0 (a control scored against its own reference is no control)
            "reward/own_reference_frac": s["own"] / n,
            "reward/accuracy": s["correct"] / s["graded"] if s["graded"] else float("nan"),
            "rollout/response_len_mean": s["len"] / n, "rollout/truncated_frac": s["truncated"] / n,
            # distinct responses per group / group size: falls toward 1/n when the policy collapses
            "rollout/distinct_frac": s["distinct"] / max(s["groups"], 1),
            # collapse monitors (issue 33): distinct extracted answers per group (the answer a rule
            # verifier reads, normalized; no answer counts as one more), and the share of a group's
            # responses equal to its most common response (1: all identical)
            "rollout/distinct_answers": s["answers"] / max(s["groups"], 1),
            # the responses generated this step, every sampling round's (what the step's rollouts cost)
            "rollout/responses": int(s["count"]),
            "rollout/identical_frac": s["identical"] / max(s["groups"], 1),
            "_tokens": s["len"]}


def group_std_stats(groups: list[Group]) -> tuple[float, float]:
    """(mean of the finite group reward stds, count of groups with std > 1e-6) over every rank's groups."""
    stds = [g.std for g in groups]
    total, count, nonzero = dist.sum_values(
        [sum(s for s in stds if math.isfinite(s)), sum(math.isfinite(s) for s in stds), sum(s > 1e-6 for s in stds)])
    return (total / count if count else float("nan")), nonzero


def filter_metrics(ema: float | None, threshold: float | None, kept: int, generated: int, tries: int,
                   mean_std: float, nonzero: float, cached: int, passed: int | None = None) -> dict:
    """filter/*: the std filter's step (global counts), its EMA and threshold (0 while it is off).
    `kept`: the groups the step trains on (at most prompts_per_step); `passed`: every group the
    filter let through, the surplus beyond prompts_per_step included."""
    return {"filter/kept_frac": kept / max(generated, 1), "filter/kept_groups": kept,
            "filter/passed_groups": kept if passed is None else passed,
            "filter/generated_groups": generated, "filter/tries": tries, "filter/mean_std": mean_std,
            "filter/ema_std": ema if ema is not None else float("nan"),
            "filter/threshold": threshold if threshold is not None else 0.0,
            "filter/nonzero_std_frac": nonzero / max(generated, 1), "filter/cached_prompts": cached}


def distinct_answers(group: Group) -> int:
    """How many different answers a group's responses give (`label_free.extracted_answer`; None,
    no answer, counts as one)."""
    return len({extracted_answer(group.prompt.response_text(r.text)) for r in group.rollouts})


def identical_share(group: Group) -> float:
    """The share of the group's responses equal (stripped) to its most common response."""
    texts = Counter(r.text.strip() for r in group.rollouts)
    return max(texts.values()) / len(group.rollouts) if group.rollouts else 0.0


def sample_rows(groups: list[Group], limit: int = 4) -> list[dict]:
    """The responses of the first `limit` groups with their rewards, for samples/step_N.jsonl."""
    rows = []
    for g in groups[:limit]:
        for r, o in zip(g.rollouts, g.rewards):
            # "reference": the prompt's own; "scored_reference" (from the output): the one its reward read
            rows.append({"prompt": g.prompt.example.prompt[-1]["content"], "reference": g.prompt.example.reference,
                         "response": g.prompt.response_text(r.text), **o.to_dict()})
    return rows


# The collapse monitors' documented thresholds (docs/training.md, "Collapse monitors"): one warning per run
# and monitor the first time a step crosses it (intrinsic rewards such as entropy, self-certainty and
# majority vote rise, then collapse: arXiv 2506.17219, 2505.21444). (metric, "below" | "above", limit, why)
COLLAPSE_WARNINGS = [
    ("policy/entropy", "below", 0.05, "the policy is nearly deterministic on its own responses"),
    ("rollout/distinct_answers", "below", 1.05, "nearly every group gives a single answer (a majority-vote "
                                                "reward then pays for consistency, right or wrong)"),
    ("rollout/identical_frac", "above", 0.9, "most responses repeat their group's most common text"),
]


class CollapseMonitor:
    """Warns once per monitor (COLLAPSE_WARNINGS) when a step's metric crosses its threshold; the
    metrics themselves are logged every step (metrics.jsonl, the report's collapse panels)."""

    def __init__(self):
        self.warned: set[str] = set()

    def __call__(self, step: int, m: dict) -> None:
        for key, side, limit, why in COLLAPSE_WARNINGS:
            value = m.get(key)
            if value is None or not math.isfinite(value) or key in self.warned:
                continue
            if (value < limit) if side == "below" else (value > limit):
                self.warned.add(key)
                if dist.is_main():
                    log.warning("step %d: collapse? %s %.3f is %s %g: %s", step, key, value, side, limit, why)


def flag_collapse(step: int, m: dict, n: int) -> None:
    """Warn when the groups' responses are nearly all the same text (the policy collapsed onto
    one answer or template, so the advantages are mostly zero); the metric stays in the log.

    Collapse: on average at most 2 distinct responses of n per group, and at most 1 (all the same)
    when n is 2 (issue 29: with 2 responses, "at most 2 distinct" held every step). One response
    per prompt has nothing to compare: never flagged."""
    limit = min(2, n - 1)  # distinct responses per group that count as collapse
    if n > 1 and dist.is_main() and m["rollout/distinct_frac"] * n <= limit + 1e-9:
        log.warning("step %d: collapse? on average only %.1f distinct responses of %d per group "
                    "(rollout/distinct_frac %.2f)", step, m["rollout/distinct_frac"] * n, n, m["rollout/distinct_frac"])


class LengthMonitor:
    """Likelihood rewards, log-probability ones most, can be raised by shortening the reasoning
    (arXiv 2602.03979), so the step's mean response length is compared with that of the run's first
    `window` steps (`rollout/response_len_ratio`), with one warning the first time the ratio falls
    below `warn_below` (trainer.length_warn_ratio; 0: none). Its state is checkpointed."""

    def __init__(self, warn_below: float, window: int = 3):
        self.warn_below, self.window = warn_below, window
        self.first: list[float] = []
        self.warned = False

    def __call__(self, step: int, m: dict) -> None:
        length = m.get("rollout/response_len_mean")
        if length is None or not math.isfinite(length):
            return
        if len(self.first) < self.window:
            self.first.append(float(length))
        base = sum(self.first) / len(self.first)
        ratio = m["rollout/response_len_ratio"] = length / base if base > 0 else float("nan")
        if self.warn_below and not self.warned and len(self.first) == self.window and ratio < self.warn_below:
            self.warned = True
            if dist.is_main():
                log.warning("step %d: responses shortened to %.0f%% of the first %d steps' mean length (%.1f -> %.1f "
                            "tokens; rollout/response_len_ratio): the reward may pay for saying less",
                            step, 100 * ratio, self.window, base, length)

    def state_dict(self) -> dict:
        return {"first": list(self.first), "warned": self.warned}

    def load_state_dict(self, state: dict | None) -> None:
        if state:  # checkpoints from before the monitor have none: it starts afresh
            self.first, self.warned = [float(v) for v in state["first"]], bool(state["warned"])
