"""Prompt prefills kept across `generate` calls (`HFRollout.reusing_prompts`).

The held-out evaluation samples the same prompts twice, greedy and then k samples each: two
prefills of every prompt, the larger part of its compute at short answers (fp32 on an AVX2 CPU: the
demo's 100 prompts take about 8.7 s per pass). Within the block the first pass keeps each prompt's
keys and values (every position but the last token, as the shared prefill computes them) and a
later chunk whose prompts are all kept starts from them instead of running the model.

Rows are left-padded and positions come from the attention mask, so a prompt's keys and values do
not depend on the width of the batch it was computed in: they are its last `len(prompt) - 1`
columns, and the padding columns in front (masked everywhere) are left at zero. A prompt's values
differ from a fresh prefill of another batch only by the float rounding of other matmul shapes,
as the shared prefill's already do (tests/test_rollout.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the memory plan reads BUDGET_BYTES without importing torch
    import torch

# What `HFRollout.reusing_prompts` keeps, at most (keys and values of the rollout copy's dtype; the
# memory plan's "kept prompt prefills"). The demo's 100 held-out prompts: 175 MB in fp32
# (SmolLM2-135M, 38 positions each); prompts beyond it are prefilled again.
BUDGET_BYTES = 256 * 2**20


class PromptPrefills:
    """Per prompt (its token ids), the keys and values of every layer [heads, len(prompt) - 1, dim]."""

    def __init__(self, budget_bytes: int = BUDGET_BYTES):
        self.budget = budget_bytes
        self.used = 0
        self.kept: dict[tuple[int, ...], list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def has(self, prompts: list[list[int]]) -> bool:
        return all(tuple(p) in self.kept for p in prompts)

    def keep(self, cache, prompts: list[list[int]]) -> None:
        """Keep each of `prompts` (the rows of a prefill `cache`, left-padded) while the budget lasts."""
        layers = [(layer.keys, layer.values) for layer in cache.layers]
        width = layers[0][0].shape[-2]
        for row, prompt in enumerate(prompts):
            if tuple(prompt) in self.kept:
                continue
            start = width - (len(prompt) - 1)
            kv = [(k[row, :, start:].clone(), v[row, :, start:].clone()) for k, v in layers]
            size = sum(t.numel() * t.element_size() for pair in kv for t in pair)
            if self.used + size > self.budget:
                return
            self.kept[tuple(prompt)] = kv
            self.used += size

    def cache(self, config, prompts: list[list[int]], width: int, capacity: int = 0):
        """The prefill cache of `prompts` left-padded to `width` columns, from the kept values (`has`
        must hold); preallocated for `capacity` positions when given, as the shared prefill's."""
        from transformers.cache_utils import DynamicCache

        from rlpr.rollout.decode import preallocated_cache

        cache = preallocated_cache(config, capacity) if capacity else DynamicCache(config=config)
        kept = [self.kept[tuple(p)] for p in prompts]
        for i in range(len(kept[0])):
            k0, v0 = kept[0][i]
            keys = k0.new_zeros(len(prompts), k0.shape[0], width, k0.shape[-1])
            values = v0.new_zeros(len(prompts), v0.shape[0], width, v0.shape[-1])
            for row, layers in enumerate(kept):
                k, v = layers[i]
                keys[row, :, width - k.shape[-2]:] = k
                values[row, :, width - v.shape[-2]:] = v
            cache.update(keys, values, i)
        return cache
