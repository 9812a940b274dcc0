"""Score B / score A: aggregate the model's log-probs of the reference tokens (spec section 1.4-1.6).

One no-grad forward per micro-batch; sequences are length-sorted and packed by a padded-token
budget so that padding waste stays small; only reference positions go through the output layer.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from rlpr.model.batching import token_budget_batches, width_batches
from rlpr.model.forward import (PrefixState, distribution_stats, eval_mode, hidden_states, past_continuation_hidden,
                               project_logprobs, token_logprobs)
from rlpr.model.packing import prefix_continuation_hidden
from rlpr.reward.from_cache import allows
from rlpr.reward.r3 import r3_scores
from rlpr.reward.sequence import ScoredText, TokenizedBatch, pad_batch, strip_response, tokenize_scored


def _mean_prob(logp: torch.Tensor) -> float:
    return logp.exp().mean().item()


def _mean_logprob(logp: torch.Tensor) -> float:
    return logp.mean().item()


def _sum_logprob(logp: torch.Tensor) -> float:
    return logp.sum().item()


def _seq_likelihood(logp: torch.Tensor) -> float:
    return logp.sum().exp().item()


def _geo_mean_prob(logp: torch.Tensor) -> float:
    return logp.mean().exp().item()


# The registry of aggregations (`reward.aggregation`): logp_i, i = 1..n, are the fp32 log-probs of
# the n reference tokens of one scored text; each maps them to one score.
#   mean_prob       (1/n) sum_i exp(logp_i)    in [0, 1]   the RLPR paper's probability reward
#   mean_logprob    (1/n) sum_i logp_i         in (-inf, 0] the mean log-probability (JEPO-style)
#   sum_logprob     sum_i logp_i               in (-inf, 0] log p(y* | Q, z): the log-likelihood
#   seq_likelihood  exp(sum_i logp_i)          in [0, 1]   p(y* | Q, z): VeriFree's reward
#   geo_mean_prob   exp((1/n) sum_i logp_i)    in [0, 1]   the geometric-mean probability
# Log-domain scores (mean_logprob, sum_logprob, r3) are <= 0, while an unscored response (invalid
# format, no fallback) scores 0: use them with a fallback or a format every response meets
# (docs/verifier-free.md).
LOG_DOMAIN = ("mean_logprob", "sum_logprob", "r3")  # scores <= 0: an unscored response's 0 would beat them all
AGGREGATIONS: dict[str, Callable[[torch.Tensor], float]] = {
    "mean_prob": _mean_prob,
    "mean_logprob": _mean_logprob,
    "sum_logprob": _sum_logprob,
    "seq_likelihood": _seq_likelihood,
    "geo_mean_prob": _geo_mean_prob,
}
# Group-level aggregations: one score per response from the whole group's log-probs, (per-response
# log-probs or None, per-response alignment keys, group ids) -> per-response score or None.
#   r3   sum_j w_j logp_ij, w_j = std_i(logp_ij) / sum_k std_i(logp_ik)   DRO's R3 (rlpr/reward/r3.py)
GROUP_AGGREGATIONS: dict[str, Callable[..., list[float | None]]] = {
    "r3": r3_scores,
}


def aggregation_names() -> tuple[str, ...]:
    """Every value of `reward.aggregation`: the per-sequence ones, then the group-level ones."""
    return (*AGGREGATIONS, *GROUP_AGGREGATIONS)


def aggregate(logp: torch.Tensor, how: str = "mean_prob") -> float:
    """Aggregate the fp32 log-probs [n] of one sequence's reference tokens."""
    if how in GROUP_AGGREGATIONS:
        raise ValueError(f"aggregation {how!r} weighs a whole group's responses together; it has no "
                         "per-sequence value (use group_scores)")
    try:
        fn = AGGREGATIONS[how]
    except KeyError:
        raise ValueError(f"unknown aggregation {how!r}; choose one of {', '.join(aggregation_names())}") from None
    return fn(logp.float())


def group_scores(logps: list[torch.Tensor | None], keys: list, groups: list, how: str) -> list[float]:
    """A group-level aggregation's scores (0.0 for an unscored response or a non-finite score)."""
    scores = GROUP_AGGREGATIONS[how](logps, keys, groups)
    return [s if s is not None and math.isfinite(s) else 0.0 for s in scores]


