"""NOVER's reasoning reward (arXiv 2505.16022; reference code thinkwee/NOVER): pure arithmetic.

For a response o = (t, y) with reasoning t (the text inside `<think> ... </think>` under the r1
format) the reference y* is scored after the prompt and the reasoning, as score B scores it
(o' = x + t + y*, rlpr's reference mask). With logp_i the log-probabilities of the n reference
tokens and |t| the reasoning's length in tokens, the "reasoning perplexity" is

    P = exp( -(1/n) sum_i logp_i / N(|t|) ),   N(|t|) = max(1, 1 + log10 |t|)   (N = 1 when |t| = 0)

(lower is better: the reasoning made the reference likely; N discounts long reasoning). Within a
group, the responses that pass the strict format gate are ranked by P and the rank is the reward:

    r = (m - rank + 1) / m

where m is the number of gated-in responses of the group and rank in 1..m counts from the lowest
P, so the lowest P gets 1 and the highest 1/m: the reference code's `(valid_count - rank0) /
valid_count` (reward_functions.py `reasoning_reward`, rank0 0-based). Ties share the mean of
their ranks (the reference code breaks them by response order, which is arbitrary). A response
that fails the gate (or has no scored reference token) gets 0, the lowest. N uses log10 as the
reference code does (utils.py: `max(1, 1 + np.log10(reasoning_len))`).

The optional efficiency term (the paper's R_e; the reference code's `efficiency_reward`): among the
m gated-in responses of a group, a response earns the fraction of the other m - 1 that it beats on
both counts, a strictly shorter reasoning and a strictly lower P:

    R_e(i) = #{j != i gated in: |t_i| < |t_j| and P_i < P_j} / (m - 1)

(0 when m < 2, and for a gated-out response). The reference code weights it as the rank
(`EFFICIENCY_REWARD_WEIGHT = REASONING_REWARD_WEIGHT = 1.0`).
"""

from __future__ import annotations

import math
from typing import Hashable, Sequence

from rlpr.reward.parsing import THINK_CLOSE, THINK_OPEN, parse_response


def length_norm(reasoning_tokens: int) -> float:
    """N(|t|) = max(1, 1 + log10 |t|); 1 for an empty reasoning."""
    return max(1.0, 1.0 + math.log10(reasoning_tokens)) if reasoning_tokens > 0 else 1.0


def reasoning_perplexity(mean_logprob: float, reasoning_tokens: int) -> float:
    """P = exp(-mean_logprob / N(|t|)), mean_logprob the mean log-prob per reference token."""
    return math.exp(-mean_logprob / length_norm(reasoning_tokens))


# reward.nover_gate: which responses enter the rank. format: NOVER's strict format gate; scored:
# every response whose reference was scored (a tagless one through the spec-1b fallback, its whole
# text the reasoning), for models that do not write the tags (an option beyond the paper).
NOVER_GATES = ("format", "scored")


def reasoning_text(response: str, mode: str = "r1", whole_if_invalid: bool = False) -> str:
    """The reasoning t of a format-valid response: inside `<think> ... </think>` when it has them
    (r1), else everything before the answer block; for an invalid response '' (or, with
    `whole_if_invalid`, the whole response: the reasoning the spec-1b fallback scores y* after)."""
    parsed = parse_response(response, mode)
    if not parsed.valid:
        return response if whole_if_invalid else ""
    head = response[:parsed.block]
    if THINK_OPEN in head and THINK_CLOSE in head:
        return head.split(THINK_OPEN, 1)[1].split(THINK_CLOSE, 1)[0]
    return head


def rank_rewards(perplexities: Sequence[float | None]) -> list[float]:
    """One group's rewards from its perplexities (None: gated out, reward 0). Ranked ascending
    among the m gated-in ones, ties share the mean rank, r = (m - rank + 1) / m."""
    kept = sorted((p, i) for i, p in enumerate(perplexities) if p is not None)
    out = [0.0] * len(perplexities)
    m, k = len(kept), 0
    while k < m:
        j = k
        while j + 1 < m and kept[j + 1][0] == kept[k][0]:
            j += 1
        rank = (k + 1 + j + 1) / 2  # the mean of the 1-based ranks k+1 .. j+1
        for _, i in kept[k:j + 1]:
            out[i] = (m - rank + 1) / m
        k = j + 1
    return out


def consecutive_groups(keys: Sequence[Hashable]) -> list[int]:
    """Group ids for runs of equal consecutive keys (how a caller that passes no groups is read:
    a group's responses are next to each other and share a prompt and reference)."""
    ids, last = [], object()
    for key in keys:
        if not ids or key != last:
            ids.append((ids[-1] + 1) if ids else 0)
        else:
            ids.append(ids[-1])
        last = key
    return ids


def group_rank_rewards(perplexities: Sequence[float | None], groups: Sequence[Hashable]) -> list[float]:
    """`rank_rewards` within each group (responses with equal group ids), in the input's order."""
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(perplexities)
    for idx in members.values():
        for i, r in zip(idx, rank_rewards([perplexities[i] for i in idx])):
            out[i] = r
    return out


def efficiency_rewards(perplexities: Sequence[float | None], lengths: Sequence[int]) -> list[float]:
    """One group's efficiency terms R_e (None perplexity: gated out, 0): the fraction of the other
    gated-in responses with both a longer reasoning and a higher P; all 0 with fewer than 2."""
    kept = [i for i, p in enumerate(perplexities) if p is not None]
    out = [0.0] * len(perplexities)
    if len(kept) < 2:
        return out
    for i in kept:
        beaten = sum(1 for j in kept if j != i and lengths[i] < lengths[j] and perplexities[i] < perplexities[j])
        out[i] = beaten / (len(kept) - 1)
    return out


def group_efficiency_rewards(perplexities: Sequence[float | None], lengths: Sequence[int],
                             groups: Sequence[Hashable]) -> list[float]:
    """`efficiency_rewards` within each group (responses with equal group ids), in the input's order."""
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    out = [0.0] * len(perplexities)
    for idx in members.values():
        for i, r in zip(idx, efficiency_rewards([perplexities[i] for i in idx], [lengths[i] for i in idx])):
            out[i] = r
    return out
