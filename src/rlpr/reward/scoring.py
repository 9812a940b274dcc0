"""Score B / score A: aggregate the model's log-probs of the reference tokens (spec section 1.4-1.6).

One no-grad forward per micro-batch; sequences are length-sorted and packed by a padded-token
budget so that padding waste stays small; only reference positions go through the output layer.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from rlpr.forward import token_logprobs
from rlpr.reward.sequence import ScoredText, pad_batch, tokenize_scored


def _mean_prob(logp: torch.Tensor) -> float:
    return logp.exp().mean().item()


def _mean_logprob(logp: torch.Tensor) -> float:
    return logp.mean().item()


def _seq_likelihood(logp: torch.Tensor) -> float:
    return logp.sum().exp().item()


def _geo_mean_prob(logp: torch.Tensor) -> float:
    return logp.mean().exp().item()


AGGREGATIONS: dict[str, Callable[[torch.Tensor], float]] = {
    "mean_prob": _mean_prob,          # the paper's PR
    "mean_logprob": _mean_logprob,
    "seq_likelihood": _seq_likelihood,  # VeriFree-style likelihood (ablation)
    "geo_mean_prob": _geo_mean_prob,
}


def aggregate(logp: torch.Tensor, how: str = "mean_prob") -> float:
    """Aggregate the fp32 log-probs [n] of one sequence's reference tokens."""
    try:
        fn = AGGREGATIONS[how]
    except KeyError:
        raise ValueError(f"unknown aggregation {how!r}; choose one of {', '.join(AGGREGATIONS)}") from None
    return fn(logp.float())


def _micro_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped (longest first) so that each group's padded size stays within max_tokens."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches, current = [], []
    for i in order:
        width = lengths[current[0]] if current else lengths[i]
        if current and width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


@torch.no_grad()
def reference_logprobs(model, tokenizer, items: list[ScoredText | None], *, temperature: float = 1.0,
                       max_length: int | None = None, max_batch_tokens: int = 8192,
                       padding_side: str = "right") -> list[torch.Tensor | None]:
    """Per item, the fp32 log-probs of its reference tokens; None for an item that is None, has no
    reference token, or is longer than `max_length` tokens (these score 0)."""
    out: list[torch.Tensor | None] = [None] * len(items)
    todo = [i for i, it in enumerate(items) if it is not None]
    if not todo:
        return out
    enc = tokenize_scored(tokenizer, [items[i] for i in todo])
    keep = [k for k, i in enumerate(todo)
            if any(enc.ref_mask[k]) and (max_length is None or len(enc.input_ids[k]) <= max_length)]
    lengths = [len(enc.input_ids[k]) for k in keep]
    was_training = model.training
    model.eval()
    try:
        for batch in _micro_batches(lengths, max_batch_tokens):
            ks = [keep[j] for j in batch]
            ids, attn, target = pad_batch([enc.input_ids[k] for k in ks], [enc.ref_mask[k] for k in ks],
                                          tokenizer.pad_token_id, padding_side)
            ids, attn, target = (t.to(model.device) for t in (ids, attn, target))
            logp, _ = token_logprobs(model, ids, attn, target, temperature)
            counts = target[:, 1:].sum(-1).tolist()
            for k, piece in zip(ks, torch.split(logp.cpu(), counts)):
                out[todo[k]] = piece
    finally:
        model.train(was_training)
    return out


def score_texts(model, tokenizer, items: list[ScoredText | None], *, aggregation: str = "mean_prob",
                **kwargs) -> list[float]:
    """Aggregated reference scores; 0.0 where `reference_logprobs` gives None."""
    logps = reference_logprobs(model, tokenizer, items, **kwargs)
    scores = [0.0 if lp is None else aggregate(lp, aggregation) for lp in logps]
    return [s if math.isfinite(s) else 0.0 for s in scores]
