"""The controls and label-free rewards (spec section 9): pure arithmetic, beside RLPR in one trainer.

A verifier-free method's gain counts only net of what a reward WITHOUT the reference's information
does through the same estimator, filter and update (sharpening alone lifts Avg@k toward greedy):

- `random` (Spurious Rewards, arXiv 2506.10947): r ~ Bernoulli(p), drawn from a generator seeded
  by (run seed, prompt id, response index), so that a rerun draws the same rewards.
- shuffled reference (`reward.shuffle_references`): RLPR with y*_i replaced by y*_pi(i), pi a
  derangement of the training prompts fixed by the run seed (`derangement`).
- `entropy` (EM-RL, arXiv 2505.15134; RENT, 2505.22660): r = -(1/T) sum_t H(p_t), p_t the policy's
  next-token distribution at response position t; RENT's variant averages the last k tokens only
  (`reward.entropy_last_k`).
- `self_certainty` (INTUITOR, arXiv 2505.19590): r = (1/T) sum_t KL(U || p_t)
  = (1/T) sum_t ( -log|V| - (1/|V|) sum_v log p_t(v) ).
- `majority` (TTRL, arXiv 2504.16084): the group's most frequent extracted answer (ties: the
  earliest) is the pseudo-label; r = 1 where a response's answer equals it, else 0; a response with
  no extractable answer neither votes nor scores.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import torch


def random_rewards(keys: Sequence[tuple[Hashable, int]], seed: int, p: float = 0.5) -> list[float]:
    """Bernoulli(p) per response, each from its own generator seeded by (run seed, prompt id,
    response index): the draw depends on nothing else (batching, ranks, the policy)."""
    return [float(random.Random(f"rlpr-random:{seed}:{prompt}:{index}").random() < p) for prompt, index in keys]


def entropy_reward(entropies: torch.Tensor, last_k: int = 0) -> float:
    """-(1/T) sum_t H(p_t) over the response's tokens (the last `last_k` only when > 0: RENT)."""
    chosen = entropies[-last_k:] if last_k else entropies
    return -chosen.double().mean().item()


def self_certainty_reward(mean_logps: torch.Tensor, vocab_size: int) -> float:
    """(1/T) sum_t KL(U || p_t), where KL(U || p) = -log|V| - mean_v log p(v) (>= 0, 0 for uniform p)."""
    return (-math.log(vocab_size) - mean_logps.double()).mean().item()


def majority_rewards(answers: Sequence[str | None], groups: Sequence[Hashable]) -> list[float]:
    """Per response 1.0 where its answer equals its group's most frequent answer, else 0.0; None
    (no extractable answer) neither votes nor scores. Ties go to the answer that appears first."""
    votes: dict[Hashable, Counter] = {}
    first: dict[Hashable, dict[str, int]] = {}
    for i, (a, g) in enumerate(zip(answers, groups)):
        if a is not None:
            votes.setdefault(g, Counter())[a] += 1
            first.setdefault(g, {}).setdefault(a, i)
    label = {g: max(c, key=lambda a: (c[a], -first[g][a])) for g, c in votes.items()}
    return [float(a is not None and a == label.get(g)) for a, g in zip(answers, groups)]


def derangement(references: Sequence[str], seed: int) -> list[int]:
    """pi, a permutation of range(n) fixed by `seed` with pi(i) != i for every i (Sattolo's
    algorithm: one cycle through all prompts), then pairs swapped so that no prompt is given a
    reference whose text equals its own wherever a swap can avoid it (many prompts may share an
    answer). n = 1 has no derangement: [0]."""
    n = len(references)
    rng = random.Random(f"rlpr-derangement:{seed}")
    pi = list(range(n))
    for i in range(n - 1, 0, -1):
        j = rng.randrange(i)
        pi[i], pi[j] = pi[j], pi[i]
    for i in range(n):
        if references[pi[i]] != references[i]:
            continue
        for j in rng.sample(range(n), n):
            if (j != i and references[pi[j]] != references[i] and references[pi[i]] != references[j]
                    and pi[j] != i and pi[i] != j):
                pi[i], pi[j] = pi[j], pi[i]
                break
    return pi


def kept_own_reference(references: Sequence[str], pi: Sequence[int]) -> list[int]:
    """The prompts i that pi still gives a reference text equal to their own (none in a control)."""
    return [i for i, j in enumerate(pi) if references[j] == references[i]]


# --------------------------------------------------------------------------- the reward kinds

@dataclass
class LabelFreeBatch:
    """What a label-free kind may read about a batch of responses (the reference is not among it).
    `stats()` runs the policy once, on first use: per response its tokens' (entropy [T], mean
    log-prob over the vocabulary [T]), None for a response with no token to score."""

    responses: list[str]
    groups: list[Hashable]
    keys: list[tuple[Hashable, int]]  # (prompt id, response index): the random draw's seed
    seed: int  # the run's seed (trainer.seed)
    random_p: float
    entropy_last_k: int
    vocab_size: int
    stats: Callable[[], list[tuple[torch.Tensor, torch.Tensor] | None]]


def random_kind(b: LabelFreeBatch) -> list[float]:
    return random_rewards(b.keys, b.seed, b.random_p)


def entropy_kind(b: LabelFreeBatch) -> list[float]:
    """An unscored (empty) response gets the uniform distribution's value, -log|V| (the lowest)."""
    return [entropy_reward(s[0], b.entropy_last_k) if s else -math.log(b.vocab_size) for s in b.stats()]


def self_certainty_kind(b: LabelFreeBatch) -> list[float]:
    """An unscored (empty) response gets the uniform distribution's value, 0 (the lowest)."""
    return [self_certainty_reward(s[1], b.vocab_size) if s else 0.0 for s in b.stats()]


def extracted_answer(response: str) -> str | None:
    """The answer a rule verifier reads, normalized as it compares (`verifiers.exact_key`)."""
    from rlpr.reward.verifiers import exact_key

    return exact_key(response)


def majority_kind(b: LabelFreeBatch) -> list[float]:
    return majority_rewards([extracted_answer(r) for r in b.responses], b.groups)


def response_keys(groups: Sequence[Hashable]) -> list[tuple[Hashable, int]]:
    """(group id, the response's position within its group) per response."""
    seen: Counter = Counter()
    out = []
    for g in groups:
        out.append((g, seen[g]))
        seen[g] += 1
    return out
