"""Policy-gradient losses (spec section 5): PPO-clip with clip-higher, aggregation modes whose
value does not depend on how a mini-batch is split, and KL estimators.

Shapes: token tensors are flat `[N]` over the response tokens of a micro-batch, with `seq [N]`
giving each token's sequence index (0..S-1) within the micro-batch. Aggregations divide sums by a
normaliser computed over the WHOLE mini-batch (all micro-batches, all ranks), so that summing the
micro-batch losses gives exactly the mini-batch loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


def ppo_clip_token_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                        clip_low: float = 0.2, clip_high: float = 0.27) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO-clip loss [N] = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)) and the
    per-token clipped indicator [N] (float)."""
    ratio = torch.exp(logp - old_logp)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    return loss, (clipped > unclipped).float()


@dataclass(frozen=True)
class Normaliser:
    """Mini-batch-wide counts that the aggregations divide by."""

    tokens: int  # response tokens in the whole mini-batch
    sequences: int  # sequences in the whole mini-batch


def _seq_lengths(seq: torch.Tensor, num_seqs: int) -> torch.Tensor:
    return torch.bincount(seq, minlength=num_seqs).clamp(min=1).to(torch.float32)


def token_mean(values, seq, num_seqs, norm: Normaliser):
    """Mean over all response tokens of the mini-batch."""
    return values.sum() / norm.tokens


def seq_mean_token_mean(values, seq, num_seqs, norm: Normaliser):
    """Mean over sequences of each sequence's token mean."""
    per_seq = torch.zeros(num_seqs, dtype=values.dtype, device=values.device).index_add(0, seq, values)
    return (per_seq / _seq_lengths(seq, num_seqs)).sum() / norm.sequences


def seq_mean_token_sum(values, seq, num_seqs, norm: Normaliser):
    """Mean over sequences of each sequence's token sum."""
    return values.sum() / norm.sequences


LOSS_AGGREGATIONS: dict[str, Callable] = {
    "token_mean": token_mean,
    "seq_mean_token_mean": seq_mean_token_mean,
    "seq_mean_token_sum": seq_mean_token_sum,
}


def aggregate_loss(values: torch.Tensor, seq: torch.Tensor, num_seqs: int, norm: Normaliser,
                   mode: str = "token_mean") -> torch.Tensor:
    return LOSS_AGGREGATIONS[mode](values, seq, num_seqs, norm)


def kl_k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """log p - log p_ref."""
    return logp - ref_logp


def kl_k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """0.5 (log p - log p_ref)^2."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """exp(ref - logp) - (ref - logp) - 1: unbiased, non-negative ("low variance").

    Computed as expm1(d) - d: exp(d) - 1 rounds to slightly below d for |d| ~ 1e-14 (a negative
    KL of -1e-16); expm1(d) >= d holds in floating point too."""
    d = torch.clamp(ref_logp - logp, -20.0, 20.0)
    return torch.expm1(d) - d


KL_ESTIMATORS: dict[str, Callable] = {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


# algorithm.rollout_is: correct the policy loss for rollouts sampled by another engine (vllm), whose
# log-probs differ from the trainer's (kernels, precision): each token's loss is multiplied by
# rho = exp(logp_trainer - logp_engine) of the sampled token (token_*), or by one rho per response
# from the sum of its tokens' differences (sequence_*), clipped to [low, high] (*_truncate:
# truncated IS, TIS) or set to 0 outside it (*_mask). TRL's vllm_importance_sampling_mode (its
# default sequence_mask, clip_max 3), verl's rollout importance sampling.
ROLLOUT_IS = ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def rollout_is_weights(trainer_logp: torch.Tensor, engine_logp: torch.Tensor, seq: torch.Tensor, num_seqs: int,
                       mode: str, low: float, high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(rho [N], outside [N] bool) for the N sampled tokens (`seq` [N]: their response index in
    0..num_seqs-1); `outside`: the tokens whose rho fell outside [low, high] (clipped or masked).
    Detached: the weights carry no gradient."""
    if mode not in ROLLOUT_IS[1:]:
        raise ValueError(f"unknown rollout_is mode {mode!r}; choose one of {', '.join(ROLLOUT_IS[1:])}")
    diff = (trainer_logp.detach() - engine_logp.detach()).float()
    if mode.startswith("sequence"):
        per_seq = torch.zeros(num_seqs, dtype=diff.dtype, device=diff.device).index_add(0, seq, diff)
        diff = per_seq[seq]
    rho = torch.exp(diff)
    outside = (rho < low) | (rho > high)
    rho = rho.clamp(low, high) if mode.endswith("truncate") else rho.masked_fill(outside, 0.0)
    return rho, outside