def _shared_prefix_groups(tokenizer, items, enc, keep: list[int]) -> tuple[list[tuple[list[int], list[int]]], list[int]]:
    """Split `keep` (indices into enc) into groups whose tokens start with their prompt's own
    tokenization (so the prompt can run once for the group), and the rest.

    A prompt with one text (score A, a greedy held-out response) gains nothing from sharing and
    would cost a forward pass of its own: it goes to the rest, which runs in padded batches
    (100 held-out prompts: 100 batch-1 passes became a handful of batches)."""
    by_prefix: dict[str, list[int]] = {}
    rest = []
    for k in keep:
        item = items[k]
        if item.prefix_chars:
            by_prefix.setdefault(item.text[:item.prefix_chars], []).append(k)
        else:
            rest.append(k)
    groups = []
    for prefix_text, ks in by_prefix.items():
        if len(ks) < 2:
            rest.extend(ks)
            continue
        prefix = tokenizer(prefix_text, add_special_tokens=False)["input_ids"]
        p = len(prefix)
        fits = [k for k in ks if enc.input_ids[k][:p] == prefix and not any(enc.ref_mask[k][:p])]
        rest.extend(k for k in ks if k not in set(fits))
        if fits:
            groups.append((prefix, fits))
    return groups, rest


def through_last_scored(enc: TokenizedBatch) -> TokenizedBatch:
    """Each text cut after its last scored token: no later token changes a scored token's log-prob
    (causal attention), so the forwards skip what closes the answer (" </answer>", EOS)."""
    ends = [len(m) - m[::-1].index(True) if any(m) else len(m) for m in enc.ref_mask]
    return TokenizedBatch([ids[:e] for ids, e in zip(enc.input_ids, ends)], [m[:e] for m, e in zip(enc.ref_mask, ends)])


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _cache_starts(enc, keep: list[int], caches: list) -> tuple[dict[int, int], list[int]]:
    """Split `keep` (indices into enc) into the texts that continue their rollout's kept cache, with
    where each continues (L: its longest common token prefix with the cached ids, at most the
    position before its first scored token, whose hidden state the new forward must produce), and
    the rest. A text without a cache or sharing no token with it goes to the rest."""
    starts, rest = {}, []
    for k in keep:
        cache = caches[k]
        first = enc.ref_mask[k].index(True)
        start = min(common_prefix(enc.input_ids[k], cache.ids), first - 1) if cache is not None else 0
        if start > 0:
            starts[k] = start
        else:
            rest.append(k)
    return starts, rest


def continuing_model(scorer, cache, on_copy: str):
    """The model that continues a kept `cache` (reward.score_b_on_copy): the rollout copy that computed
    it (`cache.model`: the policy's weights with LoRA merged, in the copy's dtype) where `on_copy` is
    always, or auto and the copy has the scorer's dtype (the same arithmetic to float rounding, without
    the adapter's separate matmuls); else the scorer."""
    copy = getattr(cache, "model", None)
    if copy is not None and allows(on_copy, next(copy.parameters()).dtype, next(scorer.parameters()).dtype):
        return copy
    return scorer


def _cached_logprobs(model, enc, starts: dict[int, int], caches: list, temperature: float, max_batch_tokens: int,
                     on_copy: str = "never"):
    """(index into enc, its reference log-probs) for the texts of `starts`: each text's tokens from
    its start run on its kept cache's first `start` positions (by `continuing_model`), in token-budget
    batches of similar widths (`width_batches`: a row counts its full length, its past padded to the
    batch's longest)."""
    by_model: dict[int, tuple] = {}
    for k in starts:
        runner = continuing_model(model, caches[k], on_copy)
        by_model.setdefault(id(runner), (runner, []))[1].append(k)
    for runner, ks in by_model.values():
        for batch in width_batches([len(enc.input_ids[k]) - starts[k] for k in ks],
                                   [len(enc.input_ids[k]) for k in ks], max_batch_tokens):
            rows = [ks[j] for j in batch]
            hidden, tokens = past_continuation_hidden(
                runner, [caches[k].kv[..., :starts[k], :] for k in rows], [enc.input_ids[k][starts[k]:] for k in rows],
                [enc.ref_mask[k][starts[k]:] for k in rows])
            logp, _ = project_logprobs(runner, hidden, tokens, temperature)
            yield from zip(rows, torch.split(logp.float().cpu(), [sum(enc.ref_mask[k]) for k in rows]))


