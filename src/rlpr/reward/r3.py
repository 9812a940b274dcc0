"""R3, the Reasoning Reflection Reward of DRO (Xu et al., "Direct Reasoning Optimization",
arXiv 2506.13351, section 4.1.3): pure arithmetic on a group's reference log-probabilities.

The G responses to one prompt are scored on the same reference y* = (y_1 .. y_n): logp_ij is the
log-probability of y_j after the prompt, the i-th response's reasoning and y_<j (score B's
per-token log-probs). Reference tokens whose log-probability varies across the group's reasonings
are the "reasoning-reflective" ones; R3 weights each token by that variation:

    sigma_j = std_i(logp_ij)                     (over the group's scored responses)
    w_j     = sigma_j / sum_k sigma_k            (uniform 1/n when every sigma_j is 0)
    R3_i    = sum_j w_j * logp_ij                (<= 0: a weighted mean log-probability)

The paper gives R3_i = sum_j w(sigma_j) log pi(y_j | q, c_i, y_<j) with sigma_j the standard deviation
of token j's log-probability across the sampled reasonings and w "assigning greater weight to tokens
with higher standard deviation"; the exact w is not published (v1), so rlpr takes w proportional to
sigma_j, normalised to sum to 1 (docs/verifier-free.md says what is confirmed and what assumed).
With std-normalised advantages (GRPO) the normalisation does not change the advantages: it scales
the whole group's rewards by one number.

The tokens must line up across the group: responses are compared only with the responses of their
group whose reference token ids are identical (`keys`), so a response whose reference was
tokenized differently (a different whitespace before y* merged into its first token, say) gets
its own weights; alone in its key, sigma is 0 and it scores the plain mean log-probability.
"""

from __future__ import annotations

from typing import Hashable, Sequence

import torch


def token_weights(logps: torch.Tensor) -> torch.Tensor:
    """w [n] from the log-probs [m, n] of m responses on the same n reference tokens: the tokens'
    standard deviation across the m responses, normalised to sum to 1 (uniform when all are 0)."""
    sigma = logps.double().std(dim=0, unbiased=False) if logps.shape[0] > 1 else torch.zeros(logps.shape[1],
                                                                                             dtype=torch.float64)
    total = sigma.sum()
    if not torch.isfinite(total) or total <= 0:
        return torch.full((logps.shape[1],), 1.0 / logps.shape[1], dtype=torch.float64)
    return sigma / total


def r3_scores(logps: Sequence[torch.Tensor | None], keys: Sequence[Hashable],
              groups: Sequence[Hashable]) -> list[float | None]:
    """R3 per response (None where `logps` is None: an unscored response). Responses are weighed
    together when they share a group id and an alignment key (their reference token ids)."""
    members: dict = {}
    for i, (lp, key, group) in enumerate(zip(logps, keys, groups)):
        if lp is not None and lp.numel():
            members.setdefault((group, key), []).append(i)
    out: list[float | None] = [None] * len(logps)
    for idx in members.values():
        stacked = torch.stack([logps[i].double() for i in idx])  # [m, n]
        scores = stacked @ token_weights(stacked)
        for i, s in zip(idx, scores.tolist()):
            out[i] = s
    return out
