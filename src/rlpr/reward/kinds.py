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
- the controls and label-free rewards (spec section 9; rlpr/reward/label_free.py), each
  (1 - alpha) * r + alpha * format with r from `label_free` and no reference read: `random`
  (Bernoulli(reward.random_p)), `entropy` (minus the mean token entropy, EM-RL / RENT),
  `self_certainty` (the mean KL(U || p_t), INTUITOR) and `majority` (agreement with the group's most
  common extracted answer, TTRL). The shuffled-reference control is not a kind: any kind that reads
  the reference reads another prompt's with `reward.shuffle_references`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

from rlpr.reward.label_free import LabelFreeBatch, entropy_kind, majority_kind, random_kind, self_certainty_kind
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


def no_reward(s: Scores, alpha: float, pr_weight: float, vr_weight: float) -> float:
    """A kind whose signal is per token (pure OPSD, its no-teacher control): no sequence reward."""
    return 0.0


@dataclass(frozen=True)
class RewardKind:
    combine: Callable[[Scores, float, float, float], float]
    needs_score_b: bool  # runs the policy over o' (the probability reward)
    needs_grader: bool  # the reward depends on a verifier's verdict (reward.verifier)
    # group-level step: (per-response pre-scores, None = gated out; group ids) -> per-response delta
    group_transform: Callable[[Sequence[float | None], Sequence[Hashable]], list[float]] | None = None
    # a reward that reads no reference (the controls, the label-free family): batch -> r per response
    label_free: Callable[[LabelFreeBatch], list[float]] | None = None
    reads_policy: bool = False  # label_free runs the policy over the responses (entropy, self_certainty)
    sequence_reward: bool = True  # False: every response's reward is 0 (no repetition penalty, no std filter)
    # the per-token signal added in the update (rlpr/train/opsd.py): None, "teacher" (OPSD) or
    # "no_teacher" (the control: -delta on the lowest-probability tokens)
    token_signal: str | None = None


REWARD_KINDS: dict[str, RewardKind] = {
    "probability": RewardKind(probability, needs_score_b=True, needs_grader=False),
    "verifier": RewardKind(verifier, needs_score_b=False, needs_grader=True),
    "hybrid": RewardKind(hybrid, needs_score_b=True, needs_grader=True),
    "nover": RewardKind(probability, needs_score_b=True, needs_grader=False, group_transform=group_rank_rewards),
    "random": RewardKind(probability, needs_score_b=False, needs_grader=False, label_free=random_kind),
    "entropy": RewardKind(probability, needs_score_b=False, needs_grader=False, label_free=entropy_kind,
                          reads_policy=True),
    "self_certainty": RewardKind(probability, needs_score_b=False, needs_grader=False,
                                 label_free=self_certainty_kind, reads_policy=True),
    "majority": RewardKind(probability, needs_score_b=False, needs_grader=False, label_free=majority_kind),
    "opsd": RewardKind(no_reward, needs_score_b=False, needs_grader=False, sequence_reward=False,
                       token_signal="teacher"),
    "opsd_hybrid": RewardKind(probability, needs_score_b=True, needs_grader=False, token_signal="teacher"),
    "opsd_no_teacher": RewardKind(no_reward, needs_score_b=False, needs_grader=False, sequence_reward=False,
                                  token_signal="no_teacher"),
}


def reads_reference(kind: str, opsd_context: str = "reference") -> bool:
    """Whether a kind reads the reference (what reward.shuffle_references replaces): the probability
    reward, a verifier, or an OPSD teacher shown it (opsd.context reference or solution)."""
    k = REWARD_KINDS[kind]
    if k.label_free is not None:
        return False
    return k.needs_score_b or k.needs_grader or (k.token_signal == "teacher" and opsd_context != "none")