def _engine_logprobs(enc, rows: list[int], caches: list, temperature: float):
    """(index into enc, its reference log-probs or None) for texts whose cache lives in a rollout
    engine (vllm's EngineCache): the engine scores them with its prefix cache read; None where it
    could not (the caller recomputes those)."""
    by_engine: dict[int, list[int]] = {}
    for k in rows:
        by_engine.setdefault(id(caches[k].engine), []).append(k)
    for ks in by_engine.values():
        positions = [[t for t, m in enumerate(enc.ref_mask[k]) if m] for k in ks]
        pieces = caches[ks[0]].engine.reference_logprobs([enc.input_ids[k] for k in ks], positions, temperature)
        yield from zip(ks, pieces)


def _forward_batches(enc, groups, rest, max_batch_tokens: int):
    """The forwards of a scoring pass, as (prefix ids or None, indices into enc): each shared-prefix
    group's rows (a row counts its full length: the prompt's keys/values are repeated for it), then
    the rest for padded batches, all in token-budget batches (`token_budget_batches`)."""
    for prefix, ks in groups:
        for batch in token_budget_batches([len(enc.input_ids[k]) for k in ks], max_batch_tokens):
            yield prefix, [ks[j] for j in batch]
    for batch in token_budget_batches([len(enc.input_ids[k]) for k in rest], max_batch_tokens):
        yield None, [rest[j] for j in batch]


@torch.no_grad()
def reference_logprobs(model, tokenizer, items: list[ScoredText | None], *, temperature: float = 1.0,
                       max_length: int | None = None, max_batch_tokens: int = 8192,
                       padding_side: str = "right", share_prefix: bool = True,
                       splice: str = "text", too_long: list[int] | None = None,
                       caches: list | None = None, pack: bool = False, on_copy: str = "never"
                       ) -> list[torch.Tensor | None]:
    """Per item, the fp32 log-probs of its reference tokens; None for an item that is None, has no
    reference token, or is longer than `max_length` tokens (these score 0; the indices of the
    last are appended to `too_long`, so that callers can count and flag them, issue 29).

    With `share_prefix`, texts that start with the same prompt run it once (exact; see
    `forward.continuation_hidden`); the others go through padded, length-sorted batches.
    `splice`: how the texts become ids (`sequence.tokenize_scored`). `caches`: per item, the KV cache
    its rollout kept (`rollout.kept_cache.RowCache`, computed with `model`'s weights) or None; a text
    then runs only its tokens after the longest common prefix with the cached ids. A cache in a rollout
    engine (vllm's `EngineCache`, with the weights of `model`) is scored by the engine from its prefix
    cache instead. `pack` (trainer.pack_responses, resolved): a shared prompt's texts run packed into
    rows after it (`model.packing`) instead of one padded row each. `on_copy` (reward.score_b_on_copy):
    whether the rollout copy that kept a cache continues it (`continuing_model`).
    """
    out: list[torch.Tensor | None] = [None] * len(items)
    todo = [i for i, it in enumerate(items) if it is not None]
    if not todo:
        return out
    scored = [items[i] for i in todo]
    enc = tokenize_scored(tokenizer, scored, splice)
    keep = [k for k in range(len(todo))
            if any(enc.ref_mask[k]) and (max_length is None or len(enc.input_ids[k]) <= max_length)]
    if too_long is not None and max_length is not None:
        too_long.extend(todo[k] for k in range(len(todo)) if len(enc.input_ids[k]) > max_length)
    enc = through_last_scored(enc)
    kept = [caches[i] for i in todo] if caches is not None else None  # per text of enc
    starts, keep = _cache_starts(enc, keep, kept) if kept is not None else ({}, keep)
    in_engine = [k for k in starts if getattr(kept[k], "engine", None) is not None]
    for k, piece in _engine_logprobs(enc, in_engine, kept, temperature):
        del starts[k]
        if piece is None:
            keep.append(k)  # the engine could not: recomputed below
        else:
            out[todo[k]] = piece
    groups, rest = _shared_prefix_groups(tokenizer, scored, enc, keep) if share_prefix else ([], keep)
    with eval_mode(model):
        if starts:
            for k, piece in _cached_logprobs(model, enc, starts, kept, temperature, max_batch_tokens, on_copy):
                out[todo[k]] = piece
        for prefix, ks in _forward_batches(enc, groups, rest, max_batch_tokens):
            if prefix is not None:
                p = len(prefix)
                hidden, tokens = prefix_continuation_hidden(model, PrefixState(model, prefix),
                                                            [enc.input_ids[k][p:] for k in ks],
                                                            [enc.ref_mask[k][p:] for k in ks], pack)
                logp, _ = project_logprobs(model, hidden, tokens, temperature)
                counts = [sum(enc.ref_mask[k][p:]) for k in ks]
            else:
                ids, attn, target = pad_batch([enc.input_ids[k] for k in ks], [enc.ref_mask[k] for k in ks],
                                              tokenizer.pad_token_id, padding_side)
                ids, attn, target = (t.to(model.device) for t in (ids, attn, target))
                logp, _ = token_logprobs(model, ids, attn, target, temperature)
                counts = target[:, 1:].sum(-1).tolist()
            for k, piece in zip(ks, torch.split(logp.float().cpu(), counts)):
                out[todo[k]] = piece
    return out


