"""Group advantage estimators (spec section 4), a registry of pure tensor functions.

Every function takes the scalar rewards of whole groups, `rewards [G, n]` (G groups of n responses
to the same prompt), and returns one advantage per response, `[G, n]`.

All but `reinforce` subtract a per-group baseline, so adding one constant to every reward of a group
(a per-prompt score A, say) leaves their advantages unchanged; `reinforce` subtracts the batch's mean
instead, where such a shift shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

EPS = 1e-6


def grpo(rewards: torch.Tensor) -> torch.Tensor:
    """(r - mean_group) / (std_group + 1e-6), unbiased std; 0 for a whole group with std < 1e-6."""
    mean = rewards.mean(-1, keepdim=True)
    std = rewards.std(-1, unbiased=True, keepdim=True)
    adv = (rewards - mean) / (std + EPS)
    return torch.where(std < EPS, torch.zeros_like(adv), adv)


def dr_grpo(rewards: torch.Tensor) -> torch.Tensor:
    """Dr. GRPO: r - mean_group, no division by the std."""
    return rewards - rewards.mean(-1, keepdim=True)


def rloo(rewards: torch.Tensor) -> torch.Tensor:
    """REINFORCE leave-one-out: r_i - mean of the other n - 1 rewards of the group."""
    n = rewards.shape[-1]
    return (rewards - rewards.mean(-1, keepdim=True)) * n / (n - 1)


def centred_moments(rewards: torch.Tensor) -> tuple[float, float, float]:
    """(count, sum, sum of squares) of the group-centred rewards: summed over ranks, they give
    REINFORCE++'s batch statistics of the global batch."""
    centred = (rewards - rewards.mean(-1, keepdim=True)).double()
    return float(centred.numel()), centred.sum().item(), centred.pow(2).sum().item()


def reinforce_pp(rewards: torch.Tensor, moments: tuple[float, float, float] | None = None) -> torch.Tensor:
    """REINFORCE++ with baseline: subtract the group mean, then normalise over the whole batch.

    `moments` (see `centred_moments`) are the batch's statistics when the batch spans several
    ranks; by default, those of `rewards`.
    """
    centred = rewards - rewards.mean(-1, keepdim=True)
    n, total, squares = moments if moments is not None else centred_moments(rewards)
    if n < 2:
        return centred
    mean = total / n
    std = max(squares - total * total / n, 0.0) / (n - 1)
    return (centred - mean) / (std ** 0.5 + EPS)


def reward_moments(rewards: torch.Tensor) -> tuple[float, float, float]:
    """(count, sum, sum of squares) of the rewards themselves: summed over ranks, they give the
    global batch's mean reward (REINFORCE's baseline)."""
    r = rewards.double()
    return float(r.numel()), r.sum().item(), r.pow(2).sum().item()


def reinforce(rewards: torch.Tensor, moments: tuple[float, float, float] | None = None) -> torch.Tensor:
    """REINFORCE with a batch baseline: r - the mean reward of the whole batch (every group of every
    rank), no per-group baseline, no std division.

    Why it exists: every other estimator here subtracts a per-group baseline, under which RLPR's
    debiasing B - A (one score A per prompt) cancels except through the threshold clip. Here the
    rewards of different prompts are compared with one another, so a per-prompt A changes which
    responses are pushed up: the estimator under which the debiasing's own effect is visible (the
    `reinforce` and `reinforce_no_debias` variants of benchmarks/learning.py; docs/learning.md).

    `moments` (see `reward_moments`) are the batch's statistics when the batch spans several ranks;
    by default, those of `rewards`.
    """
    n, total, _ = moments if moments is not None else reward_moments(rewards)
    if n < 1:
        return torch.zeros_like(rewards)
    return rewards - total / n


# (count, sum, sum of squares): what a rank holding no groups contributes to the summed moments
NO_MOMENTS = (0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Estimator:
    """An advantage estimator with one signature, `(rewards [G, n], moments) -> [G, n]`.

    A batch estimator compares responses across the whole batch: its `moments` function gives a
    rank's (count, sum, sum of squares) of what it normalises over, which the trainer sums over
    ranks (a rank without groups adds `NO_MOMENTS`) and passes back as `moments`, so that every rank
    uses the global batch's statistics (None: those of `rewards`). The per-group estimators have no
    `moments` function and ignore the argument."""

    fn: Callable[..., torch.Tensor]
    moments: Callable[[torch.Tensor], tuple[float, float, float]] | None = None

    @property
    def batch(self) -> bool:
        return self.moments is not None

    def __call__(self, rewards: torch.Tensor, moments=None) -> torch.Tensor:
        return self.fn(rewards, moments) if self.batch else self.fn(rewards)


# The registry of estimators: its keys are the allowed values of algorithm.advantage.
ADVANTAGES: dict[str, Estimator] = {
    "grpo": Estimator(grpo), "rloo": Estimator(rloo), "dr_grpo": Estimator(dr_grpo),
    "reinforce_pp": Estimator(reinforce_pp, moments=centred_moments),
    "reinforce": Estimator(reinforce, moments=reward_moments),
}


def get_advantage(name: str) -> Estimator:
    if name not in ADVANTAGES:
        raise ValueError(f"unknown advantage {name!r}; choose one of {', '.join(ADVANTAGES)}")
    return ADVANTAGES[name]


def compute_advantages(rewards: torch.Tensor, name: str = "grpo", moments=None) -> torch.Tensor:
    """`moments`: the global batch statistics for a batch estimator (its `Estimator.moments`, summed
    over ranks; ignored by the per-group ones)."""
    if rewards.dim() != 2 or rewards.shape[-1] < 2:
        raise ValueError(f"rewards must be [groups, n >= 2], got {tuple(rewards.shape)}")
    return get_advantage(name)(rewards.float(), moments)
