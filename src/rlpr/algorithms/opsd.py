"""On-policy self-distillation with the reference (OPSD, spec section 10): pure tensor arithmetic.

Student S: the policy on the prompt alone; teacher T: the same model shown the reference before the
question (stop-gradient). At response position t, s_t = S(. | q, o_<t) and u_t = T(. | c(q, y*), o_<t).

- `generalized_jsd`: JSD_beta(u, s) = beta KL(u || m) + (1 - beta) KL(s || m), m = beta u + (1 - beta) s,
  with the reference code's ends (siyan-zhao/OPSD, opsd_trainer.py `generalized_jsd_loss`, from
  TRL's GKD): beta = 0 is the forward KL(u || s), beta = 1 the reverse KL(s || u).
- `clip_token_divergence`: min(JSD_t, c), the reference code's per-token clip (jsd_token_clip).
- `top_k_rows`: the teacher's k most likely tokens, renormalised over those k (the student is
  gathered at the same indices and renormalised too, as the reference code does).
- `sampled_token_advantage`: a_t = clip(log u_t(o_t) - log s_t(o_t), -c, c) (the reference code's
  memory-light `use_tinker_loss` form; it does not clip).
- `no_teacher_advantages`: the no-teacher control, -delta on the step's lowest-probability tokens.
- `pearson`, `spearman`, `identity_stats`: the identity check between the OPSD sum and RLPR's
  log-form debiased reward.

Shapes: token rows are flat over a batch's response tokens, `[N]` per token and `[N, K]` per token
and vocabulary entry (K = V for the full vocabulary, or k).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

# opsd.loss: the distillation signal's form
LOSSES = ("jsd", "sampled_token")
# opsd.teacher: the teacher's weights
TEACHERS = ("initial", "current", "ema")
# opsd.context: what the teacher is shown before the question
CONTEXTS = ("reference", "solution", "none")


def generalized_jsd(teacher_logp: torch.Tensor, student_logp: torch.Tensor, beta: float) -> torch.Tensor:
    """JSD_beta(u_t, s_t) per row [N] from log-probabilities [N, K], each row normalised over the same
    K entries (fp32 or fp64; finite). beta = 0: KL(u || s); beta = 1: KL(s || u); in between, the
    divergence to the mixture m = beta u + (1 - beta) s. Differentiable in both arguments."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    u, s = teacher_logp, student_logp
    if beta == 0.0:
        return (u.exp() * (u - s)).sum(-1)
    if beta == 1.0:
        return (s.exp() * (s - u)).sum(-1)
    m = torch.logsumexp(torch.stack([u + math.log(beta), s + math.log1p(-beta)]), dim=0)
    return beta * (u.exp() * (u - m)).sum(-1) + (1.0 - beta) * (s.exp() * (s - m)).sum(-1)


def top_k_rows(teacher_logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's k most likely entries per row of logits [N, V]: (indices [N, k], log-probs [N, k]
    renormalised over those k). k >= V keeps every entry (in order of probability)."""
    values, indices = torch.topk(teacher_logits.float(), k=min(k, teacher_logits.shape[-1]), dim=-1)
    return indices, torch.log_softmax(values, dim=-1)


def student_rows(student_logits: torch.Tensor, indices: torch.Tensor | None) -> torch.Tensor:
    """The student's log-probs [N, K] to compare with the teacher's rows: over the full vocabulary
    (`indices` None), or gathered at the teacher's top-k `indices` [N, k] and renormalised."""
    logits = student_logits.float()
    if indices is not None:
        logits = logits.gather(-1, indices)
    return torch.log_softmax(logits, dim=-1)


def jsd_from_logits(student_logits: torch.Tensor, teacher_logp: torch.Tensor, indices: torch.Tensor | None = None,
                    *, beta: float) -> torch.Tensor:
    """JSD_beta(u_t, s_t) [N] from the student's logits [N, V] (temperature applied) and the teacher's
    rows [N, K] (`student_rows` matches them: the full vocabulary, or the teacher's top-k `indices`)."""
    return generalized_jsd(teacher_logp.float(), student_rows(student_logits, indices), beta)


def clip_token_divergence(divergence: torch.Tensor, clip: float) -> torch.Tensor:
    """min(JSD_t, clip) per token [N] (clip 0: unchanged): the reference code's jsd_token_clip, so
    that a few tokens whose divergence is many times the mean (style words such as "wait") cannot
    carry the loss; a token past the clip adds `clip` and no gradient."""
    return divergence.clamp(max=clip) if clip > 0 else divergence


def sampled_token_advantage(teacher_logp: torch.Tensor, student_logp: torch.Tensor, clip: float) -> torch.Tensor:
    """a_t = clip(log u_t(o_t) - log s_t(o_t), -clip, clip) [N] (detached: an advantage carries no
    gradient); clip = inf: unclipped, as the reference code."""
    diff = (teacher_logp.detach() - student_logp.detach()).float()
    return diff.clamp(-clip, clip) if math.isfinite(clip) else diff


def no_teacher_advantages(student_logps: Sequence[torch.Tensor], rho: float, delta: float) -> list[torch.Tensor]:
    """The no-teacher control: a_t = -delta on the ceil(rho * N) tokens of lowest student log-prob
    among all N tokens of `student_logps` (one [T_i] tensor per response: the step), 0 elsewhere;
    ties go to the earlier token in that order. Returns one [T_i] tensor per response."""
    lengths = [len(t) for t in student_logps]
    flat = torch.cat([t.detach().double().reshape(-1) for t in student_logps]) if lengths else torch.zeros(0)
    n = flat.numel()
    marked = torch.zeros(n, dtype=torch.bool)
    count = min(n, math.ceil(rho * n - 1e-9))
    if count:
        order = torch.sort(flat, stable=True).indices  # ascending; equal values keep their order
        marked[order[:count]] = True
    advantages = torch.where(marked, torch.tensor(-float(delta)), torch.tensor(0.0)).float()
    return list(torch.split(advantages, lengths))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r of two equal-length sequences (NaN with fewer than 2 pairs or a constant side)."""
    if len(x) != len(y):
        raise ValueError("pearson: sequences of different lengths")
    n = len(x)
    if n < 2:
        return float("nan")
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rho: Pearson's r of the ranks (average ranks for ties)."""
    return pearson(ranks(x), ranks(y))


@dataclass(frozen=True)
class IdentityStats:
    """The identity check over a step's responses: the OPSD sum sum_t [log u_t(o_t) - log s_t(o_t)]
    against RLPR's log p(y* | q, o) - log p(y* | q), per response."""

    pearson: float
    spearman: float
    mean_gap: float  # mean of (OPSD sum - RLPR's log reward)
    count: int

    def metrics(self, prefix: str = "opsd/identity_") -> dict:
        return {f"{prefix}pearson": self.pearson, f"{prefix}spearman": self.spearman,
                f"{prefix}mean_gap": self.mean_gap, f"{prefix}n": float(self.count)}


def identity_stats(opsd_sums: Sequence[float], rlpr_log_rewards: Sequence[float]) -> IdentityStats:
    """Correlations and mean gap over the pairs where both sides are finite."""
    pairs = [(a, b) for a, b in zip(opsd_sums, rlpr_log_rewards) if math.isfinite(a) and math.isfinite(b)]
    xs, ys = [a for a, _ in pairs], [b for _, b in pairs]
    gap = sum(a - b for a, b in pairs) / len(pairs) if pairs else float("nan")
    return IdentityStats(pearson(xs, ys), spearman(xs, ys), gap, len(pairs))