def score_texts(model, tokenizer, items: list[ScoredText | None], *, aggregation: str = "mean_prob",
                **kwargs) -> list[float]:
    """Aggregated reference scores; 0.0 where `reference_logprobs` gives None."""
    logps = reference_logprobs(model, tokenizer, items, **kwargs)
    scores = [0.0 if lp is None else aggregate(lp, aggregation) for lp in logps]
    return [s if math.isfinite(s) else 0.0 for s in scores]


@torch.no_grad()
def response_distribution_stats(model, tokenizer, prompt_texts: list[str], responses: list[str], *,
                                max_length: int | None = None, max_batch_tokens: int = 8192, pack: bool = False
                                ) -> list[tuple[torch.Tensor, torch.Tensor] | None]:
    """Per response, the policy's next-token distribution at each of its tokens given the prompt and
    the tokens before (`forward.distribution_stats`: entropy [T] and mean log-prob over the
    vocabulary [T]); None for an empty response or one longer, with its prompt, than `max_length`.
    The response is the text after the prompt (EOS removed), tokenized with it as score B tokenizes
    o'; a group's responses share their prompt's forward, as score B's do (packed with `pack`)."""
    eos = tokenizer.eos_token or ""
    items = [ScoredText(p + r, len(p), len(p) + len(r), prefix_chars=len(p)) for p, r in
             ((p, strip_response(r, eos)) for p, r in zip(prompt_texts, responses))]
    out: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * len(items)
    enc = tokenize_scored(tokenizer, items)
    keep = [k for k in range(len(items)) if any(enc.ref_mask[k][1:]) and not enc.ref_mask[k][0]
            and (max_length is None or len(enc.input_ids[k]) <= max_length)]
    groups, rest = _shared_prefix_groups(tokenizer, items, enc, keep)
    device = next(model.parameters()).device

    state, state_of = None, None
    with eval_mode(model):
        for prefix, ks in _forward_batches(enc, groups, rest, max_batch_tokens):
            if prefix is not None:
                p = len(prefix)
                if state_of is not prefix:  # the group's prompt runs once
                    state, state_of = PrefixState(model, prefix), prefix
                hidden, _ = prefix_continuation_hidden(model, state, [enc.input_ids[k][p:] for k in ks],
                                                       [enc.ref_mask[k][p:] for k in ks], pack)
                counts = [sum(enc.ref_mask[k][p:]) for k in ks]
            else:
                ids, attn, target = pad_batch([enc.input_ids[k] for k in ks], [enc.ref_mask[k] for k in ks],
                                              tokenizer.pad_token_id, "right")
                ids, attn, target = ids.to(device), attn.to(device), target.to(device)
                hidden = hidden_states(model, ids, attn)[:, :-1][target[:, 1:]]
                counts = target[:, 1:].sum(-1).tolist()
            entropy, mean_logp = distribution_stats(model, hidden)
            for k, h, m in zip(ks, torch.split(entropy.cpu(), counts), torch.split(mean_logp.cpu(), counts)):
                out[k] = (h, m)
    return out
