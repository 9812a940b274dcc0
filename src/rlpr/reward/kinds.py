"""Reward kinds: how the probability reward, a verifier's verdict and the format term combine.

Pure arithmetic on one response's scores, in a registry (`reward.kind`):

- `probability` (RLPR, spec section 3): (1 - alpha) * shaping(B - A) + alpha * format.
- `verifier` (RLVR, the paper's baseline): (1 - alpha) * correct + alpha * format, where
  `correct` is 1 when the verifier of `reward.verifier` accepts the response, else 0
  (rlpr/reward/verifiers.py: `oracle`, the grader of `rlpr eval`, or `exact`, a normalized exact
  match of the extracted answer).
- `hybrid` (the official RLPR code's `prob_mix` reward manager, `mix_type=soft`):
  vr_weight * verifier + pr_weight * probability, each with its own format term, so the format
  counts twice (0.1 * 1.0 + 0.1 * 0.5 with the defaults), and debiasing applies to the
  probability part only; the std filter and the advantages see the sum.
- `nover` (NOVER, arXiv 2505.16022): (1 - alpha) * rank + alpha * format, where `rank` (in
  `delta`) is the response's rank by reasoning perplexity within its group, 0 for a response that
  fails the strict format gate (rlpr/reward/nover.py); its `group_transform` turns the group's
  perplexities into the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from rlpr.reward.nover import group_rank_rewards


@dataclass(frozen=True)
class Scores:
    """What one response was scored with: shaped B - A (`delta`), the verifier's verdict, format."""

    delta: float
    correct: float  # 1.0 / 0.0, the verdict of reward.verifier (0.0 when no verifier applies)
    format: float


def probability(s: Scores, alpha: float, pr_weight: float, vr_weight: float) -> float:
    return (1.0 - alpha) * s.delta + alpha * s.format


def verifier(s: Scores, alpha: float, pr_weight: float, vr_weight: float) -> float:
    return (1.0 - alpha) * s.correct + alpha * s.format


def hybrid(s: Scores, alpha: float, pr_weight: float, vr_weight: float) -> float:
    return vr_weight * verifier(s, alpha, 0, 0) + pr_weight * probability(s, alpha, 0, 0)


@dataclass(frozen=True)
class RewardKind:
    combine: Callable[[Scores, float, float, float], float]
    needs_score_b: bool  # runs the policy over o' (the probability reward)
    needs_grader: bool  # the reward depends on a verifier's verdict (reward.verifier)
    # group-level step: (per-response pre-scores, None = gated out; group ids) -> per-response delta
    group_transform: Callable[[Sequence[float | None], Sequence[Hashable]], list[float]] | None = None


REWARD_KINDS: dict[str, RewardKind] = {
    "probability": RewardKind(probability, needs_score_b=True, needs_grader=False),
    "verifier": RewardKind(verifier, needs_score_b=False, needs_grader=True),
    "hybrid": RewardKind(hybrid, needs_score_b=True, needs_grader=True),
    "nover": RewardKind(probability, needs_score_b=True, needs_grader=False, group_transform=group_rank_rewards),
}