# algorithm.entropy_tokens: which tokens the entropy bonus covers, as a 0/1 weight per token from
# the tokens' advantages. `all` is the spec's. `nonzero_advantage` leaves out the responses whose
# advantage is 0 (a group whose responses all got the same reward): a batch without any reward
# signal then gets no gradient at all, where under Adam the tiny entropy gradient alone is scaled up
# to full lr-sized steps (measured: entropy 2.3 -> 9.0 nats in 20 steps of an RLVR run that never
# rewarded a response, docs/learning.md).
ENTROPY_TOKENS: dict[str, Callable[[torch.Tensor], torch.Tensor | None]] = {
    "all": lambda advantages: None,
    "nonzero_advantage": lambda advantages: (advantages != 0).to(advantages.dtype),
}


# algorithm.pg_tokens: which response tokens the policy loss covers (all of them, or the reasoning
# before the answer block: VeriFree trains the sampled answer through the reference-SFT term instead)
PG_TOKENS = ("all", "reasoning")

# algorithm.ref_sft_norm: one response's value in the reference-SFT term from its reference
# tokens' log-probs (sums [S], token counts [S]): their mean, or their sum (VeriFree's, whose SFT
# loss sums -log p over the answer block's tokens).
REF_SFT_NORMS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "mean": lambda sums, counts: sums / counts,
    "sum": lambda sums, counts: sums,
}

# algorithm.ref_sft_weight: the weight w of one response in the reference-SFT term, from its
# (reward, advantage); a plain number, so it carries no gradient.
SFT_WEIGHTS: dict[str, Callable[[float, float], float]] = {
    "reward": lambda reward, advantage: reward,  # VeriFree: R(z) = p(y* | Q, z) weights grad log p(y* | Q, z)
    "advantage": lambda reward, advantage: advantage,
    "one": lambda reward, advantage: 1.0,
}


def ref_sft_loss(logp: torch.Tensor, seq: torch.Tensor, num_seqs: int, weights: torch.Tensor,
                 coef: float, norm: Normaliser, per_response: str = "mean") -> tuple[torch.Tensor, torch.Tensor]:
    """The reference-SFT term of a micro-batch: -coef * sum_s w_s * v_s / S, with v_s the mean
    (`per_response="mean"`) or the sum (`"sum"`, VeriFree) of logp_t over the reference tokens of s.

    `logp [N]`: log-probs of the reference tokens of o' (each given Q, the reasoning and the reference
    tokens before it), `seq [N]` their sequence index in 0..num_seqs-1, `weights [num_seqs]`
    (detached), S = `norm.sequences` (the whole mini-batch's responses, so the sum over micro-batches
    is the mini-batch's value). Returns (loss, per-sequence mean log-probs [num_seqs], detached)."""
    sums = torch.zeros(num_seqs, dtype=logp.dtype, device=logp.device).index_add(0, seq, logp)
    counts = _seq_lengths(seq, num_seqs).to(logp.device)
    values = REF_SFT_NORMS[per_response](sums, counts)
    loss = -coef * (weights.to(values.device).detach() * values).sum() / norm.sequences
    return loss, (sums / counts).detach()
