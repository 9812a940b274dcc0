"""Each response's KV cache kept from its rollout, for score B (reward.score_b_from_cache).

Score B's sequence o' is the prompt, the response's reasoning and then the reference; the rollout
engine has just computed the keys and values of the prompt and the response with the same weights.
A decode loop hands `KeptCaches` its cache when rows leave the batch (at compaction and at the end),
and the real positions of each finished row are copied out (left padding removed, so positions
0..L-1, rotary already applied): a `RowCache` with the token ids at those positions. Score B then
runs only the tokens of o' after their longest common prefix (reward/scoring.py).

Memory: a row's keys and values over all layers, 2 x layers x kv heads x head dim x dtype bytes per
token (23 KiB for SmolLM2-135M in bf16), from the rollout until scoring; the trainer drops them
after scoring. Rows beyond a budget (KEEP_FRACTION of the memory free when the rollout starts) keep
nothing, and score B recomputes them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from rlpr.model.memory import available_bytes

# the share of the memory available at the start of a rollout that kept caches may take: the decode
# batch's own cache and working set, and after it the scoring pass's, need the rest
KEEP_FRACTION = 0.5


@dataclass
class RowCache:
    """One response's keys/values and the token ids they were computed from."""

    kv: torch.Tensor  # [layers, 2 (keys, values), kv heads, L, head dim], positions 0..L-1
    ids: list[int]  # the L tokens at those positions: the prompt, then the response's tokens but the last
    model: object = None  # the rollout copy that computed them, which can continue them (reward.score_b_on_copy)

    @property
    def length(self) -> int:
        return self.kv.shape[-2]

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()


def full_attention_cache(model) -> bool:
    """Whether every cache layer of `model` is a plain full-attention one, holding every position (no
    sliding window, no linear attention): what a kept cache needs (a sliding-window layer keeps only
    its window) and what the static decode loop replaces."""
    try:
        layers = DynamicCache(config=model.config).layers
    except Exception:  # a config transformers cannot build a cache from
        return False
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def response_length(tokens: torch.Tensor, stops: torch.Tensor) -> int:
    """The tokens of a response row (pad after its end): through its first stop token, else all."""
    hit = torch.isin(tokens, stops).nonzero()
    return int(hit[0, 0]) + 1 if hit.numel() else tokens.numel()


class KeptCaches:
    """The caches of one decode call's rows, keyed by output row. `prompt_lengths[r]`: row r's real
    prompt tokens, right-aligned at column `width` (the loops' left-padded layout: cache column j
    holds prompt column j, and response token k sits at column width + k)."""

    def __init__(self, prompt_lengths: list[int], width: int, stops: tuple[int, ...], budget: int | None,
                 model=None):
        self.model = model  # the rollout copy computing the caches: each RowCache names it
        self.prompt_lengths = prompt_lengths
        self.width = width
        self.stops = torch.tensor(stops, dtype=torch.long)
        self.budget = budget
        self.used = 0
        self.rows: dict[int, torch.Tensor] = {}

    @classmethod
    def for_batch(cls, prompt_lengths: list[int], width: int, stops: tuple[int, ...], model) -> "KeptCaches":
        free = available_bytes(model.device)
        return cls(prompt_lengths, width, stops, None if free is None else int(KEEP_FRACTION * free), model)

    def take(self, layers: list[tuple[torch.Tensor, torch.Tensor]], batch_rows, out_rows, tokens: torch.Tensor) -> None:
        """Copy the real positions of batch rows `batch_rows` (output rows `out_rows`) out of `layers`,
        a (keys, values) pair [rows, kv heads, positions, head dim] per layer; `tokens` [output rows,
        new tokens]: what each row drew so far (pad after its end). The last drawn token was never fed."""
        batch_rows, out_rows = [int(r) for r in batch_rows], [int(r) for r in out_rows]
        stops = self.stops.to(tokens.device)
        for b, r in zip(batch_rows, out_rows):
            if r in self.rows:
                continue
            start = self.width - self.prompt_lengths[r]
            end = self.width + response_length(tokens[r], stops) - 1
            k0 = layers[0][0]
            size = len(layers) * 2 * k0.shape[1] * (end - start) * k0.shape[-1] * k0.element_size()
            if self.budget is not None and self.used + size > self.budget:
                continue
            kv = k0.new_empty(len(layers), 2, k0.shape[1], end - start, k0.shape[-1])
            for slot, (k, v) in zip(kv, layers):
                slot[0].copy_(k[b, :, start:end])
                slot[1].copy_(v[b, :, start:end])
            self.rows[r] = kv
            self.used += size

    def row(self, r: int, prompt: list[int], response: list[int]) -> RowCache | None:
        """Output row `r`'s cache with its token ids (None: not kept)."""
        kv = self.rows.pop(r, None)
        if kv is None:
            return None
        ids = list(prompt) + list(response[:-1])
        if len(ids) != kv.shape[-2]:
            raise RuntimeError(f"kept cache of row {r} holds {kv.shape[-2]} positions for {len(ids)} tokens")
        return RowCache(kv, ids, self.model)
